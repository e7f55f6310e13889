"""A host with several servers in the report (issue 26): the host's result is its worst instance's
with every instance's kept, and each instance gets a row with what the host's one reset stopped,
killed and freed on its own GPUs."""
from __future__ import annotations

import pytest

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import (host_row, merge_rows, render_markdown,
                                                                            with_instance_rows)
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_result import (
    inference_service_host_assessment, inference_service_host_result, inference_service_report_row)


def instance(unit, status="ready", gpus=(0, 1), reset=False, **values):
    result = {"host": "node1", "unit": unit, "engine": "vllm", "status": status, "ok": status in ("ready", "check"),
              "reason": "" if status == "ready" else "%s went wrong" % unit, "gpus": list(gpus), "reset": reset,
              "ready_s": 1.5 if reset else None, "acceptance_rate": 0.7, "main_pid": 100, "changed": reset,
              "restarted": reset}
    result.update(values)
    return result


def test_the_host_says_its_worst_instance_and_keeps_every_instance():
    results = [instance("a.service"), instance("b.service", "degraded", (2, 3)), instance("c.service", "failed", (4,)),
               instance("d.service", "ready", (5,), reset=True)]
    host = inference_service_host_result(results, host="node1")
    assert (host["status"], host["unit"], host["ok"], host["changed"], host["restarted"]) == (
        "failed", "c.service", False, True, True)
    assert host["reason"] == "b.service: b.service went wrong\nc.service: c.service went wrong"
    assert [item["unit"] for item in host["instances"]] == ["a.service", "b.service", "c.service", "d.service"]
    # Degraded is worse than ready, better than failed; among equals the first instance speaks.
    assert inference_service_host_result(results[:2], host="node1")["status"] == "degraded"
    ready = inference_service_host_result([results[0], results[3]], host="node1")
    assert (ready["status"], ready["unit"], ready["ok"]) == ("ready", "a.service", True)


def test_a_refused_instance_refuses_the_host_one_line_per_problem_naming_its_unit():
    refused = dict(instance("b.service"), stage="validate", status="failed", ok=False,
                   reason="inference_service: bad port\ninference_service: bad model")
    host = inference_service_host_result([refused, dict(refused, unit="c.service", stage="unreachable",
                                                        reason="unreachable: no answer")], host="node1")
    assert host["stage"] == "unreachable" and not host["ok"]
    assert host["reason"].splitlines() == ["b.service: inference_service: bad port", "b.service: inference_service: bad model",
                                           "c.service: unreachable: no answer"]
    # Refused before anything was touched: said once, by node_reset's `invalid`, not again as a service problem.
    assert inference_service_report_row(host)["problems"] == []


@pytest.mark.parametrize("bad", [[], "a", [1], None])
def test_no_instance_is_a_mistake_of_the_caller(bad):
    with pytest.raises(TypeError):
        inference_service_host_result(bad, host="node1")
    with pytest.raises(TypeError):
        inference_service_host_assessment(bad)


def test_the_host_is_healthy_only_when_every_instance_is():
    looks = [{"unit": "a.service", "verdict": "healthy", "healthy": True, "reason": "200", "gpus": [0]},
             {"unit": "b.service", "verdict": "slow", "healthy": "True", "reason": "slow", "gpus": [1]},
             {"unit": "c.service", "verdict": "unhealthy", "healthy": False, "reason": "refused", "gpus": [2]}]
    host = inference_service_host_assessment(looks)
    assert (host["healthy"], host["verdict"], host["unit"]) == (False, "unhealthy", "c.service")
    assert [item["healthy"] for item in host["instances"]] == [True, True, False]
    assert inference_service_host_assessment(looks[:2])["healthy"] is True
    assert inference_service_host_assessment(looks[:2])["verdict"] == "slow"


def gpu(index, mib):
    return {"index": index, "uuid": "GPU-%08d-0000-0000-0000-000000000000" % index, "memory_used_mib": mib}


def test_each_instance_row_has_what_the_reset_stopped_killed_and_freed_on_its_own_gpus():
    steps = {"gpu_reset": {"memory_before": [gpu(0, 900), gpu(1, 900), gpu(2, 500), gpu(3, 500)],
                           "targets": [{"pid": 10, "gpus": [2]}, {"pid": 11, "gpus": [3]}, {"pid": 12, "gpus": []},
                                       {"pid": 13, "gpus": [0]}],
                           "killed": [{"pid": 10}, {"pid": 11}, {"pid": 12}], "elapsed_s": 1},
             "nvml_verify": {"gpus": [gpu(0, 900), gpu(1, 900), gpu(2, 0), gpu(3, 0)], "count": 4}}
    rows = [host_row("node1", {"status": "ok", "ok": True, "steps": steps, "killed_count": 3})]
    service = inference_service_host_result(
        [instance("a.service", gpus=(0, 1)),
         instance("b.service", gpus=("GPU-00000002-0000-0000-0000-000000000000", 3), reset=True)], host="node1")
    rows = with_instance_rows(merge_rows(rows, [inference_service_report_row(service)]))
    a, b = rows[0]["instances"]
    assert (a["unit"], a["stopped"], a["killed"], a["mib_freed"]) == ("a.service", False, 0, 0)
    # GPU 2 by its UUID, GPU 3 by index: 1000 MiB; the two workers, not the API server that held no GPU.
    assert (b["unit"], b["stopped"], b["killed"], b["mib_freed"]) == ("b.service", True, 2, 1000)
    assert rows[0]["killed"] == 3 and rows[0]["service_status"] == "ready"
    text = render_markdown("reset_and_serve", "s", rows)
    assert "| node1 | b.service | GPU-00000002-0000-0000-0000-000000000000,3 | ready | yes | 1000 | 1.5 | 70% |" in text
    assert "| node1 | a.service | 0,1 | ready | no | 0 | - | 70% |" in text
    # A read-only run names the column for what it would do.
    assert "| would reset |" in render_markdown("reset_and_serve", "s", rows, read_only=True)


def test_a_host_with_one_server_has_no_instance_rows():
    rows = [host_row("node1", {"status": "ok", "ok": True, "steps": {}})]
    rows = with_instance_rows(merge_rows(rows, [inference_service_report_row(instance("a.service"))]))
    assert "instances" not in rows[0]
    assert "| unit |" not in render_markdown("reset_and_serve", "s", rows)


def test_the_host_row_is_not_ok_when_an_instance_does_not_serve():
    service = inference_service_host_result([instance("a.service"), instance("b.service", "failed", (2,))], host="node1")
    row = inference_service_report_row(service)
    assert not row["ok"] and row["service_status"] == "failed"
    assert row["problems"] == ["b.service: service failed: b.service went wrong"]
    assert [item["ok"] for item in row["instances"]] == [True, False]
