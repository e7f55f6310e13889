"""The program every simulated process runs (stdlib only, standalone).

`crash` copies this file to ROOT/bin/simproc and ROOT/bin/vllm, so the processes depend on
nothing outside ROOT once started. Each process reads its part of ROOT/run/plan.json, takes
its name, opens its device files, maps or opens its shm segment, starts its children, then
reports ready and sleeps until killed.

Device files behave as the real driver's do (measured on a 2 x H200 host, driver 580): every
process that touches the driver opens every device file; a process with a CUDA context also
maps the device file of each GPU visible to it plus nvidiactl and nvidia-uvm, and closes
nothing. So a spec's `devices` are opened and kept open, and its `maps` are mapped too.

    simproc launch                     the node's init: starts the top-level processes, reaps
    vllm serve MODEL --tensor-parallel-size N   the API server; starts its TP workers
    simproc KEY                        any other process in the plan
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(os.path.abspath(sys.argv[0])).parent.parent
RUN = ROOT / "run"
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
LIBC = ctypes.CDLL(None, use_errno=True)


def plan() -> dict:
    return json.loads((RUN / "plan.json").read_text())


def write_json(path: Path, data: dict) -> None:
    """Write atomically: the reader polls for the file and must never see half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def set_name(name: str) -> None:
    # The kernel keeps 15 characters: "VLLM::EngineCore" reads back as "VLLM::EngineCor".
    LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def map_only(path: str, size: int) -> None:
    """Map the segment and close the fd, so only /proc/PID/maps shows it. Python's mmap
    module keeps a dup of the fd, so the mapping is made with libc directly."""
    LIBC.mmap.restype = ctypes.c_void_p
    LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDWR)
    try:
        addr = LIBC.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of %s failed" % path)


def map_device(fd: int) -> None:
    """Map an open device file privately, as a CUDA context maps /dev/nvidiaN."""
    LIBC.mmap.restype = ctypes.c_void_p
    LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    addr = LIBC.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of fd %d failed" % fd)


def spawn(key: str, spec: dict, new_session: bool) -> subprocess.Popen:
    args = spec.get("args") or [str(ROOT / "bin" / "simproc"), key]
    argv = [spec.get("argv0") or sys.executable] + args
    log = open(RUN / "log" / (key + ".log"), "ab")  # pylint: disable=consider-using-with
    try:
        return subprocess.Popen(argv, executable=sys.executable, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=new_session)
    finally:
        log.close()


def wait_ready(keys: list, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not all((RUN / "ready" / (k + ".json")).exists() for k in keys):
        if time.monotonic() > deadline:
            raise SystemExit("children not ready: %s" % keys)
        time.sleep(0.02)


def launch(spec_all: dict) -> None:
    """Be the node's init: start the top-level processes, adopt every orphan among them
    (child subreaper) and reap whatever dies, as systemd or a container's init would. Exit
    when nothing is left. Without this, orphans would go to this host's PID 1, which may
    never reap them."""
    LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    set_name("sim-init")
    record("launcher")
    for key, spec in spec_all.items():
        if spec.get("parent") == "launcher":
            spawn(key, spec, new_session=True)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def record(key: str) -> None:
    # Recorded first, so that `clean` finds this process even if the build fails later;
    # the start time makes that safe against pid reuse.
    with open("/proc/self/stat", encoding="utf-8") as handle:
        ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
    write_json(RUN / "procs" / (key + ".json"), {"pid": os.getpid(), "key": key, "start_ticks": ticks})


def become(key: str, spec: dict, spec_all: dict) -> None:
    if spec.get("name"):
        set_name(spec["name"])
    record(key)
    if spec.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held = [os.open(dev, os.O_RDWR) for dev in spec.get("devices", [])]
    for dev in spec.get("maps", []):
        map_device(held[spec["devices"].index(dev)])
    extra = {}
    if spec.get("map_only"):
        map_only(spec["map_only"]["path"], spec["map_only"]["size"])
    if spec.get("open_shm_dir"):
        # torch names its segments after the owning pid, so this one is created here.
        path = os.path.join(spec["open_shm_dir"], "torch_%d_%s_0" % (os.getpid(), spec["token"]))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b"\0" * 65536)
        held.append(fd)
        extra["open_shm"] = path
    children = [k for k, s in spec_all.items() if s.get("parent") == key]
    procs = [spawn(k, spec_all[k], new_session=False) for k in children]
    wait_ready(children)
    write_json(RUN / "ready" / (key + ".json"), dict(pid=os.getpid(), ppid=os.getppid(), **extra))
    if spec.get("exit_after_children"):
        return  # the children stay behind as orphans
    # Reap children as they die, as a real server does: a zombie frees its GPU memory and
    # must not look like a live holder to the fake NVML.
    signal.signal(signal.SIGCHLD, lambda *_: reap(procs))
    reap(procs)
    while True:
        signal.pause()


def reap(procs: list) -> None:
    for proc in procs:
        proc.poll()


def main() -> None:
    spec_all = plan()
    if sys.argv[1] == "launch":
        launch(spec_all)
    elif sys.argv[1] == "serve":
        become("api_server", spec_all["api_server"], spec_all)
    else:
        become(sys.argv[1], spec_all[sys.argv[1]], spec_all)


if __name__ == "__main__":
    main()
