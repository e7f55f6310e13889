"""nvml_verify run as Ansible runs it, against the fake libnvidia-ml loaded by the real pynvml.

Holders are real processes this test starts; the fake NVML counts their memory only while
they live, so killing one is what frees "the GPU". Which GPUs the module touched comes from
the fake's call log (FakeNvml.record_calls), not from timing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES
from tests.run_module import run_module
from tests.sim import procinfo

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def holders():
    """Start real holder processes; kill every one this test started afterwards."""
    started = []

    def start():
        proc = subprocess.Popen(["sleep", "600"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def verify(fake_nvml, check=False, **params):
    return run_module("nvml_verify", params, check=check, env=fake_nvml.env())


def label(fake_nvml, index, physical=None):
    """How the module names a GPU: its index, then its UUID and PCI bus id (the card as created)."""
    gpu = fake_nvml.gpus()[index if physical is None else physical]
    return "GPU %d (%s, %s)" % (index, gpu["uuid"], gpu["pci_bus_id"])


def touched(fake_nvml):
    """The GPUs (as created) that recorded NVML calls named; None stands for system-wide calls."""
    return {row["gpu"] for row in fake_nvml.calls()}


def wait_for_call(fake_nvml, call, gpu, give_up_s=60.0):
    """Block until the module has made `call` on GPU `gpu` (as created)."""
    deadline = time.monotonic() + give_up_s
    while time.monotonic() < deadline:
        if any(row["call"] == call and row["gpu"] == gpu for row in fake_nvml.calls()):
            return
        time.sleep(0.02)
    raise AssertionError("the module never made %s on GPU %d" % (call, gpu))


def test_idle_node_passes_on_v2_memory(fake_nvml):
    result = verify(fake_nvml, expected_count=8)
    assert result["rc"] == 0, result["msg"]
    assert result["ok"] is True and result["changed"] is False
    assert len(result["gpus"]) == 8
    for gpu in result["gpus"]:
        # v1 "used" counts the reserved 615 MiB and would never pass; v2 reads 0.
        assert gpu["memory_used_mib"] == 0
        assert gpu["memory_reserved_mib"] == 615
        assert gpu["memory_used_v1_mib"] == 615
        assert gpu["uuid"] in fake_nvml.uuids
        assert gpu["problems"] == [] and gpu["processes"] == []
    assert result["polls"] == 1
    assert result["driver_version"] == "570.133.20"


@pytest.mark.parametrize("kind", ["compute", "graphics"])
def test_live_holder_fails_with_gpu_pid_and_memory(fake_nvml, holders, kind):
    """A graphics context (an X server, or a CUDA-GL interop buffer) holds memory as a compute
    context does: NVML lists it among the graphics processes, and it is named with its type."""
    holder = holders()
    fake_nvml.register(holder.pid, 2, 4000, kind=kind)
    result = verify(fake_nvml, timeout=0.3)
    assert result["rc"] != 0 and result["ok"] is False and result["changed"] is False
    gpu2 = result["gpus"][2]
    assert gpu2["processes"] == [{"pid": holder.pid, "used_mib": 4000, "type": kind, "exists": True}]
    assert gpu2["memory_used_mib"] == 4000 and gpu2["unattributed_mib"] == 0
    msg = result["msg"]
    assert label(fake_nvml, 2) + ": NVML lists %s process %d (exists here, 4000 MiB)" % (kind, holder.pid) in msg
    assert "4000 MiB of memory used" in msg and "cleanslate.gpu.gpu_reset" in msg
    assert result["polls"] >= 2
    # The other GPUs are clean and not named.
    assert all(not gpu["problems"] for gpu in result["gpus"] if gpu["index"] != 2)
    assert "GPU 3" not in msg


def reads_of(fake_nvml, gpu):
    """How many reads of GPU `gpu` (as created) the module has finished: the retired pages
    status is the last call of a GPU's read, made once per read (a process list takes two
    calls when there is something to list)."""
    return sum(1 for row in fake_nvml.calls()
               if row["call"] == "nvmlDeviceGetRetiredPagesPendingStatus" and row["gpu"] == gpu)


def wait_for_reads(fake_nvml, gpu, count, runner, give_up_s=60.0):
    """Block until the module has read GPU `gpu` `count` times in all, while it is still running."""
    deadline = time.monotonic() + give_up_s
    while reads_of(fake_nvml, gpu) < count:
        assert runner.is_alive(), "the module returned while a GPU was still held"
        assert time.monotonic() < deadline, "the module stopped reading GPU %d" % gpu
        time.sleep(0.02)


def test_passes_when_holder_is_killed_during_the_poll(fake_nvml, holders):
    """Two holders, freed one after the other: the polls that read GPU 7 still held (its graphics
    holder alive, GPU 0 already free) do not pass, and the first poll after the last holder is
    gone does."""
    first, last = holders(), holders()
    fake_nvml.register(first.pid, 0, 70000)
    fake_nvml.register(last.pid, 7, 70000, kind="graphics")
    fake_nvml.record_calls()
    box = {}
    runner = threading.Thread(target=lambda: box.update(verify(fake_nvml, timeout=120, poll_interval=0.05)))
    runner.start()
    try:
        wait_for_reads(fake_nvml, 7, 1, runner)
        first.kill()
        first.wait()
        # Two more complete reads of GPU 7 begin after GPU 0 was freed; GPU 7 is held all along.
        held_reads = reads_of(fake_nvml, 7) + 2
        wait_for_reads(fake_nvml, 7, held_reads, runner)
        assert runner.is_alive() and not box, "the module passed while GPU 7 was held"
        last.kill()
        last.wait()
    finally:
        runner.join(150)
    assert box["rc"] == 0, box["msg"]
    assert box["ok"] is True
    assert box["polls"] >= held_reads + 1  # every read that saw a holder, then the one that saw none
    assert all(gpu["memory_used_mib"] == 0 and gpu["processes"] == [] for gpu in box["gpus"])


def test_memory_stuck_with_no_process_fails_after_timeout(fake_nvml):
    fake_nvml.inject("stuck_memory", gpu=5, mib=2048)
    result = verify(fake_nvml, timeout=1, poll_interval=0.1)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["polls"] >= 2  # memory may still be freed: it polls on until the timeout
    assert "no longer polling" not in result["msg"]
    gpu5 = result["gpus"][5]
    assert gpu5["processes"] == [] and gpu5["unattributed_mib"] == 2048
    assert label(fake_nvml, 5) + ": 2048 MiB of memory used" in result["msg"]
    assert "2048 MiB is memory used with no visible process" in result["msg"]
    assert "nvidia-smi -r -i 5" in result["msg"]


def test_gpu_missing_from_the_enumeration_fails_expected_count(fake_nvml):
    fake_nvml.inject("gpu_removed", gpu=3)
    result = verify(fake_nvml, expected_count=8, timeout=0.2)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["count"] == 7
    assert result["problems"] == ["NVML lists 7 GPUs, 8 expected: a GPU fell off the bus or was not probed when the"
                                  " driver loaded; check dmesg for Xid 79 or 'fallen off the bus', then reboot."]
    # Without the count check the seven that are listed are clean.
    assert verify(fake_nvml, expected_count=8, checks=["memory", "processes"])["ok"] is True


def test_lost_gpu_is_reported_lost_whatever_the_checks(fake_nvml):
    # A GPU that fell off the bus keeps its place in the enumeration and answers GPU_IS_LOST.
    fake_nvml.inject("gpu_lost", gpu=3)
    result = verify(fake_nvml, expected_count=8, checks=["ecc"], timeout=10)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["count"] == 8 and result["problems"] == []
    gpu3 = result["gpus"][3]
    assert (gpu3["index"], gpu3["uuid"], gpu3["pci_bus_id"]) == (3, None, None)  # never answered: unknown
    assert gpu3["problems"] == [
        "GPU 3 (UUID unknown, PCI bus id unknown): lost (NVML: GPU is lost): it fell off the bus or stopped answering"
        " (NVML does not tell a lost GPU's PCI bus id: nvidia-smi prints it); check dmesg for Xid 79, then reboot or"
        " power-cycle the host."]
    assert [gpu["index"] for gpu in result["gpus"] if gpu["problems"]] == [3]
    # Waiting cannot bring it back: the module says so at once instead of polling for 60 s.
    assert result["polls"] == 1
    assert "no longer polling: waiting cannot clear these" in result["msg"]


def test_each_lost_gpu_is_reported_under_its_own_index(fake_nvml):
    """Two GPUs lost at once (a board or NVLink fault): NVML can tell neither's UUID nor bus id,
    and each is still checked and reported on its own."""
    fake_nvml.inject("gpu_lost", gpu=3)
    fake_nvml.inject("gpu_lost", gpu=5)
    result = verify(fake_nvml, expected_count=8, timeout=10)
    assert result["rc"] != 0 and result["ok"] is False
    assert [gpu["index"] for gpu in result["gpus"]] == list(range(8))
    assert [gpu["index"] for gpu in result["gpus"] if gpu["problems"]] == [3, 5]
    assert all(": lost (NVML: GPU is lost)" in result["gpus"][index]["problems"][0] for index in (3, 5))


@pytest.mark.parametrize("fault, params, expected", [
    ("ecc_uncorrected", {"count": 3}, "3 uncorrected volatile ECC errors"),
    ("remap_pending", {"rows": 2}, "Row remapping pending (correctable 0, uncorrectable 2)"),
    ("remap_failed", {}, "Row remapping failed"),
    ("retired_pages_pending", {}, "Retired pages pending"),
])
def test_health_faults_fail_with_their_counters(fake_nvml, fault, params, expected):
    fake_nvml.inject(fault, gpu=1, **params)
    result = verify(fake_nvml, timeout=60)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["polls"] == 1  # no wait clears these: it does not poll on for 60 s
    problems = result["gpus"][1]["problems"]
    assert problems and all(problem.startswith(label(fake_nvml, 1) + ": ") for problem in problems)
    assert expected in problems[0]
    assert [gpu["index"] for gpu in result["gpus"] if gpu["problems"]] == [1]


def test_health_fault_passes_when_its_check_is_not_selected(fake_nvml):
    fake_nvml.inject("ecc_uncorrected", gpu=1, count=3)
    result = verify(fake_nvml, checks=["memory", "processes", "count"])
    assert result["rc"] == 0 and result["ok"] is True
    assert result["gpus"][1]["ecc_uncorrected_volatile"] == 3


def test_retired_pages_not_supported_is_not_a_failure(fake_nvml):
    fake_nvml.inject("retired_pages_not_supported")
    result = verify(fake_nvml)
    assert result["rc"] == 0, result["msg"]
    assert all(gpu["retired_pages_pending"] is None for gpu in result["gpus"])


def fork_and_exit():
    """(parent, its child's pid): the parent forks a child that keeps running, prints its pid
    and exits; it is a zombie until the caller reaps it with parent.wait()."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys, time\n"
         "pid = os.fork()\n"
         "if pid == 0:\n"
         "    os.setsid(); sys.stdout.close(); time.sleep(600)\n"
         "else:\n"
         "    print(pid, flush=True)\n"],
        stdout=subprocess.PIPE, text=True)
    return parent, int(parent.stdout.readline())


def test_dead_pid_listed_with_live_forked_child(fake_nvml):
    # The parent forks a child that keeps running, prints its pid and exits: NVML still
    # lists the parent, while the child holds the memory.
    parent, child = fork_and_exit()
    parent.wait()
    try:
        fake_nvml.register(child, 4, 3000, reported_pid=parent.pid)
        result = verify(fake_nvml, timeout=0.2)
    finally:
        os.kill(child, signal.SIGKILL)
    assert result["rc"] != 0 and result["ok"] is False
    gpu4 = result["gpus"][4]
    assert gpu4["processes"] == [{"pid": parent.pid, "used_mib": 3000, "type": "compute", "exists": False}]
    assert gpu4["unattributed_mib"] == 3000
    msg = result["msg"]
    assert "process %d (does not exist here, 3000 MiB)" % parent.pid in msg
    assert "died leaving a forked child" in msg
    assert "3000 MiB is memory used with no visible process" in msg


def test_a_listed_pid_that_is_a_zombie_does_not_exist_here(fake_nvml):
    # As above, but the parent is not reaped yet: /proc still has it, as a zombie, which holds
    # no memory. It must not count as the process that accounts for the memory its child holds.
    parent, child = fork_and_exit()
    try:
        assert procinfo.wait_state(parent.pid, "Z"), "the parent never became a zombie"
        fake_nvml.register(child, 4, 3000, reported_pid=parent.pid)
        result = verify(fake_nvml, timeout=0.2)
        assert procinfo.state(parent.pid) == "Z"  # still a zombie while the module ran
    finally:
        os.kill(child, signal.SIGKILL)
        parent.wait()
    gpu4 = result["gpus"][4]
    assert gpu4["processes"] == [{"pid": parent.pid, "used_mib": 3000, "type": "compute", "exists": False}]
    assert gpu4["unattributed_mib"] == 3000
    assert "process %d (does not exist here, 3000 MiB)" % parent.pid in result["msg"]


def test_allow_processes_with_a_higher_memory_limit_passes(fake_nvml, holders):
    holder = holders()
    fake_nvml.register(holder.pid, 6, 500)
    result = verify(fake_nvml, allow_processes=True, max_memory_used_mib=1024, timeout=0)
    assert result["rc"] == 0, result["msg"]
    assert result["gpus"][6]["processes"][0]["pid"] == holder.pid


def test_selects_gpus_by_index_uuid_and_pci_bus_id(fake_nvml, holders):
    holder = holders()
    fake_nvml.register(holder.pid, 0, 9000)  # GPU 0 is busy but not selected
    result = verify(fake_nvml, gpus=["3", fake_nvml.uuids[5].upper(), "0000:db:00.0", "7"],
                    timeout=0)
    assert result["rc"] == 0, result["msg"]
    assert [(gpu["index"], gpu["uuid"], gpu["pci_bus_id"]) for gpu in result["gpus"]] == [
        (index, fake_nvml.uuids[index], fake_nvml.gpus()[index]["pci_bus_id"]) for index in (3, 5, 7)]
    assert [gpu["minor_number"] for gpu in result["gpus"]] == [3, 5, 7]


def test_check_mode_runs_the_same_check(fake_nvml):
    fake_nvml.inject("stuck_memory", gpu=0, mib=100)
    result = verify(fake_nvml, check=True, timeout=0)
    assert result["rc"] != 0 and result["changed"] is False
    assert "100 MiB of memory used" in result["msg"]
    fake_nvml.clear()
    assert verify(fake_nvml, check=True)["ok"] is True


def test_driver_not_loaded_is_one_clear_sentence(fake_nvml):
    fake_nvml.inject("driver_not_loaded")
    result = verify(fake_nvml)
    assert result["rc"] != 0
    assert result["msg"].startswith("NVIDIA driver not loaded: ")
    assert "Traceback" not in str(result)


def test_missing_library_is_one_clear_sentence(fake_nvml, tmp_path):
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    env = dict(fake_nvml.env(), LD_LIBRARY_PATH=str(empty))
    result = run_module("nvml_verify", {}, env=env)
    assert result["rc"] != 0
    assert result["msg"].startswith("libnvidia-ml not found: ")
    assert "Traceback" not in str(result)


def test_hung_gpu_call_is_bounded(fake_nvml):
    fake_nvml.inject("hang", gpu=6, seconds=300)
    # run_module gives up after 60 s: the module must return long before the hang ends.
    result = run_module("nvml_verify", {"call_timeout": 0.5}, env=fake_nvml.env(), timeout=60)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["gpus"][6]["problems"] == [
        label(fake_nvml, 6) + ": NVML call nvmlDeviceGetMemoryInfo_v2 did not return within 0.5 s (call_timeout): the"
        " GPU or its driver is hung; check dmesg for Xid errors, then reset the GPU (nvidia-smi -r -i 6) or reboot."]
    assert result["unfinished_call"]["cause"] == "call_timeout"
    # GPUs 0-5 were read before it: their readings are reported; 7 was never reached.
    assert all(gpu["memory_used_mib"] == 0 and not gpu["problems"] for gpu in result["gpus"][:6])
    assert result["gpus"][7]["memory_used_mib"] is None and "not read" in result["gpus"][7]["problems"][0]
    assert "Traceback" not in str(result)


# ----- inputs: one clear sentence, NVML never touched -----

# Each option's upper bound, as the sentences state it (the range itself is _ranges.py's).
TOP = {option: rule.maximum for option, rule in RANGES["nvml_verify"].items()}


@pytest.mark.parametrize("params, expected", [
    ({"timeout": -1}, "timeout must be 0 or more seconds, got -1"),
    ({"timeout": "nan"}, "timeout must be a finite number"),
    ({"timeout": "inf"}, "timeout must be a finite number"),
    ({"timeout": 1e10}, "timeout must be %s or less seconds, got 10000000000.0" % TOP["timeout"]),
    ({"timeout": "soon"}, "timeout"),
    ({"poll_interval": 0}, "poll_interval must be more than 0 seconds, got 0"),
    ({"poll_interval": -0.5}, "poll_interval must be more than 0 seconds, got -0.5"),
    ({"poll_interval": "nan"}, "poll_interval must be a finite number"),
    ({"poll_interval": "-inf"}, "poll_interval must be a finite number"),
    ({"poll_interval": 1e300}, "poll_interval must be %s or less seconds" % TOP["poll_interval"]),
    ({"poll_interval": [1]}, "poll_interval"),
    ({"call_timeout": 0}, "call_timeout must be more than 0 seconds, got 0"),
    ({"call_timeout": "nan"}, "call_timeout must be a finite number"),
    ({"call_timeout": "inf"}, "call_timeout must be a finite number"),
    ({"call_timeout": 1e10}, "call_timeout must be %s or less seconds" % TOP["call_timeout"]),
    ({"call_timeout": -1}, "call_timeout must be more than 0 seconds, got -1"),
    ({"call_timeout": "fast"}, "call_timeout"),
    ({"max_memory_used_mib": -5}, "max_memory_used_mib must be 0 or more MiB, got -5"),
    ({"max_memory_used_mib": "x"}, "max_memory_used_mib"),
    ({"max_memory_used_mib": "nan"}, "max_memory_used_mib"),
    # "inf" for an int option is a traceback inside ansible-core 2.19's own check_type_int, before the module
    # runs (fixed upstream: ansible/ansible#87253); float options take it and are refused above.
    ({"expected_count": 0}, "expected_count must be 1 or more GPUs, got 0"),
    ({"expected_count": -3}, "expected_count must be 1 or more GPUs, got -3"),
    ({"expected_count": 1.5}, "expected_count"),
    ({"expected_count": "nan"}, "expected_count"),
    ({"checks": []}, "checks is empty, so any GPU would pass; name at least one of memory, processes, count, ecc,"
                     " remapped_rows, retired_pages, xid"),
    ({"checks": ["memory", "temperature"]}, "temperature"),
    ({"gpus": [""]}, "gpus entry '' is not a GPU index (0), a UUID (GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77) or a"
                     " PCI bus id (00000000:18:00.0)"),
    ({"gpus": ["\u00b2"]}, "gpus entry '\u00b2' is not a GPU index"),
    ({"gpus": ["-1"]}, "gpus entry '-1' is not a GPU index"),
    ({"gpus": ["GPU-nope"]}, "gpus entry 'GPU-nope' is not a GPU index"),
    ({"gpus": ["MIG-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77"]}, "is not a GPU index"),
    ({"gpus": ["18:00"]}, "gpus entry '18:00' is not a GPU index"),
    ({"gpus": ["0\n1"]}, "is not a GPU index"),
])
def test_bad_input_is_one_clear_error_and_nvml_is_not_touched(fake_nvml, params, expected):
    fake_nvml.record_calls()
    result = verify(fake_nvml, **params)
    assert result["rc"] != 0
    assert result.get("changed", False) is False
    assert expected in result["msg"]
    assert "gpus" not in result
    assert fake_nvml.calls() == []
    assert "Traceback" not in str(result)


def test_a_huge_expected_count_is_refused_before_nvml_in_one_sentence(fake_nvml):
    result = verify(fake_nvml, expected_count=10 ** 20, timeout=30)
    assert result["rc"] != 0 and "polls" not in result
    assert result["msg"] == "expected_count must be %s or less GPUs, got 100000000000000000000" % TOP["expected_count"]


def test_every_bad_input_is_named_at_once(fake_nvml):
    result = verify(fake_nvml, timeout="nan", poll_interval=0, checks=[], gpus=["x"])
    assert result["rc"] != 0
    for option in ("timeout", "poll_interval", "checks", "gpus entry 'x'"):
        assert option in result["msg"]


@pytest.mark.parametrize("selector", ["9", "GPU-00000000-0000-0000-0000-000000000000", "0000:99:00.0"])
def test_unknown_gpu_names_the_gpus_there_are(fake_nvml, selector):
    result = verify(fake_nvml, gpus=["0", selector])
    assert result["rc"] != 0 and "Traceback" not in str(result)
    assert result["msg"].startswith("unknown GPU %r: this host has GPU indices 0-7 and UUIDs " % selector)
    assert "%s (2, %s)" % (fake_nvml.uuids[2], fake_nvml.gpus()[2]["pci_bus_id"]) in result["msg"]


def test_max_memory_at_or_above_a_gpus_memory_is_refused(fake_nvml):
    # Like checks: [], a limit no GPU can reach would pass a GPU whatever it holds.
    result = verify(fake_nvml, gpus=["0"], max_memory_used_mib=143771, timeout=30)
    assert result["rc"] != 0 and result["polls"] == 1
    assert result["gpus"][0]["problems"] == [
        label(fake_nvml, 0) + ": max_memory_used_mib 143771 is not below this GPU's 143771 MiB of memory, so the"
        " memory check could never fail; give a lower limit, or leave memory out of checks."]
    assert verify(fake_nvml, gpus=["0"], max_memory_used_mib=143771, checks=["processes"])["ok"] is True


# ----- timeout bounds the whole call -----

def test_timeout_bounds_slow_reads(fake_nvml):
    # Every memory and process call takes 1.9 s on every GPU: one read of 8 GPUs takes a minute.
    fake_nvml.inject("hang", seconds=1.9)
    # A module that let reads run past the timeout would take a minute: give up well before.
    result = run_module("nvml_verify", {"timeout": 1}, env=fake_nvml.env(), timeout=30)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["polls"] == 0  # not one read finished
    assert result["unfinished_call"]["call"] == "nvmlDeviceGetMemoryInfo_v2"
    assert result["unfinished_call"]["cause"] == "timeout"
    assert (result["unfinished_call"]["index"], result["unfinished_call"]["uuid"]) == (0, fake_nvml.uuids[0])
    assert result["gpus"][0]["problems"][0].startswith(
        label(fake_nvml, 0) + ": NVML call nvmlDeviceGetMemoryInfo_v2 had been running for ")
    assert "when the 1 s timeout ran out: NVML answers slowly or the GPU is hung" in result["msg"]
    assert result["msg"].startswith("GPUs not proved clean: time ran out after ")
    # Seven GPUs were never reached, and say so rather than pass.
    assert all("not read" in gpu["problems"][0] for gpu in result["gpus"][1:])
    # Before the deadline covered reads, this took 61 s; a generous bound, not a timing test.
    assert result["waited_s"] < 20


def test_timeout_bounds_nvml_init(fake_nvml):
    # Without persistence mode nvmlInit can take seconds; the timeout starts before it.
    fake_nvml.inject("init_delay", seconds=60)
    result = run_module("nvml_verify", {"timeout": 1, "call_timeout": 120}, env=fake_nvml.env(), timeout=170)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["unfinished_call"]["call"] == "nvmlInit" and result["unfinished_call"]["index"] is None
    assert result["gpus"] == [] and result["polls"] == 0
    assert len(result["problems"]) == 1
    assert result["problems"][0].startswith("NVML call nvmlInit had been running for ")
    assert result["problems"][0].endswith("when the 1 s timeout ran out: NVML answers slowly or the GPU is hung;"
                                          " check dmesg for Xid errors, and give a longer timeout if NVML is only slow.")
    assert result["waited_s"] < 20  # the init sleeps 60 s


def test_timeout_zero_gives_its_one_read_call_timeout_in_all(fake_nvml):
    fake_nvml.inject("hang", seconds=0.8)  # each call answers within call_timeout; the read does not
    result = run_module("nvml_verify", {"timeout": 0, "call_timeout": 2}, env=fake_nvml.env(), timeout=170)
    assert result["rc"] != 0 and result["polls"] == 0
    assert result["unfinished_call"]["cause"] == "timeout"
    assert "when the 2 s that timeout 0 gives its one read (call_timeout) ran out" in result["msg"]
    assert result["waited_s"] < 20  # one full read would take 8 x 4 x 0.8 = 26 s


def test_a_read_is_not_started_when_it_cannot_end_before_the_timeout(fake_nvml, holders):
    # Each read of GPU 0 takes at least 0.2 s (4 slow calls); reads follow each other at once
    # (poll_interval 1 ms), so a read started whenever its start is before the deadline would
    # almost always be cut. The last one must not start so late that the timeout cuts it and
    # blames NVML for being slow.
    holder = holders()
    fake_nvml.register(holder.pid, 0, 500)
    fake_nvml.inject("hang", gpu=0, seconds=0.05)
    result = verify(fake_nvml, gpus=["0"], timeout=1, poll_interval=0.001)
    assert result["rc"] != 0 and result["polls"] >= 1
    assert result["unfinished_call"] is None
    assert result["msg"].startswith("GPUs not clean after ")
    assert result["gpus"][0]["problems"][0].startswith(label(fake_nvml, 0) + ": NVML lists compute process")


# ----- selection: pinned to the card, unselected GPUs untouched -----

@pytest.mark.parametrize("fault", ["gpu_removed", "gpu_lost"])
def test_an_index_stays_on_its_card_when_the_gpu_falls_off(fake_nvml, holders, fault):
    holder = holders()
    fake_nvml.register(holder.pid, 0, 70000)  # GPU 0 stays busy: the module keeps polling
    fake_nvml.record_calls()
    box = {}
    runner = threading.Thread(target=lambda: box.update(verify(fake_nvml, gpus=["0"], timeout=120, poll_interval=0.05)))
    runner.start()
    try:
        wait_for_call(fake_nvml, "nvmlDeviceGetMemoryInfo_v2", 0)  # GPU 0 is pinned and read
        fake_nvml.inject(fault, gpu=0)  # with gpu_removed, the old GPU 1 is index 0 now
    finally:
        runner.join(150)
    assert box["rc"] != 0 and box["ok"] is False
    [gpu] = box["gpus"]
    # Reported under the card's own name, lost, not replaced by the (clean) card that took its index.
    assert (gpu["index"], gpu["uuid"], gpu["pci_bus_id"]) == (0, fake_nvml.uuids[0], "00000000:18:00.0")
    assert gpu["problems"][0].startswith(label(fake_nvml, 0) + ": lost (NVML: GPU is lost)")
    assert touched(fake_nvml) <= {None, 0}  # never a call on another card
    assert "no longer polling" in box["msg"]


@pytest.mark.parametrize("selector", ["uuid", "0000:3a:00.0"])
def test_a_lost_gpu_selected_by_uuid_or_bus_id_is_reported_lost_by_that_name(fake_nvml, selector):
    fake_nvml.inject("gpu_lost", gpu=2)
    chosen = fake_nvml.uuids[2] if selector == "uuid" else selector
    result = verify(fake_nvml, gpus=[chosen, "5"], timeout=30)
    assert result["rc"] != 0 and result["ok"] is False
    lost, five = result["gpus"][-1], result["gpus"][0]
    assert five["index"] == 5 and five["problems"] == []
    if selector == "uuid":
        assert (lost["uuid"], lost["pci_bus_id"]) == (fake_nvml.uuids[2], None)
    else:
        assert (lost["uuid"], lost["pci_bus_id"]) == (None, "00000000:3A:00.0")
    assert lost["index"] is None  # NVML cannot say where in the enumeration a lost GPU sits
    assert lost["problems"][0].startswith("GPU at an unknown index (")
    assert "lost (NVML: GPU is lost)" in lost["problems"][0]


def test_an_index_selection_with_a_gpu_missing_is_refused(fake_nvml):
    # GPU 2 was not probed at driver load: the old GPU 6 is index 5 now, so "5" may not be the card meant.
    fake_nvml.inject("gpu_removed", gpu=2)
    result = verify(fake_nvml, gpus=["5"], expected_count=8, checks=["memory"], timeout=30)
    assert result["rc"] != 0 and result["polls"] == 1
    assert (result["gpus"][0]["index"], result["gpus"][0]["uuid"]) == (5, fake_nvml.uuids[6])  # what it read, told
    assert result["problems"] == [
        "NVML lists 7 GPUs, 8 expected: a GPU fell off the bus or was not probed when the driver loaded; check dmesg"
        " for Xid 79 or 'fallen off the bus', then reboot. The GPUs after the missing one have moved down one index,"
        " so gpus given by index may name other cards than meant: select them by UUID or PCI bus id."]
    # By UUID the card is found wherever it moved; only the count check still speaks.
    by_uuid = verify(fake_nvml, gpus=[fake_nvml.uuids[6]], expected_count=8, checks=["memory"], timeout=30)
    assert by_uuid["rc"] == 0, by_uuid["msg"]
    assert by_uuid["gpus"][0]["pci_bus_id"] == fake_nvml.gpus()[6]["pci_bus_id"]


def test_a_hung_gpu_outside_the_selection_is_never_touched(fake_nvml):
    fake_nvml.inject("hang", gpu=6, seconds=300)
    fake_nvml.record_calls()
    result = verify(fake_nvml, gpus=["0", "1"], expected_count=8, call_timeout=2, timeout=30)
    assert result["rc"] == 0, result["msg"]
    assert [gpu["index"] for gpu in result["gpus"]] == [0, 1]
    assert touched(fake_nvml) == {None, 0, 1}


def test_a_lost_gpu_outside_the_selection_does_not_fail_it(fake_nvml):
    fake_nvml.inject("gpu_lost", gpu=6)
    fake_nvml.record_calls()
    result = verify(fake_nvml, gpus=["0", "1"], expected_count=8, timeout=30)
    assert result["rc"] == 0, result["msg"]
    assert touched(fake_nvml) == {None, 0, 1}
    # Selected, it fails.
    assert verify(fake_nvml, gpus=["0", "6"], expected_count=8, timeout=30)["rc"] != 0
