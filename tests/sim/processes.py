"""The node's processes: who runs, under which name and parent, holding what.

`plan()` says it, `start()` makes it happen through ROOT/bin/simproc (program.py) and
returns what /proc then shows, per role."""
from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from . import devices, procinfo
from .procinfo import SimError

PROGRAM = Path(__file__).with_name("program.py")
MODEL = "sim/Llama-3.1-70B-Instruct"
WORKER_MIB = 70000
ORPHAN_MIB = 20000
IGNORER_MIB = 10000
READY_TIMEOUT = 120.0  # generous: tests share two cores with other suites
LAUNCHERS = {}  # root -> Popen of its init, kept so that clean() can reap it


UNPINNED_MIB = 8000
FORKED_MIB = 1634  # what the measured forked child kept alive: its parent's context


def opened(dev_dir: Path, gpus: int) -> list:
    """What every process that touches the driver opens: every device file."""
    return [str(dev_dir / name) for name in devices.names(gpus)]


def context(dev_dir: Path, gpus: int, visible: list, uvm: bool = True) -> dict:
    """A CUDA process's device files, as measured on the real driver (2 x H200, driver 580):
    all open; mapped, the file of each GPU visible to it (its context may be on one of them
    only) plus nvidiactl, and nvidia-uvm when it has a context of its own. CUDA initialised
    without a context, and a child forked after its parent's CUDA initialisation, map the GPU
    files and nvidiactl but not nvidia-uvm."""
    maps = [str(dev_dir / ("nvidia%d" % gpu)) for gpu in visible] + [str(dev_dir / "nvidiactl")]
    return {"devices": opened(dev_dir, gpus), "maps": maps + ([str(dev_dir / "nvidia-uvm")] if uvm else [])}


# The roles a correct reset leaves running, and why (`make demo` marks them in its tables); the
# others hold GPU memory or serve it and are stopped.
SPARED = {
    "monitor": "a GPU client: device files open, no memory",
    "init_only": "CUDA initialised without a context: no memory",
    "persistenced": "nvidia-persistenced, a GPU client",
    "bystander": "touches no GPU",
    "shm_mapper": "maps a shm segment, holds no GPU",
}


def plan(root: Path, gpus: int, tp: int, mapped: str, shm_dir: Path) -> dict:
    """key -> spec read by program.py; `role`, `gpus` and `mib` are for the manifest."""
    dev = root / "dev"
    spec = {
        "api_server": {"role": "api_server", "name": "vllm", "parent": "launcher",
                       "args": [str(root / "bin" / "vllm"), "serve", MODEL, "--tensor-parallel-size", str(tp)]},
    }
    for rank in range(tp):
        # vLLM's TP workers are titled VLLM::Worker_TP<rank>; the kernel keeps 15 chars.
        spec["worker_%d" % rank] = dict(context(dev, gpus, [rank]), role="worker", name="VLLM::Worker_TP%d" % rank,
                                        parent="api_server", gpus=[rank], mib=WORKER_MIB)
    # rank 0 also keeps a torch segment named after its own pid open (an in-use segment by fd)
    spec["worker_0"].update(open_shm_dir=str(shm_dir), token="%d" % secrets.randbits(31))
    orphan_gpu, ignorer_gpu, unpinned_gpu, forked_gpu = tp % gpus, (tp + 1) % gpus, (tp + 2) % gpus, (tp + 3) % gpus
    spec.update({
        # The engine's parent exits at once, so the engine core is re-parented.
        "engine_parent": {"role": None, "name": "vllm", "parent": "launcher", "exit_after_children": True},
        "orphan_worker": dict(context(dev, gpus, [orphan_gpu]), role="orphan_worker", name="VLLM::EngineCore",
                              parent="engine_parent", gpus=[orphan_gpu], mib=ORPHAN_MIB),
        "term_ignorer": dict(context(dev, gpus, [ignorer_gpu]), role="term_ignorer", name="sglang::scheduler_TP0",
                             parent="launcher", ignore_sigterm=True, gpus=[ignorer_gpu], mib=IGNORER_MIB),
        # Every GPU visible (no CUDA_VISIBLE_DEVICES), its context on one: it maps every GPU's
        # file while NVML lists it on that one GPU only.
        "unpinned_worker": dict(context(dev, gpus, list(range(gpus))), role="unpinned_worker",
                                name="sglang::unpinned", parent="launcher", gpus=[unpinned_gpu], mib=UNPINNED_MIB),
        # A child forked after its parent's CUDA initialisation, whose parent then died: it maps
        # the parent's GPU file and nvidiactl (not nvidia-uvm) and keeps the parent's context,
        # which NVML goes on listing under the dead parent's pid.
        "forking_parent": {"role": None, "name": "python3", "parent": "launcher", "exit_after_children": True},
        "forked_child": dict(context(dev, gpus, [forked_gpu], uvm=False), role="forked_child", name="pt_data_worker",
                             parent="forking_parent", gpus=[forked_gpu], mib=FORKED_MIB, listed_as_parent=True),
        # A monitoring agent (an exporter, a device plugin): it opens every device file and maps
        # none, like any NVML client. It holds no GPU memory and is not protected by name.
        "monitor": {"role": "monitor", "name": "gpu-monitor", "parent": "launcher", "devices": opened(dev, gpus)},
        "bystander": {"role": "bystander", "name": None, "parent": "launcher"},
        # argv[0] as the real daemon's, so psutil's name() gives the full 19-char name. Like any
        # NVML user it opens every device file and maps none.
        "persistenced": {"role": "persistenced", "name": "nvidia-persistenced", "argv0": "nvidia-persistenced",
                         "parent": "launcher", "devices": opened(dev, gpus)},
        "shm_mapper": {"role": "shm_mapper", "name": "shm-mapper", "parent": "launcher",
                       "map_only": {"path": mapped, "size": Path(mapped).stat().st_size}},
    })
    if orphan_gpu != forked_gpu:
        # CUDA initialised without a context (a health check that imported torch, pinned to one
        # GPU): it maps that GPU's file and nvidiactl but holds no memory, and NVML does not
        # list it. Only on a GPU where NVML accounts for all the memory: beside the forked
        # child's unattributed memory it could not be told from a holder (neither maps nvidia-uvm).
        spec["init_only"] = dict(context(dev, gpus, [orphan_gpu], uvm=False), role="init_only", name="cuda-probe",
                                 parent="launcher")
    return spec


def start(root: Path, spec: dict, python: str) -> dict:
    """Start everything; return key -> ready report ({pid, ppid, ...})."""
    run = root / "run"
    for sub in ("procs", "ready", "log"):
        (run / sub).mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps(spec, indent=1))
    (root / "bin").mkdir()
    for name in ("simproc", "vllm"):
        shutil.copyfile(PROGRAM, root / "bin" / name)
        (root / "bin" / name).chmod(0o755)
    # The launcher is the node's init: it starts the top-level processes and reaps them and
    # every orphan among them. It is our child only so that `clean` in this same process
    # can reap it too; it outlives us when we are a short-lived CLI.
    with open(run / "log" / "launcher.log", "ab") as log:
        LAUNCHERS[str(root)] = subprocess.Popen(
            [python, str(root / "bin" / "simproc"), "launch"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    return wait_ready(run, list(spec), LAUNCHERS[str(root)])


def wait_ready(run: Path, keys: list, launcher: subprocess.Popen) -> dict:
    deadline = time.monotonic() + READY_TIMEOUT
    ready = {}
    while len(ready) < len(keys):
        if launcher.poll() is not None:
            raise SimError("the simulated node's init exited (%s): %s" % (launcher.returncode, last_log_line(run, "launcher")))
        for key in keys:
            path = run / "ready" / (key + ".json")
            if key not in ready and path.exists():
                ready[key] = json.loads(path.read_text())
        if len(ready) < len(keys) and time.monotonic() > deadline:
            late = [k for k in keys if k not in ready]
            raise SimError("simulated processes not ready after %ds: %s (%s)"
                           % (READY_TIMEOUT, ", ".join(late), last_log_line(run, late[0])))
        time.sleep(0.02)
    return ready


def wait_exited(run: Path, key: str, ready: dict) -> None:
    """Wait until a process that exits by design (the orphan's parent) is gone."""
    record = next((r for r in recorded(run.parent) if r["key"] == key), None)
    deadline = time.monotonic() + READY_TIMEOUT
    while record and procinfo.same_process(record["pid"], record["create_time"]):
        if time.monotonic() > deadline:
            raise SimError("%s (pid %d) did not exit" % (key, ready[key]["pid"]))
        time.sleep(0.02)


def reap_launcher(root: Path, timeout: float = 60.0) -> None:
    """After everything else is gone the init exits by itself; reap it if it is our child."""
    launcher = LAUNCHERS.pop(str(root), None)
    if launcher is not None:
        try:
            launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()


def last_log_line(run: Path, key: str) -> str:
    try:
        lines = (run / "log" / (key + ".log")).read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1] if lines else "no output"


def describe(spec: dict, ready: dict) -> dict:
    """role -> [manifest entry], from what /proc shows now."""
    roles = {}
    for key, item in spec.items():
        if key not in ready or item.get("exit_after_children"):
            continue
        pid = ready[key]["pid"]
        entry = {"pid": pid, "create_time": procinfo.create_time(pid), "name": procinfo.comm(pid),
                 "cmdline": procinfo.cmdline(pid), "ppid": procinfo.ppid(pid),
                 "devices": item.get("devices", []), "maps": item.get("maps", []), "gpus": item.get("gpus", []),
                 "mib": item.get("mib", 0)}
        if item["parent"] != "launcher":
            entry["parent_pid"] = ready[item["parent"]]["pid"]
        if item.get("listed_as_parent"):
            entry["listed_pid"] = entry["parent_pid"]  # the pid NVML shows for its memory
        if "open_shm" in ready[key]:
            entry["open_shm"] = ready[key]["open_shm"]
        roles.setdefault(item["role"], []).append(entry)
    return roles


def describe_init(root: Path) -> dict:
    record = next(r for r in recorded(root) if r["key"] == "launcher")
    pid = record["pid"]
    return {"pid": pid, "create_time": procinfo.create_time(pid), "name": procinfo.comm(pid),
            "cmdline": procinfo.cmdline(pid), "ppid": procinfo.ppid(pid)}


def recorded(root: Path) -> list:
    """Every process that reported its start, even in a half-built root: [{pid, create_time}]."""
    found = []
    for path in sorted((root / "run" / "procs").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            found.append({"pid": int(data["pid"]), "create_time": procinfo.ticks_to_time(int(data["start_ticks"])),
                          "key": data.get("key")})
        except (OSError, ValueError, KeyError):
            continue  # a half-written record: its process had not started anything yet
    return found
