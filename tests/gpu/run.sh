#!/usr/bin/env bash
# Entry point on a machine with an NVIDIA GPU (and no internet): install ansible-core and the
# other missing packages from carried wheels, link the collection, run the crash scenarios and
# the benchmarks against the real driver. Writes everything under OUT (default build/gpu).
#
#   bash tests/gpu/run.sh [OUT]        (SCENARIOS='4-spawn-tree ...' runs only those, no benchmarks)
#
# Scenarios 7-pinned-gpu-select 8-unpinned-context 9-forked-child-select 10-monitor-client
# 11-cuda-init-client 12-two-servers-two-gpus need two GPUs (nvidia-h200-x2) and report SKIP on one.
#
# Wheels: `make gpu-wheels` fills .whl/ on a machine with a package index (Python 3.12, x86-64).
# Nothing here resets a GPU or changes its settings.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/gpu}
mkdir -p "$out"
if ! python3 -c 'import ansible' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cleanslate-site .whl/*.whl
  export PYTHONPATH=/tmp/cleanslate-site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/cleanslate-site/bin:$PATH
fi
mkdir -p .ansible/collections/ansible_collections/cleanslate
ln -sfn ../../../.. .ansible/collections/ansible_collections/cleanslate/gpu
export LC_ALL=C.UTF-8 LANG=C.UTF-8
ANSIBLE_PYTHON_INTERPRETER=$(command -v python3)
export PYTHONUNBUFFERED=1 ANSIBLE_PYTHON_INTERPRETER
nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.csv"
python3 tests/gpu/probe_driver.py | tee "$out/probe.txt"
python3 tests/gpu/xid_metal.py | tee "$out/xid_metal.json" || echo "xid_metal: exit $?" | tee -a "$out/xid_metal.json"
rc=0
python3 -m tests.gpu.scenarios --out "$out" ${SCENARIOS:+--only $SCENARIOS} || rc=$?
exit $rc
