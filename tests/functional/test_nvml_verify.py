"""nvml_verify run as Ansible runs it, against the fake libnvidia-ml loaded by the real pynvml.

Holders are real processes this test starts; the fake NVML counts their memory only while
they live, so killing one is what frees "the GPU".
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.run_module import run_module

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


def module_pid(state_dir: Path) -> int | None:
    """The pid of the module process pointed at this test's state (our own child only)."""
    needle = ("FAKE_NVML_STATE=%s" % state_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                environ = handle.read().split(b"\0")
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if needle in environ and b"nvml_verify.py" in cmdline:
            return int(entry)
    return None


def wait_until_polling(state_dir: Path, give_up_s: float = 60.0) -> None:
    """Block until the module process has loaded the (fake) libnvidia-ml, i.e. started polling."""
    deadline = time.monotonic() + give_up_s
    while time.monotonic() < deadline:
        pid = module_pid(state_dir)
        if pid is not None:
            try:
                with open("/proc/%d/maps" % pid, encoding="utf-8") as handle:
                    if "libnvidia-ml.so.1" in handle.read():
                        return
            except OSError:
                pass
        time.sleep(0.02)
    raise AssertionError("the module never loaded libnvidia-ml")


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


def test_live_holder_fails_with_gpu_pid_and_memory(fake_nvml, holders):
    holder = holders()
    fake_nvml.register(holder.pid, 2, 4000)
    result = verify(fake_nvml, timeout=0.3)
    assert result["rc"] != 0 and result["ok"] is False and result["changed"] is False
    gpu2 = result["gpus"][2]
    assert gpu2["processes"] == [{"pid": holder.pid, "used_mib": 4000, "type": "compute", "exists": True}]
    assert gpu2["memory_used_mib"] == 4000
    msg = result["msg"]
    assert "GPU 2 (%s)" % fake_nvml.uuids[2] in msg
    assert "process %d (exists here, 4000 MiB)" % holder.pid in msg
    assert "4000 MiB of memory used" in msg and "cleanslate.gpu.gpu_reset" in msg
    assert result["polls"] >= 2
    # The other GPUs are clean and not named.
    assert all(not gpu["problems"] for gpu in result["gpus"] if gpu["index"] != 2)
    assert "GPU 3" not in msg


def test_passes_when_holder_is_killed_during_the_poll(fake_nvml, holders):
    first, last = holders(), holders()
    fake_nvml.register(first.pid, 0, 70000)
    fake_nvml.register(last.pid, 7, 70000, kind="graphics")
    box = {}
    runner = threading.Thread(target=lambda: box.update(verify(fake_nvml, timeout=120, poll_interval=0.05)))
    runner.start()
    try:
        wait_until_polling(fake_nvml.state_dir)
        first.kill()
        first.wait()
        time.sleep(0.3)  # let a few polls see GPU 7 still held
        last.kill()
        last.wait()
    finally:
        runner.join(150)
    assert box["rc"] == 0, box["msg"]
    assert box["ok"] is True
    assert box["polls"] >= 2
    assert all(gpu["memory_used_mib"] == 0 for gpu in box["gpus"])


def test_memory_stuck_with_no_process_fails_after_timeout(fake_nvml):
    fake_nvml.inject("stuck_memory", gpu=5, mib=2048)
    result = verify(fake_nvml, timeout=0.5, poll_interval=0.1)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["waited_s"] >= 0.5
    assert result["polls"] >= 2
    gpu5 = result["gpus"][5]
    assert gpu5["processes"] == [] and gpu5["unattributed_mib"] == 2048
    assert "GPU 5 (%s)" % fake_nvml.uuids[5] in result["msg"]
    assert "2048 MiB is memory used with no visible process" in result["msg"]
    assert "nvidia-smi -r -i 5" in result["msg"]


def test_lost_gpu_fails_expected_count(fake_nvml):
    fake_nvml.inject("gpu_lost", gpu=3)
    result = verify(fake_nvml, expected_count=8, timeout=0.2)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["count"] == 7
    assert "NVML reaches 7 GPUs (7 listed), 8 expected" in result["msg"]
    assert "fell off the bus" in result["msg"]
    # Without the count check the seven that answer are clean.
    assert verify(fake_nvml, expected_count=8, checks=["memory", "processes"])["ok"] is True


@pytest.mark.parametrize("fault, params, expected", [
    ("ecc_uncorrected", {"count": 3}, "3 uncorrected volatile ECC errors"),
    ("remap_pending", {"rows": 2}, "Row remapping pending (correctable 0, uncorrectable 2)"),
    ("remap_failed", {}, "Row remapping failed"),
    ("retired_pages_pending", {}, "Retired pages pending"),
])
def test_health_faults_fail_with_their_counters(fake_nvml, fault, params, expected):
    fake_nvml.inject(fault, gpu=1, **params)
    result = verify(fake_nvml, timeout=0)
    assert result["rc"] != 0 and result["ok"] is False
    assert result["polls"] == 1
    assert "GPU 1 (%s): " % fake_nvml.uuids[1] in result["msg"]
    assert expected in result["msg"]
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


def test_dead_pid_listed_with_live_forked_child(fake_nvml):
    # The parent forks a child that keeps running, prints its pid and exits: NVML still
    # lists the parent, while the child holds the memory.
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys, time\n"
         "pid = os.fork()\n"
         "if pid == 0:\n"
         "    os.setsid(); sys.stdout.close(); time.sleep(600)\n"
         "else:\n"
         "    print(pid, flush=True)\n"],
        stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
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


def test_allow_processes_with_a_higher_memory_limit_passes(fake_nvml, holders):
    holder = holders()
    fake_nvml.register(holder.pid, 6, 500)
    result = verify(fake_nvml, allow_processes=True, max_memory_used_mib=1024, timeout=0)
    assert result["rc"] == 0, result["msg"]
    assert result["gpus"][6]["processes"][0]["pid"] == holder.pid


def test_selects_gpus_by_index_and_uuid(fake_nvml, holders):
    holder = holders()
    fake_nvml.register(holder.pid, 0, 9000)  # GPU 0 is busy but not selected
    result = verify(fake_nvml, gpus=["3", fake_nvml.uuids[5].lower()], timeout=0)
    assert result["rc"] == 0, result["msg"]
    assert [gpu["index"] for gpu in result["gpus"]] == [3, 5]


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
    assert result["rc"] != 0
    assert "on GPU 6 did not return within 0.5 s" in result["msg"]
    assert "Traceback" not in str(result)


@pytest.mark.parametrize("params, expected", [
    ({"timeout": -1}, "timeout must be 0 or more, got -1"),
    ({"poll_interval": 0}, "poll_interval must be more than 0, got 0"),
    ({"max_memory_used_mib": -5}, "max_memory_used_mib must be 0 or more, got -5"),
    ({"expected_count": 0}, "expected_count must be 1 or more, got 0"),
    ({"checks": ["memory", "temperature"]}, "temperature"),
    ({"gpus": ["9"]}, "unknown GPU '9': this host has GPU indices 0-7 and UUIDs GPU-"),
    ({"gpus": ["GPU-nope"]}, "unknown GPU 'GPU-nope'"),
])
def test_bad_input_is_one_clear_error(fake_nvml, params, expected):
    result = verify(fake_nvml, **params)
    assert result["rc"] != 0
    assert result.get("changed", False) is False
    assert expected in result["msg"]
    assert "Traceback" not in str(result)
