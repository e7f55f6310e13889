"""The fleet playbooks' verdict on a host that is not ok (action/fleet_verdict.py), through the real
action: only a host the run found silent ends unreachable (ansible-playbook's exit status 4); every
other status, a swept container with survivors included, fails the host (exit status 2)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.cleanslate.gpu.plugins.action.fleet_verdict import ActionModule
from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import node_reset_result
from tests.unit.test_node_reset_filter import steps


def verdict(status, msg="node is not ok"):
    task = SimpleNamespace(args={"status": status, "msg": msg}, async_val=0, check_mode=False,
                           action="cleanslate.gpu.fleet_verdict", delegate_to=None)
    action = ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")), None, None, None)
    return action.run(task_vars={})


def test_a_host_found_silent_is_unreachable_and_not_failed():
    result = verdict("unreachable", "node3 is unreachable")
    assert result["unreachable"] is True and not result.get("failed"), result
    assert result["msg"] == "node3 is unreachable" and result["changed"] is False


@pytest.mark.parametrize("status", ["swept-unreachable", "failed at gpu_reset", "failed at pve_sweep", "dirty",
                                    "invalid", "not run"])
def test_every_other_status_fails_the_host_and_is_not_unreachable(status):
    result = verdict(status)
    assert result["failed"] is True and not result.get("unreachable"), (status, result)
    assert result["changed"] is False


def test_a_container_swept_with_survivors_left_fails_the_run_as_failed_not_unreachable():
    swept = steps(pve_reach={"unreachable": True, "msg": "timed out"}, gpu_reset={}, shm_clean={}, nvml_verify={},
                  pve_sweep={"changed": True, "killed": [], "survivors": [{"pid": 71}]})
    row = node_reset_result(swept, "ct129")
    assert row["fails_host"] and row["status"] == "swept-unreachable", row
    result = verdict(row["status"])
    assert result["failed"] is True and not result.get("unreachable"), result
