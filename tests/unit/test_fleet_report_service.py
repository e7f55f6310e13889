"""The fleet report of reset_and_serve, through the report's own code: each host's row keys as
the inference_service role writes them (cleanslate.gpu.inference_service_report_row), the node_reset results reset_and_serve.yml records for a host it does
not reset (healthy, or refused), and the columns reset_and_serve.yml passes to fleet_report.yml,
then fleet_report's host_row, merge_rows and render_markdown, as the action runs them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ansible.parsing.dataloader import DataLoader

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import host_row, merge_rows, render_markdown
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_result import inference_service_report_row

REPO = Path(__file__).resolve().parents[2]
LOADER = DataLoader()
PLAYBOOK = LOADER.load_from_file(str(REPO / "playbooks" / "reset_and_serve.yml"), trusted_as_template=True)
ANSIBLE = Path(sys.executable).with_name("ansible")


def _task(name: str) -> dict:
    """A task of reset_and_serve.yml by its name, wherever it sits (plays, blocks)."""
    def walk(items):
        for item in items or []:
            if item.get("name") == name:
                yield item
            yield from walk(item.get("tasks")) if "tasks" in item else ()
            yield from walk(item.get("block")) if "block" in item else ()
    found = list(walk(PLAYBOOK))
    assert len(found) == 1, name
    return found[0]


def columns() -> list:
    report = [play for play in PLAYBOOK if play.get("ansible.builtin.import_playbook") == "fleet_report.yml"]
    return report[0]["vars"]["fleet_report_columns"]


def service_row(host: str, result: dict) -> dict:
    """inference_service_report_row for a host whose inference_service_result is `result`."""
    return inference_service_report_row(dict(result, host=host))


def recorded_result(task: str, host: str, **variables) -> dict:
    """The node_reset_result that reset_and_serve.yml's set_fact `task` records for `host`, templated
    by Ansible itself: the template calls the collection's filter (cleanslate.gpu.node_reset_result),
    which only Ansible's collection loader finds, as in a run."""
    fact = _task(task)["ansible.builtin.set_fact"]["node_reset_result"]
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    given = dict(variables, ansible_python_interpreter=sys.executable, recorded=str(fact))
    out = subprocess.run([str(ANSIBLE), "localhost", "-c", "local", "-i", "localhost,", "-m", "ansible.builtin.debug",
                          "-a", "var=recorded", "-e", json.dumps(given)], cwd=REPO, env=env, check=True,
                         capture_output=True, text=True).stdout
    # "localhost | SUCCESS => {JSON}"
    return dict(json.loads(out.split("=>", 1)[1])["recorded"], host=host)


def reset_result() -> dict:
    """node_reset_result of a host that node_reset cleaned: 2 workers stopped, 2 GPUs freed."""
    before = [{"index": 0, "uuid": "GPU-0", "memory_used_mib": 132269},
              {"index": 1, "uuid": "GPU-1", "memory_used_mib": 132269}]
    after = [dict(gpu, memory_used_mib=0) for gpu in before]
    return {"status": "ok", "ok": True, "changed": True, "killed_count": 2, "shm_bytes_freed": 131072,
            "bytecode_removed": 0, "seconds_total": 3.5, "problems": [],
            "steps": {"gpu_reset": {"changed": True, "memory_before": before, "elapsed_s": 2.0},
                      "nvml_verify": {"gpus": after, "count": 2, "waited_s": 0.1}}}


def service(status, **values):
    base = {"host": "-", "engine": "vllm", "engine_version": "0.33.0", "status": status, "ok": status != "failed",
            "reason": "", "ready_s": None, "first_completion_ms": None, "acceptance_rate": None}
    base.update(values)
    return base


def report(results: dict, services: dict):
    rows = [host_row(host, result) for host, result in results.items()]
    rows = merge_rows(rows, [service_row(host, result) for host, result in services.items()])
    return {row["host"]: row for row in rows}, render_markdown("reset_and_serve", "T", rows, columns()).splitlines()


def test_the_service_columns_and_each_status_reach_the_report_through_its_rows_and_columns():
    refused = "inference_service_speculative.tensor_parallel_size is refused by vLLM's SpeculativeConfig"
    rows, lines = report(
        {"node1": reset_result(),
         "node2": recorded_result("Record that the healthy host needed no reset", "node2",
                                  inference_service_assessment={"reason": "/health 200"}),
         "node3": reset_result(),
         "node4": reset_result(),
         "node5": recorded_result("Record that the host was refused before anything was touched", "node5",
                                  inference_service_result={"reason": refused}),
         "node6": None},
        {"node1": service("ready", ready_s=412.66, first_completion_ms=842.4, acceptance_rate=0.7132),
         "node2": service("ready", engine="sglang", engine_version="0.5.23", first_completion_ms=301.0,
                          acceptance_rate=0.7),
         "node3": service("degraded", acceptance_rate=0.15, ready_s=2.0, first_completion_ms=40.0,
                          reason="speculative decoding accepts 15% of drafted tokens, below "
                                 "inference_service_min_acceptance_rate 30%"),
         "node4": service("failed", reason="the unit died while loading: CUDA error"),
         "node5": service("failed", engine_version="", stage="validate", reason=refused)})
    assert lines[2] == ("| host | status | killed | MiB freed | shm freed | bytecode removed | seconds | engine | ready s"
                        " | first completion ms | acceptance | service |")
    assert "| node1 | ok | 2 | 264538 | 128.0 KiB | 0 | 2.1 | vllm 0.33.0 | 412.7 | 842 | 71% | ready |" in lines
    # Healthy, left running: no reset, no new readiness time; its completion and acceptance.
    assert "| node2 | ok | 0 | 0 | 0 Bytes | 0 | 0.0 | sglang 0.5.23 | - | 301 | 70% | ready |" in lines
    assert "| node3 | ok | 2 | 264538 | 128.0 KiB | 0 | 2.1 | vllm 0.33.0 | 2.0 | 40 | 15% | degraded |" in lines
    assert "| node4 | ok | 2 | 264538 | 128.0 KiB | 0 | 2.1 | vllm 0.33.0 | - | - | - | failed |" in lines
    assert "| node5 | invalid | 0 | 0 | 0 Bytes | 0 | 0.0 | vllm | - | - | - | failed |" in lines
    assert "6 hosts, 4 not ok." in lines
    assert lines[lines.index("- node3 (ok):") + 1] == (
        "  - service degraded: speculative decoding accepts 15% of drafted tokens, below"
        " inference_service_min_acceptance_rate 30%")
    assert lines[lines.index("- node4 (ok):") + 1] == "  - service failed: the unit died while loading: CUDA error"
    assert lines[lines.index("- node5 (invalid):") + 1:lines.index("- node6 (not run):")] == ["  - " + refused]
    assert lines[-1].startswith("  - no result")
    # The JSON keeps the whole service result beside the columns; ok is and-ed.
    assert rows["node1"]["ok"] and rows["node2"]["ok"]
    assert not rows["node3"]["ok"] and not rows["node4"]["ok"] and not rows["node5"]["ok"]
    assert rows["node5"]["problems"] == [refused] and rows["node5"]["status"] == "invalid"
    assert rows["node1"]["service"]["acceptance_rate"] == 0.7132 and rows["node1"]["service_status"] == "ready"


def test_the_check_mode_row_is_ok_and_says_check():
    rows, lines = report({"node1": reset_result()},
                         {"node1": service("check", ok=True, reason="check mode: would restart")})
    assert rows["node1"]["ok"] and rows["node1"]["problems"] == []
    assert "| node1 | ok | 2 | 264538 | 128.0 KiB | 0 | 2.1 | vllm 0.33.0 | - | - | - | check |" in lines
    assert "1 host, 0 not ok." in lines


def test_a_refused_host_has_one_problem_per_refused_variable():
    # The reason holds one line per refused variable; the report lists each apart.
    result = recorded_result("Record that the host was refused before anything was touched", "node5",
                             inference_service_result={"reason": "inference_service_port is 0: a.\n"
                                                                 "inference_service_model is \"\": b.\n"})
    assert result["problems"] == ["inference_service_port is 0: a.", 'inference_service_model is "": b.']
    assert (result["status"], result["fails_host"]) == ("invalid", True)
