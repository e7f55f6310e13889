"""Pure logic of _nvml and nvml_verify: GPU selectors, memory no visible process accounts for,
pid liveness (against real processes and a real zombie), the time bounds on NVML calls (one
call, and the deadline over a whole job), the input checks, and the sentences each check
produces from what was read."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from tests.run_module import ensure_collection_link

sys.path.insert(0, str(ensure_collection_link()))
# pylint: disable=wrong-import-position
from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml  # noqa: E402
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES  # noqa: E402
from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml_verify_module as nvml_verify  # noqa: E402

UUIDS = ["GPU-0000000%d-aaaa-bbbb-cccc-dddddddddddd" % index for index in range(4)]


def bus(index):
    return "00000000:1%d:00.0" % index


def label(index):
    return "GPU %d (%s, %s)" % (index, UUIDS[index], bus(index))


def clean_gpu(index):
    return {"index": index, "uuid": UUIDS[index], "name": "NVIDIA H200", "pci_bus_id": bus(index),
            "minor_number": index, "unreachable": None,
            "memory_total_mib": 143771, "memory_used_mib": 0, "memory_reserved_mib": 615,
            "memory_used_v1_mib": 615, "processes": [], "ecc_uncorrected_volatile": 0,
            "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
            "retired_pages_pending": None}


@pytest.fixture
def gpus():
    return [clean_gpu(i) for i in range(4)]


@pytest.fixture
def snap():
    """What _nvml.snapshot() returns for gpu_reset."""
    return {"driver_version": "570.133.20", "count": 4, "gpus": [clean_gpu(i) for i in range(4)], "lost": []}


def params(**overrides):
    base = {"gpus": [], "expected_count": None, "max_memory_used_mib": 16, "allow_processes": False,
            "timeout": 30.0, "poll_interval": 0.1, "call_timeout": 5.0, "checks": list(nvml_verify.CHECKS)}
    base.update(overrides)
    return base


# ----- selectors -----

@pytest.mark.parametrize("selector, parsed", [
    ("3", ("index", 3)), (" 0 ", ("index", 0)), (7, ("index", 7)), ("0012", ("index", 12)),
    (UUIDS[1].upper(), ("uuid", UUIDS[1])),
    ("00000000:5D:00.0", ("pci_bus_id", "00000000:5D:00.0")),
    ("0000:5d:00.0", ("pci_bus_id", "00000000:5D:00.0")),
    ("0:5d:0", ("pci_bus_id", "00000000:5D:00.0")),
    ("5d:00.0", ("pci_bus_id", "00000000:5D:00.0")),
    ("1:db:00.1", ("pci_bus_id", "00000001:DB:00.1")),
])
def test_parse_selector_forms(selector, parsed):
    assert _nvml.parse_selector(selector) == parsed


@pytest.mark.parametrize("selector", ["", " ", "-1", -1, True, None, "\u00b2", "\u0663", "1.5", "GPU-", "GPU-nope",
                                      "MIG-00000001-aaaa-bbbb-cccc-dddddddddddd", "5d:00", "0000:5d:00.9", "0\n1",
                                      "../0", "0000:5g:00.0"])
def test_parse_selector_refuses_what_is_no_selector(selector):
    assert _nvml.parse_selector(selector) is None


def test_same_bus_id_across_spellings():
    assert _nvml.same_bus_id("00000000:1B:00.0", "0000:1b:00.0")
    assert not _nvml.same_bus_id("00000000:1B:00.0", "0000:1c:00.0")
    assert not _nvml.same_bus_id(None, "0000:1b:00.0")


def test_describe_gpu_names_index_uuid_and_bus_id():
    assert _nvml.describe_gpu(clean_gpu(2)) == label(2)
    assert _nvml.describe_gpu({"index": 3, "uuid": None, "pci_bus_id": None}) == \
        "GPU 3 (UUID unknown, PCI bus id unknown)"
    assert _nvml.describe_gpu({"index": None, "uuid": UUIDS[1], "pci_bus_id": None}) == \
        "GPU at an unknown index (%s, PCI bus id unknown)" % UUIDS[1]


# ----- resolve_gpus (gpu_reset's selection from one snapshot) -----

def test_resolve_all_when_empty(snap):
    assert _nvml.resolve_gpus(snap, []) == [0, 1, 2, 3]
    assert _nvml.resolve_gpus(snap, None) == [0, 1, 2, 3]


def test_resolve_indices_uuids_and_bus_ids_sorted_and_unique(snap):
    assert _nvml.resolve_gpus(snap, [3, "1", UUIDS[3].upper(), " 0 ", "0000:12:00.0"]) == \
        [0, 1, 2, 3]


@pytest.mark.parametrize("selector", [4, "17", "GPU-unknown", True, "-1", "\u00b2", "0000:99:00.0"])
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
    snap["lost"].append({"index": 2, "uuid": None, "pci_bus_id": None, "error": "GPU is lost"})
    assert _nvml.resolve_gpus(snap, ["2"]) == [2]


# ----- unattributed_mib -----

def test_unattributed_counts_only_processes_that_exist():
    gpu = clean_gpu(0)
    gpu["memory_used_mib"] = 5000
    gpu["processes"] = [{"pid": 10, "used_mib": 3000, "type": "compute", "exists": True},
                        {"pid": 11, "used_mib": 2000, "type": "compute", "exists": False}]
    assert _nvml.unattributed_mib(gpu) == 2000


def test_unattributed_counts_a_compute_and_graphics_process_once():
    """Counted twice, pid 10's 3000 MiB would hide the 2000 MiB nobody here accounts for."""
    gpu = clean_gpu(0)
    gpu["memory_used_mib"] = 5000
    gpu["processes"] = [{"pid": 10, "used_mib": 3000, "type": "compute", "exists": True},
                        {"pid": 10, "used_mib": 3000, "type": "graphics", "exists": True}]
    assert _nvml.unattributed_mib(gpu) == 2000


def test_unattributed_unknown_when_a_visible_share_is_unknown():
    gpu = clean_gpu(0)
    gpu["memory_used_mib"] = 3000
    gpu["processes"] = [{"pid": 10, "used_mib": None, "type": "compute", "exists": True}]
    assert _nvml.unattributed_mib(gpu) is None


# ----- the time bounds -----

def test_a_call_that_never_returns_is_given_up_and_later_calls_fail_at_once():
    caller = _nvml._BoundedCaller(0.2)  # pylint: disable=protected-access
    release = threading.Event()
    try:
        assert caller.call("quick", lambda: 42) == 42
        with pytest.raises(_nvml.NvmlTimeout) as caught:
            caller.call("nvmlDeviceGetMemoryInfo_v2 on GPU 6", release.wait)
        assert str(caught.value).startswith("NVML call nvmlDeviceGetMemoryInfo_v2 on GPU 6 did not return within 0.2 s")
        assert caught.value.cause == "call_timeout"
        # The worker is still stuck: the next call must not queue behind it.
        with pytest.raises(_nvml.NvmlError, match="NVML is not answering: nvmlDeviceGetMemoryInfo_v2 on GPU 6"):
            caller.call("nvmlDeviceGetCount", lambda: 8)
    finally:
        release.set()


def test_the_deadline_cuts_a_job_of_calls_that_each_answer_in_time():
    # Each call would answer within call_timeout (60 s); the deadline, 0.3 s away, comes first.
    gpu = {"index": 4, "uuid": UUIDS[0], "pci_bus_id": bus(0)}
    caller = _nvml._BoundedCaller(60, deadline=time.monotonic() + 0.3, budget_s=0.3)  # pylint: disable=protected-access
    release, finished, made = threading.Event(), threading.Event(), []

    def job():
        try:
            caller.step("first", gpu, release.wait, 30)
            caller.step("second", gpu, made.append, "second")
        finally:
            finished.set()
    with pytest.raises(_nvml.NvmlTimeout) as caught:
        caller.run(job)
    assert (caught.value.cause, caught.value.call, caught.value.gpu) == ("timeout", "first", gpu)
    assert str(caught.value).startswith("the 0.3 s timeout ran out while NVML call first on %s had been running for"
                                        % "GPU 4 (%s, %s)" % (UUIDS[0], bus(0)))
    assert caught.value.as_dict()["index"] == 4
    release.set()
    assert finished.wait(30)
    assert made == [] and caller.stuck is not None  # abandoned: the second call was never made


def test_a_call_error_reaches_the_caller():
    caller = _nvml._BoundedCaller(5)  # pylint: disable=protected-access
    try:
        with pytest.raises(ZeroDivisionError):
            caller.call("divide", lambda: 1 // 0)
        assert caller.call("after", lambda: "fine") == "fine"
    finally:
        caller.stop()


def test_sink_keeps_what_came_before_close_only():
    sink = _nvml.Sink()
    sink.put(0, "read")
    assert sink.close() == {0: "read"}
    sink.put(1, "late")
    assert sink.close() == {0: "read"}


# ----- nvml_verify: inputs -----

# Each option's upper bound, as the sentences state it (the range itself is _ranges.py's).
TOP = {option: rule.maximum for option, rule in RANGES["nvml_verify"].items()}


@pytest.mark.parametrize("overrides, expected", [
    ({"timeout": -0.5}, ["timeout must be 0 or more seconds, got -0.5"]),
    ({"timeout": float("nan")}, ["timeout must be a finite number of seconds, got nan"]),
    ({"timeout": TOP["timeout"] + 0.5}, ["timeout must be %s or less seconds, got %s" % (TOP["timeout"], TOP["timeout"] + 0.5)]),
    ({"poll_interval": 0.0}, ["poll_interval must be more than 0 seconds, got 0.0"]),
    ({"poll_interval": float("inf")}, ["poll_interval must be a finite number of seconds, got inf"]),
    ({"call_timeout": -1.0}, ["call_timeout must be more than 0 seconds, got -1.0"]),
    ({"max_memory_used_mib": -1}, ["max_memory_used_mib must be 0 or more MiB, got -1"]),
    ({"max_memory_used_mib": True}, ["max_memory_used_mib must be a number of MiB, got True"]),
    ({"expected_count": 0}, ["expected_count must be 1 or more GPUs, got 0"]),
    # The upper bounds the node_reset role always had, now the module's own (module_utils/_ranges.py).
    ({"expected_count": TOP["expected_count"] + 1},
     ["expected_count must be %s or less GPUs, got %s" % (TOP["expected_count"], TOP["expected_count"] + 1)]),
    ({"max_memory_used_mib": TOP["max_memory_used_mib"] + 1},
     ["max_memory_used_mib must be %s or less MiB, got %s" % (TOP["max_memory_used_mib"], TOP["max_memory_used_mib"] + 1)]),
    ({"checks": []}, ["checks is empty, so any GPU would pass; name at least one of memory, processes, count, ecc,"
                      " remapped_rows, retired_pages, xid"]),
    ({"gpus": ["0", "x", ""]}, ["gpus entry 'x' is not %s" % _nvml.SELECTOR_FORMS,
                                "gpus entry '' is not %s" % _nvml.SELECTOR_FORMS]),
    ({"timeout": -1.0, "expected_count": -2}, ["timeout must be 0 or more seconds, got -1.0",
                                               "expected_count must be 1 or more GPUs, got -2"]),
    ({}, []),
    ({"timeout": 0.0, "max_memory_used_mib": 0, "gpus": ["0", UUIDS[1], "0000:18:00.0"]}, []),
])
def test_input_problems(overrides, expected):
    assert nvml_verify.input_problems(params(**overrides)) == expected


# ----- nvml_verify: checks and sentences -----

def test_clean_gpus_pass(gpus):
    reported, host, ok, lasting = nvml_verify.evaluate(gpus, 4, params(expected_count=4))
    assert ok and not lasting and host == [] and all(gpu["problems"] == [] for gpu in reported)
    assert "unreachable" not in reported[0] and "handle" not in reported[0]
    assert reported[2]["pci_bus_id"] == bus(2) and reported[2]["minor_number"] == 2


def test_memory_limit_is_inclusive_and_can_be_waited_for(gpus):
    gpus[1]["memory_used_mib"] = 16
    assert nvml_verify.evaluate([gpus[1]], 4, params())[2] is True
    gpus[1]["memory_used_mib"] = 17
    reported, _host, ok, lasting = nvml_verify.evaluate([gpus[1]], 4, params())
    assert not ok and not lasting
    assert reported[0]["problems"][0].startswith(
        label(1) + ": 17 MiB of memory used (v2, 615 MiB driver-reserved not counted)")


def test_processes_allowed_still_checks_memory(gpus):
    gpus[0]["memory_used_mib"] = 900
    gpus[0]["processes"] = [{"pid": 77, "used_mib": 900, "type": "compute", "exists": True}]
    reported, _host, ok, _lasting = nvml_verify.evaluate([gpus[0]], 4, params(allow_processes=True))
    assert not ok and len(reported[0]["problems"]) == 1 and "900 MiB of memory used" in reported[0]["problems"][0]
    assert nvml_verify.evaluate([gpus[0]], 4, params(allow_processes=True, max_memory_used_mib=1024))[2] is True


def test_a_limit_no_gpu_can_reach_is_a_lasting_problem(gpus):
    reported, _host, ok, lasting = nvml_verify.evaluate([gpus[0]], 4, params(max_memory_used_mib=10 ** 30))
    assert not ok and lasting
    assert "could never fail" in reported[0]["problems"][0]
    assert nvml_verify.evaluate([gpus[0]], 4, params(max_memory_used_mib=143770))[2] is True


def test_unselected_check_is_ignored(gpus):
    gpus[2]["remapped_rows"]["pending"] = True
    assert nvml_verify.evaluate([gpus[2]], 4, params(checks=["memory", "ecc"]))[2] is True
    reported, _host, ok, lasting = nvml_verify.evaluate([gpus[2]], 4, params(checks=["remapped_rows"]))
    assert not ok and lasting and reported[0]["problems"] == [
        label(2) + ": Row remapping pending (correctable 0, uncorrectable 0): reset the GPU (nvidia-smi -r -i 2) or"
        " reboot to apply it."]


def test_not_supported_counters_pass(gpus):
    for gpu in gpus:
        gpu["ecc_uncorrected_volatile"] = None
        gpu["remapped_rows"] = None
        gpu["retired_pages_pending"] = None
    assert nvml_verify.evaluate(gpus, 4, params())[2] is True


def test_lost_selected_gpu_fails_whatever_the_checks(gpus):
    gpus[3]["unreachable"] = {"call": "nvmlDeviceGetMemoryInfo_v2", "error": "GPU is lost", "lost": True}
    reported, _host, ok, lasting = nvml_verify.evaluate([gpus[3]], 4, params(checks=["ecc"]))
    assert not ok and lasting
    assert reported[0]["uuid"] == UUIDS[3]  # known from before it was lost
    assert reported[0]["problems"] == [
        label(3) + ": lost (NVML: GPU is lost): it fell off the bus or stopped answering; check dmesg for Xid 79,"
        " then reboot or power-cycle the host."]


def test_an_unreadable_gpu_names_the_call_and_nvmls_words(gpus):
    gpus[1]["unreachable"] = {"call": "nvmlDeviceGetUUID", "error": "Unknown Error", "lost": False}
    reported, _host, ok, lasting = nvml_verify.evaluate([gpus[1]], 4, params())
    assert not ok and lasting
    assert reported[0]["problems"] == [label(1) + ": NVML cannot read it (nvmlDeviceGetUUID: Unknown Error): check"
                                                  " dmesg for Xid errors, then reset the GPU (nvidia-smi -r -i 1) or reboot."]


def test_count_below_expected_is_a_host_problem(gpus):
    _reported, host, ok, lasting = nvml_verify.evaluate(gpus[:3], 3, params(expected_count=4))
    assert not ok and lasting and host[0].startswith("NVML lists 3 GPUs, 4 expected")
    assert "moved down one index" not in host[0]  # every GPU selected: no index was given
    assert nvml_verify.evaluate(gpus[:3], 3, params(expected_count=4, checks=["memory"]))[2] is True


def test_count_below_expected_with_indices_selected_warns_of_the_shift_whatever_the_checks(gpus):
    for checks in (list(nvml_verify.CHECKS), ["memory"]):
        _reported, host, ok, _lasting = nvml_verify.evaluate(
            [gpus[1]], 3, params(expected_count=4, gpus=["1"], checks=checks))
        assert not ok and host[0].endswith("so gpus given by index may name other cards than meant: select them by"
                                           " UUID or PCI bus id.")
    by_uuid = nvml_verify.evaluate([gpus[1]], 3, params(expected_count=4, gpus=[UUIDS[1]], checks=["memory"]))
    assert by_uuid[2] is True


def test_count_above_expected(gpus):
    _reported, host, ok, _lasting = nvml_verify.evaluate(gpus, 4, params(expected_count=2))
    assert not ok and host == ["NVML lists 4 GPUs, 2 expected: set expected_count to what this host has."]


def test_an_unfinished_call_is_told_on_its_gpu_and_the_unread_say_so(gpus):
    unread = {key: gpus[2][key] for key in ("index", "uuid", "pci_bus_id", "name", "minor_number", "unreachable")}
    exc = _nvml.NvmlTimeout("nvmlDeviceGetMemoryInfo_v2", {"index": 1, "uuid": UUIDS[1], "pci_bus_id": bus(1)},
                            0.95, 1.0, "timeout")
    reported, host, ok, lasting = nvml_verify.evaluate([gpus[0], gpus[1], unread], 4, params(timeout=1.0), exc)
    assert not ok and lasting and host == []
    assert reported[0]["problems"] == []
    assert reported[1]["problems"] == [
        label(1) + ": NVML call nvmlDeviceGetMemoryInfo_v2 had been running for 0.9 s when the 1 s timeout ran out:"
        " NVML answers slowly or the GPU is hung; check dmesg for Xid errors, and give a longer timeout if NVML is"
        " only slow."]
    assert reported[2]["problems"] == [label(2) + ": not read: time ran out before NVML got to this GPU."]
    assert reported[2]["memory_used_mib"] is None and reported[2]["unattributed_mib"] is None


def test_an_unfinished_system_call_is_a_host_problem():
    exc = _nvml.NvmlTimeout("nvmlInit", None, 2.0, 2.0, "timeout")
    _reported, host, ok, _lasting = nvml_verify.evaluate([], None, params(timeout=0.0, call_timeout=2.0), exc)
    assert not ok and host == [
        "NVML call nvmlInit had been running for 2.0 s when the 2 s that timeout 0 gives its one read (call_timeout)"
        " ran out: NVML answers slowly or the GPU is hung; check dmesg for Xid errors, and give a longer timeout if"
        " NVML is only slow."]


def test_an_unfinished_call_on_a_gpu_not_pinned_yet_is_a_host_problem_named_for_that_gpu():
    exc = _nvml.NvmlTimeout("nvmlDeviceGetUUID", {"index": 2, "uuid": None, "pci_bus_id": None}, 5.0, 5.0,
                            "call_timeout")
    _reported, host, ok, _lasting = nvml_verify.evaluate([], 4, params(), exc)
    assert not ok and host == [
        "GPU 2 (UUID unknown, PCI bus id unknown): NVML call nvmlDeviceGetUUID did not return within 5 s"
        " (call_timeout): the GPU or its driver is hung; check dmesg for Xid errors, then reset the GPU"
        " (nvidia-smi -r -i 2) or reboot."]


def test_failure_message_names_each_failing_gpu_only(gpus):
    gpus[1]["ecc_uncorrected_volatile"] = 5
    reported, host, _ok, _lasting = nvml_verify.evaluate(gpus, 4, params())
    msg = nvml_verify.failure_message(reported, host, 30.04, 301)
    assert msg.startswith("GPUs not clean after 30.0 s (301 NVML reads): %s: 5 uncorrected" % label(1))
    assert "GPU 0" not in msg and "GPU 2" not in msg
    assert ", no longer polling" in nvml_verify.failure_message(reported, host, 0.01, 1, early=True)


def test_context_overhead_under_the_limit_is_not_called_unattributed(gpus):
    # What a real H200 showed: the holder's listed share is 8 MiB below the GPU's "used".
    gpus[0]["memory_used_mib"] = 4622
    gpus[0]["processes"] = [{"pid": 468, "used_mib": 4614, "type": "compute", "exists": True}]
    reported, _host, ok, _lasting = nvml_verify.evaluate([gpus[0]], 4, params())
    assert not ok
    assert reported[0]["unattributed_mib"] == 8
    assert not any("no visible process" in problem for problem in reported[0]["problems"])
    gpus[0]["processes"][0]["used_mib"] = 2000
    reported, _host, _ok, _lasting = nvml_verify.evaluate([gpus[0]], 4, params())
    assert "2622 MiB is memory used with no visible process" in reported[0]["problems"][1]
