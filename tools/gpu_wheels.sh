#!/usr/bin/env bash
# Fill .whl/ with the wheels the GPU machine lacks to run the playbooks (it has Python 3.12, torch,
# psutil and nvidia-ml-py, and no package index): ansible-core and what it imports, at the versions
# constraints.txt pins. Run here, where PyPI is reachable; tests/gpu/run.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(ansible-core resolvelib jmespath cryptography cffi pycparser Jinja2 MarkupSafe PyYAML packaging)
pins=()
for name in "${packages[@]}"; do
  pin=$(grep -i "^${name}==" constraints.txt) || { echo "gpu_wheels: $name is not pinned in constraints.txt" >&2; exit 1; }
  pins+=("$pin")
done
rm -rf .whl && mkdir -p .whl
"${PYTHON:-python3}" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}"
ls .whl
