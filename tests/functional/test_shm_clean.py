"""cleanslate.gpu.shm_clean against real files in a private directory under the real /dev/shm
(tmpfs) and real processes that hold them: a multiprocessing.shared_memory segment, a file
mapped and then closed, a file held open, live, dead and zombie torch_<pid>_* creators.

Every test works only in its own /dev/shm/cleanslate-test-* directory and only on processes it
started; both are removed at teardown.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES
from tests import readable_copy
from tests.run_module import run_module
from tests.sim import procinfo
from tests.sim import shm as sim_shm
from tests.syscall_gate import SyscallGate

REPO = Path(__file__).resolve().parents[2]
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


def test_only_regular_files_and_links_are_removed(shm_dir, tmp_path):
    """Every file type under a matching name: the file and the link go (the link's target stays),
    the directory, FIFO, socket and device node stay, each with the reason."""
    leftover(shm_dir, "nccl-file")
    target = tmp_path / "link-target"
    target.write_bytes(b"not ours")
    (shm_dir / "nccl-link").symlink_to(target)
    (shm_dir / "nccl-dir").mkdir()
    leftover(shm_dir / "nccl-dir", "nccl-inner")
    os.mkfifo(shm_dir / "nccl-fifo")
    # bind() from the directory: a socket path is limited to 108 bytes.
    subprocess.run([sys.executable, "-c", "import os, socket, sys; os.chdir(sys.argv[1]); "
                    "socket.socket(socket.AF_UNIX).bind('nccl-socket')", str(shm_dir)], check=True)
    kinds = {"nccl-dir": "a directory", "nccl-fifo": "a FIFO", "nccl-socket": "a socket"}
    if os.geteuid() == 0:
        os.mknod(shm_dir / "nccl-null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
        kinds["nccl-null"] = "a character device"
    before = listing_of_kinds(shm_dir)

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert result["rc"] == 0, result
    assert paths(result["removed"]) == {"nccl-file", "nccl-link"}
    assert {name: item["why"] for name, item in by_name(result["kept"]).items()} == {
        name: kind + ("; directories are never removed" if kind == "a directory" else
                      "; only regular files and symbolic links are removed") for name, kind in kinds.items()}
    after = listing_of_kinds(shm_dir)
    assert after == {name: kind for name, kind in before.items() if name not in ("nccl-file", "nccl-link")}
    assert (shm_dir / "nccl-dir" / "nccl-inner").exists()
    assert target.read_bytes() == b"not ours"


def listing_of_kinds(directory):
    """Name -> file type letter as ls -l shows it (-, l, d, p, s, c)."""
    letters = ((stat.S_ISLNK, "l"), (stat.S_ISDIR, "d"), (stat.S_ISFIFO, "p"), (stat.S_ISSOCK, "s"),
               (stat.S_ISCHR, "c"), (stat.S_ISREG, "-"))
    return {name: next(letter for test, letter in letters if test(os.lstat(directory / name).st_mode))
            for name in os.listdir(directory)}


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


# What the test does to nccl-b while the module is held in its unlink of nccl-a, and what the
# module must then say about nccl-b.
CHANGES = {
    "replaced": "changed during the run; left for the next run",  # a new file (new inode) under the name
    "rewritten": "changed during the run; left for the next run",  # same inode, written again (new mtime)
    "removed": "disappeared during the run",  # someone else removed it first
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_segment_changed_during_the_run_is_kept_with_the_reason(shm_dir, tmp_path, change):
    """A server starting while the module runs may create a segment under a leftover's name. The
    module examines every entry (type, age, users) before it removes any; the test holds it inside
    its first unlinkat (a seccomp user notification: the module's code is not touched) and changes
    nccl-b then, so that the change lands after nccl-b was judged a leftover and before it is removed."""
    leftover(shm_dir, "nccl-a")
    second = leftover(shm_dir, "nccl-b")
    before = second.stat()
    fresh = b"a new server's segment"
    changed = []

    def change_b_during_first_unlink(call):
        if changed:
            return
        assert call.path == b"nccl-a" and (shm_dir / "nccl-a").exists(), call
        if change == "replaced":
            (shm_dir / "new-b").write_bytes(fresh)
            os.rename(shm_dir / "new-b", second)
        elif change == "rewritten":
            with open(second, "r+b") as handle:
                handle.write(fresh)
        else:
            second.unlink()
        changed.append(call)

    with SyscallGate(tmp_path, hold=["unlinkat"], handler=change_b_during_first_unlink) as gate:
        result = run_module("shm_clean", {"path": str(shm_dir)}, python=gate.python)

    assert result["rc"] == 0, result
    assert len(changed) == 1, "the module never unlinked nccl-a, so nccl-b was never changed in time"
    assert paths(result["removed"]) == {"nccl-a"}
    assert by_name(result["kept"]) == {"nccl-b": {"path": str(second), "why": CHANGES[change], "area": "shm"}}
    assert result["bytes_freed"] == result["removed"][0]["bytes"]
    assert not (shm_dir / "nccl-a").exists()
    if change == "removed":
        assert not second.exists()
    else:
        assert second.read_bytes().startswith(fresh)
        now = second.stat()
        assert (now.st_ino != before.st_ino) == (change == "replaced")
    # Held calls: only the one unlink of nccl-a; the changed nccl-b was never unlinked.
    assert [call.path for call in gate.calls] == [b"nccl-a"]


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
    shm_link = tmp_path / "link-to-shm"
    shm_link.symlink_to(work.parent)
    (tmp_path / "real").mkdir(exist_ok=True)
    symlinked = "symbolic link"
    return [
        ({"path": str(work / "missing")}, "does not exist"),
        ({"path": str(work / "nccl-dead")}, "is not a directory"),
        ({"path": str(link)}, symlinked),
        # However the link is spelled: a trailing / or /. makes the kernel follow it, and /.. climbs
        # out of its target (here into the directory holding nccl-parent).
        ({"path": str(link) + "/"}, symlinked),
        ({"path": str(link) + "/."}, symlinked),
        ({"path": str(link) + "/.."}, symlinked),
        ({"path": str(link) + "/sub"}, symlinked),
        ({"path": str(shm_link) + "/work"}, symlinked),
        ({"path": str(tmp_path / "real" / ".." / "link-to-work") + "/."}, symlinked),
        ({"path": os.path.relpath(work)}, "absolute"),
        ({"path": str(work), "patterns": ["..*"]}, "'..'"),
        ({"path": str(work), "patterns": ["../nccl-*"]}, "'/'"),
        ({"path": str(work), "patterns": ["nccl-*", "sub/nccl-*"]}, "'/'"),
        ({"path": str(work), "exclude": ["x/y"]}, "exclude entry 'x/y'"),
        ({"path": str(work), "min_age": -1}, "min_age must be 0 or more"),
        # A NaN compares false with everything: it used to pass the check and act as 0 (remove all).
        ({"path": str(work), "min_age": "nan"}, "min_age must be a finite number"),
        ({"path": str(work), "min_age": float("inf")}, "min_age must be a finite number"),
        ({"path": str(work), "min_age": "-inf"}, "min_age must be a finite number"),
        ({"path": str(work), "min_age": 1e300}, "min_age must be %s or less" % RANGES["shm_clean"]["min_age"].maximum),
        ({"path": str(work), "min_age": "soon"}, "min_age"),
    ]


BAD_INPUTS = 20


@pytest.mark.parametrize("case", range(BAD_INPUTS))
def test_bad_input_fails_with_one_message_and_removes_nothing(shm_dir, tmp_path, case):
    work = shm_dir / "work"
    work.mkdir()
    leftover(work, "nccl-dead")
    (work / "sub").mkdir()
    leftover(work / "sub", "nccl-inner")
    leftover(shm_dir, "nccl-parent")  # what '../nccl-*' or 'link/..' would reach
    cases = bad_inputs(work, tmp_path)
    assert len(cases) == BAD_INPUTS
    params, message = cases[case]
    before = tree(shm_dir)

    result = run_module("shm_clean", params)

    assert result["rc"] != 0 and result["failed"] is True
    assert message in result["msg"], result["msg"]
    assert "removed" not in result
    assert tree(shm_dir) == before


def test_the_real_directory_behind_a_link_is_cleaned_when_named_itself(shm_dir, tmp_path):
    """The refusal is about the spelling, not the directory: named by its real path, it is cleaned,
    and '..' after a real directory is resolved from that directory."""
    work = shm_dir / "work"
    work.mkdir()
    leftover(work, "nccl-dead")
    (tmp_path / "link-to-work").symlink_to(work)

    result = run_module("shm_clean", {"path": str(work / "sub-that-is-not-there" / "..") + "/"})
    assert result["failed"] is True and "does not exist" in result["msg"]
    (work / "sub").mkdir()
    result = run_module("shm_clean", {"path": str(work / "sub" / "..") + "/."})

    assert result["rc"] == 0, result
    assert [i["path"] for i in result["removed"]] == [str(work / "nccl-dead")]


# --- "in use" is decided by device and inode, never by a path string (issue 11, item 8) ---------

# Opens argv[1] (bytes, any name) and either keeps it open or maps it and closes the descriptor.
HOLD_ANY_NAME = r"""
import ctypes, os, sys, time
path, how = os.fsencode(sys.argv[1]), sys.argv[2]
fd = os.open(path, os.O_RDWR)
if how == "map":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, os.fstat(fd).st_size, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
    if addr in (None, ctypes.c_void_p(-1).value):
        sys.exit("mmap failed: errno %d" % ctypes.get_errno())
    os.close(fd)
print("ready", flush=True)
time.sleep(600)
"""


def start_in_namespace(procs, path, how, view=None):
    """A holder of path in a private PID namespace (so it can only be itself that a broken module
    hits); with view=(directory, other), also in a private mount namespace where directory is seen
    only as `other`, and path is opened there. Returns the holder's pid as this machine sees it."""
    path = os.fsencode(path)
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--propagation", "private"]
    if view:
        directory, other = (os.fsencode(str(p)) for p in view)
        path = other + path[len(directory):]
        script = b'mount --bind "$1" "$2" && exec "$3" -c "$4" "$5" "$6"'
        argv += [b"sh", b"-c", script, b"sh", directory, other, os.fsencode(sys.executable),
                 HOLD_ANY_NAME.encode(), path, how.encode()]
    else:
        argv += [sys.executable, "-c", HOLD_ANY_NAME, path, how]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.append(proc)
    line = proc.stdout.readline()
    assert line == b"ready\n", proc.stderr.read() if proc.poll() is not None else line
    children = Path("/proc/%d/task/%d/children" % (proc.pid, proc.pid)).read_text().split()
    assert len(children) == 1, children
    return int(children[0]), path


def maps_of(pid):
    return Path("/proc/%d/maps" % pid).read_bytes()


def by_name(items):
    return {Path(item["path"]).name: item for item in items}


@pytest.mark.parametrize("how", ["map", "open"])
def test_a_segment_used_from_another_mount_namespace_is_in_use(shm_dir, procs, tmp_path, how):
    """The holder sees the directory under another path (a bind mount in its own mount namespace):
    its maps and descriptors name that path, but device and inode are the segment's."""
    segment = leftover(shm_dir, "nccl-elsewhere")
    dead = leftover(shm_dir, "nccl-dead")
    other = tmp_path / "another-view"
    other.mkdir()
    pid, seen_as = start_in_namespace(procs, segment, how, view=(shm_dir, other))
    if how == "map":
        assert seen_as in maps_of(pid) and os.fsencode(str(segment)) not in maps_of(pid)
    else:
        assert seen_as in {os.readlink(os.fsencode("/proc/%d/fd/%s" % (pid, fd))) for fd in os.listdir("/proc/%d/fd" % pid)}
    space = dead.lstat().st_blocks * 512

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert result["rc"] == 0, result
    assert {name: (i["path"], i["pids"]) for name, i in by_name(result["in_use"]).items()} == {
        segment.name: (str(segment), [pid])}
    assert paths(result["removed"]) == {"nccl-dead"}
    assert result["bytes_freed"] == space
    assert segment.exists() and not dead.exists()


ODD_NAMES = {
    "newline": b"nccl-new\nline",
    "carriage-return": b"nccl-carriage\rreturn",
    "deleted-suffix": b"nccl-seg (deleted)",
}


@pytest.mark.parametrize("how", ["map", "open"])
@pytest.mark.parametrize("odd", sorted(ODD_NAMES))
def test_a_used_segment_with_an_odd_name_is_in_use(shm_dir, procs, odd, how):
    """/proc prints such names escaped (maps: newline as \\012), raw (carriage return) or like an
    unlinked file (" (deleted)" appended): the name cannot be compared, the inode can."""
    name = ODD_NAMES[odd]
    segment = os.path.join(os.fsencode(str(shm_dir)), name)
    with open(segment, "wb") as handle:
        handle.write(os.urandom(8192))
    os.utime(segment, (time.time() - OLD, time.time() - OLD))
    dead = leftover(shm_dir, "nccl-dead")
    space = dead.lstat().st_blocks * 512
    pid, _path = start_in_namespace(procs, segment, how)

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert result["rc"] == 0, result
    assert [(i["path"], i["pids"]) for i in result["in_use"]] == [(os.fsdecode(segment), [pid])]
    assert paths(result["removed"]) == {"nccl-dead"}
    assert result["bytes_freed"] == space
    assert os.path.exists(segment)
    assert procinfo.alive(pid)


def test_a_held_unlinked_file_does_not_protect_a_new_file_of_its_name(shm_dir, procs):
    """The holder's descriptor reads '.../nccl-reused (deleted)'; the new file is another inode."""
    first = leftover(shm_dir, "nccl-reused")
    pid, _path = start_in_namespace(procs, first, "open")
    first.unlink()
    again = leftover(shm_dir, "nccl-reused")

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert result["rc"] == 0, result
    assert paths(result["removed"]) == {"nccl-reused"} and result["in_use"] == []
    assert not again.exists()
    assert procinfo.alive(pid)


def test_hard_linked_files_are_kept_and_say_why(shm_dir):
    segment = leftover(shm_dir, "nccl-two-names")
    os.link(segment, shm_dir / "other-name")
    single = leftover(shm_dir, "nccl-one-name")

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert result["rc"] == 0, result
    assert paths(result["removed"]) == {single.name}
    kept = by_name(result["kept"])
    assert set(kept) == {"nccl-two-names"} and "hard links" in kept["nccl-two-names"]["why"]
    assert segment.exists() and (shm_dir / "other-name").exists()


def wrapper(tmp_path, name, body):
    """An executable run_module can use as `python`: body gets the module path as $1, the
    arguments file as $2, and $PY (this interpreter)."""
    script = tmp_path / name
    script.write_text("#!/bin/sh\nPY=%s\n%s\n" % (sys.executable, body))
    script.chmod(0o755)
    return str(script)


# The system's interpreter (root's may live under /root, closed to nobody) with a copy of the
# modules and ansible's module_utils that nobody can read (the checkout may be closed to it too).
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]


@pytest.fixture
def nobody_modules():
    top = readable_copy.modules()
    yield top
    readable_copy.remove(top)


def as_nobody(tmp_path, modules, inside=""):
    """(python for run_module, env): the module run as user nobody from `modules` (pass it to
    run_module as collections too); inside, a shell command run as root before it (in the same
    shell), such as a mount in a private mount namespace."""
    env = {"PYTHONPATH": str(modules), "HOME": "/tmp"}
    probe = subprocess.run(AS_NOBODY + ["-c", "import ansible.module_utils.basic"], env=dict(os.environ, **env),
                           capture_output=True, check=False)
    assert probe.returncode == 0, "user nobody cannot import ansible from %s: %s" % (modules, probe.stderr[-300:])
    if not inside:
        return wrapper(tmp_path, "as-nobody", 'exec %s "$1" < "$2"' % " ".join(AS_NOBODY)), env
    body = "exec unshare --mount --propagation private sh -c '%s && exec %s \"$0\"' \"$1\" < \"$2\"" % (
        inside, " ".join(AS_NOBODY))
    return wrapper(tmp_path, "as-nobody-inside", body), env


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_root_entries_whose_users_cannot_be_proven_are_kept(shm_dir, procs, tmp_path, nobody_modules):
    """Run as nobody, the module cannot read root's processes: a segment that only a root process
    maps looks unused to it. It must keep every regular file and say why, not remove them."""
    held = leftover(shm_dir, "nccl-held-by-root")
    idle = leftover(shm_dir, "nccl-idle")
    (shm_dir / "nccl-link").symlink_to(idle)
    start_in_namespace(procs, held, "map")
    shm_dir.chmod(0o777)  # nobody may list and unlink here
    nobody, env = as_nobody(tmp_path, nobody_modules)

    result = run_module("shm_clean", {"path": str(shm_dir)}, python=nobody, env=env, collections=nobody_modules)

    assert result["rc"] == 0, result
    assert paths(result["removed"]) == {"nccl-link"}  # a link is removed as a link: nobody uses a name
    kept = by_name(result["kept"])
    assert set(kept) == {held.name, idle.name}
    assert all("cannot be proven" in item["why"] and "run as root" in item["why"] for item in kept.values())
    assert any("cannot be proven" in str(w) for w in result.get("warnings", []))
    assert held.exists() and idle.exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("unshare") is None,
                    reason="needs root, setpriv and unshare")
def test_a_torch_creator_whose_state_cannot_be_read_counts_as_alive(shm_dir, procs, tmp_path, nobody_modules):
    """On a /proc mounted hidepid=1, another user's /proc/PID/stat cannot be read, so whether the
    creator of a torch_<pid>_* segment lives is unknown: it counts as alive and is named as its user."""
    creator = subprocess.Popen(["sleep", "600"])
    procs.append(creator)
    segment = leftover(shm_dir, "torch_%d_1_0" % creator.pid)
    shm_dir.chmod(0o777)
    hidepid = "mount -t proc -o hidepid=1 proc /proc"
    nobody, env = as_nobody(tmp_path, nobody_modules, inside=hidepid)
    # The premise: as nobody, under that /proc, the creator exists but its state cannot be read.
    seen = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           '%s && exec "$@"' % hidepid, "sh"] + AS_NOBODY +
                          ["-c", "import os, sys; print(os.path.isdir(sys.argv[1]))\ntry: open(sys.argv[1] + '/stat')\n"
                           "except PermissionError: print('denied')", "/proc/%d" % creator.pid],
                          capture_output=True, text=True, check=False)
    assert seen.stdout.split() == ["True", "denied"], seen

    result = run_module("shm_clean", {"path": str(shm_dir)}, python=nobody, env=env, collections=nobody_modules)

    assert result["rc"] == 0, result
    assert [(i["path"], i["pids"]) for i in result["in_use"]] == [(str(segment), [creator.pid])]
    assert result["removed"] == [] and by_name(result["kept"]) == {}
    assert segment.exists()


def test_a_mount_point_is_never_removed(shm_dir, tmp_path):
    """A file bind-mounted over a matching name (in the module's own mount namespace) is kept."""
    mounted = leftover(shm_dir, "nccl-mounted")
    source = tmp_path / "mounted-source"
    source.write_bytes(b"another file system")
    plain = leftover(shm_dir, "nccl-plain")
    in_namespace = wrapper(tmp_path, "private-mount", 'exec unshare --mount --propagation private sh -c '
                                                      '\'mount --bind "$0" "$1" && exec "$2" "$3" "$4"\' '
                                                      '%s %s "$PY" "$1" "$2"' % (source, mounted))

    result = run_module("shm_clean", {"path": str(shm_dir)}, python=in_namespace)

    assert result["rc"] == 0, result
    assert paths(result["removed"]) == {plain.name}
    assert "mounted" in by_name(result["kept"])["nccl-mounted"]["why"]
    assert mounted.exists() and source.read_bytes() == b"another file system"


# --- names that are not UTF-8 (issue 11, item 10) ----------------------------------------------

def strict_json(result):
    """The result as Ansible must carry it: JSON whose every string is valid UTF-8."""
    text = json.dumps(result)
    text.encode("utf-8")  # raises on a lone surrogate, which is how an undecodable byte arrives
    return text


def test_names_that_are_not_utf8_are_cleaned_and_returned_escaped(shm_dir, procs):
    directory = os.fsencode(str(shm_dir))
    dead = os.path.join(directory, b"psm_\xff")
    held = os.path.join(directory, b"nccl-\xfe\xfd")
    other = os.path.join(directory, b"other-\xff")
    for path in (dead, held, other):
        with open(path, "wb") as handle:
            handle.write(os.urandom(8192))
        os.utime(path, (time.time() - OLD, time.time() - OLD))
    pid, _path = start_in_namespace(procs, held, "map")

    result = run_module("shm_clean", {"path": str(shm_dir)}, diff=True)

    assert result["rc"] == 0, result
    strict_json(result)
    assert [i["path"] for i in result["removed"]] == [str(shm_dir) + "/psm_\\xff"]
    assert [(i["path"], i["pids"]) for i in result["in_use"]] == [(str(shm_dir) + "/nccl-\\xfe\\xfd", [pid])]
    assert result["diff"]["before"] == "nccl-\\xfe\\xfd\nother-\\xff\npsm_\\xff\n"
    assert result["diff"]["after"] == "nccl-\\xfe\\xfd\nother-\\xff\n"
    assert not os.path.exists(dead) and os.path.exists(held) and os.path.exists(other)


def test_a_playbook_reports_what_it_did_with_names_that_are_not_utf8(shm_dir, tmp_path):
    """Ansible itself refused such a result ("Refusing to deserialize an invalid UTF8 string
    value") and lost it: run the module through a real ansible-playbook."""
    dead = os.path.join(os.fsencode(str(shm_dir)), b"psm_\xff")
    with open(dead, "wb") as handle:
        handle.write(os.urandom(8192))
    playbook = tmp_path / "clean.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [
            {"name": "clean", "cleanslate.gpu.shm_clean": {"path": str(shm_dir)}, "register": "cleaned"},
            {"name": "show", "ansible.builtin.debug": {"msg": "REMOVED={{ cleaned.removed | map(attribute='path') | list | to_json }}"}},
        ]}]))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    run_module("shm_clean", {"path": "/nonexistent"})  # makes sure the collection link exists
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'REMOVED=[\\"%s/psm_\\\\\\\\xff\\"]' % shm_dir in proc.stdout, proc.stdout[-3000:]
    assert not os.path.exists(dead)


def test_default_patterns_keep_a_live_segment_of_every_engine_family_and_remove_a_dead_one(shm_dir, procs):
    """Every family vLLM and SGLang leave in /dev/shm (tests/sim/shm.py, names read in their sources):
    a live one, held open or only mapped by a live process, is kept; a dead one is removed; a user's
    files whose names look alike are not matched at all (issue 25: SGLang issue 40723, vLLM 54002)."""
    live, dead = {}, set()
    for index, (family, make) in enumerate(sim_shm.FAMILIES.items()):
        holder_code = HOLD_MAPPED if index % 2 else HOLD_OPEN
        holder, path = start_holder(procs, holder_code, leftover(shm_dir, make(os.getpid())))
        live[path.name] = [holder.pid]
        dead.add(leftover(shm_dir, make(dead_pid())).name)
    own = {"sglang.log", "sglang-notes.txt", "my-sglang.txt", "sgl_shmoo", "my_sgl_shm_1", "multi_tokenizer_args", "sglang-loads_1", "cuda.shmx",
           "notes_sglang_loads_1", "cuda.shm"}
    for name in own:
        leftover(shm_dir, name)

    result = run_module("shm_clean", {"path": str(shm_dir)})

    assert result["rc"] == 0, result
    assert paths(result["removed"]) == dead
    assert {Path(i["path"]).name: i["pids"] for i in result["in_use"]} == live
    assert result["kept"] == [] and result["errors"] == []
    assert {p.name for p in shm_dir.iterdir()} == set(live) | own
