"""gpu_reset against the manual ritual and against fuser, side by side.

1. Reset. A fresh simulated crashed node (tests/sim) per run, whose holders all exit on
   SIGTERM (the simulator's SIGTERM-ignorer is killed before the clock starts). Timed:
     module   cleanslate.gpu.gpu_reset run as Ansible runs it (fresh interpreter, JSON in and
              out), from its start until it returns, which is after every holder is gone
     ritual   what an operator types, scoped to this node's processes and device files:
              `kill -9 <every python process of the node>; sleep 3; fuser -k -9 <devices>; sleep 3`
   Targets: module under 0.5 s, at least 10x faster than the ritual.

2. Scan. About 2000 live processes (`sleep`), 8 of which hold device files under a private
   directory. Timed: the pass gpu_reset runs (_procs.process_table with the files: each
   process's identity, open files and mappings) against `fuser -v <files>` on the same files,
   which reads open files and mappings too. Target: within 1.5x of fuser.

Medians over --repeat runs; the JSON goes to build/bench/gpu_reset.json.

    .venv/bin/python bench/bench_gpu_reset.py [--repeat 3] [--procs 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / ".ansible" / "collections"))
# pylint: disable=wrong-import-position
from tests import sim  # noqa: E402
from tests.fixtures.fake_nvml import build_library  # noqa: E402
from tests.run_module import ensure_collection_link, run_module  # noqa: E402
from tests.sim.procinfo import same_process  # noqa: E402
from bench import provenance  # noqa: E402

ensure_collection_link()
from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs  # noqa: E402

OUT = REPO / "build" / "bench"
HOLDER_ROLES = ("api_server", "worker", "orphan_worker", "term_ignorer")


def crashed(work, lib_dir, run):
    """A crashed node whose holders all exit on SIGTERM, and the pids/start times to watch."""
    manifest = sim.crash(work / ("node-%d" % run), lib_dir=lib_dir)
    ignorer = manifest["processes"]["term_ignorer"][0]
    if same_process(ignorer["pid"], ignorer["create_time"]):
        os.kill(ignorer["pid"], signal.SIGKILL)  # this bench times holders that exit on SIGTERM
    holders = [(e["pid"], e["create_time"]) for role in HOLDER_ROLES[:3] for e in manifest["processes"][role]]
    return manifest, holders


def all_gone(holders):
    return not any(same_process(pid, started) for pid, started in holders)


def time_module(manifest, holders):
    params = {"device_paths": manifest["device_paths"], "cmdline_patterns": [manifest["api_server_pattern"]],
              "grace_period": 30, "kill_timeout": 10}
    start = time.perf_counter()
    result = run_module("gpu_reset", params, env=manifest["nvml"]["env"])
    seconds = time.perf_counter() - start
    if result["rc"] != 0 or not all_gone(holders):
        raise SystemExit("gpu_reset did not stop every holder: %s" % result.get("msg", result))
    return seconds, result["elapsed_s"]


def node_python_pids(root):
    """The ritual's `pkill -9 python3`, limited to this node: python processes whose command
    line names the node's root. Never a machine-wide match."""
    pids = []
    for pid, stat in _procs.process_table(with_cmdline=True).items():
        argv = stat["cmdline"]
        try:
            exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
        except OSError:
            continue
        if exe.startswith("python") and any(root in arg for arg in argv):
            pids.append(str(pid))
    return pids


def time_ritual(manifest, holders):
    files = manifest["device_files"]
    script = "kill -9 %s 2>/dev/null; sleep 3; fuser -k -9 %s >/dev/null 2>&1; sleep 3" % (
        " ".join(node_python_pids(manifest["root"])), " ".join(files))
    start = time.perf_counter()
    subprocess.run(["bash", "-c", script], check=False)
    seconds = time.perf_counter() - start
    if not all_gone(holders):
        raise SystemExit("the ritual left holders alive")
    return seconds


def bench_reset(repeat):
    lib_dir = build_library(REPO / "build" / "fake_nvml")
    module_s, module_inner_s, ritual_s = [], [], []
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-reset-"))
    try:
        for run in range(repeat):
            # Alternate which goes first, so neither always runs on a warmer machine.
            order = (("module", "ritual") if run % 2 == 0 else ("ritual", "module"))
            for which in order:
                manifest, holders = crashed(work, lib_dir, len(module_s) + len(ritual_s))
                try:
                    if which == "module":
                        wall, inner = time_module(manifest, holders)
                        module_s.append(wall)
                        module_inner_s.append(inner)
                    else:
                        ritual_s.append(time_ritual(manifest, holders))
                finally:
                    sim.clean(manifest["root"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"module_s": module_s, "module_elapsed_s": module_inner_s, "ritual_s": ritual_s,
            "module_median_s": statistics.median(module_s), "ritual_median_s": statistics.median(ritual_s),
            "module_elapsed_median_s": statistics.median(module_inner_s)}


def start_sleepers(count, files):
    """count `sleep` processes; the first len(files) hold one file each open (fd 3)."""
    procs = []
    try:
        for index in range(count):
            if index < len(files):
                cmd = ["bash", "-c", "exec 3<%s; exec sleep 600" % files[index]]
            else:
                cmd = ["sleep", "600"]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
    except BaseException:
        stop(procs)
        raise
    return procs


def stop(procs):
    for proc in procs:
        proc.kill()  # our own children, by their Popen handles
    for proc in procs:
        proc.wait()


def bench_scan(repeat, count):
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-reset-scan-"))
    files = []
    for name in ["nvidia%d" % i for i in range(8)] + ["nvidiactl", "nvidia-uvm"]:
        (work / name).touch()
        files.append(str(work / name))
    procs = start_sleepers(count, files[:8])
    try:
        time.sleep(1.0)  # let the bash wrappers exec into sleep and open their file
        processes = len(_procs.process_table())
        scan_s, fuser_s = [], []
        expected = None
        for _round in range(repeat * 3):
            start = time.perf_counter()
            table = _procs.process_table(paths=files)
            scan_s.append(time.perf_counter() - start)
            held = [pid for pid, stat in table.items() if stat["opened"] or stat["mapped"]]
            start = time.perf_counter()
            fuser = subprocess.run(["fuser", "-v"] + files, capture_output=True, text=True, check=False)
            fuser_s.append(time.perf_counter() - start)
            expected = expected or set(p.pid for p in procs[:8])
            if set(held) != expected or fuser.returncode != 0:
                raise SystemExit("scan found %s, expected %s" % (sorted(held), sorted(expected)))
    finally:
        stop(procs)
        shutil.rmtree(work, ignore_errors=True)
    return {"processes": processes, "scan_s": scan_s, "fuser_s": fuser_s,
            "scan_median_s": statistics.median(scan_s), "fuser_median_s": statistics.median(fuser_s)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2000)
    args = parser.parse_args(argv)
    if shutil.which("fuser") is None:
        raise SystemExit("fuser (psmisc) is needed for the ritual and the scan baseline")
    measured_on = provenance.begin("gpu_reset")

    reset = bench_reset(args.repeat)
    scan = bench_scan(args.repeat, args.procs)

    reset_ratio = reset["ritual_median_s"] / reset["module_median_s"]
    scan_ratio = scan["scan_median_s"] / scan["fuser_median_s"]
    summary = [
        {"measure": "gpu_reset: crashed node, all holders gone", "ours_s": reset["module_median_s"],
         "baseline": "kill -9 python; sleep 3; fuser -k; sleep 3", "baseline_s": reset["ritual_median_s"],
         "ratio": reset_ratio, "target": "< 0.5 s and >= 10x faster",
         "met": reset["module_median_s"] < 0.5 and reset_ratio >= 10},
        {"measure": "gpu_reset: /proc scan, %d processes" % scan["processes"], "ours_s": scan["scan_median_s"],
         "baseline": "fuser -v", "baseline_s": scan["fuser_median_s"], "ratio": scan_ratio,
         "target": "<= 1.5x fuser", "met": scan_ratio <= 1.5},
    ]
    print("%-44s %10s %10s %8s  %s" % ("measure", "ours s", "base s", "ratio", "target"))
    for row in summary:
        verdict = "" if row["met"] else "  NOT MET"
        print("%-44s %10.3f %10.3f %8.2f  %s%s"
              % (row["measure"], row["ours_s"], row["baseline_s"], row["ratio"], row["target"], verdict))
    print("module's own elapsed_s (after interpreter start and imports): median %.3f s"
          % reset["module_elapsed_median_s"])
    OUT.mkdir(parents=True, exist_ok=True)
    report = {"host": {"python": platform.python_version(), "cpus": os.cpu_count(), "kernel": platform.release()},
              "repeat": args.repeat, "reset": reset, "scan": scan, "summary": summary,
              "measured_on": provenance.end(measured_on)}
    (OUT / "gpu_reset.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
