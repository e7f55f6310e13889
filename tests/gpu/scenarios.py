"""Crash scenarios against a real NVIDIA driver, each followed by playbooks/reset.yml on
localhost and checked the way an operator would check: NVML v2 memory back to idle, the
protected daemon alive, nvml_verify passing, the report written, a second run unchanged.

    python3 -m tests.gpu.scenarios --out DIR [--only NAME ...]

Run by tests/gpu/run.sh (which sets up ansible from carried wheels). Before each reset a
check-mode gpu_reset lists its targets; if any target is not a process this script started,
the scenario stops without signalling anything (a real GPU machine may run things of others).

Scenarios 12 to 14 (tests/gpu/shared_node.py) put two servers on one node, each in a cgroup
named like its unit, crash one and reset it alone; 12 needs two GPUs.

Scenarios 7 to 11 need two GPUs (they report SKIP on one) and run gpu_reset itself, as Ansible
runs it, with `gpus`: pinned holders on GPU 0 and GPU 1, an unpinned process with its context on
GPU 0, a forked child of a dead parent, an NVML monitor and a CUDA-init-only process that must
survive. Each step signals only when its check-mode targets are exactly the pids it expects.
Nothing here resets a GPU or changes a GPU setting.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PY = sys.executable
TAG = "cleanslate-gpu-scenario-serve"
IDLE_MIB = 16  # nvml_verify's default max_memory_used_mib


def nvml_read() -> dict:
    """One NVML reading in a child process, so this process never holds the device files."""
    code = ("import json,pynvml as n;n.nvmlInit();"
            "h=[n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())];"
            "m=lambda x:x//1048576;"
            "print(json.dumps([{'index':i,'v1_used_mib':m(n.nvmlDeviceGetMemoryInfo(g).used),"
            "'v2_used_mib':m(n.nvmlDeviceGetMemoryInfo(g,version=n.nvmlMemory_v2).used),"
            "'v2_reserved_mib':m(n.nvmlDeviceGetMemoryInfo(g,version=n.nvmlMemory_v2).reserved),"
            "'pids':[p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(g)],"
            "'pid_mib':sorted([p.pid,None if p.usedGpuMemory is None else m(p.usedGpuMemory)]"
            " for p in n.nvmlDeviceGetComputeRunningProcesses(g))} for i,g in enumerate(h)]));"
            "n.nvmlShutdown()")
    return json.loads(subprocess.run([PY, "-c", code], check=True, capture_output=True, text=True).stdout)


def alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def identity(pid: int):
    """(parent pid, start time) of a live process, or None: a pid reused by another process differs."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else (int(fields[1]), int(fields[19]))


class Started:
    """Processes this script started, by pid, for the preflight guard and the cleanup."""

    def __init__(self):
        self.procs = []
        self.pids = set()

    def start(self, role: str, workdir: Path, mib: int = 1024, timeout: float = 300, visible: str | None = None,
              device: int = 0, extra: tuple = ()) -> dict:
        """Start a holder role; visible: CUDA_VISIBLE_DEVICES for it ("" or None: every GPU visible);
        extra: more of the role's arguments."""
        ready = workdir / ("%s-%d-%d.json" % (role, os.getpid(), len(self.procs)))
        if ready.exists():
            ready.unlink()
        argv = [PY, "-m", "tests.gpu.holders", role, "--ready", str(ready), "--mib", str(mib), "--tag", TAG,
                "--device", str(device)] + list(extra)
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible:
            env["CUDA_VISIBLE_DEVICES"] = visible
        proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if proc.poll() not in (None, 0) or time.monotonic() > deadline:
                raise RuntimeError("%s did not get ready (rc=%s)" % (role, proc.poll()))
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        self.pids.update(info["pids"])
        self.pids.add(proc.pid)
        return info

    def owns(self, pid: int) -> bool:
        """Whether pid is one we started or descends from one (e.g. multiprocessing's resource_tracker)."""
        while pid > 1:
            if pid in self.pids:
                return True
            try:
                with open("/proc/%d/stat" % pid) as handle:
                    pid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
        return False

    def reap(self):
        for proc in self.procs:
            proc.poll()

    def kill_all(self):
        for pid in sorted(self.pids):
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


def ansible_env() -> dict:
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_PYTHON_INTERPRETER"] = PY
    env["ANSIBLE_STDOUT_CALLBACK"] = "default"
    return env


def preflight_targets(protect: list, patterns: list) -> list:
    """gpu_reset in check mode with the reset's options: what it would signal, nothing signalled."""
    args = json.dumps({"protect_names": protect, "cmdline_patterns": patterns})
    out = subprocess.run(["ansible", "localhost", "-c", "local", "-m", "cleanslate.gpu.gpu_reset", "-a", args,
                          "--check", "-e", "ansible_python_interpreter=" + PY],
                         cwd=REPO, env=dict(ansible_env(), ANSIBLE_STDOUT_CALLBACK="minimal", ANSIBLE_LOAD_CALLBACK_PLUGINS="1"),
                         capture_output=True, text=True, check=False)
    match = re.search(r"=> (\{.*\})\s*$", out.stdout, re.S)
    if not match:
        raise RuntimeError("preflight gave no JSON:\n%s\n%s" % (out.stdout, out.stderr))
    return json.loads(match.group(1)).get("targets", [])


INVENTORY = """all:
  children:
    gpu_nodes:
      hosts:
        localhost:
          ansible_connection: local
          ansible_python_interpreter: %s
"""


def run_reset(extra: dict, log: Path) -> dict:
    """playbooks/reset.yml -l gpu_nodes on this machine; returns the recap counts and timing."""
    vars_file = log.with_suffix(".vars.json")
    vars_file.write_text(json.dumps(extra))
    inventory = log.parent / "inventory.yml"
    inventory.write_text(INVENTORY % PY)
    # The fleet report beside the log, where no other run writes (the newest one there is this run's).
    report_dir = log.parent / "reports"
    start = time.monotonic()
    out = subprocess.run(["ansible-playbook", "playbooks/reset.yml", "-i", str(inventory), "-l", "gpu_nodes",
                          "-e", "@" + str(vars_file), "-e", "fleet_report_path=" + str(report_dir)],
                         cwd=REPO, env=ansible_env(), capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    log.write_text(out.stdout + out.stderr)
    recap = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out.stdout)
    if not recap:
        raise RuntimeError("no play recap; see %s\n%s" % (log, out.stdout[-3000:] + out.stderr[-2000:]))
    ok, changed, unreachable, failed = (int(x) for x in recap.groups())
    reports = sorted(report_dir.glob("*.json"), key=lambda p: p.stat().st_mtime)
    row = json.loads(reports[-1].read_text())["hosts"][0] if reports else {}
    return {"rc": out.returncode, "changed": changed, "failed": failed + unreachable, "seconds": round(seconds, 2),
            "report": str(reports[-1]) if reports else None, "row": row}


PROTECT = ["nvidia-persistenced", "nv-hostengine", "dcgm-exporter"]


def scenario(name: str, workdir: Path, setup, out: Path, reset_vars: dict) -> dict:
    started = Started()
    result = {"scenario": name}
    try:
        info = setup(started, workdir)
        started.reap()
        result["before"] = nvml_read()
        targets = preflight_targets(PROTECT, reset_vars["node_reset_gpu_reset_cmdline_patterns"])
        foreign = [t for t in targets if not started.owns(t["pid"])]
        result["preflight_targets"] = [{"pid": t["pid"], "name": t["name"], "reason": t.get("reason")}
                                       for t in targets]
        if foreign:
            result["error"] = "preflight found targets this script did not start: %s" % foreign
            return result
        first = run_reset(reset_vars, out / ("%s-first.log" % name))
        started.reap()
        second = run_reset(reset_vars, out / ("%s-second.log" % name))
        after = nvml_read()
        protected = info.get("protected", [])
        result.update(first=first, second=second, after=after,
                      protected_alive=all(alive(pid) for pid in protected))
        checks = {
            "first run ok": first["rc"] == 0 and first["failed"] == 0,
            "memory back under %d MiB (v2)" % IDLE_MIB: all(g["v2_used_mib"] < IDLE_MIB for g in after),
            "protected process alive": result["protected_alive"],
            "report written": bool(first["report"]),
            "second run changed=0": second["rc"] == 0 and second["changed"] == 0,
        }
        checks.update(info.get("checks", lambda first: {})(first))
        result["checks"] = checks
        result["passed"] = all(checks.values())
        return result
    except Exception as exc:  # pylint: disable=broad-except
        result["error"] = repr(exc)
        return result
    finally:
        started.kill_all()


def s1_big_holder(started, workdir):
    started.start("hold", workdir, mib=20480)
    return {"checks": lambda first: {"report: one killed, >= 20000 MiB freed":
                                     first["row"].get("killed") == 1 and first["row"].get("mib_freed", 0) >= 20000}}


def s2_fork_child(started, workdir):
    info = started.start("fork-child", workdir, mib=4096)
    dead, child = info["dead_parent"], info["pids"][0]
    started.pids.add(dead)
    deadline = time.monotonic() + 10
    while alive(dead) and time.monotonic() < deadline:
        time.sleep(0.05)
    listed = [pid for g in nvml_read() for pid in g["pids"]]
    return {"checks": lambda first: {"NVML listed the dead parent while the child held memory": dead in listed,
                                     "forked child gone": not alive(child)}}


def s3_term_ignorer(started, workdir):
    info = started.start("ignore-term", workdir, mib=2048)
    return {"checks": lambda first: {"TERM-ignorer gone": not alive(info["pids"][0])}}


def s4_spawn_tree(started, workdir):
    info = started.start("spawn-tree", workdir, mib=2048)
    return {"checks": lambda first: {"spawn parent (holds nothing) gone": not alive(info["parent"]),
                                     "every worker gone": not any(alive(pid) for pid in info["pids"])}}


def s5_monitor(started, workdir):
    monitor = started.start("nvml-monitor", workdir)
    started.start("hold", workdir, mib=1024)
    return {"protected": monitor["pids"]}


def s6_shm(started, workdir):
    """torch_* and psm_* segments left in /dev/shm by a crashed server whose cleaners died with it.

    torch (2.11 and 2.13 alike; at::NewProcessWideShmHandle) names a segment
    torch_<pid>_<random>_<counter>. Why the first version of this scenario found none:
    - With the file_system strategy the names belong to torch_shm_manager, which calls setsid()
      (its own session and process group) and shm_unlink()s every segment 2 s after its last client
      disconnects. A SIGKILL to the server's process group misses it, and it cleans up. Segments
      outlive a crash when the manager dies too: systemd stopping the unit (KillMode=control-group),
      docker kill, an OOM kill of the cgroup. So the crash here kills the manager as well.
    - Queue.put() shares a tensor in the queue's feeder thread after put() returned, so the kill
      could come before any segment existed; share_memory_() shares before it returns.
    """
    holder = r"""
import json, os, sys, time
from multiprocessing import shared_memory
import torch
import torch.multiprocessing
ready = sys.argv[1]
torch.multiprocessing.set_sharing_strategy("file_system")
before = set(os.listdir("/dev/shm"))
tensors = [torch.full((1 << 20,), i, dtype=torch.float32).share_memory_() for i in range(4)]
segments = [shared_memory.SharedMemory(create=True, size=1 << 20) for _segment in range(3)]
made = sorted(set(os.listdir("/dev/shm")) - before)
managers = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open("/proc/%s/stat" % pid) as handle:
            comm, rest = handle.read().rsplit(")", 1)
    except OSError:
        continue
    fields = rest.split()
    if comm.endswith("(torch_shm_manag") and int(fields[1]) == os.getpid():
        managers.append([int(pid), int(fields[19])])
with open(ready + ".tmp", "w") as handle:
    json.dump({"pid": os.getpid(), "torch": torch.__version__, "made": made, "managers": managers,
               "psm": [seg.name.lstrip("/") for seg in segments]}, handle)
os.replace(ready + ".tmp", ready)
while True:
    time.sleep(3600)
"""

    ready = workdir / ("shm-leftovers-%d.json" % os.getpid())
    if ready.exists():
        ready.unlink()
    proc = subprocess.Popen([PY, "-c", holder, str(ready), TAG], cwd=REPO, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    started.procs.append(proc)
    started.pids.add(proc.pid)
    deadline = time.monotonic() + 300
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the shm holder did not get ready (rc=%s)" % proc.poll())
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    # The crash, as a cgroup kill does it: the manager (ours while it is still the holder's child
    # with the start time it reported), then the holder's process group with its resource_tracker.
    for pid, starttime in info["managers"]:
        if identity(pid) == (proc.pid, starttime):
            os.kill(pid, signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # Longer than torch_shm_manager's 2 s: had it survived, it would have unlinked its segments by now.
    time.sleep(3)
    mine = "torch_%d_" % info["pid"]
    torch_made = [n for n in info["made"] if n.startswith(mine)]
    renamed = [n for n in info["made"] if not n.startswith(("torch_", "psm_", "sem."))]
    leftovers = [n for n in torch_made + info["psm"] if os.path.exists("/dev/shm/" + n)]
    made_check = "torch %s made %s* segments" % (info["torch"], mine)
    if renamed and not torch_made:
        made_check += " (it made %s instead: shm_clean's default patterns must learn that name)" % renamed
    facts = {
        made_check: bool(torch_made),
        "torch_* and psm_* leftovers outlived the crash (manager killed too)":
            any(n.startswith(mine) for n in leftovers) and any(n.startswith("psm_") for n in leftovers),
    }
    return {"checks": lambda first: dict(facts, **{
        "report: shm bytes freed > 0": first["row"].get("shm_bytes_freed", 0) > 0,
        "every leftover removed": not [n for n in leftovers if os.path.exists("/dev/shm/" + n)]})}


SCENARIOS = [("1-cuda-20gib", s1_big_holder), ("2-fork-dead-parent", s2_fork_child),
             ("3-term-ignorer", s3_term_ignorer), ("4-spawn-tree", s4_spawn_tree),
             ("5-protected-monitor", s5_monitor), ("6-shm-leftovers", s6_shm)]


# --- two GPUs: gpu_reset itself (run as Ansible runs it) with `gpus`, one step at a time ------
#
# Each step first runs gpu_reset in check mode with the step's options; unless its targets are
# exactly the pids the step expects (all started here), the scenario stops there and nothing is
# signalled. Then the real run, and the step's checks.

def guard(targets: list, expected, owns) -> str | None:
    """Why a step must not signal anything (None: go ahead): its check-mode targets must be
    processes this script started, and exactly the ones it expects."""
    pids = set(t["pid"] for t in targets)
    foreign = sorted(pid for pid in pids if not owns(pid))
    if foreign:
        return "check mode found targets this script did not start: %s" % foreign
    if pids != set(expected):
        return "check mode found targets %s where %s were expected" % (sorted(pids), sorted(set(expected)))
    return None


def step(params: dict, expect, checks) -> dict:
    """One gpu_reset run: its options, the pids it must target and {name: check(result)}."""
    return {"params": params, "expect": expect, "checks": checks}


def two_gpu_scenario(name: str, workdir: Path, setup) -> dict:
    """Run the steps setup(started, workdir) returns; the result says what passed, or why not."""
    sys.path.insert(0, str(REPO))
    from tests.run_module import run_module  # pylint: disable=import-outside-toplevel
    result = {"scenario": name, "steps": []}
    gpus = len(nvml_read())
    if gpus < 2:
        result.update(skipped="needs 2 GPUs, this machine has %d" % gpus, passed=True, checks={})
        return result
    started = Started()
    try:
        steps = setup(started, workdir)
        result["checks"] = {}
        for number, item in enumerate(steps, 1):
            started.reap()
            preview = run_module("gpu_reset", item["params"], check=True)
            if preview.get("failed"):
                stop = preview.get("msg")
            else:
                stop = guard(preview.get("targets", []), item["expect"], started.owns)
            record = {"params": item["params"], "preflight_targets": preview.get("targets"),
                      "clients": preview.get("clients")}
            result["steps"].append(record)
            if stop:
                result["error"] = "step %d: %s; nothing was signalled" % (number, stop)
                return result
            record["result"] = run_module("gpu_reset", item["params"])
            started.reap()
            record["after"] = nvml_read()
            for label, check in item["checks"].items():
                result["checks"]["step %d: %s" % (number, label)] = bool(check(record["result"], record["after"]))
        result["passed"] = all(result["checks"].values())
        return result
    except Exception as exc:  # pylint: disable=broad-except
        result["error"] = repr(exc)
        return result
    finally:
        started.kill_all()


def idle(after: list, gpu: int) -> bool:
    return after[gpu]["v2_used_mib"] < IDLE_MIB


def s7_pinned_select(started, workdir):
    """Two servers pinned to GPU 0 and GPU 1; `gpus: ["1"]` stops only GPU 1's."""
    gpu0 = started.start("hold", workdir, mib=2048, visible="0")["pids"][0]
    gpu1 = started.start("hold", workdir, mib=2048, visible="1")["pids"][0]
    return [step({"gpus": ["1"]}, [gpu1], {
        "GPU 1's holder gone, GPU 0's alive": lambda r, a: r.get("rc") == 0 and not alive(gpu1) and alive(gpu0),
        "GPU 1 idle, GPU 0 still used": lambda r, a: idle(a, 1) and not idle(a, 0),
        "target on GPU 1 only": lambda r, a: [t["gpus"] for t in r.get("targets", [])] == [[1]]})]


def s8_unpinned_context(started, workdir):
    """Every GPU visible, a context on GPU 0 only (it maps nvidia0 and nvidia1), and a holder
    pinned to GPU 1: resetting GPU 1 spares the unpinned one; resetting GPU 0 stops it."""
    unpinned = started.start("hold", workdir, mib=2048, device=0)["pids"][0]
    pinned = started.start("hold", workdir, mib=2048, visible="1")["pids"][0]
    return [step({"gpus": ["1"]}, [pinned], {
        "pinned GPU 1 holder gone, unpinned alive": lambda r, a: not alive(pinned) and alive(unpinned),
        "GPU 1 idle": lambda r, a: idle(a, 1)}),
        step({"gpus": ["0"]}, [unpinned], {
            "unpinned holder gone": lambda r, a: r.get("rc") == 0 and not alive(unpinned),
            "its target was on GPU 0 only": lambda r, a: [t["gpus"] for t in r.get("targets", [])] == [[0]],
            "both GPUs idle": lambda r, a: idle(a, 0) and idle(a, 1)})]


def s9_forked_child_select(started, workdir):
    """The parent (every GPU visible, context on GPU 1) forks and dies; its child keeps the
    context, NVML lists the dead parent on GPU 1. Resetting GPU 1 stops the child and spares
    GPU 0's server."""
    info = started.start("fork-child", workdir, mib=2048, device=1)
    dead, child = info["dead_parent"], info["pids"][0]
    started.pids.add(dead)
    deadline = time.monotonic() + 10
    while alive(dead) and time.monotonic() < deadline:
        time.sleep(0.05)
    gpu0 = started.start("hold", workdir, mib=2048, visible="0")["pids"][0]
    return [step({"gpus": ["1"]}, [child], {
        "forked child gone, GPU 0's holder alive": lambda r, a: r.get("rc") == 0 and not alive(child) and alive(gpu0),
        "GPU 1 idle": lambda r, a: idle(a, 1)})]


def s10_monitor_client(started, workdir):
    """An NVML monitor that no protected name covers opens every device file: it holds no GPU
    memory, so a reset of every GPU leaves it running and reports it as a client."""
    monitor = started.start("gpu-monitor", workdir)["pids"][0]
    holder = started.start("hold", workdir, mib=2048, visible="0")["pids"][0]
    return [step({}, [holder], {
        "holder gone, monitor alive": lambda r, a: r.get("rc") == 0 and not alive(holder) and alive(monitor),
        "monitor reported as a client": lambda r, a: monitor in [c["pid"] for c in r.get("clients", [])],
        "every GPU idle": lambda r, a: all(idle(a, g) for g in range(len(a)))})]


def s11_cuda_init_client(started, workdir):
    """CUDA initialised without a context maps the GPU files but holds no memory: with NVML
    accounting for all the memory, it is a client and survives the reset of the real holder."""
    probe = started.start("cuda-init", workdir)["pids"][0]
    holder = started.start("hold", workdir, mib=2048, visible="1")["pids"][0]
    return [step({}, [holder], {
        "holder gone, CUDA-init process alive": lambda r, a: r.get("rc") == 0 and not alive(holder) and alive(probe),
        "it is reported as a client": lambda r, a: probe in [c["pid"] for c in r.get("clients", [])]})]


TWO_GPU_SCENARIOS = [("7-pinned-gpu-select", s7_pinned_select), ("8-unpinned-context", s8_unpinned_context),
                     ("9-forked-child-select", s9_forked_child_select), ("10-monitor-client", s10_monitor_client),
                     ("11-cuda-init-client", s11_cuda_init_client)]


def release_latency(workdir: Path, mib: int = 20480) -> float:
    """Seconds from SIGKILL of a holder of `mib` MiB until NVML v2 used is idle again."""
    started = Started()
    try:
        info = started.start("hold", workdir, mib=mib)
        import pynvml  # pylint: disable=import-outside-toplevel
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        kill_at = time.monotonic()
        os.kill(info["pids"][0], signal.SIGKILL)
        while any(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used >= IDLE_MIB * 2**20
                  for h in handles):
            time.sleep(0.002)
        seconds = time.monotonic() - kill_at
        pynvml.nvmlShutdown()
        return seconds
    finally:
        started.kill_all()


def _wait_idle(handles, pynvml) -> None:
    while any(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used >= IDLE_MIB * 2**20
              for h in handles):
        time.sleep(0.005)


def reset_vs_ritual(workdir: Path, runs: int = 3, mib: int = 4096) -> dict:
    """The same crash (one CUDA holder that exits on SIGTERM), cleared two ways, side by side:
    the gpu_reset module (run as Ansible runs it) and the manual ritual, each timed from its
    start until NVML v2 shows the GPU idle. The ritual here is confined to this script's holder
    (kill -9 <pid>; sleep 3; fuser -v on the device files; sleep 3; nvidia-smi), since the real
    one (pkill -9 python3; fuser -k /dev/nvidia*) would kill whatever else runs on the machine."""
    sys.path.insert(0, str(REPO))
    from tests.run_module import run_module  # pylint: disable=import-outside-toplevel
    import pynvml  # pylint: disable=import-outside-toplevel
    devices = sorted(str(p) for p in Path("/dev").glob("nvidia*") if not p.is_dir())
    times = {"module": [], "ritual": []}
    pynvml.nvmlInit()  # this process is the module's ancestor: never one of its targets
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        for _run in range(runs):
            for way in ("module", "ritual"):
                started = Started()
                try:
                    pid = started.start("hold", workdir, mib=mib)["pids"][0]
                    check = run_module("gpu_reset", {"protect_names": PROTECT}, check=True)
                    if [t["pid"] for t in check.get("targets", [])] != [pid]:
                        raise RuntimeError("targets other than our holder: %s" % check.get("targets"))
                    start = time.monotonic()
                    if way == "module":
                        result = run_module("gpu_reset", {"protect_names": PROTECT})
                        if result.get("failed"):
                            raise RuntimeError(result.get("msg"))
                    else:
                        subprocess.run("kill -9 %d; sleep 3; fuser -v %s; sleep 3; nvidia-smi >/dev/null"
                                       % (pid, " ".join(devices)), shell=True, check=False,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    _wait_idle(handles, pynvml)
                    times[way].append(round(time.monotonic() - start, 3))
                finally:
                    started.kill_all()
    finally:
        pynvml.nvmlShutdown()
    med = {way: statistics.median(values) for way, values in times.items()}
    return {"runs": times, "median_s": med, "ritual_over_module": round(med["ritual"] / med["module"], 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m tests.gpu.scenarios")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", nargs="*", default=None, help="scenario names; none skips the benchmarks too")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = out / "work"
    workdir.mkdir(exist_ok=True)
    for stale in workdir.glob("*.json"):
        stale.unlink()
    reset_vars = {"node_reset_gpu_reset_cmdline_patterns": [re.escape(TAG)],
                  "node_reset_gpu_reset_protect_names": PROTECT}
    summary = {"idle": nvml_read(), "scenarios": []}
    runners = [(name, lambda setup=setup, name=name: scenario(name, workdir, setup, out, reset_vars))
               for name, setup in SCENARIOS]
    runners += [(name, lambda setup=setup, name=name: two_gpu_scenario(name, workdir, setup))
                for name, setup in TWO_GPU_SCENARIOS]
    from tests.gpu.shared_node import SHARED_NODE_SCENARIOS  # pylint: disable=import-outside-toplevel
    runners += [(name, lambda run=run: run(workdir)) for name, run in SHARED_NODE_SCENARIOS]
    for name, runner in runners:
        if args.only and name not in args.only:
            continue
        result = runner()
        summary["scenarios"].append(result)
        status = "SKIP" if result.get("skipped") else "PASS" if result.get("passed") else "FAIL"
        shown = result.get("error") or result.get("checks") or result.get("skipped")
        print("%-22s %s %s" % (name, status, json.dumps(shown)), flush=True)
    if args.only:
        (out / "scenarios.json").write_text(json.dumps(summary, indent=2) + "\n")
        return 0 if all(r.get("passed") for r in summary["scenarios"]) else 1
    summary["sigkill_to_released_s_20gib"] = [round(release_latency(workdir), 3) for _run in range(3)]
    print("SIGKILL to released (20 GiB holder), s:", summary["sigkill_to_released_s_20gib"], flush=True)
    summary["reset_vs_ritual"] = reset_vs_ritual(workdir)
    print("gpu_reset module vs manual ritual until the GPU is idle:", json.dumps(summary["reset_vs_ritual"]), flush=True)
    (out / "scenarios.json").write_text(json.dumps(summary, indent=2) + "\n")
    # A skipped scenario (one GPU) counts as neither: "11 passed" on one GPU overstated the proof.
    skipped = sum(1 for r in summary["scenarios"] if r.get("skipped"))
    passed = sum(1 for r in summary["scenarios"] if r.get("passed") and not r.get("skipped"))
    failed = len(summary["scenarios"]) - passed - skipped
    print("%d passed, %d skipped, %d failed" % (passed, skipped, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
