"""The role's flag data: generated from the engines' reference flag lists by tools/gen_flag_data.py,
committed, and holding what the validator and the stand-in engine rely on."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLAGS = REPO / "roles" / "inference_service" / "files" / "flags"
REFERENCE = Path("/work/shared/reference")


def load(name):
    return json.loads((FLAGS / name).read_text())


def test_vllm_data_holds_the_serve_flags_and_the_speculative_config_keys():
    data = load("vllm-0.33.0.json")
    flags = {flag for option in data["options"] for flag in option["flags"]}
    assert {"--speculative-config", "-sc", "--tensor-parallel-size", "-tp", "--shutdown-timeout",
            "--enable-prefix-caching", "--disable-prefix-caching"} <= flags
    assert "--help" not in flags
    keys = data["speculative"]["keys"]
    assert len(keys) == 43  # the rows of vllm_speculative_config_keys.tsv
    assert keys["num_speculative_tokens"] == {"kind": "int", "above": 0, "nullable": False}
    assert keys["num_speculative_tokens_per_batch_size"]["kind"] == "schedule"
    assert keys["target_model_config"]["kind"] == "internal"
    assert "eagle3" in keys["method"]["choices"] and "medusa" not in keys["method"]["choices"]
    assert "deepseek_mtp" in data["speculative"]["method_aliases"]


def test_sglang_data_holds_the_server_flags_and_the_step_rule():
    data = load("sglang-0.5.23.json")
    flags = {flag for option in data["options"] for flag in option["flags"]}
    assert {"--model-path", "--tp-size", "--enable-metrics", "--config", "--speculative-adaptive"} <= flags
    assert "--cuda-graph-max-bs" not in flags  # gone in 0.5.23: ambiguous between -decode and -prefill
    assert data["speculative"]["all_or_none"] == ["speculative_num_steps", "speculative_eagle_topk",
                                                  "speculative_num_draft_tokens"]
    deprecated = [o["flags"][0] for o in data["options"] if o.get("deprecated")]
    assert "--disable-cuda-graph" in deprecated


def test_truncated_choice_lists_are_not_used_as_choices():
    """The extraction cut long fields at 300 characters: such a list would refuse real values."""
    for name in ("vllm-0.33.0.json", "sglang-0.5.23.json"):
        for option in load(name)["options"]:
            assert len(",".join(option.get("choices") or [])) < 300, option["flags"]


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="the reference flag lists are not on this machine")
def test_the_committed_data_is_what_the_generator_makes_from_the_reference():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gen_flag_data.py"), str(REFERENCE), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
