"""shm_clean's guarding decisions that the kernel this runs on cannot show by itself.

On overlayfs, older kernels show a mapping of a file in /proc/PID/maps with the device and inode
of the layer's real file, not the overlay's that stat() and mountinfo give (the kernel this was
written on, 6.18, shows the overlay's): a device filter then misses every mapping of a segment,
and a live segment looks unused. The test mounts a real overlayfs in a private mount namespace (the one
tests/functional/pidns.py makes), maps a segment from a real process, and hands the scan that
process's real maps as such a kernel prints them (the device and inode of the upper layer's file).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.functional import pidns

# Maps the file through libc and closes the descriptor: only the mapping keeps it in use (NCCL does so).
HOLD_MAPPED = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDWR)
if libc.mmap(None, os.fstat(fd).st_size, 3, 1, fd, 0) in (None, ctypes.c_void_p(-1).value):
    sys.exit("mmap failed: errno %d" % ctypes.get_errno())
os.close(fd)
print(os.getpid(), flush=True)
time.sleep(600)
"""

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


def as_an_older_kernel_maps(maps, shown, real):
    """maps text with each mapping of the file at path `shown` printed as an older kernel prints
    it: the layer's real file's device, inode and path (`real`)."""
    st = os.stat(real)
    lines = []
    for line in maps.splitlines(keepends=True):
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].rstrip(b"\n") == os.fsencode(shown):
            fields[3] = b"%02x:%02x" % (os.major(st.st_dev), os.minor(st.st_dev))
            fields[4] = b"%d" % st.st_ino
            line = b" ".join(fields[:5]) + b"    " + os.fsencode(real) + b"\n"
        lines.append(line)
    return b"".join(lines)


def segment_mapped_on_overlayfs(ns) -> dict:
    """Scenario (PID 1 of a namespace with a private mount namespace): an overlayfs with a live
    segment mapped by a process and a dead one; which segments the scan finds in use when maps
    shows the upper layer's device, and what shm_clean itself does on this kernel."""
    sys.path.insert(0, str(pidns.REPO / ".ansible" / "collections"))
    from ansible_collections.cleanslate.gpu.plugins.module_utils import _file_users  # pylint: disable=import-outside-toplevel
    top = ns.scratch
    for name in ("lower", "upper", "work", "merged"):
        (top / name).mkdir()
    mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", "lowerdir=%s,upperdir=%s,workdir=%s" % (
        top / "lower", top / "upper", top / "work"), str(top / "merged")], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        return {"skip": "cannot mount an overlayfs here: %s" % mounted.stderr.strip()}
    merged = top / "merged"
    for name in ("nccl-live", "nccl-dead"):
        (merged / name).write_bytes(b"\0" * 8192)
        os.utime(merged / name, (1, 1))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_MAPPED, str(merged / "nccl-live")], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL)
    ns.procs.append(holder)
    pid = int(holder.stdout.readline())
    fd = os.open(str(merged), os.O_RDONLY | os.O_DIRECTORY)
    try:
        device = _file_users.directory_device(fd)
    finally:
        os.close(fd)
    proc = top / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True)
    with open("/proc/%d/maps" % pid, "rb") as handle:
        (proc / "maps").write_bytes(as_an_older_kernel_maps(handle.read(), merged / "nccl-live", top / "upper" / "nccl-live"))
    inodes = {name: os.stat(merged / name).st_ino for name in ("nccl-live", "nccl-dead")}
    found, unreadable = _file_users.users(inodes, device, proc=str(top / "proc"))
    result = ns.module("shm_clean", {"path": str(merged), "patterns": ["nccl-*"]})
    return {"holder": pid, "device": device, "found": found, "unreadable": unreadable,
            "removed": sorted(item["path"] for item in result.get("removed", [])),
            "in_use": sorted(item["path"] for item in result.get("in_use", [])), "rc": result["rc"],
            "merged": str(merged)}


def test_on_overlayfs_a_segment_only_mapped_is_in_use_whatever_device_maps_shows():
    """Bug: trusting the overlay mount's device (as on tmpfs) filters the maps by a device they
    do not show on such kernels, and the live segment is removed."""
    out = pidns.run_in_pidns("tests.functional.test_shm_clean_guards:segment_mapped_on_overlayfs")
    if "skip" in out:
        pytest.skip(out["skip"])
    assert out["unreadable"] == []
    assert out["found"] == {"nccl-live": [out["holder"]]}, "device filter %s" % (out["device"],)
    # And on this kernel, through the module: the live segment stays, the dead one goes.
    assert out["rc"] == 0
    assert out["in_use"] == [out["merged"] + "/nccl-live"]
    assert out["removed"] == [out["merged"] + "/nccl-dead"]
