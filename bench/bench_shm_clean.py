"""shm_clean against the manual ritual, side by side.

A private directory under /dev/shm gets 10,000 crash leftovers named like the real ones; 500 live
`sleep` processes run meanwhile, and some of them hold a leftover open (a job still using its
segment). Then, from identical starting states, we time:

  rm -f     `cd DIR && rm -f -- nccl-* psm_* ...` with the module's default patterns; checks nothing
  module    cleanslate.gpu.shm_clean run as Ansible runs it (fresh interpreter, JSON in and out)
  startup   the module with a pattern that matches nothing: the fixed cost of a module run

and print the medians, the ratio module / rm -f, and how many in-use segments each one deleted.
The JSON goes to build/bench/shm_clean.json.

    .venv/bin/python bench/bench_shm_clean.py [--leftovers 10000] [--procs 500] [--held 100] [--repeat 3]
                                              [--hold-by open|map]

--hold-by map makes the holders Python processes that map their leftover and close the descriptor
(as NCCL does), so only /proc/PID/maps shows the use.
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
from tests.run_module import run_module  # noqa: E402  pylint: disable=wrong-import-position
from bench import provenance  # noqa: E402  pylint: disable=wrong-import-position

PATTERNS = ["nccl-*", "psm_*", "sem.mp-*", "sem.loky-*", "torch_*", "*vllm*"]
# One name per pattern family, in the shapes the real libraries use.
SHAPES = ["nccl-%08x", "psm_%08x", "sem.mp-%08x", "sem.loky-%08x", "torch_4194303_%d_0", "vllm-ipc-%08x"]


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def names(count):
    dead = dead_pid()
    out = []
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        out.append(shape.replace("4194303", str(dead)) % i)
    return out


def populate(directory, leftover_names, size):
    """(Re)create every leftover with `size` bytes of data, keeping inodes of existing ones."""
    payload = os.urandom(size)
    for name in leftover_names:
        with open(directory / name, "wb") as handle:
            handle.write(payload)


def start_sleepers(count):
    return [subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL) for number in range(count)]


MAP_AND_CLOSE = r"""
import mmap, os, sys, time
path = sys.argv[1]
mapping = mmap.mmap(os.open(path, os.O_RDWR), 0)
# Python's mmap keeps a duplicate of the descriptor: close every descriptor of the file, so that
# only the mapping shows the use (as NCCL leaves it).
for name in os.listdir("/proc/self/fd"):
    try:
        if os.readlink("/proc/self/fd/" + name) == path:
            os.close(int(name))
    except OSError:
        pass
print("ready", flush=True)
time.sleep(3600)
"""


def start_holders(directory, held_names, how="open"):
    """One process per name using that leftover: a job still using it. open: a sleep process
    holding it open on its stdin; map: a Python process that maps it and closes its descriptors."""
    procs = []
    for name in held_names:
        if how == "map":
            proc = subprocess.Popen([sys.executable, "-c", MAP_AND_CLOSE, str(directory / name)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
            procs.append(proc)
            if proc.stdout.readline() != b"ready\n":
                raise SystemExit("a mapping holder failed to start")
            continue
        with open(directory / name, "rb") as handle:
            procs.append(subprocess.Popen(["sleep", "3600"], stdin=handle))
    return procs


def stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait()


def time_rm_globbed(directory):
    """rm -f with the shell expanding the globs, exactly as typed by hand."""
    started = time.perf_counter()
    subprocess.run(["sh", "-c", "cd \"$1\" && rm -f -- " + " ".join(PATTERNS), "sh", str(directory)], check=True)
    return time.perf_counter() - started


def time_module(directory, patterns=None):
    params = {"path": str(directory)}
    if patterns is not None:
        params["patterns"] = patterns
    started = time.perf_counter()
    result = run_module("shm_clean", params)
    elapsed = time.perf_counter() - started
    if result["rc"] != 0:
        raise SystemExit("module failed: %s" % result.get("msg"))
    return elapsed, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--leftovers", type=int, default=10000)
    parser.add_argument("--procs", type=int, default=500)
    parser.add_argument("--held", type=int, default=100, help="sleep processes that hold a leftover open")
    parser.add_argument("--size", type=int, default=4096, help="bytes per leftover")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hold-by", choices=("open", "map"), default="open",
                        help="how the holders use their leftover: an open descriptor, or only a mapping")
    parser.add_argument("--out", default=str(REPO / "build" / "bench" / "shm_clean.json"))
    args = parser.parse_args()
    if args.held > min(args.procs, args.leftovers):
        parser.error("--held must not exceed --procs or --leftovers")

    measured_on = provenance.begin("shm_clean")
    directory = Path(tempfile.mkdtemp(prefix="cleanslate-bench-", dir="/dev/shm"))
    leftover_names = names(args.leftovers)
    held_names = leftover_names[::max(1, args.leftovers // max(1, args.held))][:args.held]
    idle, holders = [], []
    times = {"rm -f": [], "module": [], "startup": []}
    deleted_in_use = {"rm -f": [], "module": []}
    try:
        idle = start_sleepers(args.procs - args.held)
        for round_number in range(args.repeat):
            # rm -f deletes the held files too, so every round starts with fresh files and holders.
            populate(directory, leftover_names, args.size)
            stop(holders)
            holders = start_holders(directory, held_names, args.hold_by)
            elapsed, result = time_module(directory)
            times["module"].append(elapsed)
            deleted_in_use["module"].append(sum(not (directory / n).exists() for n in held_names))
            if len(result["removed"]) != args.leftovers - args.held or len(result["in_use"]) != args.held:
                raise SystemExit("module removed %d and kept %d in use; expected %d and %d" % (
                    len(result["removed"]), len(result["in_use"]), args.leftovers - args.held, args.held))

            populate(directory, leftover_names, args.size)
            times["startup"].append(time_module(directory, patterns=["cleanslate-bench-matches-nothing"])[0])

            times["rm -f"].append(time_rm_globbed(directory))
            deleted_in_use["rm -f"].append(sum(not (directory / n).exists() for n in held_names))
    finally:
        stop(holders)
        stop(idle)
        shutil.rmtree(directory, ignore_errors=True)

    median = {key: statistics.median(values) for key, values in times.items()}
    report = {
        "leftovers": args.leftovers, "processes": args.procs, "held": args.held, "held_by": args.hold_by,
        "bytes_each": args.size,
        "repeat": args.repeat, "seconds": times, "median_s": median,
        "ratio_module_to_rm": median["module"] / median["rm -f"],
        "ratio_module_work_to_rm": (median["module"] - median["startup"]) / median["rm -f"],
        "in_use_deleted": {key: max(values) for key, values in deleted_in_use.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        "measured_on": provenance.end(measured_on),
    }
    report["summary"] = [{
        "measure": "shm_clean, %d leftovers, %d procs" % (args.leftovers, args.procs), "ours_s": median["module"],
        "baseline": "rm -f (deleted %d in use)" % report["in_use_deleted"]["rm -f"], "baseline_s": median["rm -f"],
        "ratio": report["ratio_module_to_rm"], "target": "0 in use deleted",
        "met": report["in_use_deleted"]["module"] == 0}]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    print("shm_clean vs rm -f: %d leftovers, %d live processes (%d holding a leftover by %s), median of %d runs"
          % (args.leftovers, args.procs, args.held, "a mapping only" if args.hold_by == "map" else "an open descriptor",
             args.repeat))
    print("%-34s %10s %16s" % ("", "seconds", "in-use deleted"))
    print("%-34s %10.3f %16d" % ("rm -f (checks nothing)", median["rm -f"], report["in_use_deleted"]["rm -f"]))
    print("%-34s %10.3f %16d" % ("shm_clean module", median["module"], report["in_use_deleted"]["module"]))
    print("%-34s %10.3f %16s" % ("  of which module startup", median["startup"], "-"))
    print("ratio module / rm -f: %.1fx (%.1fx without the fixed startup)"
          % (report["ratio_module_to_rm"], report["ratio_module_work_to_rm"]))
    print("written: %s" % out)


if __name__ == "__main__":
    main()
