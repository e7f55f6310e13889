"""The fake libnvidia-ml.so.1, read through the unmodified pynvml in a separate process.

Every holder here is a real process this test started (sleep, or a python that forks), and
every kill targets only those pids or their own process group.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fixtures.fake_nvml import BuildError, FakeNvml, build_library
from tests.fixtures.fake_nvml.probe import NvmlError, NvmlProbe

REPO = Path(__file__).resolve().parents[2]
IDLE = {"v1_total": 143771, "v1_used": 615, "v1_free": 143771 - 615,
        "v2_total": 143771, "v2_reserved": 615, "v2_used": 0, "v2_free": 143771 - 615}


@contextmanager
def sleeper():
    """A real process that lives until the test ends (or kills it)."""
    process = subprocess.Popen(["sleep", "600"])  # pylint: disable=consider-using-with
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    return text[text.rindex(")") + 2]


def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    """Generous wait for something the kernel does asynchronously (a process dying)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def probe(fake_nvml):
    """A pynvml process pointed at this test's fake state, already initialised."""
    with NvmlProbe(fake_nvml.env()) as running:
        running("n.nvmlInit()")
        yield running


def test_idle_h200_reads_reserved_memory_in_v1_only(probe, fake_nvml):
    assert probe("n.nvmlDeviceGetCount()") == 8
    assert probe("n.nvmlSystemGetDriverVersion()") == "570.133.20"
    for index in range(8):
        assert probe(f"memory(handle({index}))") == IDLE
        assert probe(f"processes(handle({index}))") == []
        assert probe(f"processes(handle({index}), 'graphics')") == []
        assert probe(f"n.nvmlDeviceGetUUID(handle({index}))") == fake_nvml.uuids[index]
        assert probe(f"n.nvmlDeviceGetIndex(handle({index}))") == index
    assert probe("n.nvmlDeviceGetName(handle(0))") == "NVIDIA H200"
    assert probe("n.nvmlDeviceGetPciInfo(handle(0)).busId") == "00000000:18:00.0"
    assert probe("n.nvmlDeviceGetPciInfo(handle(7)).busId") == "00000000:DB:00.0"
    assert probe("n.nvmlDeviceGetPersistenceMode(handle(0))") == 1
    assert probe("n.nvmlDeviceGetTotalEccErrors(handle(0), 1, 0)") == 0
    assert probe("n.nvmlDeviceGetRemappedRows(handle(0))") == [0, 0, 0, 0]
    assert probe("n.nvmlDeviceGetRetiredPagesPendingStatus(handle(0))") == 0


def test_uuids_are_deterministic_and_distinct(tmp_path, fake_nvml_lib):
    first = FakeNvml(tmp_path / "a", fake_nvml_lib).create(gpu_count=8)
    second = FakeNvml(tmp_path / "b", fake_nvml_lib).create(gpu_count=8)
    assert first == second
    assert len(set(first)) == 8
    assert all(len(uuid) == 40 and uuid.startswith("GPU-") and uuid.count("-") == 5 for uuid in first)


def test_handle_by_uuid_and_unknown_uuid(probe, fake_nvml):
    uuid = fake_nvml.uuids[5]
    assert probe(f"n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID({uuid!r}))") == 5
    with pytest.raises(NvmlError) as error:
        probe("n.nvmlDeviceGetHandleByUUID('GPU-00000000-0000-0000-0000-000000000000')")
    assert error.value.name == "NVMLError_NotFound"
    with pytest.raises(NvmlError) as error:
        probe("handle(8)")
    assert error.value.name == "NVMLError_InvalidArgument"


def test_live_holder_counts_and_killing_it_frees_the_memory(probe, fake_nvml):
    with sleeper() as holder:
        fake_nvml.register(holder.pid, 3, 70000)
        assert probe("memory(handle(3))")["v2_used"] == 70000
        assert probe("memory(handle(3))")["v1_used"] == 70615
        assert probe("memory(handle(3))")["v2_free"] == 143771 - 615 - 70000
        assert probe("processes(handle(3))") == [[holder.pid, 70000]]
        assert probe("memory(handle(2))") == IDLE
        holder.kill()
        holder.wait()
        assert probe("memory(handle(3))") == IDLE
        assert probe("processes(handle(3))") == []


def test_holders_on_one_gpu_add_up_and_graphics_is_listed_apart(probe, fake_nvml):
    with sleeper() as first, sleeper() as second, sleeper() as display:
        fake_nvml.register(first.pid, 0, 1000)
        fake_nvml.register(second.pid, 0, 2000)
        fake_nvml.register(display.pid, 0, 300, kind="graphics")
        assert probe("memory(handle(0))")["v2_used"] == 3300
        assert probe("processes(handle(0))") == sorted([[first.pid, 1000], [second.pid, 2000]])
        assert probe("processes(handle(0), 'graphics')") == [[display.pid, 300]]
        fake_nvml.unregister(second.pid)
        assert probe("memory(handle(0))")["v2_used"] == 1300


def test_zombie_holder_holds_nothing(probe, fake_nvml):
    with sleeper() as holder:
        fake_nvml.register(holder.pid, 1, 5000)
        assert probe("memory(handle(1))")["v2_used"] == 5000
        holder.kill()  # not reaped yet: it stays a zombie until wait()
        wait_until(lambda: proc_state(holder.pid) == "Z", "the killed holder to become a zombie")
        assert probe("memory(handle(1))") == IDLE
        assert probe("processes(handle(1))") == []


def test_dead_parent_listed_while_forked_child_holds_the_memory(probe, fake_nvml):
    # The parent forks a child that outlives it, as a crashed engine leaves a worker behind.
    parent = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", "import os, time\npid = os.fork()\n"
         "if pid == 0:\n    time.sleep(600)\nelse:\n    print(pid, flush=True)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    group = parent.pid  # its own session: the child is in this group and nothing else is
    try:
        child = int(parent.stdout.readline())
        parent.wait()
        assert proc_state(parent.pid) is None
        fake_nvml.register(child, 4, 8192, reported_pid=parent.pid)
        assert probe("processes(handle(4))") == [[parent.pid, 8192]]
        assert probe("memory(handle(4))")["v2_used"] == 8192
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: proc_state(child) in (None, "Z"), "the forked child to die")
        assert probe("processes(handle(4))") == []
        assert probe("memory(handle(4))") == IDLE
    finally:
        parent.stdout.close()
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_driver_not_loaded_fails_init(fake_nvml):
    fake_nvml.inject("driver_not_loaded")
    with NvmlProbe(fake_nvml.env()) as probe:
        with pytest.raises(NvmlError) as error:
            probe("n.nvmlInit()")
        assert error.value.name == "NVMLError_DriverNotLoaded"
        assert error.value.code == 9
        fake_nvml.clear("driver_not_loaded")
        probe("n.nvmlInit()")
        assert probe("n.nvmlDeviceGetCount()") == 8


def test_missing_state_reads_as_no_driver(tmp_path, fake_nvml_lib):
    missing = FakeNvml(tmp_path / "never-created", fake_nvml_lib)
    with NvmlProbe(missing.env()) as probe:
        with pytest.raises(NvmlError) as error:
            probe("n.nvmlInit()")
    assert error.value.name == "NVMLError_DriverNotLoaded"


def test_library_error_is_a_version_mismatch(fake_nvml):
    fake_nvml.inject("library_error")
    with NvmlProbe(fake_nvml.env()) as probe:
        with pytest.raises(NvmlError) as error:
            probe("n.nvmlInit()")
    assert error.value.name == "NVMLError_LibRmVersionMismatch"


def test_calls_after_shutdown_are_uninitialized(probe):
    probe("n.nvmlShutdown()")
    with pytest.raises(NvmlError) as error:
        probe("n.nvmlDeviceGetCount()")
    assert error.value.name == "NVMLError_Uninitialized"


def test_lost_gpu_stays_enumerated_and_answers_gpu_is_lost(probe, fake_nvml):
    # What a real driver does after Xid 79 ("fallen off the bus"): the GPU still counts and keeps
    # its index, but nvidia-smi says "Unable to determine the device handle for GPU ...: GPU is lost".
    probe("store('h2', handle(2))")
    fake_nvml.inject("gpu_lost", gpu=2)
    assert probe("n.nvmlDeviceGetCount()") == 8
    for lookup in ("handle(2)", "memory(h2)", f"n.nvmlDeviceGetHandleByUUID({fake_nvml.uuids[2]!r})",
                   "n.nvmlDeviceGetHandleByPciBusId('00000000:3A:00.0')"):
        with pytest.raises(NvmlError) as error:
            probe(lookup)
        assert error.value.name == "NVMLError_GpuIsLost", lookup
    # The others keep their indices.
    assert probe("n.nvmlDeviceGetUUID(handle(3))") == fake_nvml.uuids[3]
    assert probe("n.nvmlDeviceGetIndex(handle(7))") == 7
    fake_nvml.clear()
    assert probe("memory(h2)") == IDLE


def test_removed_gpu_leaves_the_enumeration_and_the_next_ones_shift(probe, fake_nvml):
    # After a driver reload that could not probe it ("NVIDIA probe routine failed for 1 device(s)").
    probe("store('h2', handle(2))")
    probe("store('h3', handle(3))")
    fake_nvml.inject("gpu_removed", gpu=2)
    assert probe("n.nvmlDeviceGetCount()") == 7
    listed = probe("[n.nvmlDeviceGetUUID(handle(i)) for i in range(n.nvmlDeviceGetCount())]")
    assert listed == fake_nvml.uuids[:2] + fake_nvml.uuids[3:]
    assert probe("n.nvmlDeviceGetIndex(h3)") == 2  # the old GPU 3 is index 2 now
    with pytest.raises(NvmlError) as error:
        probe("memory(h2)")
    assert error.value.name == "NVMLError_GpuIsLost"
    for lookup in (f"n.nvmlDeviceGetHandleByUUID({fake_nvml.uuids[2]!r})",
                   "n.nvmlDeviceGetHandleByPciBusId('00000000:3A:00.0')"):
        with pytest.raises(NvmlError) as error:
            probe(lookup)
        assert error.value.name == "NVMLError_NotFound", lookup
    with pytest.raises(NvmlError) as error:
        probe("handle(7)")
    assert error.value.name == "NVMLError_InvalidArgument"


@pytest.mark.parametrize("bus_id", ["00000000:5D:00.0", "0000:5d:00.0", "0:5d:0", "5d:00.0"])
def test_handle_by_pci_bus_id_in_every_form_nvml_accepts(probe, bus_id):
    assert probe(f"n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId({bus_id!r}))") == 3


def test_calls_are_recorded_with_the_gpu_they_touched(probe, fake_nvml):
    probe("handle(1)")
    assert fake_nvml.calls() == []  # nothing is recorded until asked
    fake_nvml.record_calls()
    probe("memory(handle(4))")
    probe(f"n.nvmlDeviceGetHandleByUUID({fake_nvml.uuids[6]!r})")
    probe("n.nvmlDeviceGetCount()")
    calls = [(row["call"], row["gpu"]) for row in fake_nvml.calls()]
    assert calls == [("nvmlDeviceGetHandleByIndex_v2", 4), ("nvmlDeviceGetMemoryInfo", 4),
                     ("nvmlDeviceGetMemoryInfo_v2", 4), ("nvmlDeviceGetHandleByUUID", 6),
                     ("nvmlDeviceGetCount_v2", None)]
    assert {row["pid"] for row in fake_nvml.calls()} == {probe("__import__('os').getpid()")}
    fake_nvml.create(gpu_count=8)  # a fresh state records nothing again
    probe("n.nvmlDeviceGetCount()")
    assert fake_nvml.calls() == []


def test_init_delay_slows_nvml_init_only(fake_nvml):
    fake_nvml.inject("init_delay", seconds=1.5)
    with NvmlProbe(fake_nvml.env()) as probe:
        # A lower bound only: the injected sleep can never return early.
        assert probe("(lambda t: (n.nvmlInit(), __import__('time').monotonic() - t)[1])"
                     "(__import__('time').monotonic())") >= 1.5
        assert probe("n.nvmlDeviceGetCount()") == 8


def test_stuck_memory_is_used_with_no_process(probe, fake_nvml):
    fake_nvml.inject("stuck_memory", gpu=6, mib=2048)
    assert probe("memory(handle(6))")["v2_used"] == 2048
    assert probe("memory(handle(6))")["v1_used"] == 2048 + 615
    assert probe("processes(handle(6))") == []
    assert probe("memory(handle(5))") == IDLE


def test_uncorrected_ecc_errors(probe, fake_nvml):
    fake_nvml.inject("ecc_uncorrected", gpu=1, count=3)
    assert probe("n.nvmlDeviceGetTotalEccErrors(handle(1), n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)") == 3
    assert probe("n.nvmlDeviceGetTotalEccErrors(handle(1), n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC)") == 3
    assert probe("n.nvmlDeviceGetTotalEccErrors(handle(1), n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)") == 0
    assert probe("n.nvmlDeviceGetTotalEccErrors(handle(0), n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)") == 0
    with pytest.raises(NvmlError) as error:
        probe("n.nvmlDeviceGetTotalEccErrors(handle(1), 7, n.NVML_VOLATILE_ECC)")
    assert error.value.name == "NVMLError_InvalidArgument"


def test_row_remap_pending_and_failed(probe, fake_nvml):
    fake_nvml.inject("remap_pending", gpu=0)
    fake_nvml.inject("remap_failed", gpu=7)
    # (correctable rows, uncorrectable rows, pending, failure occurred)
    assert probe("n.nvmlDeviceGetRemappedRows(handle(0))") == [0, 1, 1, 0]
    assert probe("n.nvmlDeviceGetRemappedRows(handle(7))") == [0, 0, 0, 1]
    assert probe("n.nvmlDeviceGetRemappedRows(handle(3))") == [0, 0, 0, 0]


def test_retired_pages_pending_and_not_supported(probe, fake_nvml):
    fake_nvml.inject("retired_pages_pending", gpu=2)
    assert probe("n.nvmlDeviceGetRetiredPagesPendingStatus(handle(2))") == 1
    assert probe("n.nvmlDeviceGetRetiredPagesPendingStatus(handle(3))") == 0
    fake_nvml.inject("retired_pages_not_supported")
    for index in (2, 3):
        with pytest.raises(NvmlError) as error:
            probe(f"n.nvmlDeviceGetRetiredPagesPendingStatus(handle({index}))")
        assert error.value.name == "NVMLError_NotSupported"


def test_hang_delays_memory_and_process_calls_on_that_gpu(probe, fake_nvml):
    fake_nvml.inject("hang", gpu=5, seconds=1.5)
    probe("store('h5', handle(5))")  # taking a handle does not hang
    # A lower bound only: the injected sleep can never return early.
    elapsed = probe("(lambda t: (memory(h5), __import__('time').monotonic() - t)[1])"
                    "(__import__('time').monotonic())")
    assert elapsed >= 1.5
    elapsed = probe("(lambda t: (processes(h5), __import__('time').monotonic() - t)[1])"
                    "(__import__('time').monotonic())")
    assert elapsed >= 1.5
    fake_nvml.clear("hang")
    assert probe("memory(handle(5))") == IDLE


def test_memory_v2_with_a_wrong_version_is_refused(probe):
    with pytest.raises(NvmlError) as error:
        probe("n.nvmlDeviceGetMemoryInfo(handle(0), version=1)")
    assert error.value.name == "NVMLError_ArgumentVersionMismatch"


@pytest.mark.parametrize("call, message", [
    (lambda f: f.inject("melted"), "unknown fault 'melted'"),
    (lambda f: f.inject("stuck_memory", gpu=1), "needs mib="),
    (lambda f: f.inject("stuck_memory", gpu=9, mib=5), "gpu must be a GPU index from 0 to 7"),
    (lambda f: f.inject("hang", gpu=1, seconds=2, mib=3), "not mib"),
    (lambda f: f.inject("gpu_lost"), "needs gpu="),
    (lambda f: f.inject("gpu_removed", gpu=8), "gpu must be a GPU index from 0 to 7"),
    (lambda f: f.inject("init_delay", gpu=1, seconds=1.0), "takes seconds, not gpu"),
    (lambda f: f.inject("hang", seconds=float("nan")), "needs seconds=<positive float>"),
    (lambda f: f.register(os.getpid(), 0, -5), "mib must be a non-negative integer"),
    (lambda f: f.register(os.getpid(), 0, 5, kind="video"), "kind must be one of compute, graphics"),
])
def test_bad_input_is_one_clear_error_and_changes_nothing(fake_nvml, call, message):
    with pytest.raises(ValueError, match=message):
        call(fake_nvml)
    assert fake_nvml.faults() == []
    assert fake_nvml.registrations() == []


def test_registering_a_dead_pid_is_refused(fake_nvml):
    with sleeper() as holder:
        holder.kill()
        holder.wait()
        with pytest.raises(ValueError, match=f"pid {holder.pid} is not a running process"):
            fake_nvml.register(holder.pid, 0, 100)
    assert fake_nvml.registrations() == []


def test_build_is_reused_until_the_source_changes(tmp_path):
    out = build_library(tmp_path / "lib")
    library = out / "libnvidia-ml.so.1"
    first = library.stat().st_ino
    build_library(out)
    assert library.stat().st_ino == first  # same file: not rebuilt
    (out / "libnvidia-ml.so.1.sha256").write_text("stale\n")
    build_library(out)
    assert library.stat().st_ino != first  # a changed fingerprint rebuilds


def test_concurrent_builds_leave_one_loadable_library(tmp_path, fake_nvml_lib):
    out = tmp_path / "lib"
    code = f"from tests.fixtures.fake_nvml import build_library; build_library({str(out)!r})"
    builders = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO) for attempt in range(3)]  # pylint: disable=consider-using-with
    assert [builder.wait(timeout=300) for builder in builders] == [0, 0, 0]
    assert sorted(path.name for path in out.iterdir()) == ["libnvidia-ml.so.1", "libnvidia-ml.so.1.sha256"]
    state = FakeNvml(tmp_path / "nvml", out)
    state.create(gpu_count=2)
    with NvmlProbe(state.env()) as probe:
        probe("n.nvmlInit()")
        assert probe("n.nvmlDeviceGetCount()") == 2


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(BuildError, match="C compiler 'no-such-cc' not found"):
        build_library(tmp_path / "lib")
    assert not (tmp_path / "lib").exists()


def test_command_line_builds_and_drives_a_state(tmp_path):
    out = tmp_path / "lib"
    state_dir = tmp_path / "nvml"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tests.fixtures.fake_nvml", *map(str, args)],
                              cwd=REPO, capture_output=True, text=True, check=False, timeout=300)

    built = cli("build", out)
    assert built.returncode == 0, built.stderr
    assert (out / "libnvidia-ml.so.1").is_file()
    created = cli("create", state_dir, "--gpus", 2)
    assert created.stdout.split() == FakeNvml(state_dir).uuids
    assert cli("inject", state_dir, "stuck_memory", "gpu=1", "mib=64").returncode == 0
    refused = cli("inject", state_dir, "stuck_memory", "gpu=1")
    assert refused.returncode == 2 and "needs mib=" in refused.stderr
    with NvmlProbe(FakeNvml(state_dir, out).env()) as probe:
        probe("n.nvmlInit()")
        assert probe("memory(handle(1))")["v2_used"] == 64
