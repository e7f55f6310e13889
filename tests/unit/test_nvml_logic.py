"""Pure logic of _nvml and nvml_verify: GPU selection, memory no visible process accounts for,
pid liveness (against real processes and a real zombie), the time bound on a call that
never returns, and the sentences each check produces from a snapshot."""
from __future__ import annotations

import copy
import subprocess
import sys
import threading

import pytest

from tests.run_module import ensure_collection_link

sys.path.insert(0, str(ensure_collection_link()))
# pylint: disable=wrong-import-position
from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml  # noqa: E402
from ansible_collections.cleanslate.gpu.plugins.modules import nvml_verify  # noqa: E402

UUIDS = ["GPU-0000000%d-aaaa-bbbb-cccc-dddddddddddd" % index for index in range(4)]


def clean_gpu(index):
    return {"index": index, "uuid": UUIDS[index], "name": "NVIDIA H200", "pci_bus_id": "00000000:1%d:00.0" % index,
            "memory_total_mib": 143771, "memory_used_mib": 0, "memory_reserved_mib": 615,
            "memory_used_v1_mib": 615, "processes": [], "ecc_uncorrected_volatile": 0,
            "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
            "retired_pages_pending": None}


@pytest.fixture
def snap():
    return {"driver_version": "570.133.20", "count": 4, "gpus": [clean_gpu(i) for i in range(4)], "lost": []}


def params(**overrides):
    base = {"gpus": [], "expected_count": None, "max_memory_used_mib": 16, "allow_processes": False,
            "timeout": 30.0, "poll_interval": 0.1, "call_timeout": 5.0, "checks": list(nvml_verify.CHECKS)}
    base.update(overrides)
    return base


# ----- resolve_gpus -----

def test_resolve_all_when_empty(snap):
    assert _nvml.resolve_gpus(snap, []) == [0, 1, 2, 3]
    assert _nvml.resolve_gpus(snap, None) == [0, 1, 2, 3]


def test_resolve_indices_and_uuids_sorted_and_unique(snap):
    assert _nvml.resolve_gpus(snap, [3, "1", UUIDS[3].upper(), " 0 "]) == [0, 1, 3]


@pytest.mark.parametrize("selector", [4, "17", "GPU-unknown", True, "-1"])
def test_resolve_unknown_names_the_valid_ones(snap, selector):
    with pytest.raises(ValueError) as caught:
        _nvml.resolve_gpus(snap, [0, selector])
    message = str(caught.value)
    assert message.startswith("unknown GPU %r" % (selector,))
    assert "indices 0-3" in message
    assert "%s (2)" % UUIDS[2] in message


def test_resolve_keeps_a_lost_index_selectable(snap):
    # GPU 2 no longer answers: selecting it must report it lost, not "unknown".
    snap["gpus"].pop(2)
    snap["lost"].append({"index": 2, "error": "GPU is lost"})
    assert _nvml.resolve_gpus(snap, ["2"]) == [2]


# ----- unattributed_mib -----

def test_unattributed_counts_only_processes_that_exist():
    gpu = clean_gpu(0)
    gpu["memory_used_mib"] = 5000
    gpu["processes"] = [{"pid": 10, "used_mib": 3000, "type": "compute", "exists": True},
                        {"pid": 11, "used_mib": 2000, "type": "compute", "exists": False}]
    assert _nvml.unattributed_mib(gpu) == 2000


def test_unattributed_counts_a_compute_and_graphics_process_once():
    gpu = clean_gpu(0)
    gpu["memory_used_mib"] = 3000
    gpu["processes"] = [{"pid": 10, "used_mib": 3000, "type": "compute", "exists": True},
                        {"pid": 10, "used_mib": 3000, "type": "graphics", "exists": True}]
    assert _nvml.unattributed_mib(gpu) == 0


def test_unattributed_unknown_when_a_visible_share_is_unknown():
    gpu = clean_gpu(0)
    gpu["memory_used_mib"] = 3000
    gpu["processes"] = [{"pid": 10, "used_mib": None, "type": "compute", "exists": True}]
    assert _nvml.unattributed_mib(gpu) is None


# ----- pid_exists -----

def test_pid_exists_for_live_dead_and_zombie_processes():
    live = subprocess.Popen(["sleep", "600"])
    zombie = subprocess.Popen(["true"])
    try:
        assert _nvml.pid_exists(live.pid) is True
        # Not reaped yet: wait until the kernel shows it as a zombie.
        for _attempt in range(2000):
            with open("/proc/%d/stat" % zombie.pid, "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            threading.Event().wait(0.01)
        assert _nvml.pid_exists(zombie.pid) is False
    finally:
        live.kill()
        live.wait()
        zombie.wait()
    assert _nvml.pid_exists(live.pid) is False
    assert _nvml.pid_exists(0) is False


# ----- the time bound -----

def test_a_call_that_never_returns_is_given_up_and_later_calls_fail_at_once():
    caller = _nvml._BoundedCaller(0.2)  # pylint: disable=protected-access
    release = threading.Event()
    try:
        assert caller.call("quick", lambda: 42) == 42
        with pytest.raises(_nvml.NvmlError) as caught:
            caller.call("nvmlDeviceGetMemoryInfo_v2 on GPU 6", release.wait)
        assert str(caught.value).startswith("NVML call nvmlDeviceGetMemoryInfo_v2 on GPU 6 did not return within 0.2 s")
        # The worker is still stuck: the next call must not queue behind it.
        with pytest.raises(_nvml.NvmlError, match="NVML is not answering: nvmlDeviceGetMemoryInfo_v2 on GPU 6"):
            caller.call("nvmlDeviceGetCount", lambda: 8)
    finally:
        release.set()


def test_a_call_error_reaches_the_caller():
    caller = _nvml._BoundedCaller(5)  # pylint: disable=protected-access
    try:
        with pytest.raises(ZeroDivisionError):
            caller.call("divide", lambda: 1 // 0)
        assert caller.call("after", lambda: "fine") == "fine"
    finally:
        caller.stop()


# ----- nvml_verify: checks and sentences -----

def test_clean_snapshot_passes(snap):
    gpus, host, ok = nvml_verify.evaluate(snap, [0, 1, 2, 3], params(expected_count=4))
    assert ok and host == [] and all(gpu["problems"] == [] for gpu in gpus)


def test_memory_limit_is_inclusive(snap):
    snap["gpus"][1]["memory_used_mib"] = 16
    assert nvml_verify.evaluate(snap, [1], params())[2] is True
    snap["gpus"][1]["memory_used_mib"] = 17
    gpus, _host, ok = nvml_verify.evaluate(snap, [1], params())
    assert not ok
    assert gpus[0]["problems"][0].startswith("17 MiB of memory used (v2, 615 MiB driver-reserved not counted)")


def test_processes_allowed_still_checks_memory(snap):
    snap["gpus"][0]["memory_used_mib"] = 900
    snap["gpus"][0]["processes"] = [{"pid": 77, "used_mib": 900, "type": "compute", "exists": True}]
    gpus, _host, ok = nvml_verify.evaluate(snap, [0], params(allow_processes=True))
    assert not ok and len(gpus[0]["problems"]) == 1 and "900 MiB of memory used" in gpus[0]["problems"][0]
    assert nvml_verify.evaluate(snap, [0], params(allow_processes=True, max_memory_used_mib=1024))[2] is True


def test_unselected_check_is_ignored(snap):
    snap["gpus"][2]["remapped_rows"]["pending"] = True
    assert nvml_verify.evaluate(snap, [2], params(checks=["memory", "ecc"]))[2] is True
    gpus, _host, ok = nvml_verify.evaluate(snap, [2], params(checks=["remapped_rows"]))
    assert not ok and gpus[0]["problems"] == [
        "Row remapping pending (correctable 0, uncorrectable 0): reset the GPU (nvidia-smi -r -i 2) or reboot to apply it."]


def test_not_supported_counters_pass(snap):
    for gpu in snap["gpus"]:
        gpu["ecc_uncorrected_volatile"] = None
        gpu["remapped_rows"] = None
        gpu["retired_pages_pending"] = None
    assert nvml_verify.evaluate(snap, [0, 1, 2, 3], params())[2] is True


def test_lost_selected_gpu_fails_whatever_the_checks(snap):
    snap["gpus"].pop(3)
    snap["lost"].append({"index": 3, "error": "GPU is lost"})
    gpus, _host, ok = nvml_verify.evaluate(snap, [3], params(checks=["ecc"]))
    assert not ok
    assert gpus[0]["uuid"] is None
    assert gpus[0]["problems"][0].startswith("GPU 3 is lost (NVML: GPU is lost)")


def test_count_below_expected_is_a_host_problem(snap):
    lost = copy.deepcopy(snap)
    lost["count"] = 3
    lost["gpus"].pop()
    _gpus, host, ok = nvml_verify.evaluate(lost, [0, 1, 2], params(expected_count=4))
    assert not ok and host[0].startswith("NVML reaches 3 GPUs (3 listed), 4 expected")
    assert nvml_verify.evaluate(lost, [0, 1, 2], params(expected_count=4, checks=["memory"]))[2] is True


def test_failure_message_names_each_failing_gpu_only(snap):
    snap["gpus"][1]["ecc_uncorrected_volatile"] = 5
    gpus, host, _ok = nvml_verify.evaluate(snap, [0, 1, 2, 3], params())
    msg = nvml_verify.failure_message(gpus, host, 30.04, 301)
    assert msg.startswith("GPUs not clean after 30.0 s (301 NVML reads): GPU 1 (%s): 5 uncorrected" % UUIDS[1])
    assert "GPU 0" not in msg and "GPU 2" not in msg


@pytest.mark.parametrize("overrides, expected", [
    ({"timeout": -0.5}, "timeout must be 0 or more, got -0.5"),
    ({"poll_interval": 0.0}, "poll_interval must be more than 0, got 0.0"),
    ({"call_timeout": -1.0}, "call_timeout must be more than 0, got -1.0"),
    ({"max_memory_used_mib": -1}, "max_memory_used_mib must be 0 or more, got -1"),
    ({"expected_count": 0}, "expected_count must be 1 or more, got 0"),
    ({}, None),
    ({"timeout": 0.0}, None),
])
def test_bad_params(overrides, expected):
    assert nvml_verify.bad_params(params(**overrides)) == expected


def test_context_overhead_under_the_limit_is_not_called_unattributed(snap):
    # What a real H200 showed: the holder's listed share is 8 MiB below the GPU's "used".
    snap["gpus"][0]["memory_used_mib"] = 4622
    snap["gpus"][0]["processes"] = [{"pid": 468, "used_mib": 4614, "type": "compute", "exists": True}]
    gpus, _host, ok = nvml_verify.evaluate(snap, [0], params())
    assert not ok
    assert gpus[0]["unattributed_mib"] == 8
    assert not any("no visible process" in problem for problem in gpus[0]["problems"])
    snap["gpus"][0]["processes"][0]["used_mib"] = 2000
    gpus, _host, _ok = nvml_verify.evaluate(snap, [0], params())
    assert "2622 MiB is memory used with no visible process" in gpus[0]["problems"][1]
