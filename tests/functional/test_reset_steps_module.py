"""The module cleanslate.gpu.reset_steps run as Ansible runs it on a host (tests/run_module.py): the
steps in one process, each step's main() in a child of its own. What crosses to the controller:
its answer, where a secret of the evidence's (a no_log option of that module) is masked wherever
it appears, as that module masks it in its own answer."""
from __future__ import annotations

import json

from tests.run_module import run_module

SECRET = "sk-reset-steps-4242-canary"


def test_the_evidences_secrets_are_masked_in_the_whole_answer(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    # The secret in another step's arguments too: shm_clean does not know it is one.
    result = run_module("reset_steps", {
        "evidence": {"path": str(tmp_path / "evidence"), "secrets": [SECRET], "cmdline_patterns": ["never-" + SECRET]},
        "shm_clean": {"path": str(shm), "exclude": [SECRET]}})
    assert result["rc"] == 0, result
    assert list(result["steps"]) == ["evidence", "shm_clean"], result
    assert result["failed_step"] is None and result["steps"]["shm_clean"]["removed"] == []
    assert SECRET not in json.dumps(result), json.dumps(result)[:3000]


def test_a_step_that_fails_stops_the_steps_after_it_in_its_own_answer(tmp_path):
    """A step's refusal is its module's own answer (message, failed); the module itself ends well,
    names the step, and runs none after it (the action fails the task)."""
    result = run_module("reset_steps", {"shm_clean": {"path": "relative/shm"},
                                        "nvml_verify": {"timeout": 0}})
    assert result["rc"] == 0, result
    assert list(result["steps"]) == ["shm_clean"] and result["failed_step"] == "shm_clean", result
    assert result["steps"]["shm_clean"]["failed"] is True and "absolute" in result["steps"]["shm_clean"]["msg"]


def test_record_is_refused_here_it_is_the_actions(tmp_path):
    result = run_module("reset_steps", {"shm_clean": {"path": str(tmp_path)},
                                        "record": {"steps": {}, "result": {}, "metrics_dir": str(tmp_path)}})
    assert result["rc"] == 1 and "record" in result["msg"] and "steps" not in result, result
