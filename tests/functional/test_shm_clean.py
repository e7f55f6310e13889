"""cleanslate.gpu.shm_clean against real files in a private directory under the real /dev/shm
(tmpfs) and real processes that hold them: a multiprocessing.shared_memory segment, a file
mapped and then closed, a file held open, live, dead and zombie torch_<pid>_* creators.

Every test works only in its own /dev/shm/cleanslate-test-* directory and only on processes it
started; both are removed at teardown.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.run_module import run_module
from tests.sim import procinfo

SHM = Path("/dev/shm")
OLD = 3600  # seconds: leftovers are made this old so that min_age never keeps them
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs a /dev/shm tmpfs")

# Each holder prints the path it holds, then sleeps until the test kills it.
HOLD_PSM = r"""
import os, sys, time
from multiprocessing import shared_memory
shm = shared_memory.SharedMemory(create=True, size=65536)
shm.buf[:5] = b"hello"
# shm_open only creates at the top of /dev/shm: move the live segment into the test's directory.
dest = os.path.join(sys.argv[1], shm.name.lstrip("/"))
os.rename("/dev/shm/" + shm.name.lstrip("/"), dest)
print(dest, flush=True)
time.sleep(600)
"""
HOLD_MAPPED = r"""
import ctypes, os, sys, time
# Python's mmap keeps a dup of the descriptor; map through libc so that closing it leaves only the mapping.
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDWR)
addr = libc.mmap(None, os.fstat(fd).st_size, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
if addr in (None, ctypes.c_void_p(-1).value):
    sys.exit("mmap failed: errno %d" % ctypes.get_errno())
os.close(fd)  # only the mapping keeps the segment in use now, as NCCL does
print(sys.argv[1], flush=True)
time.sleep(600)
"""
HOLD_OPEN = r"""
import sys, time
handle = open(sys.argv[1], "rb")
print(sys.argv[1], flush=True)
time.sleep(600)
"""


@pytest.fixture
def shm_dir():
    path = Path(tempfile.mkdtemp(prefix="cleanslate-test-", dir=SHM))
    try:
        yield path
    finally:
        for entry in path.iterdir():
            if entry.is_file() and not entry.is_symlink() and shutil.which("chattr"):
                subprocess.run(["chattr", "-i", str(entry)], capture_output=True, check=False)
        shutil.rmtree(path)


@pytest.fixture
def procs():
    """Processes started by this test; killed and reaped at teardown."""
    started = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def start_holder(procs, code, arg):
    proc = subprocess.Popen([sys.executable, "-c", code, str(arg)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    procs.append(proc)
    line = proc.stdout.readline().strip()
    assert line, "holder process failed to start"
    return proc, Path(line)


def leftover(directory, name, size=8192):
    """A crash leftover with real data (so tmpfs allocates it), last modified an hour ago."""
    path = directory / name
    path.write_bytes(os.urandom(size))
    os.utime(path, (time.time() - OLD, time.time() - OLD))
    return path


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def fd_targets(pid):
    fd_dir = Path("/proc/%d/fd" % pid)
    return {os.readlink(fd_dir / name) for name in os.listdir(fd_dir)}


def listing(directory):
    """Name -> (type, content or link target): what a user would see with ls and cat."""
    out = {}
    for entry in sorted(directory.iterdir()):
        if entry.is_symlink():
            out[entry.name] = ("link", os.readlink(entry))
        elif entry.is_dir():
            out[entry.name] = ("dir", sorted(p.name for p in entry.iterdir()))
        else:
            out[entry.name] = ("file", entry.read_bytes())
    return out


def paths(items):
    return {Path(item["path"]).name for item in items}


@pytest.fixture
def crashed(shm_dir, procs, tmp_path):
    """A directory as a crashed server leaves it, next to a live job's segments."""
    for name in ("nccl-dead-1", "psm_dead", "sem.mp-dead", "sem.loky-dead", "x-vllm-dead", "nccl-keep-excluded"):
        leftover(shm_dir, name)
    psm_holder, psm = start_holder(procs, HOLD_PSM, shm_dir)
    os.utime(psm, (time.time() - OLD, time.time() - OLD))
    mapped_holder, mapped = start_holder(procs, HOLD_MAPPED, leftover(shm_dir, "nccl-mapped"))
    open_holder, opened = start_holder(procs, HOLD_OPEN, leftover(shm_dir, "nccl-open"))
    creator = subprocess.Popen(["sleep", "600"])
    procs.append(creator)
    torch_live = leftover(shm_dir, "torch_%d_1234_0" % creator.pid)
    torch_dead = leftover(shm_dir, "torch_%d_5678_0" % dead_pid())
    young = shm_dir / "nccl-young"
    young.write_bytes(os.urandom(4096))
    outside = tmp_path / "outside-nccl-target"
    outside.write_bytes(b"not ours")
    (shm_dir / "nccl-link").symlink_to(outside)
    os.utime(shm_dir / "nccl-link", (time.time() - OLD, time.time() - OLD), follow_symlinks=False)
    (shm_dir / "nccl-dir").mkdir()
    leftover(shm_dir / "nccl-dir", "inner")
    leftover(shm_dir, "keep.txt")
    return {
        "dir": shm_dir,
        "params": {"path": str(shm_dir), "min_age": 600, "exclude": ["*-excluded"]},
        "outside": outside,
        "removable": {"nccl-dead-1", "psm_dead", "sem.mp-dead", "sem.loky-dead", "x-vllm-dead",
                      torch_dead.name, "nccl-link"},
        "in_use": {psm.name: [psm_holder.pid], mapped.name: [mapped_holder.pid], opened.name: [open_holder.pid],
                   torch_live.name: [creator.pid]},
        "holders": [psm_holder, mapped_holder, open_holder, creator],
        "mapped": (mapped_holder.pid, mapped),
    }


def test_removes_leftovers_and_keeps_every_live_segment(crashed):
    directory = crashed["dir"]
    # The mapped segment must be held by its mapping alone, or the test proves nothing about maps.
    pid, mapped = crashed["mapped"]
    assert str(mapped) not in fd_targets(pid)
    before = listing(directory)

    result = run_module("shm_clean", crashed["params"])

    assert result["rc"] == 0, result
    assert result["changed"] is True
    assert paths(result["removed"]) == crashed["removable"]
    assert {Path(i["path"]).name: i["pids"] for i in result["in_use"]} == crashed["in_use"]
    skipped = {Path(i["path"]).name: i["why"] for i in result["kept"]}
    assert set(skipped) == {"nccl-young", "nccl-dir"}
    assert "min_age" in skipped["nccl-young"] and "directory" in skipped["nccl-dir"]
    assert result["errors"] == []
    after = listing(directory)
    assert set(after) == set(before) - crashed["removable"]
    for name in after:  # nothing that stayed was modified
        assert after[name] == before[name], name
    assert crashed["outside"].read_bytes() == b"not ours"
    assert all(proc.poll() is None for proc in crashed["holders"])
    psm = [name for name in after if name.startswith("psm_") and name != "psm_dead"]
    assert (directory / psm[0]).read_bytes()[:5] == b"hello"


def test_bytes_freed_is_the_space_of_what_was_removed(crashed):
    directory = crashed["dir"]
    space = {name: os.lstat(directory / name).st_blocks * 512 for name in crashed["removable"]}
    assert all(space[name] > 0 for name in crashed["removable"] if name != "nccl-link")

    result = run_module("shm_clean", crashed["params"])

    assert {Path(i["path"]).name: i["bytes"] for i in result["removed"]} == {
        name: (0 if name == "nccl-link" else space[name]) for name in crashed["removable"]}
    assert result["bytes_freed"] == sum(i["bytes"] for i in result["removed"]) == sum(
        space[name] for name in crashed["removable"] if name != "nccl-link")


def test_check_mode_reports_what_would_go_and_removes_nothing(crashed):
    directory = crashed["dir"]
    before = listing(directory)

    planned = run_module("shm_clean", crashed["params"], check=True)

    assert planned["rc"] == 0 and planned["changed"] is True
    assert paths(planned["removed"]) == crashed["removable"]
    assert listing(directory) == before
    done = run_module("shm_clean", crashed["params"])
    assert done["removed"] == planned["removed"]
    assert done["bytes_freed"] == planned["bytes_freed"]


def test_second_run_changes_nothing(crashed):
    first = run_module("shm_clean", crashed["params"])
    assert first["changed"] is True
    left = listing(crashed["dir"])

    second = run_module("shm_clean", crashed["params"])

    assert second["rc"] == 0
    assert second["changed"] is False
    assert second["removed"] == [] and second["bytes_freed"] == 0
    assert second["in_use"] == first["in_use"]
    assert listing(crashed["dir"]) == left


def test_diff_lists_entries_before_and_after(crashed):
    names = sorted(os.listdir(crashed["dir"]))

    result = run_module("shm_clean", crashed["params"], check=True, diff=True)

    assert result["diff"]["before"] == "".join(n + "\n" for n in names)
    assert result["diff"]["after"] == "".join(n + "\n" for n in names if n not in crashed["removable"])


def test_remove_in_use_removes_live_segments_but_not_their_holders(crashed):
    params = dict(crashed["params"], remove_in_use=True)

    result = run_module("shm_clean", params)

    assert result["rc"] == 0
    assert paths(result["removed"]) == crashed["removable"] | set(crashed["in_use"])
    assert {Path(i["path"]).name for i in result["in_use"]} == set(crashed["in_use"])
    assert set(os.listdir(crashed["dir"])) == {"nccl-young", "nccl-dir", "keep.txt", "nccl-keep-excluded"}
    assert all(proc.poll() is None for proc in crashed["holders"])


def test_young_entries_go_once_min_age_allows(crashed):
    params = dict(crashed["params"], min_age=0)

    result = run_module("shm_clean", params)

    assert "nccl-young" in paths(result["removed"])
    assert not (crashed["dir"] / "nccl-young").exists()


def test_zombie_torch_creator_counts_as_dead(shm_dir):
    child = subprocess.Popen(["true"])
    try:
        for attempt in range(600):  # generous: the machine is shared
            if procinfo.state(child.pid) == "Z":
                break
            time.sleep(0.05)
        else:
            pytest.fail("child never became a zombie")
        segment = leftover(shm_dir, "torch_%d_1_0" % child.pid)

        result = run_module("shm_clean", {"path": str(shm_dir)})

        assert paths(result["removed"]) == {segment.name}
        assert result["in_use"] == []
    finally:
        child.wait()


def test_only_regular_files_and_links_are_removed(shm_dir):
    os.mkfifo(shm_dir / "nccl-fifo")
    leftover(shm_dir, "nccl-file")

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert paths(result["removed"]) == {"nccl-file"}
    assert [(Path(i["path"]).name, "FIFO" in i["why"]) for i in result["kept"]] == [("nccl-fifo", True)]
    assert (shm_dir / "nccl-fifo").exists()


def test_permission_denied_on_one_entry_fails_after_cleaning_the_rest(shm_dir):
    if shutil.which("chattr") is None or os.geteuid() != 0:
        pytest.skip("needs root and chattr to make one tmpfs entry undeletable")
    stuck = leftover(shm_dir, "nccl-stuck")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True, check=False).returncode:
        pytest.skip("this tmpfs does not support the immutable flag")
    leftover(shm_dir, "nccl-a")
    leftover(shm_dir, "nccl-z")

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert result["rc"] != 0 and result["failed"] is True
    assert str(stuck) in result["msg"]
    assert [i["path"] for i in result["errors"]] == [str(stuck)]
    assert result["changed"] is True
    assert paths(result["removed"]) == {"nccl-a", "nccl-z"}
    assert sorted(os.listdir(shm_dir)) == ["nccl-stuck"]


def tree(root):
    """Every path under root with its content or link target: a deep before/after snapshot."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                out[str(path)] = ("link", os.readlink(path))
            elif path.is_file():
                out[str(path)] = ("file", path.read_bytes())
            else:
                out[str(path)] = ("dir",)
    return out


def bad_inputs(work, tmp_path):
    link = tmp_path / "link-to-work"
    link.symlink_to(work)
    return [
        ({"path": str(work / "missing")}, "does not exist"),
        ({"path": str(work / "nccl-dead")}, "is not a directory"),
        ({"path": str(link)}, "symbolic link"),
        ({"path": os.path.relpath(work)}, "absolute"),
        ({"path": str(work), "patterns": ["..*"]}, "'..'"),
        ({"path": str(work), "patterns": ["../nccl-*"]}, "'/'"),
        ({"path": str(work), "patterns": ["nccl-*", "sub/nccl-*"]}, "'/'"),
        ({"path": str(work), "exclude": ["x/y"]}, "exclude entry 'x/y'"),
        ({"path": str(work), "min_age": -1}, "min_age must be 0 or more"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_bad_input_fails_with_one_message_and_removes_nothing(shm_dir, tmp_path, case):
    work = shm_dir / "work"
    work.mkdir()
    leftover(work, "nccl-dead")
    (work / "sub").mkdir()
    leftover(work / "sub", "nccl-inner")
    leftover(shm_dir, "nccl-parent")  # what '../nccl-*' would reach
    params, message = bad_inputs(work, tmp_path)[case]
    before = tree(shm_dir)

    result = run_module("shm_clean", params)

    assert result["rc"] != 0 and result["failed"] is True
    assert message in result["msg"], result["msg"]
    assert "removed" not in result
    assert tree(shm_dir) == before
