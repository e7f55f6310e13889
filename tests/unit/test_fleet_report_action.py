"""The fleet_report action as a playbook runs it (issue 24): the files it writes, their names, a
verify run's columns, a merge with this run's hosts, and the names it refuses."""
from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import ActionModule


def node_result(status="ok", ok=True, targets=0, **values):
    base = {"status": status, "ok": ok, "changed": False, "killed_count": targets, "shm_bytes_freed": 0,
            "bytecode_removed": 0, "problems": [],
            "steps": {"gpu_reset": {"targets": [{"pid": 100 + n, "name": "python3", "cmdline": "vllm serve m",
                                                 "evidence": "maps /dev/nvidia0"} for n in range(targets)],
                                    "killed": [], "elapsed_s": 0.5},
                      "nvml_verify": {"gpus": [{"index": 0, "uuid": "GPU-a", "memory_used_mib": 70000 if targets else 0}],
                                      "count": 1, "waited_s": 0.0}}}
    base.update(values)
    return base


def act(tmp_path, check_mode=False, **args):
    action = ActionModule.__new__(ActionModule)
    action._task = SimpleNamespace(check_mode=check_mode)
    base = {"dest": str(tmp_path / "reports"), "kind": "reset", "stamp": "20261201T000000Z", "hosts": [],
            "rows": [], "columns": [], "not_run": None, "merge": []}
    base.update(args)
    hostvars = {host: {"node_reset_result": result} for host, result in base.pop("results", {}).items()}
    return action.act(base, {"hostvars": hostvars}, {})


def test_a_verify_run_lists_what_a_reset_would_stop_and_the_memory_in_use(tmp_path):
    written = act(tmp_path, kind="verify", hosts=["node1"],
                  results={"node1": node_result("dirty", False, targets=1, kind="verify")})
    row = written["rows"][0]
    assert row["would_stop"] == [{"pid": 100, "name": "python3", "cmdline": "vllm serve m", "gpus": [],
                                  "reason": "maps /dev/nvidia0"}]
    text = "\n".join(written["markdown"])
    assert "| host | status | would stop | MiB used |" in text
    assert "| node1 | dirty | 1 | 70000 |" in text
    assert "A reset would stop:\n- node1:\n  - pid 100 python3 (GPU none; maps /dev/nvidia0): vllm serve m" in text


def test_a_host_in_a_merged_report_and_in_this_run_has_one_row_this_runs(tmp_path):
    old = tmp_path / "old" / "reset-20261130T000000Z.json"
    old.parent.mkdir()
    old.write_text(json.dumps({"kind": "reset", "time": "20261130T000000Z",
                               "hosts": [{"host": "node1", "status": "dirty", "ok": False, "problems": ["old"]},
                                         {"host": "node2", "status": "ok", "ok": True, "problems": []}]}))
    written = act(tmp_path, hosts=["node1"], merge=[str(old)], results={"node1": node_result()})
    assert [(row["host"], row["status"]) for row in written["rows"]] == [("node2", "ok"), ("node1", "ok")]
    document = json.loads(open(written["json_path"], encoding="utf-8").read())
    assert [row["host"] for row in document["hosts"]] == ["node2", "node1"]
    assert document["merged_from"] == [str(old)]
    assert "2 hosts, 0 not ok." in written["markdown"]


def test_a_check_mode_report_is_named_apart_so_a_merge_of_real_reports_never_takes_it(tmp_path):
    written = act(tmp_path, check_mode=True, hosts=["node1"], results={"node1": node_result(targets=1)})
    assert os.path.basename(written["json_path"]) == "reset-check-20261201T000000Z.json"
    assert os.path.basename(written["markdown_path"]) == "reset-check-20261201T000000Z.md"
    assert json.loads(open(written["json_path"], encoding="utf-8").read())["check_mode"] is True
    assert not (tmp_path / "reports" / "reset-20261201T000000Z.json").exists()
    real = act(tmp_path, hosts=["node1"], results={"node1": node_result()}, stamp="20261201T000001Z")
    assert os.path.basename(real["json_path"]) == "reset-20261201T000001Z.json"


def test_both_files_are_the_writers_alone(tmp_path):
    written = act(tmp_path, hosts=["node1"], results={"node1": node_result()})
    for path in (written["json_path"], written["markdown_path"]):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("kind", ["reset/../../etc", "reset/x", "../reset", "reset\n", "Reset", "a" * 33, ""])
def test_a_kind_that_is_not_a_plain_name_is_refused_and_nothing_is_written(tmp_path, kind):
    with pytest.raises(AnsibleActionFail, match="kind"):
        act(tmp_path, kind=kind, hosts=["node1"], results={"node1": node_result()})
    assert not (tmp_path / "reports").exists()
    assert not list(tmp_path.rglob("*.json"))


def test_runs_ending_in_the_same_second_keep_each_its_report(tmp_path, monkeypatch):
    """Heals of two hosts run in parallel (the heal rulebook) and may end in the same second: the
    second report takes the next name instead of replacing the first."""
    monkeypatch.setattr("time.gmtime", lambda *dummy: (2026, 12, 2, 1, 2, 3, 2, 336, 0))
    first = act(tmp_path, stamp=None, hosts=["node1"], results={"node1": node_result()})
    second = act(tmp_path, stamp=None, hosts=["node2"], results={"node2": node_result()})
    assert first["json_path"].endswith("reset-20261202T010203Z.json")
    assert second["json_path"].endswith("reset-20261202T010203Z-2.json")
    assert second["markdown_path"].endswith("reset-20261202T010203Z-2.md")
    assert [row["host"] for row in json.loads(open(first["json_path"], encoding="utf-8").read())["hosts"]] == ["node1"]
    assert [row["host"] for row in json.loads(open(second["json_path"], encoding="utf-8").read())["hosts"]] == ["node2"]
