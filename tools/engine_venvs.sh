#!/usr/bin/env bash
# Install the real engines whose parsers the flag data is made from (issue 25), under build/engines:
# one venv per engine version, each with the engine alone (--no-deps) and a .pth to a shared venv
# (build/engines/base) holding the CPU build of torch and the light packages the engines' argument
# parsers and vLLM's SpeculativeConfig import. About 7 GB in all, against about 10 GB for each full
# install; not run by CI (the parser records in tests/fixtures/engine_parsers are committed).
#
#   tools/engine_venvs.sh                 # the versions below
#   tools/engine_venvs.sh vllm==0.34.0    # one more
# then: python3 tools/gen_flag_data.py --dump build/engines/<engine>-<version> ...
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
DIR=build/engines
# The newest on the package index and the two before it (pip index versions vllm / sglang).
DEFAULT=(vllm==0.31.0 vllm==0.32.0 vllm==0.33.0 sglang==0.5.21 sglang==0.5.22 sglang==0.5.23)
# What the parsers import, beyond the standard library. torch 2.13.0 is the CPU wheel on this
# machine's disk (a newer pin would pull a CUDA build of several GB); the engines' own pins of
# torch only matter to their kernels, never to their parsers.
BASE=(torch==2.13.0 regex cachetools psutil sentencepiece numpy requests tqdm blake3 py-cpuinfo
  "transformers>=5.16.1,<5.21.0" "huggingface_hub>=1.31.0" "tokenizers>=0.23.2" "safetensors>=0.6.2"
  "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*" "fastapi[standard]>=0.133.0,<0.137.0" "starlette>=1.0.1"
  aiohttp multidict "openai>=2.25.0" "pydantic>=2.12.0" orjson prometheus_client pillow
  prometheus-fastapi-instrumentator tiktoken lm-format-enforcer==0.11.3 "llguidance>=1.7.0,<1.8.0"
  outlines_core==0.2.14 lark==1.2.2 xgrammar==0.2.8 typing_extensions filelock partial-json-parser jsonschema
  pyzmq msgspec "mistral_common[image]>=1.11.6" opencv-python-headless pyyaml einops compressed-tensors==0.17.0
  depyf==0.20.0 cloudpickle watchfiles python-json-logger ninja pybase64 cbor2 ijson setproctitle
  "oss-harmony>=0.0.11" "anthropic>=0.71.0" "model-hosting-container-standards>=0.1.14,<1.0.0" "mcp>=2.2.0,<3.0.0"
  opentelemetry-sdk opentelemetry-api opentelemetry-exporter-otlp opentelemetry-semantic-conventions-ai ipython
  gguf)
# What SGLang's configuration build (tools/compare_engines.py runs the role's engine check) imports
# beyond its parser: torchvision (its multimodal configs import torchvision.transforms), the wheel of
# torch 2.13, --no-deps. PyPI's is a CUDA build whose operators cannot load on the CPU torch; its two
# unguarded operator registrations are guarded below, as its others are, so that it imports.
TORCHVISION="torchvision==0.28.0"

specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=("${DEFAULT[@]}")
mkdir -p "$DIR"
if [ ! -x "$DIR/base/bin/python" ]; then
  "$PYTHON" -m venv "$DIR/base"
fi
"$DIR/base/bin/pip" install -q --disable-pip-version-check "${BASE[@]}"
"$DIR/base/bin/pip" install -q --disable-pip-version-check --no-deps "$TORCHVISION"
shared=$("$DIR/base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
sed -i 's/^@torch.library.register_fake("torchvision::\(q\{0,1\}nms\)")$/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda fn: fn))/' \
  "$shared/torchvision/_meta_registrations.py"
for spec in "${specs[@]}"; do
  venv="$DIR/${spec/==/-}"
  if [ ! -x "$venv/bin/python" ]; then
    "$PYTHON" -m venv "$venv"
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$shared" > "$site/engines-base.pth"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "$spec"
  echo "$venv: $("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('${spec%%==*}'))")"
done
du -sh "$DIR"
