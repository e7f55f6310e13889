"""What a real reset's report says it stopped and removed, each with why, and how it stays bounded."""
from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import host_row, render_markdown
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_details import CMDLINE_CHARS, MAX_LISTED


def target(pid, **values):
    return dict({"pid": pid, "name": "VLLM::Worker_TP", "cmdline": "python -m vllm.worker --rank %d" % pid,
                 "gpus": [pid % 8], "reason": "device", "evidence": "maps GPU %d, with nvidia-uvm" % (pid % 8)}, **values)


def reset_result(targets, killed, shm=None, shm_before=None):
    steps = {"gpu_reset": {"targets": targets, "killed": killed, "elapsed_s": 1.0},
             "shm_clean": dict({"removed": [], "in_use": [], "kept": [], "bytes_freed": 0}, **(shm or {}))}
    if shm_before is not None:
        steps["shm_before"] = {"in_use": shm_before}
    return {"status": "ok", "ok": True, "changed": True, "killed_count": len(killed), "steps": steps}


def test_each_process_stopped_with_its_gpus_the_signal_that_ended_it_and_why():
    api = target(10, name="vllm", gpus=[], reason="cmdline", evidence="command line matches 'vllm serve'",
                 cmdline="vllm serve m --api-key ********")
    row = host_row("node1", reset_result([api, target(11), target(12)], [
        {"pid": 10, "name": "vllm", "signal": "SIGTERM", "seconds": 0.01},
        {"pid": 12, "name": "VLLM::Worker_TP", "signal": "SIGKILL", "seconds": 3.2}]))
    # Only the targets that went are stopped (11 was a target that never ended: a survivor).
    assert row["stopped"] == [
        {"pid": 10, "name": "vllm", "cmdline": "vllm serve m --api-key ********", "gpus": [],
         "reason": "command line matches 'vllm serve'", "signal": "SIGTERM", "seconds": 0.01},
        {"pid": 12, "name": "VLLM::Worker_TP", "cmdline": "python -m vllm.worker --rank 12", "gpus": [4],
         "reason": "maps GPU 4, with nvidia-uvm", "signal": "SIGKILL", "seconds": 3.2}]
    assert row["stopped_left_out"] == 0 and "would_stop" not in row
    lines = render_markdown("reset", "T", [row]).splitlines()
    at = lines.index("Stopped:")
    assert lines[at + 1:at + 4] == [
        "- node1:",
        "  - pid 10 vllm (SIGTERM, GPU none; command line matches 'vllm serve'): vllm serve m --api-key ********",
        "  - pid 12 VLLM::Worker_TP (SIGKILL, GPU 4; maps GPU 4, with nvidia-uvm): python -m vllm.worker --rank 12"]


def test_thousands_of_processes_and_a_long_command_line_stay_bounded_and_say_what_was_left_out():
    count = MAX_LISTED + 1234
    long_line = "python " + "x" * (CMDLINE_CHARS * 3)
    row = host_row("node1", reset_result([target(pid, cmdline=long_line) for pid in range(count)],
                                         [{"pid": pid, "signal": "SIGTERM", "seconds": 0.1} for pid in range(count)]))
    assert len(row["stopped"]) == MAX_LISTED and row["stopped_left_out"] == 1234
    assert row["stopped"][0]["cmdline"] == long_line[:CMDLINE_CHARS] + "... (%d more characters)" % (
        len(long_line) - CMDLINE_CHARS)
    markdown = render_markdown("reset", "T", [row])
    assert "  - and 1234 more processes, not listed" in markdown.splitlines()
    assert max(len(line) for line in markdown.splitlines()) < 400


def test_a_segment_removed_because_the_reset_stopped_its_holder_says_so_and_one_nobody_held_too():
    """The check said 11 segments, the reset removed 12: the twelfth was held by a worker the reset stopped."""
    worker = {"path": "/dev/shm/torch_12_1_0", "pids": [12], "holders": [{"pid": 12, "name": "VLLM::Worker_TP"}],
              "area": "shm"}
    mapper = {"path": "/dev/shm/psm_1", "pids": [77], "holders": [{"pid": 77, "name": "shm-mapper"}], "area": "shm"}
    # A segment held by a stopped worker and by a process left running is no segment the reset freed.
    shared = {"path": "/dev/shm/nccl-2", "pids": [12, 77], "holders": [{"pid": 12, "name": "VLLM::Worker_TP"},
                                                                       {"pid": 77, "name": "shm-mapper"}], "area": "shm"}
    removed = [{"path": path, "bytes": 4096, "area": "shm"} for path in ("/dev/shm/torch_12_1_0", "/dev/shm/nccl-1",
                                                                         "/dev/shm/nccl-2")]
    row = host_row("node1", reset_result(
        [target(12)], [{"pid": 12, "signal": "SIGTERM", "seconds": 0.1}],
        shm={"removed": removed, "in_use": [mapper],
             "kept": [{"path": "/dev/shm/nccl-dir", "why": "a directory; directories are never removed"}]},
        shm_before=[worker, mapper, shared]))
    assert row["shm_leftovers"] == [
        {"path": "/dev/shm/torch_12_1_0", "done": "removed",
         "why": "held only by pid 12 (VLLM::Worker_TP), which the reset stopped"},
        {"path": "/dev/shm/nccl-1", "done": "removed", "why": "no live process held it"},
        {"path": "/dev/shm/nccl-2", "done": "removed", "why": "no live process held it"},
        {"path": "/dev/shm/psm_1", "done": "kept", "why": "in use: pid 77 (shm-mapper)"},
        {"path": "/dev/shm/nccl-dir", "done": "kept", "why": "a directory; directories are never removed"}]
    lines = render_markdown("reset", "T", [row]).splitlines()
    at = lines.index("- node1: 3 removed, 2 kept")
    assert lines[at + 1:at + 3] == [
        "  - kept /dev/shm/nccl-dir: a directory; directories are never removed",
        "  - removed /dev/shm/torch_12_1_0: held only by pid 12 (VLLM::Worker_TP), which the reset stopped"]


def test_a_check_says_which_segment_in_use_the_reset_removes():
    held = {"path": "/dev/shm/torch_12_1_0", "pids": [12], "holders": [{"pid": 12, "name": "VLLM::Worker_TP"}]}
    mapper = {"path": "/dev/shm/psm_1", "pids": [77], "holders": [{"pid": 77, "name": "shm-mapper"}]}
    row = host_row("node1", reset_result([target(12)], [], shm={"removed": [{"path": "/dev/shm/nccl-1"}],
                                                                "in_use": [held, mapper]}), read_only=True)
    assert row["shm_leftovers"] == [
        {"path": "/dev/shm/nccl-1", "done": "would remove", "why": "no live process held it"},
        {"path": "/dev/shm/torch_12_1_0", "done": "kept",
         "why": "in use: pid 12 (VLLM::Worker_TP), which a reset stops: the reset removes it"},
        {"path": "/dev/shm/psm_1", "done": "kept", "why": "in use: pid 77 (shm-mapper)"}]
    markdown = render_markdown("reset", "T", [row], read_only=True).splitlines()
    assert "  - kept /dev/shm/torch_12_1_0: in use: pid 12 (VLLM::Worker_TP), which a reset stops: the reset removes it" \
        in markdown
    assert not any(line.startswith("  - kept /dev/shm/psm_1") for line in markdown)  # in "Kept in use" already


def test_a_segment_removed_in_use_as_remove_in_use_asks_is_listed_once_as_removed():
    held = {"path": "/dev/shm/psm_1", "pids": [77], "holders": [{"pid": 77, "name": "shm-mapper"}]}
    row = host_row("node1", reset_result([], [], shm={"removed": [{"path": "/dev/shm/psm_1"}], "in_use": [held]}))
    assert row["shm_leftovers"] == [{"path": "/dev/shm/psm_1", "done": "removed",
                                     "why": "in use: pid 77 (shm-mapper); removed as remove_in_use asks"}]
