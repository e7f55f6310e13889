"""The inference server's command line (plugin_utils/_serve_command.py and _engine_flags.py): what
the role renders for vLLM 0.33.0 and SGLang 0.5.23, and every configuration it refuses, with the
sentence the user reads. The data are the committed flag files the role ships."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_flags, _serve_command

REPO = Path(__file__).resolve().parents[2]
FLAGS = str(REPO / "roles" / "inference_service" / "files" / "flags")
TEST_VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}


def settings(**overrides) -> dict:
    base = {
        "engine": "vllm", "engine_version": None, "model": "meta-llama/Llama-3.1-70B-Instruct", "served_name": "llama",
        "tensor_parallel_size": 4, "host": "0.0.0.0", "port": 8000, "gpu_memory_fraction": 0, "max_model_len": 0,
        "speculative": {}, "extra_args": [], "environment": {},
        "secrets_set": {"api_key": False, "hf_token": False, "admin_api_key": False, "environment": []},
        "executable": "", "venv": "", "unit": "vllm.service", "user": "", "drain_timeout": 30,
        "config_dir": "/etc/cleanslate/inference",
    }
    base.update(overrides)
    if base["engine_version"] is None:  # the newest each engine has data for: these tests are not about versions
        base["engine_version"] = TEST_VERSIONS.get(base["engine"], "")
    return base


def build(**overrides) -> dict:
    values = settings(**overrides)
    flags = _engine_flags.EngineFlags(_engine_flags.load([FLAGS], values["engine"], values["engine_version"]))
    return _serve_command.build(values, flags)


def refused(**overrides) -> str:
    with pytest.raises((_serve_command.ServeConfigError, _engine_flags.FlagError)) as caught:
        build(**overrides)
    return str(caught.value)


EAGLE3 = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-70B", "num_speculative_tokens": 3}


# --- what is rendered ----------------------------------------------------------------------

def test_vllm_command_line_with_eagle3_and_a_batch_size_schedule():
    spec = dict(EAGLE3, num_speculative_tokens_per_batch_size=[[1, 32, 3], [33, 256, 1]])
    built = build(speculative=spec, gpu_memory_fraction=0.9, max_model_len=32768, venv="/opt/vllm",
                  extra_args=["--max-num-seqs", 256, "--enable-prefix-caching"])
    argv = built["argv"]
    assert argv[:4] == ["/opt/vllm/bin/vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "--served-model-name"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
    assert argv[argv.index("--max-model-len") + 1] == "32768"
    assert argv[argv.index("--shutdown-timeout") + 1] == "30"
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == spec
    assert argv[-3:] == ["--max-num-seqs", "256", "--enable-prefix-caching"]
    assert built["url"] == "http://127.0.0.1:8000"
    assert built["timeout_stop_sec"] == 60
    assert built["speculative"] == {
        "enabled": True, "method": "eagle3", "method_given": "eagle3", "draft_tensor_parallel_size": 4,
        "note": "the draft runs with the target's tensor-parallel size (4): draft_tensor_parallel_size is not set"}


def test_defaults_leave_the_engine_defaults_alone():
    argv = build()["argv"]
    assert argv[0] == "/usr/local/bin/vllm"
    assert "--gpu-memory-utilization" not in argv and "--max-model-len" not in argv
    assert "--speculative-config" not in argv


def test_exec_start_quotes_every_item_for_systemd():
    built = build(served_name="pct%name", extra_args=["--chat-template", 'say "$HOME" \\ ;'])
    lines = built["exec_start"].split(" \\\n    ")
    assert lines[0] == '"/usr/local/bin/vllm"'
    assert '"pct%%name"' in lines                            # a % specifier would be expanded
    assert lines[-1] == '"say \\"$$HOME\\" \\\\ ;"'          # $ substituted, quotes and backslashes escaped
    assert len(lines) == len(built["argv"])                 # one argument per line: a readable diff


def test_secrets_never_reach_the_command_line():
    built = build(secrets_set={"api_key": True, "hf_token": True, "environment": ["WANDB_API_KEY"]})
    assert built["secret_environment"] == {"VLLM_API_KEY": "api_key", "HF_TOKEN": "hf_token",
                                           "WANDB_API_KEY": "environment"}
    assert not any("key" in item.lower() or "token" in item.lower() for item in built["argv"])
    assert built["secret_config"] == {}


def test_sglang_takes_its_api_key_from_a_config_file_and_adds_enable_metrics():
    spec = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "lmsys/EAGLE3-llama",
            "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
            "speculative_adaptive": True}
    built = build(engine="sglang", unit="sglang.service", port=30000, speculative=spec,
                  secrets_set={"api_key": True, "hf_token": True, "admin_api_key": True, "environment": []})
    argv = built["argv"]
    assert argv[:4] == ["/usr/local/bin/sglang", "serve", "--model-path", "meta-llama/Llama-3.1-70B-Instruct"]
    assert "--enable-metrics" in argv and "--speculative-adaptive" in argv
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    assert argv[argv.index("--config") + 1] == "/etc/cleanslate/inference/sglang.secrets.yaml"
    assert built["secret_config"] == {"path": "/etc/cleanslate/inference/sglang.secrets.yaml",
                                      "secrets": {"api-key": "api_key", "admin-api-key": "admin_api_key"}}
    assert built["secret_environment"] == {"HF_TOKEN": "hf_token"}


def test_cuda_visible_devices_gets_the_pci_bus_order():
    built = build(environment={"CUDA_VISIBLE_DEVICES": "4,5,6,7", "NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": 1})
    assert built["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert '"HF_HUB_OFFLINE=1"' in built["environment_lines"]


def test_vllm_flexible_spellings_are_accepted():
    argv = build(extra_args=["--max_num_seqs", "8", "-O3", "--max-num-batched-tokens=8192"])["argv"]
    assert argv[-4:] == ["--max_num_seqs", "8", "-O3", "--max-num-batched-tokens=8192"]


def test_warnings_for_what_is_accepted_but_suspicious():
    built = build(speculative={"method": "deepseek_mtp", "num_speculative_tokens": 1},
                  extra_args=["--disable-log-stats"])
    assert any("deprecated alias" in w for w in built["warnings"])
    assert any("/metrics" in w for w in built["warnings"])
    built = build(engine="sglang", extra_args=["--disable-cuda-graph"])
    assert any("deprecated" in w for w in built["warnings"])


# --- what is refused -----------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ({"method": "eagle3", "model": "d", "tensor_parallel_size": 2},
     "inference_service_speculative.tensor_parallel_size is refused by vLLM's SpeculativeConfig: use "
     "draft_tensor_parallel_size"),
    ({"method": "eagle3", "model": "d", "num_speculatve_tokens": 3},
     "inference_service_speculative.num_speculatve_tokens is not a key of vLLM 0.33.0's SpeculativeConfig "
     "(did you mean num_speculative_tokens"),
    ({"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-70B"}, "inference_service_speculative.method is required"),
    ({"method": "eagle3"}, "inference_service_speculative.model is required with method eagle3"),
    ({"method": "medusa", "model": "d"}, "inference_service_speculative.method must be one of ngram"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be more than 0"),
    ({"method": "ngram", "num_speculative_tokens": "3"}, "num_speculative_tokens must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens must be an integer"),
    ({"method": "ngram", "prompt_lookup_max": math.nan}, "prompt_lookup_max must be an integer"),
    ({"method": "ngram", "target_model_config": {}}, "target_model_config is set by vLLM itself"),
    ({"method": "eagle3", "model": "d", "draft_tensor_parallel_size": 2},
     "draft_tensor_parallel_size must be 1 or the target's inference_service_tensor_parallel_size (4), got 2"),
    (dict(EAGLE3, num_speculative_tokens_per_batch_size=[[1, 8]]), "each entry is [lowest batch size"),
    (dict(EAGLE3, num_speculative_tokens_per_batch_size=[[8, 1, 3]]), "1 <= lowest <= highest"),
    (dict(EAGLE3, num_speculative_tokens_per_batch_size=[[1, 8, 5]]), "tokens must be from 0"),
    (dict(EAGLE3, num_speculative_tokens_per_batch_size=[[1, 8, 3], [8, 16, 1]]), "overlap"),
    (dict(EAGLE3, num_speculative_tokens_per_batch_size="1-8:3"), "must be a list of [lowest batch size"),
    (["eagle3"], "inference_service_speculative must be a dict"),
])
def test_vllm_speculative_config_is_refused_with_the_key_at_fault(spec, message):
    assert message in refused(speculative=spec)


@pytest.mark.parametrize("spec, message", [
    ({"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3},
     "speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens are given together or not at all"),
    ({"speculative_draft_model_path": "d"}, "inference_service_speculative.speculative_algorithm is required"),
    ({"speculative_algorithm": "EAGLE3", "algorithm": "x"}, "inference_service_speculative.algorithm is not"),
    ({"speculative_algorithm": "EAGLE3", "speculative_num_steps": 0, "speculative_eagle_topk": 1,
      "speculative_num_draft_tokens": 4}, "speculative_num_steps must be an integer from 1 to 256, got 0"),
    ({"speculative_algorithm": "EAGLE3", "speculative_adaptive": "yes"}, "is a switch: true or false"),
    ({"speculative_algorithm": "EAGLE3", "speculative_num_steps": "three", "speculative_eagle_topk": 1,
      "speculative_num_draft_tokens": 4}, "speculative_num_steps must be an integer from 1 to 256, got 'three'"),
    ({"speculative_algorithm": "NGRAM", "speculative_ngram_capacity": "big"},
     "sglang 0.5.23 would refuse the command line: argument --speculative-ngram-capacity: invalid int value: 'big'"),
    ({"speculative_algorithm": "NGRAM", "speculative_attention_mode": "sideways"},
     "argument --speculative-attention-mode: invalid choice: 'sideways'"),
])
def test_sglang_speculative_options_are_refused_with_the_key_at_fault(spec, message):
    assert message in refused(engine="sglang", speculative=spec)


@pytest.mark.parametrize("extra, message", [
    (["--bogus"], "inference_service_extra_args: --bogus is not an option of vllm 0.33.0"),
    (["--port", "9000"], "--port is set by the role; use inference_service_port"),
    (["--speculative-config.method", "eagle3"], "--speculative-config is set by the role; use inference_service_speculative"),
    (["--spec-tokens", "3"], "--spec-tokens is set by the role; use inference_service_speculative"),
    (["--model", "other"], "--model is set by the role; use inference_service_model"),
    (["-tp", "8"], "-tp is set by the role; use inference_service_tensor_parallel_size"),
    (["--api-key", "k"], "--api-key would put a secret on the command line"),
    (["--hf-token", "t"], "--hf-token would put a secret on the command line"),
    (["--enforce-eager", "true"], "vllm 0.33.0 would refuse the command line: unrecognized arguments: true"),
    (["--max-num-seqs"], "argument --max-num-seqs: expected one argument"),
    (["--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value: 'many'"),
    (["--dtype", "fp3"], "argument --dtype: invalid choice: 'fp3'"),
    (["--max-num-seqs", "8\n--port 1"], "holds a control character"),
    ("--max-num-seqs 8", "must be a list of strings"),
    ([["--max-num-seqs", "8"]], "must be a list of strings"),
    ([True], "must be a list of strings"),
])
def test_vllm_extra_args_are_refused_as_the_engine_would(extra, message):
    assert message in refused(extra_args=extra)


@pytest.mark.parametrize("extra, message", [
    (["--cuda-graph-max-bs", "8"],
     "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"),
    (["--tp", "2"], "--tp is set by the role; use inference_service_tensor_parallel_size"),
    (["--speculative-num-steps", "3"], "--speculative-num-steps is set by the role; use inference_service_speculative"),
    (["--admin-api-key", "k"], "--admin-api-key would put a secret on the command line"),
    (["--max-model-len", "4096"], "--max-model-len is not an option of sglang 0.5.23"),
])
def test_sglang_extra_args_are_refused_as_the_engine_would(extra, message):
    assert message in refused(engine="sglang", extra_args=extra)


def test_sglang_config_flag_cannot_be_given_with_an_api_key():
    message = refused(engine="sglang", extra_args=["--config", "/etc/sglang.yaml"],
                      secrets_set={"api_key": True, "environment": []})
    assert "SGLang takes one --config file, which carries the key" in message


@pytest.mark.parametrize("env, message", [
    ({"VLLM_PORT": "8000"}, "VLLM_PORT is vLLM's address for its own internal communication"),
    ({"VLLM_HOST_IP": "10.0.0.1"}, "VLLM_HOST_IP is vLLM's address"),
    ({"HF_TOKEN": "hf_x"}, "inference_service_environment.HF_TOKEN looks like a secret"),
    ({"VLLM_API_KEY": "k"}, "inference_service_environment.VLLM_API_KEY looks like a secret"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES lists 2 GPU(s), fewer than"),
    ({"BAD NAME": "x"}, "'BAD NAME' is not an environment variable name"),
    ({"HF_HUB_OFFLINE": True}, "must be a string (quote YAML's true/false)"),
    ({"NCCL_DEBUG": "WARN\nExecStartPre=/bin/sh"}, "NCCL_DEBUG holds a control character"),
    (["CUDA_VISIBLE_DEVICES=0"], "must be a dict of variable names to values"),
])
def test_environment_is_refused_with_the_variable_at_fault(env, message):
    assert message in refused(environment=env)


@pytest.mark.parametrize("overrides, message", [
    ({"model": ""}, "inference_service_model must name the model"),
    ({"model": "a\nb"}, "inference_service_model must name the model"),
    ({"model": "--enforce-eager"}, "inference_service_model must name the model"),
    ({"host": "-1"}, "inference_service_host must be an IP address or a DNS host name"),
    ({"served_name": "two words"}, "inference_service_served_name is 'two words': it must be one word"),
    ({"tensor_parallel_size": 0}, "inference_service_tensor_parallel_size is 0: it must be a whole number of GPUs from 1 to 1024."),
    ({"tensor_parallel_size": -2}, "inference_service_tensor_parallel_size is -2: it must be a whole number of GPUs"),
    ({"tensor_parallel_size": 10**9}, "inference_service_tensor_parallel_size is 1000000000: it must be"),
    ({"port": 0}, "inference_service_port is 0: it must be a TCP port from 1 to 65535."),
    ({"port": 70000}, "inference_service_port is 70000: it must be a TCP port from 1 to 65535."),
    ({"host": ""}, "inference_service_host must be an IP address"),
    ({"host": "0.0.0.0 --port 1"}, "inference_service_host must be an IP address"),
    ({"gpu_memory_fraction": math.nan}, "inference_service_gpu_memory_fraction is NaN: it must be a share from 0"),
    ({"gpu_memory_fraction": math.inf}, "inference_service_gpu_memory_fraction is Infinity: it must be a share"),
    ({"gpu_memory_fraction": 1.5}, "inference_service_gpu_memory_fraction is 1.5: it must be a share from 0 (the engine's default) to 1."),
    ({"gpu_memory_fraction": -0.1}, "inference_service_gpu_memory_fraction is -0.1: it must be a share"),
    ({"max_model_len": -1}, "inference_service_max_model_len is -1: it must be a whole number of tokens from 0 (the model's own) to"),
    ({"drain_timeout": -1}, "inference_service_drain_timeout is -1: it must be a whole number of seconds from 0 to 86400."),
    ({"unit": "vllm"}, "it must be a service unit name such as vllm.service"),
    ({"unit": "../../etc/passwd.service"}, "it must be a service unit name such as vllm.service"),
    ({"unit": "a/b.service"}, "it must be a service unit name such as vllm.service"),
    ({"unit": "vllm@.service"}, "it must be a service unit name such as vllm.service"),
    ({"user": "root; rm"}, "inference_service_user must be a user name"),
    ({"venv": "opt/vllm"}, "inference_service_venv must be an absolute path"),
    ({"venv": "/opt/../etc"}, "inference_service_venv must be an absolute path"),
    ({"config_dir": "/etc/x/."}, None),
    ({"executable": "vllm"}, "inference_service_executable must be the absolute path"),
    ({"executable": "/opt/vllm/bin/"}, "inference_service_executable must be the absolute path"),
])
def test_hostile_scalars_are_refused_with_one_sentence_each(overrides, message):
    if message is None:
        build(**overrides)  # a trailing /. is still an absolute path without '..'
        return
    assert message in refused(**overrides)


def test_every_problem_is_reported_at_once():
    message = refused(speculative={"model": "d"}, extra_args=["--bogus"], environment={"VLLM_PORT": "1"})
    assert "method is required" in message and "--bogus" in message and "VLLM_PORT" in message


def test_a_version_without_data_lists_the_versions_known():
    assert refused(engine_version="0.9.2") == (
        "inference_service_engine_version '0.9.2': no flag data for vllm 0.9.2; known versions: 0.31.0, 0.32.0, 0.33.0 "
        "(a new version is one data file made by tools/gen_flag_data.py)")


def test_a_new_version_is_one_data_file(tmp_path):
    data = json.loads((Path(FLAGS) / "vllm-0.33.0.json").read_text())
    data["version"] = "0.34.0"
    data["options"] = [o for o in data["options"] if o["dest"] != "enable_prefix_caching"]
    (tmp_path / "vllm-0.34.0.json").write_text(json.dumps(data))
    flags = _engine_flags.EngineFlags(_engine_flags.load([FLAGS, str(tmp_path)], "vllm", "", host_version="0.34.0"))
    assert flags.version == "0.34.0"  # the host's
    with pytest.raises(_serve_command.ServeConfigError, match="--enable-prefix-caching is not an option of vllm 0.34.0"):
        _serve_command.build(settings(extra_args=["--enable-prefix-caching"]), flags)


def test_sglang_secrets_cannot_name_a_vllm_only_or_duplicate_variable():
    assert "admin_api_key: vllm 0.33.0 has no admin API key" in refused(
        secrets_set={"admin_api_key": True, "environment": []})
    assert "inference_service_secrets.environment.NCCL_DEBUG is also in inference_service_environment" in refused(
        environment={"NCCL_DEBUG": "WARN"}, secrets_set={"environment": ["NCCL_DEBUG"]})
