"""Several servers on one node (issue 26) against a real NVIDIA driver: one server crashes, the
reset is scoped to it, and its healthy neighbour must come through exactly as it was.

Each server is what a systemd unit runs: an API-server-like parent without CUDA, in a cgroup named
like its unit (`<cgroup v2 mount>/vllm-a.service`, made here), and its workers. The crash kills the
broken server's parent and leaves its workers holding its GPU. Then gpu_reset runs as node_reset
runs it for the broken instance (`gpus` = its GPU, `spare_units` = the neighbour's unit,
`spare_gpus` = the neighbour's GPU, a cmdline pattern that matches the neighbour's processes too),
and nvml_verify of the broken GPU alone.

  12-two-servers-two-gpus    two GPUs (nvidia-h200-x2): each server has two TP-like workers with a
                             context on its GPU. After the reset: GPU 0 idle, GPU 1's NVML memory and
                             processes exactly as before, the neighbour's pids and start times too.
  13-neighbour-without-context  one GPU: the broken server's CUDA tree on GPU 0; the neighbour's parent
                             and a worker that has every device file open without mapping it (no
                             context) both match the pattern and are spared by their unit's cgroup.
  14-neighbour-reset-yml      13's node, reset by playbooks/reset.yml with node_reset's variables
                             (node_reset_gpu_reset_spare_units, _spare_gpus, node_reset_nvml_verify_gpus):
                             a refused overlap first, then the reset, then a second run with changed=0.

Before anything is signalled, gpu_reset runs in check mode twice: without the spare options (the
reset as it was before issue 26: it must find the neighbour, or this scenario proves nothing) and
with them (its targets must be exactly the broken server's live processes, all started here, else
the scenario stops). Nothing here resets a GPU or changes a GPU setting.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from tests.gpu.scenarios import IDLE_MIB, PROTECT, REPO, TAG, Started, alive, guard, identity, nvml_read, run_reset

UNITS = ("vllm-a.service", "vllm-b.service")  # the broken server's unit, the healthy neighbour's
PATTERN = re.escape(TAG)  # the engine's pattern: every server's command line matches it


def cgroup2_mount() -> str | None:
    """Where cgroup v2 is mounted (the unified hierarchy, also under a hybrid layout), or None."""
    with open("/proc/self/mounts") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return fields[1]
    return None


class UnitCgroups:
    """The units' cgroups this script made, removed again once their processes are gone."""

    def __init__(self):
        self.made = []

    def make(self, unit: str) -> str:
        """The directory of a new cgroup named `unit`; raises OSError with the reason when it can't be made."""
        mount = cgroup2_mount()
        if not mount:
            raise OSError("no cgroup v2 hierarchy is mounted")
        path = os.path.join(mount, unit)
        if os.path.exists(path):
            raise OSError("%s exists already (not ours: left alone)" % path)
        os.mkdir(path)
        self.made.append(path)
        return path

    def remove(self):
        """Kill what is left in them (only processes this script started are born there), then remove them."""
        for path in reversed(self.made):
            for pid in read_procs(path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while True:
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)


def read_procs(path: str) -> list:
    """The pids in a cgroup directory (cgroup.procs)."""
    try:
        with open(os.path.join(path, "cgroup.procs")) as handle:
            return [int(line) for line in handle if line.strip()]
    except OSError:
        return []


def cgroup_of(pid: int) -> list:
    """The cgroup paths of a process, one per hierarchy (/proc/PID/cgroup)."""
    try:
        with open("/proc/%d/cgroup" % pid) as handle:
            return [line.rstrip("\n").split(":", 2)[2] for line in handle if line.count(":") >= 2]
    except OSError:
        return []


def device_fds(pid: int) -> int:
    """How many of its descriptors point at an NVIDIA device file."""
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return -1
    count = 0
    for name in names:
        try:
            count += os.readlink("/proc/%d/fd/%s" % (pid, name)).startswith("/dev/nvidia")
        except OSError:
            continue
    return count


def snapshot(pids) -> dict:
    """What 'exactly as it was' compares for each process: (parent, start time), cgroups, device fds."""
    return {str(pid): {"identity": identity(pid), "cgroup": cgroup_of(pid), "device_fds": device_fds(pid)}
            for pid in sorted(pids)}


def spare_options_known(run_module) -> str | None:
    """None when gpu_reset takes spare_units and spare_gpus, else why not (checked in check mode,
    before any process is started)."""
    preview = run_module("gpu_reset", {"spare_units": [], "spare_gpus": [], "cmdline_patterns": []}, check=True)
    if preview.get("failed"):
        return "gpu_reset refuses spare_units/spare_gpus here: %s" % preview.get("msg")
    return None


def start_server(started: Started, workdir: Path, cgroup: str, gpu: str, workers: int, worker_role: str, mib: int):
    """One server in `cgroup`, its workers seeing GPU `gpu` alone; returns the holder's ready info."""
    return started.start("server", workdir, mib=mib, visible=gpu,
                         extra=("--workers", str(workers), "--worker-role", worker_role, "--cgroup", cgroup))


def crash(started: Started, parent: int) -> None:
    """The API server dies (SIGKILL, as the OOM killer does); its workers go on holding the GPU."""
    os.kill(parent, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(parent) and time.monotonic() < deadline:
        started.reap()
        time.sleep(0.05)


def reset_by_modules(run_module, params: dict, left: list, neighbour: list, spared_ones: list) -> tuple:
    """gpu_reset then nvml_verify of the broken GPU, as node_reset's steps run them: (record, checks).
    spared_ones: the neighbour's processes gpu_reset must report in `spared`."""
    broken_gpu = params["gpus"][0]
    # A GPU both reset and spared is refused before anything is read or signalled.
    overlap = run_module("gpu_reset", dict(params, spare_gpus=[broken_gpu]))
    overlap_spared_all = all(alive(pid) for pid in left + neighbour)
    reset = run_module("gpu_reset", params)
    verify = run_module("nvml_verify", {"gpus": [broken_gpu], "timeout": 30})
    spared = {item["pid"]: item for item in reset.get("spared") or []}
    record = {"overlap": {"failed": overlap.get("failed"), "msg": overlap.get("msg")},
              "reset": {k: reset.get(k) for k in ("rc", "failed", "msg", "targets", "spared", "survivors")},
              "verify": {k: verify.get(k) for k in ("rc", "ok", "failed", "msg", "problems")}}
    return record, {
        "spare_gpus naming the reset GPU refused, naming spare_gpus, nothing signalled":
            bool(overlap.get("failed")) and "spare_gpus" in str(overlap.get("msg")) and overlap_spared_all,
        "gpu_reset ok, its targets the broken server's workers": reset.get("rc") == 0 and not reset.get("failed")
            and sorted(t["pid"] for t in reset.get("targets", [])) == sorted(left),
        "nvml_verify of GPU %s alone passed" % broken_gpu: verify.get("ok") is True and not verify.get("failed"),
        "the neighbour's pattern-matched processes reported as spared, naming its unit":
            all(pid in spared and params["spare_units"][0] in str(spared[pid].get("why")) for pid in spared_ones),
    }


def reset_by_playbook(params: dict, left: list, neighbour: list, logs: Path) -> tuple:
    """playbooks/reset.yml -l gpu_nodes on this machine with node_reset's variables for the broken
    instance (the role runs gpu_reset, shm_clean and nvml_verify of node_reset_nvml_verify_gpus),
    twice, after a run that spares the GPU it resets: (record, checks)."""
    variables = {"node_reset_gpu_reset_%s" % option: value for option, value in params.items()}
    variables.update(node_reset_gpu_reset_protect_names=PROTECT, node_reset_nvml_verify_gpus=params["gpus"])
    overlap = run_reset(dict(variables, node_reset_gpu_reset_spare_gpus=params["gpus"]), logs / "shared-node-overlap.log")
    overlap_log = (logs / "shared-node-overlap.log").read_text()
    overlap_spared_all = all(alive(pid) for pid in left + neighbour)
    first = run_reset(variables, logs / "shared-node-first.log")
    second = run_reset(variables, logs / "shared-node-second.log")
    record = {"variables": variables, "overlap": overlap, "first": first, "second": second}
    return record, {
        "node_reset_gpu_reset_spare_gpus naming the reset GPU refused by name, nothing signalled":
            overlap["rc"] != 0 and "node_reset_gpu_reset_spare_gpus" in overlap_log and overlap_spared_all,
        "reset.yml ok; the report: the broken server's workers killed": first["rc"] == 0 and first["failed"] == 0
            and first["row"].get("killed") == len(left),
        "a second reset.yml changed nothing (the neighbour spared again)": second["rc"] == 0 and second["changed"] == 0,
    }


def shared_node_scenario(name: str, workdir: Path, gpus_needed: int, broken_gpu: str, neighbour_gpu: str | None,
                         neighbour_role: str, broken_role: str = "hold", units: tuple = UNITS,
                         playbook: bool = False) -> dict:
    """Start the two servers, crash the first, reset it alone (gpu_reset and nvml_verify, or with
    playbook reset.yml), compare the neighbour before and after. broken_role and units are for the
    CPU's run of the same steps (tests/functional/test_gpu_shared_node.py)."""
    sys.path.insert(0, str(REPO))
    from tests.run_module import run_module  # pylint: disable=import-outside-toplevel
    result = {"scenario": name}
    gpus = len(nvml_read())
    if gpus < gpus_needed:
        result.update(skipped="needs %d GPUs, this machine has %d" % (gpus_needed, gpus), passed=True, checks={})
        return result
    why_not = spare_options_known(run_module)
    if why_not:
        result.update(skipped=why_not, passed=True, checks={})
        return result
    started, cgroups = Started(), UnitCgroups()
    try:
        try:
            broken_cg, healthy_cg = cgroups.make(units[0]), cgroups.make(units[1])
        except OSError as exc:
            result.update(skipped="no cgroup named like a unit can be made here: %s" % exc, passed=True, checks={})
            return result
        broken = start_server(started, workdir, broken_cg, broken_gpu, 2, broken_role, 2048)
        healthy = start_server(started, workdir, healthy_cg, neighbour_gpu or broken_gpu, 2 if neighbour_gpu else 1,
                               neighbour_role, 2048)
        result["servers"] = {units[0]: broken, units[1]: healthy}
        result["cgroups"] = {str(pid): cgroup_of(pid) for pid in broken["pids"] + healthy["pids"]}
        crash(started, broken["parent"])
        left = [pid for pid in broken["pids"] if alive(pid)]
        result["before"] = nvml_read()
        neighbour_before = snapshot(healthy["pids"])
        params = {"gpus": [broken_gpu], "cmdline_patterns": [PATTERN], "spare_units": [units[1]],
                  "spare_gpus": [neighbour_gpu] if neighbour_gpu else [], "grace_period": 5}
        unscoped = run_module("gpu_reset", {"gpus": [broken_gpu], "cmdline_patterns": [PATTERN]}, check=True)
        preview = run_module("gpu_reset", params, check=True)
        result["preview_without_spare"] = [t["pid"] for t in unscoped.get("targets", [])]
        result["preview"] = {"targets": preview.get("targets"), "spared": preview.get("spared"),
                             "clients": preview.get("clients")}
        stop = preview.get("msg") if preview.get("failed") else guard(preview.get("targets", []), left, started.owns)
        if stop:
            result["error"] = "check mode: %s; nothing was signalled" % stop
            return result
        if playbook:
            record, checks = reset_by_playbook(params, left, healthy["pids"], workdir.parent)
        else:
            # Reported in `spared`: at least the neighbour's pattern-matched processes that hold no GPU
            # of the reset (a worker on another GPU is out of `gpus`' scope as well, whichever is said).
            spared_ones = [healthy["parent"]] + ([] if neighbour_gpu else healthy["workers"])
            record, checks = reset_by_modules(run_module, params, left, healthy["pids"], spared_ones)
        started.reap()
        after = nvml_read()
        neighbour_after = snapshot(healthy["pids"])
        result.update(record, after=after, neighbour={"before": neighbour_before, "after": neighbour_after})
        checks.update({
            "every process started in its unit's cgroup": all(
                any(path.split("/")[-1] == unit for path in result["cgroups"][str(pid)])
                for unit, info in ((units[0], broken), (units[1], healthy)) for pid in info["pids"]),
            "without the spare options the neighbour's parent would be a target":
                healthy["parent"] in result["preview_without_spare"],
            "the broken server's processes gone": not any(alive(pid) for pid in broken["pids"]),
            "GPU %s idle (NVML v2 used < %d MiB)" % (broken_gpu, IDLE_MIB): after[int(broken_gpu)]["v2_used_mib"] < IDLE_MIB,
            "the neighbour's processes exactly as before (pid, parent, start time, cgroup, device fds)":
                neighbour_after == neighbour_before and all(v["identity"] for v in neighbour_after.values()),
        })
        if neighbour_gpu:
            gpu = int(neighbour_gpu)
            checks["GPU %s's NVML memory and processes exactly as before" % neighbour_gpu] = (
                {k: after[gpu][k] for k in ("v2_used_mib", "pid_mib")}
                == {k: result["before"][gpu][k] for k in ("v2_used_mib", "pid_mib")}
                and sorted(p for p, _mib in after[gpu]["pid_mib"]) == sorted(healthy["workers"])
                and after[gpu]["v2_used_mib"] >= 2 * 2048)
        else:
            checks["the neighbour's worker still has the device files open"] = all(
                neighbour_after[str(pid)]["device_fds"] > 0 for pid in healthy["workers"])
        result["checks"] = checks
        result["passed"] = all(checks.values())
        return result
    except Exception as exc:  # pylint: disable=broad-except
        result["error"] = repr(exc)
        return result
    finally:
        started.kill_all()
        cgroups.remove()


SHARED_NODE_SCENARIOS = [
    ("12-two-servers-two-gpus",
     lambda workdir: shared_node_scenario("12-two-servers-two-gpus", workdir, 2, "0", "1", "hold")),
    ("13-neighbour-without-context",
     lambda workdir: shared_node_scenario("13-neighbour-without-context", workdir, 1, "0", None, "open-devices")),
    ("14-neighbour-reset-yml",
     lambda workdir: shared_node_scenario("14-neighbour-reset-yml", workdir, 1, "0", None, "open-devices", playbook=True)),
]
