"""cleanslate.gpu.inference_files with `instances`: the files of a node's several servers (those a run
reset) written and their units started in one module run. What a user would notice: one server that
cannot be written loses the others nothing, no server's file is written for another, the cleanup
program they share is written once, systemd reloads its units once for the task and every unit is
started after every file, and no secret's text is returned or logged."""
from __future__ import annotations

import json

from tests.functional.fake_systemd import FakeSystemd, unit
from tests.functional.test_inference_files import MARKER, UNIT_TEXT
from tests.run_module import run_module


def server(root, name, secret, prepare_start=False, **unit_extra):
    """One server's options, its files under `root`; the programs are the same for each server."""
    return {"unit": dict({"path": str(root / "system" / f"vllm-{name}.service"), "content": UNIT_TEXT.replace("llama", name),
                          "marker": MARKER, "prepare_start": prepare_start, "start": prepare_start}, **unit_extra),
            "secret_files": [{"path": str(root / "inference" / f"vllm-{name}.env"), "content": secret}],
            "programs": {"dir": str(root / "libexec"), "files": {"prestart_clean.py": "print('clean')\n"}}}


def tree(tmp_path):
    for name in ("system", "inference"):
        (tmp_path / name).mkdir()
    return tmp_path


def test_one_refused_server_loses_the_others_nothing_and_a_second_run_changes_nothing(tmp_path):
    root = tree(tmp_path)
    foreign = root / "system" / "vllm-b.service"
    foreign.write_text("[Service]\nExecStart=/usr/bin/someone-elses\n")
    given = [server(root, name, f'KEY="sk-{name}-canary"\n') for name in "abc"]
    first = run_module("inference_files", {"instances": given})
    assert first["rc"] == 0 and first["changed"], first
    a, b, c = first["instances"]
    assert b == {"failed": True, "msg": "instances[1]: %s exists and was not written by this role (its first line is "
                 "not the marker): it is not overwritten; set inference_service_adopt_unit: true to take it over (the "
                 "old file is kept as a backup beside it)" % foreign}, b
    assert foreign.read_text() == "[Service]\nExecStart=/usr/bin/someone-elses\n"
    assert not (root / "inference" / "vllm-b.env").exists()  # nothing of the refused server is written
    for name, answer in (("a", a), ("c", c)):
        assert answer["changed"] and answer["unit"]["action"] == "created", answer
        assert (root / "system" / f"vllm-{name}.service").read_text() == UNIT_TEXT.replace("llama", name)
        assert (root / "inference" / f"vllm-{name}.env").read_text() == f'KEY="sk-{name}-canary"\n'
    # The program they share is written once, and reported by the first server that names it.
    assert [item["action"] for item in a["programs"]] == ["made", "created"] and c["programs"] == [], (a, c)
    assert "unit" not in first and "secret_files" not in first  # no server of its own
    assert "canary" not in json.dumps(first)
    again = run_module("inference_files", {"instances": [given[0], given[2]]})
    assert again["rc"] == 0 and not again["changed"], again
    assert [answer["changed"] for answer in again["instances"]] == [False, False]


def test_no_server_writes_a_file_another_server_of_the_task_writes(tmp_path):
    """Two servers that name one secret file would have the second's key overwrite the first's; two
    programs of one path must be the same text."""
    root = tree(tmp_path)
    same_env = server(root, "b", 'KEY="b"\n')
    same_env["secret_files"][0]["path"] = str(root / "inference" / "vllm-a.env")
    other_program = server(root, "c", 'KEY="c"\n')
    other_program["programs"]["files"]["prestart_clean.py"] = "print('another')\n"
    result = run_module("inference_files", {"instances": [server(root, "a", 'KEY="a"\n'), same_env, other_program]})
    assert result["rc"] == 0, result
    assert [answer.get("msg") for answer in result["instances"]] == [
        None, "instances[1]: %s is written for another server of this task too" % (root / "inference" / "vllm-a.env"),
        "instances[2]: %s is written for another server of this task too" % (root / "libexec" / "prestart_clean.py")]
    assert (root / "inference" / "vllm-a.env").read_text() == 'KEY="a"\n'
    assert (root / "libexec" / "prestart_clean.py").read_text() == "print('clean')\n"
    assert not (root / "system" / "vllm-c.service").exists()


def test_the_task_s_own_refusal_writes_no_server(tmp_path):
    root = tree(tmp_path)
    own = server(root, "a", 'KEY="a"\n')
    own["unit"]["content"] = "no marker\n"
    result = run_module("inference_files", dict(own, instances=[server(root, "b", 'KEY="b"\n')]))
    assert result["rc"] == 1 and result["msg"].startswith("unit.content for "), result
    assert sorted(path.name for path in root.rglob("*") if path.is_file()) == []


def test_systemd_reloads_once_after_every_file_and_each_stopped_unit_is_started(tmp_path):
    """One daemon-reload for the task (its unit files changed), then each stopped unit is started; a unit
    whose enablement is not as asked is left to the caller's start, in its answer's words."""
    root = tree(tmp_path)
    systemd = FakeSystemd(tmp_path / "systemd", [unit()], by_unit={
        "vllm-a.service": unit(ActiveState="failed", UnitFileState="enabled"),
        "vllm-b.service": unit(ActiveState="inactive", UnitFileState="disabled"),
        "vllm-c.service": unit(ActiveState="inactive", UnitFileState="enabled")})
    given = [server(root, name, 'KEY="x"\n', prepare_start=True) for name in "abc"]
    result = run_module("inference_files", {"instances": given}, env=systemd.env)
    assert result["rc"] == 0, result
    states = [(answer["unit"]["active_state"], answer["unit"]["started"], answer["unit"]["start_left"])
              for answer in result["instances"]]
    assert states == [("failed", True, ""), ("inactive", False, "its unit file is disabled, not enabled"),
                      ("inactive", True, "")], states
    calls = [call["argv"][1:] for call in systemd.calls("systemctl")]
    assert calls[0] == ["daemon-reload"] and calls.count(["daemon-reload"]) == 1, calls
    assert [call[-1] for call in calls if call[0] == "start"] == ["vllm-a.service", "vllm-c.service"], calls


def test_unchanged_files_need_no_reload(tmp_path):
    root = tree(tmp_path)
    given = [server(root, name, 'KEY="x"\n') for name in "ab"]
    assert run_module("inference_files", {"instances": given})["rc"] == 0
    systemd = FakeSystemd(tmp_path / "systemd", [unit(ActiveState="inactive", UnitFileState="enabled")])
    started = [server(root, name, 'KEY="x"\n', prepare_start=True) for name in "ab"]
    result = run_module("inference_files", {"instances": started}, env=systemd.env)
    assert result["rc"] == 0 and [answer["unit"]["started"] for answer in result["instances"]] == [True, True], result
    assert ["daemon-reload"] not in [call["argv"][1:] for call in systemd.calls("systemctl")]


def test_check_mode_writes_and_starts_nothing_and_diff_shows_each_unit(tmp_path):
    root = tree(tmp_path)
    given = [server(root, name, 'KEY="sk-check-canary"\n') for name in "ab"]
    result = run_module("inference_files", {"instances": given}, check=True, diff=True)
    assert result["rc"] == 0 and result["changed"], result
    assert sorted(path.name for path in root.rglob("*") if path.is_file()) == []
    assert [diff["after_header"] for diff in result["diff"]] == [str(root / "system" / f"vllm-{name}.service") for name in "ab"]
    assert "canary" not in json.dumps(result)


def test_neither_unit_nor_a_server_in_instances_is_one_sentence():
    for given in ({"secret_files": []}, {"instances": []}):
        result = run_module("inference_files", given)
        assert result["rc"] == 1, result
        assert result["msg"] == "unit, or at least one server in instances, is required: there is nothing to write"
