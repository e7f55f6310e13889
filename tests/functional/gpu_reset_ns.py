"""gpu_reset's test scenarios, each run as PID 1 of a private PID namespace (tests/functional/pidns.py).

`holders_then_runs` is the declarative one most tests use: start holders (pidns.HOLDER specs),
register what the fake NVML lists for them, run gpu_reset one or more times, and report each
run's result with which holders were alive after it. The helpers at the top build the specs
outside the namespace, as the real driver would shape them.
"""
from __future__ import annotations

import os
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


def pid_reused_mid_pass(ns, device_paths, device) -> dict:
    """A holder's files are read, then (before its identity is checked again) it dies and an
    unrelated process takes its pid. gpu_reset runs in this process, with the /proc reader
    wrapped so the reuse happens at exactly that point; the wrapped reader still reads /proc.

    Returns whether the newcomer got the pid (else the race was not staged) and survived."""
    import signal  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    from tests.run_module import ensure_collection_link  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, str(ensure_collection_link()))
    # pylint: disable=import-outside-toplevel
    from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs
    from ansible_collections.cleanslate.gpu.plugins.modules import gpu_reset

    ns.start(key="pid-2")  # (so that the holder is not pid 2, which old versions took for a kernel thread)
    holder = ns.start(key="holder", map=[device])["holder"]
    newcomer = []
    read_maps = _procs._mapped_paths  # pylint: disable=protected-access

    def read_then_reuse(pid, needle, proc=_procs.PROC):
        found = read_maps(pid, needle, proc)
        if pid == holder["pid"] and not newcomer:
            os.kill(pid, signal.SIGKILL)
            ns.procs[-1].wait()
            time.sleep(0.05)  # start times count clock ticks: the newcomer starts in a later one
            with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
                handle.write(str(pid - 1))
            newcomer.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        return found

    _procs._mapped_paths = read_then_reuse  # pylint: disable=protected-access

    class Module(object):
        check_mode = False
        _diff = False
        params = dict(device_paths=device_paths, gpus=[], cmdline_patterns=[], cgroup=None, users=None,
                      protect_names=gpu_reset.DEFAULT_PROTECT_NAMES, include_children=True,
                      grace_period=0.5, kill_timeout=5)

    try:
        result = gpu_reset.run(Module(), time.monotonic())
    finally:
        _procs._mapped_paths = read_maps  # pylint: disable=protected-access
    staged = bool(newcomer) and newcomer[0].pid == holder["pid"]
    return {"staged": staged, "newcomer_alive": bool(newcomer) and newcomer[0].poll() is None,
            "targets": [t["pid"] for t in result["targets"]], "holder": holder}
