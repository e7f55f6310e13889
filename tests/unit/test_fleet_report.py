"""The fleet report's Markdown, as an operator reads it after a run."""
from __future__ import annotations

import json
import os
import stat

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import (VARIABLE_OF, check_args, host_row, merge_rows,
                                                                            read_reports, render_markdown,
                                                                            write_atomically)
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_text import count_of, human_bytes


def row(host, ok=True, status="ok", **values):
    base = {"host": host, "ok": ok, "status": status, "killed": 0, "mib_freed": 0, "shm_bytes_freed": 0,
            "bytecode_removed": 0, "seconds": 0.0, "problems": []}
    base.update(values)
    return base


def test_sizes_read_like_df():
    assert human_bytes(0) == "0 Bytes"
    assert human_bytes(512) == "512 Bytes"
    assert human_bytes(1052672) == "1.0 MiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"


def test_one_row_per_host_then_the_hosts_that_are_not_ok_with_why():
    text = render_markdown("reset", "20261129T101500Z", [
        row("node1", killed=9, mib_freed=565000, shm_bytes_freed=1052672, bytecode_removed=1, seconds=4.25),
        row("node2", ok=False, status="unreachable"),
        row("node3", ok=False, status="failed", problems=["GPU 3: 1200 MiB used", "pid 77 (D state)"]),
    ])
    lines = text.splitlines()
    assert lines[0] == "# Fleet reset report 20261129T101500Z"
    assert "| node1 | ok | 9 | 565000 | 1.0 MiB | 1 | 4.2 |" in lines
    assert "| node2 | unreachable | 0 | 0 | 0 Bytes | 0 | 0.0 |" in lines
    assert "3 hosts, 2 not ok." in lines
    assert lines[lines.index("- node2 (unreachable):") + 1] == "  - no details"
    # One problem per line, each once.
    at = lines.index("- node3 (failed):")
    assert lines[at + 1:at + 3] == ["  - GPU 3: 1200 MiB used", "  - pid 77 (D state)"]
    assert text.count("GPU 3: 1200 MiB used") == 1


def test_every_count_says_its_noun_in_the_right_number():
    assert "1 host, 0 not ok." in render_markdown("verify", "T", [row("node1")]).splitlines()
    assert [count_of(n, "process") for n in (0, 1, 2)] == ["0 processes", "1 process", "2 processes"]
    assert [count_of(n, "GPU") for n in (1, 8)] == ["1 GPU", "8 GPUs"]
    assert count_of(1, "bytecode file") == "1 bytecode file"


@pytest.mark.parametrize("bad", [None, "", "many", float("nan"), float("inf"), -5, [1]])
def test_a_size_that_is_no_size_reads_as_zero(bad):
    assert human_bytes(bad) == "0 Bytes"


def test_a_problem_with_a_newline_stays_on_its_own_line():
    lines = render_markdown("reset", "T", [row("n", ok=False, status="dirty", problems=["a\nb|c"])]).splitlines()
    assert lines[-1] == "  - a b\\|c"


def test_an_empty_fleet_still_gives_a_table():
    lines = render_markdown("verify", "T", []).splitlines()
    assert lines[2].startswith("| host | status |")
    assert "0 hosts, 0 not ok." in lines


# ----- the rows, computed from node_reset_result -----

def gpu(index, uuid, mib):
    return {"index": index, "uuid": uuid, "memory_used_mib": mib, "problems": []}


def result(before, after, count=None, **values):
    base = {"status": "dirty", "ok": False, "changed": True, "killed_count": 3, "shm_bytes_freed": 10,
            "bytecode_removed": 1, "seconds_total": 4.5, "problems": [],
            "steps": {"gpu_reset": {"changed": True, "memory_before": before, "elapsed_s": 3.0},
                      "shm_clean": {"changed": True},
                      "pycache_purge": {"skipped": True},
                      "nvml_verify": {"gpus": after, "count": len(after) if count is None else count, "waited_s": 1.0}}}
    base.update(values)
    return base


def test_mib_freed_follows_each_gpu_by_uuid_when_one_falls_off_the_bus():
    """GPU 0 is gone after the reset and NVML renumbers the others: GPU 1 is now index 0. Each
    GPU's reading is subtracted from its own, and the lost one is named, by its old index."""
    before = [gpu(0, "GPU-a", 90000), gpu(1, "GPU-b", 80000), gpu(2, "GPU-c", 70000)]
    after = [gpu(0, "GPU-b", 0), gpu(1, "GPU-c", 5)]
    row = host_row("node1", result(before, after))
    assert row["mib_freed_per_gpu"] == {"1": 80000, "2": 69995}
    assert row["mib_freed"] == 149995
    assert row["gpus_lost"] == [{"index": 0, "uuid": "GPU-a"}]
    assert "GPU 0 (GPU-a) is lost: NVML read it before the reset and cannot read it now." in row["problems"]
    assert row["seconds_per_step"] == {"gpu_reset": 3.0, "nvml_verify": 1.0}
    # The host's own time: its steps' sum, not the controller's 4.5 s (seconds_total); the skipped
    # pycache_purge has no seconds.
    assert row["seconds"] == 4.0


def test_a_gpu_nvml_counts_but_cannot_read_has_no_figure_and_keeps_nvmls_sentence():
    before = [gpu(0, "GPU-a", 90000), gpu(1, "GPU-b", 80000)]
    after = [{"index": 0, "uuid": None, "memory_used_mib": None, "problems": ["GPU 0 is lost (NVML: GPU is lost)"]},
             gpu(1, "GPU-b", 0)]
    row = host_row("node1", result(before, after, problems=["GPU 0 is lost (NVML: GPU is lost)"]))
    assert row["mib_freed_per_gpu"] == {"1": 80000}
    assert row["gpus_lost"] == [{"index": 0, "uuid": "GPU-a"}]  # named by the reading before
    assert row["problems"] == ["GPU 0 is lost (NVML: GPU is lost)"]  # not said twice


def test_a_check_of_some_gpus_does_not_call_the_others_lost():
    before = [gpu(0, "GPU-a", 90000), gpu(1, "GPU-b", 80000)]
    row = host_row("node1", result(before, [gpu(1, "GPU-b", 0)], count=2))
    assert row["gpus_lost"] == [] and row["mib_freed_per_gpu"] == {"1": 80000}


def test_memory_never_grows_into_a_negative_figure_and_strings_count():
    row = host_row("node1", result([gpu(0, "GPU-a", "100")], [gpu(0, "GPU-a", 300)], killed_count="2"))
    assert row["mib_freed_per_gpu"] == {"0": 0} and row["killed"] == 2


def test_a_host_without_a_result_is_not_run_with_why_and_a_failed_step_keeps_its_error():
    assert host_row("node9", None, "stopped")["status"] == "not run"
    assert host_row("node9", None, "stopped")["problems"] == ["stopped"]
    row = host_row("node1", result([], [], status="failed at shm_clean", failed_step="shm_clean", error="refused"))
    assert row["failed_step"] == "shm_clean" and row["problems"] == ["refused"] and row["changed"]


def test_added_rows_add_keys_append_problems_and_can_only_make_a_host_worse():
    rows = [host_row("node1", result([], [], status="ok", ok=True)), host_row("node2", None)]
    merge_rows(rows, [{"host": "node1", "service": "ready", "ok": False, "problems": ["no /health"]},
                      {"host": "node3", "service": "down"}])
    by_host = {row["host"]: row for row in rows}
    assert by_host["node1"]["service"] == "ready" and not by_host["node1"]["ok"]
    # The reset's own verdict stays: the playbook that added the row decides what its ok means.
    assert by_host["node1"]["reset_ok"] and not by_host["node2"]["reset_ok"]
    assert by_host["node1"]["problems"] == ["no /health"]
    assert by_host["node3"] == {"host": "node3", "service": "down"}
    text = render_markdown("reset_and_serve", "T", rows, [{"key": "service", "title": "service"}])
    assert "| host | status | killed | MiB freed | shm freed | bytecode removed | seconds | service |" in text
    assert "| node1 | ok | 3 | 0 | 10 Bytes | 1 | 4.0 | ready |" in text
    assert "- node1 (ok):\n  - no /health\n" in text


# ----- merging the reports of slices -----

def write_report(path, kind, stamp, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": kind, "time": stamp, "hosts": rows}))
    return path


def test_slices_merge_into_one_report_and_a_slice_run_again_replaces_its_rows(tmp_path):
    write_report(tmp_path / "slice1" / "reset-20261129T101500Z.json", "reset", "20261129T101500Z",
                 [row("node1", ok=False, status="dirty"), row("node2")])
    write_report(tmp_path / "slice2" / "reset-20261129T101502Z.json", "reset", "20261129T101502Z", [row("node3")])
    # slice 1 again, later: its row for node1 wins wherever its file sorts.
    write_report(tmp_path / "again" / "reset-20261129T103000Z.json", "reset", "20261129T103000Z", [row("node1")])
    rows, files = read_reports([str(tmp_path / "*" / "reset-*.json")], "reset")
    assert [(r["host"], r["status"]) for r in rows] == [("node2", "ok"), ("node3", "ok"), ("node1", "ok")]
    assert files == sorted(str(p) for p in tmp_path.glob("*/reset-*.json"))


def test_a_merge_refuses_what_is_not_a_report_of_its_kind_with_one_sentence_each(tmp_path):
    verify = write_report(tmp_path / "verify-T.json", "verify", "T", [row("node1")])
    broken = tmp_path / "reset-broken.json"
    broken.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kind": "reset", "hosts": [{"status": "ok"}]}))
    with pytest.raises(AnsibleActionFail) as failure:
        read_reports([str(verify), str(broken), str(other), str(tmp_path / "none-*.json")], "reset")
    message = str(failure.value)
    assert "none-*.json matches no file" in message
    assert "cannot read the report %s" % broken in message
    assert "%s is not a fleet report" % other in message
    assert "%s is a verify report, not reset" % verify in message


def test_nothing_to_merge_is_no_row():
    assert read_reports([], "reset") == ([], [])


def test_a_report_file_is_readable_by_its_writer_alone_whatever_the_umask(tmp_path):
    """Reports carry engine journal lines and problems: never world- or group-readable."""
    old = os.umask(0)
    try:
        path = tmp_path / "reset-20261201T000000Z.json"
        write_atomically(str(path), "{}\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        # Written again over an older, world-readable one: the new file is the writer's alone too.
        path.chmod(0o644)
        write_atomically(str(path), "{\"again\": true}\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "again" in path.read_text()
    finally:
        os.umask(old)


def test_a_link_planted_at_the_partial_name_is_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "reset-20261201T000000Z.md"
    (tmp_path / "reset-20261201T000000Z.md.partial").symlink_to(victim)
    write_atomically(str(path), "report\n")
    assert victim.read_text() == "keep" and path.read_text() == "report\n"


def test_another_runs_report_being_written_is_left_alone(tmp_path):
    """Heals run at once: a run that removed the other's half-written file would have that run rename
    this one's unfinished file over the report, which a reader then finds empty."""
    path = tmp_path / "reset_and_serve-20261201T000000Z.json"
    other = tmp_path / "reset_and_serve-20261201T000000Z.json.partial"
    other.write_text("{\"other run\": ")
    write_atomically(str(path), "{}\n")
    assert other.read_text() == "{\"other run\": " and path.read_text() == "{}\n"


# ----- issue 24: the figures, problems and verdict an operator reads, each on its own -----

def uuid(n):
    return "GPU-%08x-0000-4000-8000-%012x" % (n, n)


def test_mib_freed_counts_from_the_reading_before_the_unit_stopped():
    """With a unit, NVML is read before the stop (nvml_before); gpu_reset's own reading comes after
    the stop, when the server's memory is already gone: the report counts from the first."""
    steps = {"nvml_before": {"gpus": [gpu(0, "GPU-a", 132000)]},
             "gpu_reset": {"changed": True, "memory_before": [gpu(0, "GPU-a", 500)], "elapsed_s": 1.0},
             "nvml_verify": {"gpus": [gpu(0, "GPU-a", 0)], "count": 1, "waited_s": 0.1}}
    row = host_row("node1", {"status": "ok", "ok": True, "steps": steps})
    assert row["mib_freed_per_gpu"] == {"0": 132000} and row["mib_freed"] == 132000


def test_a_lost_gpu_is_named_even_when_another_gpu_with_a_longer_number_is_lost_too():
    """GPU 1 fell off the bus (the others renumbered), and NVML cannot read the card now at index
    10: nvml_verify names that one; the report names GPU 1 itself. "GPU 10 ..." is no sentence about
    GPU 1, and a sentence that some GPU is lost is no sentence about this one."""
    before = [gpu(i, uuid(i), 1000) for i in range(12)]
    after = [gpu(i, uuid(i if i < 1 else i + 1), 0) for i in range(11)]
    after[10] = {"index": 10, "uuid": None, "memory_used_mib": None, "problems": []}
    said = "GPU 10 (%s, 0000:9a:00.0): lost (NVML: GPU is lost)" % uuid(11)
    row = host_row("node1", result(before, after, problems=[said]))
    assert {"index": 1, "uuid": uuid(1)} in row["gpus_lost"]
    assert "GPU 1 (%s) is lost: NVML read it before the reset and cannot read it now." % uuid(1) in row["problems"]
    assert row["problems"].count(said) == 1


def test_a_gpu_that_nvml_reads_with_nothing_used_is_not_lost():
    row = host_row("node1", result([gpu(0, "GPU-a", 80000), gpu(1, "GPU-b", 0)],
                                   [gpu(0, "GPU-a", 0), gpu(1, "GPU-b", 0)]))
    assert row["gpus_lost"] == [] and row["mib_freed_per_gpu"] == {"0": 80000, "1": 0}


def test_every_step_that_ran_counts_in_the_hosts_seconds():
    steps = result([], [])["steps"]
    steps["pycache_purge"] = {"changed": True, "removed": [], "elapsed_s": 2.5}
    row = host_row("node1", dict(result([], []), steps=steps))
    assert row["seconds_per_step"] == {"gpu_reset": 3.0, "pycache_purge": 2.5, "nvml_verify": 1.0}
    assert row["seconds"] == 6.5


def test_a_result_without_a_status_is_shown_failed_never_ok():
    row = host_row("node1", {"problems": ["the role stopped early"]})
    assert row["status"] == "failed" and not row["ok"]
    assert "- node1 (failed):" in render_markdown("reset", "T", [row]).splitlines()


def test_the_failed_steps_message_is_listed_once_beside_the_other_problems():
    failed = result([], [], status="failed at nvml_verify", failed_step="nvml_verify",
                    problems=["GPU 0 (GPU-a): 9000 MiB used"], error="NVML call timed out after 5 s")
    assert host_row("node1", failed)["problems"] == ["GPU 0 (GPU-a): 9000 MiB used", "NVML call timed out after 5 s"]
    said = result([], [], status="failed at shm_clean", failed_step="shm_clean", problems=["EROFS"], error="EROFS")
    assert host_row("node1", said)["problems"] == ["EROFS"]


def test_a_service_row_that_is_ok_never_makes_a_failed_reset_ok():
    rows = [host_row("node1", result([], [], status="failed at gpu_reset", ok=False, problems=["pid 7 in D state"]))]
    merge_rows(rows, [{"host": "node1", "ok": True, "service_status": "ready", "problems": []}])
    assert rows[0]["ok"] is False and rows[0]["problems"] == ["pid 7 in D state"]
    text = render_markdown("reset_and_serve", "T", rows)
    assert "1 host, 1 not ok." in text and "- node1 (failed at gpu_reset):\n  - pid 7 in D state\n" in text


def test_a_merge_with_one_bad_report_among_good_ones_writes_nothing(tmp_path):
    """A report silently missing the hosts of the bad slice would read as a smaller fleet."""
    good = write_report(tmp_path / "reset-A.json", "reset", "A", [row("node1")])
    verify = write_report(tmp_path / "verify-B.json", "verify", "B", [row("node2")])
    with pytest.raises(AnsibleActionFail, match="is a verify report, not reset"):
        read_reports([str(good), str(verify)], "reset")


def test_a_verify_report_shows_the_memory_in_use_per_host():
    rows = [row("node1", ok=False, status="dirty", mib_used={"0": 500, "1": 300}, mib_freed=0)]
    lines = render_markdown("verify", "T", rows, read_only=True).splitlines()
    assert lines[2] == "| host | status | would stop | MiB used | shm would remove | bytecode would remove | seconds |"
    assert "| node1 | dirty | 0 | 800 | 0 Bytes | 0 | 0.0 |" in lines


def test_a_report_started_by_an_alert_says_which_under_its_title():
    trigger = {"by": "cleanslate.gpu.heal", "alertname": "CleanslateGpuEngineDown", "fingerprint": "ab|12\nx", "starts_at": ""}
    lines = render_markdown("reset_and_serve", "S", [], trigger=trigger).splitlines()
    # One line, whatever the alert carried: a | or a newline cannot break the table below it.
    assert lines[2] == "Triggered by cleanslate.gpu.heal: alertname CleanslateGpuEngineDown, fingerprint ab\\|12 x."
    assert lines[4].startswith("| host | status |")
    assert "Triggered" not in render_markdown("reset", "S", [])


def shm_result(**shm):
    """node_reset_result of a reset whose shm_clean answered `shm`, its other steps done and clean."""
    return {"status": "ok", "ok": True, "changed": True, "killed_count": 1, "shm_bytes_freed": 0,
            "steps": {"shm_clean": dict({"changed": False, "removed": [], "in_use": [], "kept": [], "bytes_freed": 0},
                                        **shm)}}


HELD = {"path": "/dev/shm/psm_3f2a9c1e", "pids": [4242], "holders": [{"pid": 4242, "name": "VLLM::EngineCor"}],
        "bytes": 262144000, "size": 262144000, "area": "shm"}


def test_a_segment_kept_in_use_is_in_the_row_and_the_markdown_with_its_size_and_holder():
    """Issue 37: "freed 0 bytes" beside a 250 MiB psm_ an orphaned engine core maps, and nothing said who."""
    result = host_row("node1", shm_result(in_use=[HELD, dict(HELD, path="/tmp/3f0c5d7e", area="tmp")]))
    assert result["shm_in_use"] == [{"path": "/dev/shm/psm_3f2a9c1e", "bytes": 262144000, "size": 262144000,
                                     "holders": [{"pid": 4242, "name": "VLLM::EngineCor"}]}]
    markdown = render_markdown("reset", "T", [result])
    assert "- node1: /dev/shm/psm_3f2a9c1e, 250.0 MiB, held by pid 4242 (VLLM::EngineCor)" in markdown.splitlines()
    # A result from before the names: the pids alone, never a missing segment.
    older = host_row("node1", shm_result(in_use=[{"path": "/dev/shm/psm_1", "pids": [7]}]))
    assert older["shm_in_use"][0]["holders"] == [{"pid": 7, "name": "?"}]
    assert "Kept in use" not in render_markdown("reset", "T", [host_row("node1", shm_result())])


def test_the_tmp_leftovers_removed_and_kept_with_why_are_in_the_row_and_the_markdown():
    result = host_row("node1", shm_result(
        removed=[{"path": "/tmp/0d9e8f7a", "bytes": 0, "area": "tmp"}, {"path": "/dev/shm/nccl-1", "bytes": 4096}],
        in_use=[dict(HELD, path="/tmp/3f0c5d7e", area="tmp", holders=[{"pid": 9, "name": "python3"}])],
        kept=[{"path": "/tmp/5a6b7c8d", "why": "owned by uid 65534 (nobody), neither root nor a user of tmp_owners",
               "area": "tmp"}, {"path": "/dev/shm/nccl-dir", "why": "a directory", "area": "shm"}]))
    assert result["tmp_leftovers"] == [
        {"path": "/tmp/0d9e8f7a", "done": "removed", "why": "no live process held it (nor bound it)"},
        {"path": "/tmp/3f0c5d7e", "done": "kept", "why": "in use: pid 9 (python3)"},
        {"path": "/tmp/5a6b7c8d", "done": "kept", "why": "owned by uid 65534 (nobody), neither root nor a user of tmp_owners"}]
    lines = render_markdown("reset", "T", [result]).splitlines()
    at = lines.index("- node1: 1 removed, 2 kept")
    assert lines[at + 1:at + 3] == ["  - kept /tmp/3f0c5d7e: in use: pid 9 (python3)",
                                    "  - kept /tmp/5a6b7c8d: owned by uid 65534 (nobody), neither root nor a user of tmp_owners"]
    checked = host_row("node1", shm_result(removed=[{"path": "/tmp/0d9e8f7a", "area": "tmp"}]), read_only=True)
    assert checked["tmp_leftovers"][0]["done"] == "would remove"
    assert "- node1: 1 would be removed, 0 kept" in render_markdown("verify", "T", [checked], read_only=True)


@pytest.mark.parametrize("option, value", [
    ("dest", " " * 100000),                 # a 100 KB blank path was printed whole
    ("dest", "reports\0\n{{ x }}" * 1000),
    ("kind", "Reset\nreport" * 1000),
])
def test_a_bad_option_is_one_short_line_naming_the_playbooks_variable(option, value):
    """merge_reports.yml's first task: a bad fleet_report_path or fleet_report_kind is said on one line,
    cut, naming the variable the user set (not only the module's option)."""
    args = {"dest": "reports", "kind": "reset", "stamp": None, "columns": [], option: value}
    with pytest.raises(AnsibleActionFail) as caught:
        check_args(args)
    sentence = str(caught.value.message)
    assert sentence.startswith(option + " ") and "(the playbooks' %s)" % VARIABLE_OF[option] in sentence
    assert "\n" not in sentence and "\0" not in sentence and len(sentence) < 400, sentence[:500]
