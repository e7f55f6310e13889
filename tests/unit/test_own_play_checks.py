"""The roles in a user's own play: what stops them before ansible-core's validation task of their
entry point (cleanslate.gpu.role_variable_refusals, run by their dependency variable_checks), the
playbooks' plays that make that check stand aside, and the summary the roles print at the end."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.filter.own_play_summary import (inference_service_summary,
                                                                                node_reset_summary)
from ansible_collections.cleanslate.gpu.plugins.filter.role_variables import role_variable_refusals
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._unknown_variables import STOPPED

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_NeverShownAnywhere0123456789"


def defaults(role: str, **changed) -> dict:
    values = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    values.update(changed)
    return values


@pytest.mark.parametrize("role", ["node_reset", "inference_service"])
def test_the_defaults_stop_nothing(role):
    assert role_variable_refusals(defaults(role), role) == []


def test_a_value_ansible_core_would_refuse_stops_with_every_sentence_of_the_roles_own_check():
    # kill_timeout "abc" would fail ansible-core's float conversion; the grace period's range is the
    # role's alone, and is said in the same stop, one sentence per bad variable.
    refusals = role_variable_refusals(defaults("node_reset", node_reset_gpu_reset_kill_timeout="abc",
                                               node_reset_gpu_reset_grace_period=-1), "node_reset")
    assert refusals == ['node_reset_gpu_reset_grace_period is -1: it must be a number of seconds from 0 to 3600.',
                        'node_reset_gpu_reset_kill_timeout is "abc": it must be a number of seconds from 0 to 3600.']
    assert role_variable_refusals(defaults("node_reset", node_reset_pycache_purge_mode="sometimes"), "node_reset") == [
        'node_reset_pycache_purge_mode is "sometimes": it must be one of stale, all.']


def test_a_value_only_the_role_refuses_is_left_to_the_role_which_reports_the_host_invalid():
    # node_reset_fail_host false keeps such a host alive, its result `invalid`: not stopped here.
    assert role_variable_refusals(defaults("node_reset", node_reset_gpu_reset_grace_period=-1), "node_reset") == []


def test_a_secret_refused_by_type_is_named_without_its_value():
    refusals = role_variable_refusals(defaults("inference_service", inference_service_secrets=SECRET,
                                               inference_service_port="abc"), "inference_service")
    assert refusals == ['inference_service_port is "abc": it must be a TCP port from 1 to 65535.',
                        'inference_service_secrets is (hidden): it must be a mapping of names to values.']


def test_a_misspelled_variable_stops_the_role_unless_unknown_names_are_allowed():
    values = defaults("node_reset", node_reset_gpu_reset_gpu=["1"])
    assert role_variable_refusals(values, "node_reset") == [
        "node_reset_gpu_reset_gpu is not a variable of the node_reset role: did you mean node_reset_gpu_reset_gpus?",
        STOPPED]
    assert role_variable_refusals(values, "node_reset", allow_unknown="true") == []
    # What the roles publish is no misspelling (a second run of the role in one play sees its result).
    assert role_variable_refusals(defaults("node_reset", node_reset_result={"ok": True}), "node_reset") == []


def _role_plays(path: Path) -> list:
    """The plays of a playbook that run a role of the collection (import_role or include_role)."""
    text = yaml.safe_load(path.read_text()) or []
    return [play for play in text if "cleanslate.gpu.node_reset" in str(play.get("tasks"))
            or "cleanslate.gpu.inference_service" in str(play.get("tasks"))]


def test_every_play_of_the_playbooks_that_runs_a_role_makes_the_own_play_check_stand_aside():
    # Without it the roles' dependency fails a host with a refused variable before the fleet report,
    # which must list it `invalid`.
    plays = [(path.name, play) for path in sorted((REPO / "playbooks").glob("*.yml")) for play in _role_plays(path)]
    assert len(plays) >= 4, plays
    assert [name for name, play in plays if (play.get("vars") or {}).get("__variable_checks_playbook") is not True] == []


def test_the_reset_summary_is_the_hosts_report_row_and_says_where_the_result_is():
    result = {"host": "gpu-a01", "status": "failed", "ok": False, "killed_count": 9, "shm_bytes_freed": 2 * 1024 ** 3,
              "bytecode_removed": 3, "problems": ["GPU 1 (GPU-x): 512 MiB used"], "steps": {}}
    lines = node_reset_summary(result)
    assert lines[0].startswith("| host | status | killed | MiB freed |")
    assert lines[2] == "| gpu-a01 | failed | 9 | 0 | 2.0 GiB | 3 | 0.0 |"
    assert lines[3] == "- GPU 1 (GPU-x): 512 MiB used"
    assert lines[-1].startswith("The whole result is in node_reset_result;")
    # A verify, or a reset in check mode, stopped nothing: the columns say what a reset would do.
    assert "would stop" in node_reset_summary(dict(result, kind="verify"))[0]
    assert "would stop" in node_reset_summary(result, read_only=True)[0]


def test_the_service_summary_has_the_service_columns_and_one_line_per_instance():
    result = {"host": "gpu-a01", "status": "ready", "engine": "vllm", "engine_version": "0.33.0", "ready_s": 41.23,
              "acceptance_rate": 0.5,
              "instances": [{"unit": "vllm-a.service", "status": "ready", "ready_s": 40.0, "gpus": [0]},
                            {"unit": "vllm-b.service", "status": "failed", "reason": "exited", "gpus": [1]}]}
    lines = inference_service_summary(result)
    assert lines[0] == "| host | service | engine | ready s | first completion ms | acceptance |"
    assert lines[2].startswith("| gpu-a01 | ready |") and "| 41.2 | - | 50% |" in lines[2], lines
    assert lines[3:5] == ["- vllm-a.service: ready, ready s 40.0, acceptance -",
                          "- vllm-b.service: failed, ready s -, acceptance -"]
    assert "- vllm-b.service: service failed: exited" in lines
    assert lines[-1].startswith("The whole result is in inference_service_result;")


def test_the_service_summary_says_why_a_refused_configuration_was_not_served():
    # The fleet report gives a refusal to node_reset's row (`invalid`); the role's own summary says it itself.
    result = {"host": "gpu-a01", "status": "failed", "stage": "validate",
              "reason": "inference_service_port is \"abc\": it must be a TCP port from 1 to 65535."}
    assert inference_service_summary(result)[3] == "- " + result["reason"]
