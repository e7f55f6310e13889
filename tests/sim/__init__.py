"""The crashed-node simulator: `crash(root)` builds a node that a crashed vLLM server left
behind, under ROOT only; `clean(root)` kills what it started (by pid and start time) and
removes ROOT. Standard library only: it also runs in bare Debian test containers.

ROOT/
  .cleanslate-sim      marks a root this simulator built (clean refuses any other)
  manifest.json        what crash made (also its return value)
  dev/                 nvidia0..N-1, nvidiactl, nvidia-uvm, nvidia-uvm-tools
  shm/                 leftovers, one in-use-by-fd and one mapped-only segment
  site-packages/       simvllm with a patched module whose old bytecode still loads
  nvml/                the fake NVML state: per-GPU memory registered by the holders
  bin/ run/            the processes' program, plan, pid records, ready reports and logs

The processes descend from one "sim-init" process (the manifest's `init`), a child
subreaper that reaps them like a node's init would; orphans are re-parented to it. Their
device files look as the real driver's do (tests/sim/processes.py, `context`): every process
that touches the driver opens every device file; holders with a CUDA context map their GPUs'
files, nvidiactl and nvidia-uvm; a forked child of a dead parent and a process that only
initialised CUDA map GPU files and nvidiactl; a monitor maps none. Manifest roles: api_server,
worker (one per TP rank), orphan_worker, term_ignorer, unpinned_worker (every GPU visible,
its context on one), forked_child (NVML lists its dead parent's pid, `listed_pid`), monitor,
init_only, bystander, persistenced, shm_mapper.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from . import devices, processes, procinfo, shm, site_packages
from .procinfo import SimError

__all__ = ["SimError", "crash", "clean"]

MARKER = ".cleanslate-sim"
MAX_GPUS = 64


def _check_counts(gpus, tp) -> None:
    for label, value in (("gpus", gpus), ("tp", tp)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_GPUS:
            raise SimError("%s must be an integer from 1 to %d, not %r" % (label, MAX_GPUS, value))
    if tp > gpus:
        raise SimError("tp (%d) cannot exceed gpus (%d): each TP worker needs its own GPU" % (tp, gpus))


def _check_root(root: Path) -> Path:
    """Return the nearest directory that exists (root itself when it is an empty directory)."""
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise SimError("root %s exists and is not a directory" % root)
    if root.is_dir():
        if any(root.iterdir()):
            raise SimError("root %s exists and is not empty; give a new or empty directory" % root)
        near = root
    else:
        near = root.parent
        while not near.exists():
            near = near.parent
    if not near.is_dir() or not os.access(near, os.W_OK | os.X_OK):
        raise SimError("cannot create %s: no write permission in %s" % (root, near))
    return near


def _nvml_env(state_dir: Path, lib_dir) -> tuple:
    try:
        from ..fixtures.fake_nvml import BuildError, FakeNvml  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise SimError("the fake NVML (tests/fixtures/fake_nvml) cannot be imported: %s" % exc) from exc
    if lib_dir is not None and not (Path(lib_dir) / "libnvidia-ml.so.1").is_file():
        raise SimError("lib_dir %s holds no libnvidia-ml.so.1" % lib_dir)
    nvml = FakeNvml(state_dir, lib_dir=lib_dir)
    try:
        return nvml, nvml.env()  # without lib_dir this builds the library, outside ROOT
    except BuildError as exc:
        raise SimError(str(exc).splitlines()[0]) from exc


def crash(root, gpus=4, tp=4, device_kind="auto", lib_dir=None, python=None) -> dict:
    """Build a crashed node under ROOT and return its manifest (also in ROOT/manifest.json).

    Every input is checked before anything is made; a failure half-way kills what started
    and leaves ROOT as it was."""
    _check_counts(gpus, tp)
    root = Path(os.path.realpath(os.fspath(root)))
    python = python or sys.executable
    if not os.access(python, os.X_OK):
        raise SimError("python %s is not an executable" % python)
    try:
        near = _check_root(root)
    except PermissionError as exc:  # a directory on the way may not be searched
        raise SimError("cannot reach %s: %s" % (root, exc.strerror.lower())) from exc
    kind = devices.resolve_kind(device_kind, near)
    nvml, env = _nvml_env(root / "nvml", lib_dir)

    existed = root.is_dir()
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("built by tests.sim; `python -m tests.sim clean --root %s` removes it\n" % root)
    try:
        return _build(root, gpus, tp, kind, nvml, env, python)
    except BaseException:
        _teardown(root, keep_dir=existed)
        raise


def _build(root: Path, gpus: int, tp: int, kind: str, nvml, env: dict, python: str) -> dict:
    dev_dir, shm_dir = root / "dev", root / "shm"
    devices.create(dev_dir, gpus, kind)
    shm_dir.mkdir()
    leftovers = shm.leftovers(shm_dir)
    mapped = shm.mapped_segment(shm_dir)
    site = site_packages.build(root / "site-packages", python)

    spec = processes.plan(root, gpus, tp, mapped, shm_dir)
    ready = processes.start(root, spec, python)
    for parent in ("engine_parent", "forking_parent"):
        processes.wait_exited(root / "run", parent, ready)
    roles = processes.describe(spec, ready)
    orphan = roles["orphan_worker"][0]
    if orphan["ppid"] == orphan["parent_pid"]:
        raise SimError("the orphan worker was not re-parented")
    # torch names segments after the creating pid; this one's creator is dead.
    leftovers.append(shm.torch_leftover(shm_dir, orphan["parent_pid"]))

    nvml.create(gpu_count=gpus)
    for entries in roles.values():
        for entry in entries:
            for gpu in entry["gpus"]:
                nvml.register(entry["pid"], gpu, entry["mib"], reported_pid=entry.get("listed_pid"))

    worker0 = roles["worker"][0]
    manifest = {
        "root": str(root),
        "dev_dir": str(dev_dir),
        "device_paths": devices.patterns(dev_dir),
        "device_files": [str(dev_dir / name) for name in devices.names(gpus)],
        "device_kind": kind,
        "gpu_count": gpus,
        "tp": tp,
        "shm_dir": str(shm_dir),
        "nvml": {"state_dir": str(nvml.state_dir), "lib_dir": env["LD_LIBRARY_PATH"], "env": env},
        "processes": roles,
        "api_server_pattern": re.escape(str(root / "bin" / "vllm")) + " serve ",
        "shm": {"leftovers": sorted(leftovers),
                "in_use": [{"path": mapped, "pid": roles["shm_mapper"][0]["pid"], "how": "mapped"},
                           {"path": worker0["open_shm"], "pid": worker0["pid"], "how": "fd"}]},
        "site_packages": site,
        "python": python,
        "init": processes.describe_init(root),
    }
    path = root / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _targets(root: Path) -> list:
    """Every process this root's build started: the manifest's and the pid records (a
    half-built root has only the latter)."""
    found = {}
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}  # a half-built root
    listed = [(role, entry) for role, entries in manifest.get("processes", {}).items() for entry in entries]
    if manifest.get("init"):
        listed.append(("init", manifest["init"]))
    for role, entry in listed:
        found[entry["pid"]] = {"pid": entry["pid"], "create_time": entry["create_time"], "role": role,
                               "name": entry.get("name")}
    for record in processes.recorded(root):
        found.setdefault(record["pid"], {"pid": record["pid"], "create_time": record["create_time"],
                                         "role": record["key"], "name": None})
    return list(found.values())


def _teardown(root: Path, keep_dir: bool = False) -> list:
    targets = _targets(root)
    init = [t for t in targets if t["role"] in ("init", "launcher")]
    # Kill the node's processes first; its init reaps them and then exits by itself (killed
    # only if it does not, since zombies it had not reaped yet would go to the host's PID 1).
    killed = procinfo.kill_all([t for t in targets if t not in init])
    procinfo.wait_gone(init, 30.0)
    killed += procinfo.kill_all(init)
    processes.reap_launcher(root)
    if keep_dir:
        for child in root.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    else:
        shutil.rmtree(root)
    return killed


def clean(root) -> dict:
    """Kill what crash started under ROOT (only pids whose start time still matches), wait
    until they are gone, remove ROOT. A missing ROOT is already clean."""
    root = Path(os.path.realpath(os.fspath(root)))
    if not root.exists():
        return {"root": str(root), "killed": [], "removed": False}
    if not (root / MARKER).is_file():
        raise SimError("%s was not built by tests.sim (no %s); refusing to touch it" % (root, MARKER))
    killed = _teardown(root)
    return {"root": str(root), "killed": killed, "removed": True}
