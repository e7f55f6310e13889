"""gpu_reset's test scenarios, each run as PID 1 of a private PID namespace (tests/functional/pidns.py).

`holders_then_runs` is the declarative one most tests use: start holders (pidns.HOLDER specs),
register what the fake NVML lists for them, run gpu_reset one or more times, and report each
run's result with which holders were alive after it. The helpers at the top build the specs
outside the namespace, as the real driver would shape them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

DEVICE_NAMES = ("nvidiactl", "nvidia-uvm")
FAST = {"grace_period": 2, "kill_timeout": 20}
NO_NVML = {"LD_LIBRARY_PATH": "/nonexistent-cleanslate-test"}


def dev_files(directory: Path, gpus: int = 4) -> Path:
    """Device files of a fake node: plain files (they can be opened and mapped) under directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ["nvidia%d" % i for i in range(gpus)] + list(DEVICE_NAMES):
        (directory / name).touch()
    return directory


def globs(directory: Path) -> list:
    return [str(directory / "nvidia[0-9]*"), str(directory / "nvidiactl"), str(directory / "nvidia-uvm*")]


def every_device(directory: Path) -> list:
    return sorted(str(p) for p in directory.iterdir() if p.name.startswith("nvidia"))


def cuda(directory: Path, visible, uvm=True, **spec) -> dict:
    """A process with a CUDA context, as measured on the real driver: every device file open,
    the files of the GPUs visible to it plus nvidiactl and nvidia-uvm mapped. uvm=False: as a
    process without a context of its own maps them (CUDA initialised only, or a forked child):
    no nvidia-uvm."""
    maps = [str(directory / ("nvidia%d" % gpu)) for gpu in visible] + [str(directory / "nvidiactl")]
    return dict({"open": every_device(directory), "map": maps + ([str(directory / "nvidia-uvm")] if uvm else [])},
                **spec)


def client(directory: Path, **spec) -> dict:
    """A process that touched the driver without a context (an NVML monitor): every device file
    open, none mapped."""
    return dict({"open": every_device(directory)}, **spec)


def holders_then_runs(ns, holders, runs, nvml=None, lib_dir=None, cgroups=None, frozen=None, faults=(),
                      watch=()) -> dict:
    """holders: [{spec..., 'nvml': [{'gpu', 'mib', 'holder': key if not this one, 'listed_as':
    key of the pid NVML shows}], 'uid', 'python', 'argv_extra_hex'}]; nvml: number of fake GPUs
    (None: no NVML); faults: [{'fault', ...}] injected into it (FakeNvml.inject);
    runs: [{'params', 'check', 'diff', 'uid', 'python', 'env'}];
    cgroups: {key: cgroup directory to move that holder into}; frozen: a cgroup-v1 freezer
    directory frozen during the runs; watch: paths whose mappers to list after each run.
    Returns the holders ({key: {pid, ppid, starttime}}) and per run its result, which holders
    were alive after it and which processes mapped the watched paths then."""
    fake = None
    if nvml:
        from tests.fixtures.fake_nvml import FakeNvml  # pylint: disable=import-outside-toplevel
        fake = FakeNvml(ns.scratch / "nvml", lib_dir=lib_dir)
        fake.create(gpu_count=nvml)
        for fault in faults:
            fault = dict(fault)
            fake.inject(fault.pop("fault"), **fault)
    started = {}
    for spec in holders:
        spec = dict(spec)
        spec.pop("nvml", None)
        extra = [bytes.fromhex(arg) for arg in spec.pop("argv_extra_hex", [])]
        started.update(ns.start(argv_extra=extra, uid=spec.pop("uid", None), python=spec.pop("python", None), **spec))
    for spec in holders if fake else []:  # without NVML, nothing lists them
        for listing in spec.get("nvml", []):
            holder = started[listing.get("holder", spec["key"])]
            shown = started[listing["listed_as"]]["pid"] if "listed_as" in listing else holder["pid"]
            fake.register(holder["pid"], listing["gpu"], listing["mib"], reported_pid=shown)
    for key, group in (cgroups or {}).items():
        # Written from inside the namespace, so the pid is read as this namespace's.
        Path(group, "cgroup.procs").write_text(str(started[key]["pid"]))
    env = fake.env() if fake else NO_NVML
    done = []
    if frozen:
        Path(frozen, "freezer.state").write_text("FROZEN")
    try:
        for run in runs:
            params = dict(FAST, **run["params"])
            result = ns.module("gpu_reset", params, check=run.get("check", False), diff=run.get("diff", False),
                               env=dict(env, **run.get("env", {})), uid=run.get("uid"), python=run.get("python"))
            done.append({"result": result, "alive": dict((key, ns.alive(entry)) for key, entry in started.items()),
                         "mappers": ns.mappers(watch)})
    finally:
        if frozen:
            Path(frozen, "freezer.state").write_text("THAWED")
    return {"holders": started, "runs": done}


def crashed_node_runs(ns, lib_dir, runs) -> dict:
    """The crashed-node simulator built inside the namespace, then gpu_reset run on it as
    `runs` say ({'params', 'check', 'diff', 'pattern': add the api server's pattern}); returns
    the manifest and per run the result and which of the node's processes were alive after."""
    import tempfile  # pylint: disable=import-outside-toplevel
    from tests import sim  # pylint: disable=import-outside-toplevel
    root = Path(tempfile.mkdtemp(prefix="sim-", dir=ns.scratch)) / "node"
    manifest = sim.crash(root, lib_dir=lib_dir)
    entries = [entry for items in manifest["processes"].values() for entry in items]
    try:
        done = []
        for run in runs:
            params = {"device_paths": manifest["device_paths"]}
            if run.get("pattern", True):
                params["cmdline_patterns"] = [manifest["api_server_pattern"]]
            params.update(FAST)
            params.update(run.get("params", {}))
            result = ns.module("gpu_reset", params, check=run.get("check", False), diff=run.get("diff", False),
                               env=manifest["nvml"]["env"])
            done.append({"result": result, "alive": dict((str(e["pid"]), alive(e)) for e in entries)})
        return {"manifest": manifest, "runs": done}
    finally:
        sim.clean(root)


def alive(entry) -> bool:
    from tests.sim.procinfo import same_process  # pylint: disable=import-outside-toplevel
    return same_process(entry["pid"], entry["create_time"])


# Maps one page of a file, as a CUDA context maps /dev/nvidiaN (libc's mmap: Python's refuses an
# empty file), and keeps the mapping for the life of the process.
MAP_ONE_PAGE = """
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
def map_one_page(path):
    fd = os.open(path, os.O_RDONLY)
    if libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0) in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of %s failed" % path)
    return fd
"""

# The module's interpreter as a wrapper that holds a GPU: it maps a device file, then runs the
# module as its child (so it is one of the module's ancestors) and exits with its status.
HOLDING_WRAPPER = """#!%(python)s
import subprocess, sys
%(map_one_page)s
map_one_page(%(device)r)
with open(%(pidfile)r, "w") as handle:
    handle.write(str(os.getpid()))
sys.exit(subprocess.call([sys.executable] + sys.argv[1:]))
"""


def ancestors_holding_gpus(ns, device_paths, pid1_maps, wrapper_maps, holder) -> dict:
    """PID 1 of the namespace (this process) maps pid1_maps; the module runs under a wrapper
    that maps wrapper_maps; holder is an ordinary holder. Returns the result, the wrapper's pid
    and which of them lived on."""
    scope = {}
    exec(MAP_ONE_PAGE, scope)  # pylint: disable=exec-used
    scope["map_one_page"](pid1_maps)
    started = ns.start(**holder)
    pidfile = ns.scratch / "wrapper.pid"
    wrapper = ns.scratch / "python-holding-a-gpu"
    wrapper.write_text(HOLDING_WRAPPER % {"python": sys.executable, "map_one_page": MAP_ONE_PAGE,
                                          "device": wrapper_maps, "pidfile": str(pidfile)})
    wrapper.chmod(0o755)
    result = ns.module("gpu_reset", dict(FAST, device_paths=device_paths), env=NO_NVML, python=str(wrapper))
    return {"result": result, "wrapper": int(pidfile.read_text()), "holders": started,
            "alive": dict((key, ns.alive(entry)) for key, entry in started.items())}


# The moments at which raced_run makes the target exit, each named by what the module does then.
MOMENTS = {
    # In the pass over /proc: after it read the target's mappings, before it read its identity again.
    "mid_pass": ["openat"],
    # After the pass, when the module reads the target's command line to judge it.
    "before_description": ["openat"],
    # When the module opens a pidfd of the target, to signal it.
    "before_signal": ["pidfd_open"],
    # Without pidfds (pidfd_open fails as on a kernel before 5.3): when the module sends SIGTERM to
    # the other target, just before it signals this one with kill().
    "before_kill_without_pidfd": ["kill"],
}


def raced_run(ns, holders, device_paths, target, moment, reuse, other=None) -> dict:
    """Start holders, then run gpu_reset under a seccomp gate (tests/syscall_gate.py) that holds
    the module inside a system call at `moment` (MOMENTS) while this process makes the target
    exit (SIGKILL, reaped) and, with reuse, gives its pid to a new unrelated process (through
    ns_last_pid: this namespace hands out pids for nothing else meanwhile). The module's code
    is not touched. Returns the result (with diff), who lived on, and what the gate did."""
    import errno  # pylint: disable=import-outside-toplevel
    import signal  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    from tests.functional.pidns import starttime  # pylint: disable=import-outside-toplevel
    from tests.syscall_gate import SyscallGate  # pylint: disable=import-outside-toplevel

    started, procs = {}, {}
    for spec in holders:
        started.update(ns.start(**spec))
        procs[spec["key"]] = ns.procs[-1]
    victim = started[target]
    acted, newcomer, maps_read = [], [], []

    def act(call):
        procs[target].kill()
        procs[target].wait()
        if reuse:
            with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
                handle.write(str(victim["pid"] - 1))
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL)
            ns.procs.append(proc)
            newcomer.append({"pid": proc.pid, "starttime": starttime(proc.pid)})
        acted.append({"syscall": call.syscall, "path": (call.path or b"").decode(), "args": list(call.args[:2])})

    def on_call(call):
        if acted:
            return
        pid = victim["pid"]
        if moment == "mid_pass":
            if call.path == b"/proc/%d/maps" % pid:
                maps_read.append(call)
            elif maps_read and call.path == b"/proc/%d/stat" % pid:
                act(call)
        elif moment == "before_description" and call.path == b"/proc/%d/cmdline" % pid:
            act(call)
        elif moment == "before_signal" and call.args[0] == pid:
            act(call)
        elif moment == "before_kill_without_pidfd" and call.args[:2] == (started[other]["pid"], signal.SIGTERM):
            act(call)

    deny = {"pidfd_open": errno.ENOSYS} if moment == "before_kill_without_pidfd" else {}
    with SyscallGate(ns.scratch, hold=MOMENTS[moment], deny=deny, handler=on_call) as gate:
        result = ns.module("gpu_reset", dict(FAST, device_paths=device_paths), diff=True, env=NO_NVML,
                           python=gate.python)
    return {"result": result, "holders": started, "acted": acted, "newcomer": newcomer[0] if newcomer else None,
            "newcomer_alive": bool(newcomer) and ns.alive(newcomer[0]),
            "alive": dict((key, ns.alive(entry)) for key, entry in started.items())}


def detached_successor_runs(ns, holder, device_paths, watch, runs, params=None) -> dict:
    """`runs` times: start `holder` (whose SIGTERM handler detaches a successor, pidns.HOLDER's
    term_detaches), run gpu_reset, wait until the handler's chain is over (every process left in
    the namespace has said it is ready: the middle process has exited), then see who still maps
    the watched paths. Returns per run the module's rc, message and targets' names, and the
    mappers left; everything left is killed before the next run."""
    import os  # pylint: disable=import-outside-toplevel
    import select  # pylint: disable=import-outside-toplevel
    import signal  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    from tests.functional.pidns import read_stat  # pylint: disable=import-outside-toplevel
    done = []
    for _run in range(runs):
        started = ns.start(**holder)
        ready = {entry["pid"] for entry in started.values()}
        stdout = ns.procs[-1].stdout
        result = ns.module("gpu_reset", dict(FAST, device_paths=device_paths, **(params or {})), env=NO_NVML)
        deadline = time.monotonic() + 60  # a bound for a hung handler, not a measurement
        while True:
            ns.reap()
            living = {int(name) for name in os.listdir("/proc") if name.isdigit() and name != "1"}
            living = {pid for pid in living if (read_stat(pid) or ("Z",))[0] not in ("Z", "X")}
            if living <= ready:
                break
            if time.monotonic() > deadline:
                raise AssertionError("the SIGTERM handler's chain did not settle: %s" % sorted(living - ready))
            if select.select([stdout], [], [], 0.05)[0]:
                line = stdout.readline()
                if line:
                    ready.add(json.loads(line)["pid"])
        left = ns.mappers(watch)
        done.append({"rc": result["rc"], "msg": result.get("msg", ""), "left": left,
                     "targets": [t["name"] for t in result.get("targets", [])]})
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        ns.reap()
    return {"runs": done}


def detached_successor_gated(ns, holder, device_paths, watch, params=None, argv_extra=()) -> dict:
    """The detached successor born at the worst moment, on purpose: `holder` (term_detaches, its
    middle process held on the FIFO detach_hold) is stopped by gpu_reset under a seccomp gate
    (tests/syscall_gate.py) that holds the module at its first read of a process's stat once the
    holder is gone: the scan after the round has listed /proc. The test then lets the middle
    process fork the successor and waits until the middle has exited and the successor has taken
    its name, so the successor is in no listing that scan took, and its parent is gone when the
    scan reads it. params: more of gpu_reset's; argv_extra: more arguments of the holder (its
    successor has them too). Returns the result, who maps the watched paths after the run and
    which processes other than this one live then."""
    import os  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    from tests.functional.pidns import read_stat  # pylint: disable=import-outside-toplevel
    from tests.syscall_gate import SyscallGate  # pylint: disable=import-outside-toplevel

    fifo = str(ns.scratch / "detach.fifo")
    os.mkfifo(fifo)
    started = ns.start(argv_extra=list(argv_extra), **dict(holder, detach_hold=fifo))
    server = started[holder["key"]]["pid"]
    released = []

    def gone(pid):
        return (read_stat(pid) or ("X",))[0] in ("Z", "X")

    def named(comm):
        # The successor takes its name after its fork: until then a scan reads the middle's name.
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/comm" % entry, "rb") as handle:
                    if handle.read().strip() == comm.encode():
                        return True
            except OSError:
                continue
        return False

    def on_call(call):
        if released or not (call.path or b"").startswith(b"/proc/") or not call.path.endswith(b"/stat"):
            return
        if call.path == b"/proc/%d/stat" % server or not gone(server):
            return
        with open(fifo, "wb") as handle:  # the middle process forks the successor now
            handle.write(b"+")
        middle = int(open(fifo + ".pid").read())
        deadline = time.monotonic() + 60  # a bound for a hung middle process, not a measurement
        while not (gone(middle) and named("successor")) and time.monotonic() < deadline:
            time.sleep(0.01)
        released.append({"middle": middle, "held_at": call.path.decode()})

    with SyscallGate(ns.scratch, hold=["openat"], handler=on_call) as gate:
        result = ns.module("gpu_reset", dict(FAST, device_paths=device_paths, **(params or {})), env=NO_NVML,
                           python=gate.python)
    living = sorted(pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if pid != 1 and not gone(pid))
    return {"result": result, "released": released, "left": ns.mappers(watch), "living": living}
