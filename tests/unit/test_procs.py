"""The /proc scan and process helpers in module_utils/_procs.py, against real processes
that this test starts and that hold files under its own temporary directory."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs
from tests.sim import procinfo

HOLD_OPEN = """
import sys, time
handles = [open(p, 'rb') for p in sys.argv[1:]]
print('ready', flush=True)
time.sleep(600)
"""

HOLD_MAPPED = """
import ctypes, os, sys, time
# libc mmap directly: Python's mmap module keeps a duplicate descriptor open.
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
assert libc.mmap(None, 4096, 1, 1, fd, 0) not in (None, ctypes.c_void_p(-1).value)  # PROT_READ, MAP_SHARED
os.close(fd)  # only the mapping is left
if len(sys.argv) > 2 and sys.argv[2] == 'unlink':
    os.unlink(sys.argv[1])
print('ready', flush=True)
time.sleep(600)
"""


def _start(code, *args):
    proc = subprocess.Popen([sys.executable, "-c", code] + [str(a) for a in args],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def started():
    procs = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _file(tmp_path, name, size=4096):
    path = tmp_path / name
    path.write_bytes(b"x" * size)
    return str(path)


def _fake_stat(proc, pid, state="S", starttime=500):
    """/proc/PID/stat in a /proc-shaped tree of the test's own."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = [state, "1"] + ["0"] * 17 + [str(starttime)] + ["0"] * 10
    (proc / str(pid) / "stat").write_text("%d (name) %s\n" % (pid, " ".join(fields)))


def holders_of(paths, proc=_procs.PROC):
    """{path: sorted pids that have it open or mapped}, from one pass of process_table."""
    table = _procs.process_table(proc=proc, paths=paths)
    return {path: sorted(pid for pid, stat in table.items() if path in stat["opened"] | stat["mapped"])
            for path in paths}


def test_open_file_holders_are_found_per_path(tmp_path, started):
    one, two, idle = _file(tmp_path, "one"), _file(tmp_path, "two"), _file(tmp_path, "idle")
    first = _start(HOLD_OPEN, one, two)
    second = _start(HOLD_OPEN, two)
    started.extend([first, second])
    holders = holders_of([one, two, idle])
    assert holders == {one: [first.pid], two: sorted([first.pid, second.pid]), idle: []}


def test_deleted_file_still_matches_its_old_path(tmp_path, started):
    opened, mapped = _file(tmp_path, "opened"), _file(tmp_path, "mapped")
    holder = _start(HOLD_OPEN, opened)
    mapper = _start(HOLD_MAPPED, mapped, "unlink")
    started.extend([holder, mapper])
    os.unlink(opened)
    holders = holders_of([opened, mapped])
    assert holders == {opened: [holder.pid], mapped: [mapper.pid]}


def test_exited_process_is_no_holder(tmp_path, started):
    path = _file(tmp_path, "gone")
    proc = _start(HOLD_OPEN, path)
    proc.kill()
    proc.wait()
    assert holders_of([path])[path] == []


def test_vanished_and_odd_proc_entries_are_skipped(tmp_path):
    # A /proc-shaped tree: one process holding the file, one that vanished (no stat, no fd
    # dir, no maps), one whose descriptor link points elsewhere, and a non-numeric entry.
    proc = tmp_path / "proc"
    target = "/dev/nvidia0"
    (proc / "10" / "fd").mkdir(parents=True)
    os.symlink(target, proc / "10" / "fd" / "3")
    os.symlink(target + _procs._DELETED, proc / "10" / "fd" / "4")
    (proc / "11").mkdir()
    (proc / "12" / "fd").mkdir(parents=True)
    os.symlink("/dev/null", proc / "12" / "fd" / "0")
    (proc / "self").mkdir()
    for pid in (10, 12):
        _fake_stat(proc, pid)
    assert holders_of([target], proc=str(proc)) == {target: [10]}


IGNORE_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('ready', flush=True)
time.sleep(600)
"""

SLEEP = """
import time
print('ready', flush=True)
time.sleep(600)
"""


def _starttime(pid):
    return _procs.read_stat(pid)["starttime"]


def test_read_stat_keeps_a_comm_with_spaces_and_parentheses(started):
    proc = _start("import ctypes, time\nctypes.CDLL(None).prctl(15, b'a) (b c', 0, 0, 0)\nprint('ready', flush=True)\n"
                  "time.sleep(600)")
    started.append(proc)
    stat = _procs.read_stat(proc.pid)
    assert stat["comm"] == "a) (b c"
    # Sleeping, or running for an instant; never "" or "SR", which a substring test would let pass.
    assert stat["ppid"] == os.getpid() and stat["state"] in ("S", "R")


def test_terminate_uses_sigterm_then_sigkill_for_an_ignorer(started):
    polite, stubborn = _start(SLEEP), _start(IGNORE_TERM)
    started.extend([polite, stubborn])
    outcome = _procs.terminate(
        [(polite.pid, _starttime(polite.pid)), (stubborn.pid, _starttime(stubborn.pid))], 0.5, 30)
    assert outcome["survivors"] == [] and outcome["signalled"] == 2 and outcome["refused"] == []
    assert dict((e["pid"], e["signal"]) for e in outcome["ended"]) == {polite.pid: "SIGTERM", stubborn.pid: "SIGKILL"}
    # Both were our children: terminate reaped them, so not even a zombie is left in /proc.
    assert not os.path.exists("/proc/%d" % polite.pid) and not os.path.exists("/proc/%d" % stubborn.pid)


def test_terminate_never_signals_a_pid_whose_start_time_differs(started):
    # The same pid with another start time is another process (pid reuse): leave it alone.
    proc = _start(SLEEP)
    started.append(proc)
    outcome = _procs.terminate([(proc.pid, _starttime(proc.pid) + 1)], 0.1, 0.1)
    assert outcome == {"ended": [], "survivors": [], "signalled": 0, "refused": []}
    assert proc.poll() is None


def test_descendants_do_not_walk_through_an_excluded_process():
    table = {10: {"ppid": 1}, 11: {"ppid": 10}, 12: {"ppid": 11}, 13: {"ppid": 10}, 14: {"ppid": 13}}
    index = _procs.children_index(table)
    assert _procs.descendants([10], index, lambda pid: False) == [11, 13, 12, 14]
    assert _procs.descendants([10], index, lambda pid: pid == 13) == [11, 12]


@pytest.mark.parametrize("names, comm, expected", [
    (["nvidia-persiste", "nvidia-persistenced"], "nvidia-persiste", True),
    (["nvidia-persiste", "python3"], "nvidia-persiste", True),   # truncated comm alone
    (["python3", "python3"], "python3", False),
    (["Xorg"], "Xorg", True),
    (["Xor"], "Xor", False),                                     # short comm is never a prefix match
])
def test_protected_names_allow_for_the_15_character_comm(names, comm, expected):
    protect = {"nvidia-persistenced", "Xorg"}
    assert _procs.name_is_protected(names, comm, protect) is expected


def test_process_table_reads_each_processs_open_and_mapped_files_with_its_identity(tmp_path, started):
    opened, mapped, idle = _file(tmp_path, "opened"), _file(tmp_path, "mapped"), _file(tmp_path, "idle")
    holder = _start(HOLD_OPEN, opened)
    mapper = _start(HOLD_MAPPED, mapped)
    started.extend([holder, mapper])
    table = _procs.process_table(paths=[opened, mapped, idle])
    assert (table[holder.pid]["opened"], table[holder.pid]["mapped"]) == ({opened}, set())
    assert (table[mapper.pid]["opened"], table[mapper.pid]["mapped"]) == (set(), {mapped})
    assert table[mapper.pid]["starttime"] == _starttime(mapper.pid)
    assert all(not (s["opened"] or s["mapped"]) for pid, s in table.items() if pid not in (holder.pid, mapper.pid))


def test_now_ticks_is_on_the_clock_of_start_times(started):
    before = _procs.now_ticks()
    proc = _start(SLEEP)
    started.append(proc)
    assert before <= _starttime(proc.pid) <= _procs.now_ticks()


def test_a_kernel_thread_is_what_the_kernel_flags_as_one(started):
    proc = _start(SLEEP)
    started.append(proc)
    assert not _procs.is_kernel_thread(_procs.read_stat(proc.pid))
    kthreadd = _procs.read_stat(2)
    if kthreadd is None or kthreadd["comm"] != "kthreadd":
        pytest.skip("pid 2 is not kthreadd here (a PID namespace)")
    assert _procs.is_kernel_thread(kthreadd)
    # An ordinary process whose parent is pid 2 or whose pid is 2 is not one: only the flag counts.
    assert not _procs.is_kernel_thread(dict(_procs.read_stat(proc.pid), pid=2, ppid=2))


# --- alive: the one liveness rule of gpu_reset, shm_clean and _nvml ----------------------

def _zombie():
    """A child that exited and is not reaped yet: the kernel shows it as state Z."""
    proc = subprocess.Popen(["true"])
    if not procinfo.wait_state(proc.pid, "Z"):
        proc.wait()
        pytest.fail("child never became a zombie")
    return proc


def test_alive_for_a_live_a_zombie_and_a_reaped_process(started):
    live = _start(SLEEP)
    started.append(live)
    zombie = _zombie()
    try:
        assert _procs.alive(live.pid) is True
        assert _procs.alive(live.pid, _starttime(live.pid)) is True
        assert _procs.alive(zombie.pid) is False  # exited: holds nothing any more
    finally:
        zombie.wait()
    assert _procs.alive(zombie.pid) is False  # reaped: gone from /proc
    assert _procs.alive(0) is False


def test_alive_with_another_start_time_is_another_process(started):
    live = _start(SLEEP)
    started.append(live)
    assert _procs.alive(live.pid, _starttime(live.pid) + 1) is False


def test_alive_reads_the_state_after_the_last_parenthesis(started):
    # comm may contain ') ' and a letter that looks like a state; the state after the last ')' counts.
    proc = _start("import ctypes, time\nctypes.CDLL(None).prctl(15, b'x) Z y', 0, 0, 0)\nprint('ready', flush=True)\n"
                  "time.sleep(600)")
    started.append(proc)
    assert _procs.read_stat(proc.pid)["comm"] == "x) Z y"
    assert _procs.alive(proc.pid) is True


@pytest.mark.parametrize("state, expected", [("S", True), ("R", True), ("D", True), ("T", True),
                                             ("Z", False), ("X", False), ("x", False)])
def test_every_exited_state_counts_as_gone(tmp_path, state, expected):
    proc = tmp_path / "proc"
    _fake_stat(proc, 10, state)
    assert _procs.alive(10, proc=str(proc)) is expected
    assert _procs.alive(10, 500, proc=str(proc)) is expected
    assert _procs.alive(10, 501, proc=str(proc)) is False


def test_an_entry_that_cannot_be_read_counts_as_the_caller_says(tmp_path):
    # /proc/PID exists but its stat cannot be read (hidepid=1, a security module); here a
    # directory in its place, which open() refuses as root too. A cut-short stat is the same.
    proc = tmp_path / "proc"
    (proc / "10" / "stat").mkdir(parents=True)
    (proc / "11").mkdir()
    (proc / "11" / "stat").write_text("11 (cut")
    for pid in (10, 11):
        assert _procs.alive(pid, proc=str(proc)) is True
        assert _procs.alive(pid, 500, proc=str(proc), unreadable=False) is False
        assert _procs.read_stat(pid, proc=str(proc)) is None
    assert _procs.alive(12, proc=str(proc)) is False  # no entry: no such process


def test_start_time_is_psutils_create_time(started):
    psutil = pytest.importorskip("psutil")
    proc = _start(SLEEP)
    started.append(proc)
    assert _procs.start_time(_procs.read_stat(proc.pid)) == psutil.Process(proc.pid).create_time()


def test_cgroup_components_are_every_path_component_of_every_hierarchy():
    """spare_units compares whole components: cgroup v2's line, v1's name=systemd among the
    controllers, a template instance, a removed cgroup's suffix, a path that contains a colon."""
    text = ("12:cpu,cpuacct:/\n1:name=systemd:/system.slice/system-vllm.slice/vllm@b.service\n"
            "0::/system.slice/vllm-a.service/payload:x (deleted)\n")
    assert _procs.cgroup_components(text) == {"system.slice", "system-vllm.slice", "vllm@b.service", "vllm-a.service",
                                              "payload:x"}
    assert _procs.cgroup_components("") == set()
