"""nvml_verify against the manual ritual, side by side: how long after the last GPU holder
dies does each one report the node clean?

Eight real `sleep` processes hold 70 GB each on the eight GPUs of the fake NVML (the C
library the real pynvml loads; it counts a holder's memory only while it lives). Seven die
first; the last is killed at a random moment while the checker waits. We time from that
kill to the checker's return:

  ritual   `until <query> | all "0 MiB"; do sleep 3; done`, where the query is an
           nvidia-smi --query-gpu=memory.used style process (a fresh interpreter reading
           NVML v2 "used", as modern nvidia-smi shows it)
  module   cleanslate.gpu.nvml_verify run as Ansible runs it, polling every --poll-interval

and print the medians, the ratio ritual / module and whether the module met its target
(median under 2 x poll_interval).

A second measure: NVML that answers slowly (every memory and process call takes
--slow-call seconds on all eight GPUs, as a GPU in a bad state does) with `timeout: 1`.
We time how long each checker takes to give an answer: the module must answer within its
timeout (target: timeout + 1 s for the interpreter and Ansible's wrapper), the ritual's one
query pass takes 8 x slow-call. The JSON goes to build/bench/nvml_verify.json.

    .venv/bin/python bench/bench_nvml_verify.py [--trials 5] [--poll-interval 0.1] [--seed 1] [--slow-call 1.9]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.fixtures.fake_nvml import FakeNvml, build_library  # noqa: E402  pylint: disable=wrong-import-position
from tests.run_module import run_module  # noqa: E402  pylint: disable=wrong-import-position
from bench import provenance  # noqa: E402  pylint: disable=wrong-import-position

GPUS = 8
HOLD_MIB = 70000
RITUAL_SLEEP = 3

# What `nvidia-smi --query-gpu=memory.used --format=csv,noheader` prints, one line a GPU.
QUERY = """
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    print("%d MiB" % (pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used // 1048576))
pynvml.nvmlShutdown()
"""

RITUAL = 'until ! "$PY" -c "$QUERY" | grep -qv "^0 MiB$"; do sleep %d; done' % RITUAL_SLEEP


def start_holders(fake):
    holders = []
    for gpu in range(GPUS):
        proc = subprocess.Popen(["sleep", "600"])
        fake.register(proc.pid, gpu, HOLD_MIB)
        holders.append(proc)
    return holders


def kill(proc):
    proc.kill()
    proc.wait()


def forget(fake, holders):
    for proc in holders:
        fake.unregister(proc.pid)


def loaded_nvml(state_dir):
    """True once a process pointed at this state (the checker) has loaded libnvidia-ml."""
    needle = ("FAKE_NVML_STATE=%s" % state_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                if needle not in handle.read().split(b"\0"):
                    continue
            with open("/proc/%s/maps" % entry, encoding="utf-8") as handle:
                if "libnvidia-ml.so.1" in handle.read():
                    return True
        except OSError:
            continue
    return False


def wait_for_checker(state_dir, give_up_s=60.0):
    deadline = time.monotonic() + give_up_s
    while time.monotonic() < deadline:
        if loaded_nvml(state_dir):
            return
        time.sleep(0.01)
    raise RuntimeError("the checker never loaded libnvidia-ml")


def trial_module(fake, rng, poll_interval):
    holders = start_holders(fake)
    for proc in holders[:-1]:
        kill(proc)
    box = {}

    def run():
        box["result"] = run_module("nvml_verify", {"timeout": 120, "poll_interval": poll_interval}, env=fake.env())
        box["end"] = time.monotonic()

    runner = threading.Thread(target=run)
    runner.start()
    try:
        wait_for_checker(fake.state_dir)
        time.sleep(rng.uniform(0.1, 1.0))
        killed_at = time.monotonic()
        kill(holders[-1])
    finally:
        runner.join(180)
        forget(fake, holders)
    if not box["result"].get("ok"):
        raise RuntimeError("nvml_verify did not pass: %s" % box["result"].get("msg"))
    return box["end"] - killed_at


def trial_ritual(fake, rng):
    holders = start_holders(fake)
    for proc in holders[:-1]:
        kill(proc)
    env = dict(os.environ, **fake.env(), PY=sys.executable, QUERY=QUERY)
    ritual = subprocess.Popen(["bash", "-c", RITUAL], env=env)
    try:
        # Anywhere in the first query-and-sleep cycle, like a holder dying at any moment.
        time.sleep(rng.uniform(0.3, 0.3 + RITUAL_SLEEP))
        killed_at = time.monotonic()
        kill(holders[-1])
        ritual.wait(60)
        end = time.monotonic()
    finally:
        if ritual.poll() is None:
            ritual.kill()
            ritual.wait()
        forget(fake, holders)
    if ritual.returncode != 0:
        raise RuntimeError("the ritual loop failed (exit %d)" % ritual.returncode)
    return end - killed_at


def slow_nvml(fake, seconds, slow_timeout):
    """(module seconds to its answer, its result, one ritual query pass in seconds) on slow NVML."""
    fake.inject("hang", seconds=seconds)
    try:
        began = time.monotonic()
        result = run_module("nvml_verify", {"timeout": slow_timeout}, env=fake.env())
        module = time.monotonic() - began
        if result.get("ok") or not result.get("unfinished_call"):
            raise RuntimeError("nvml_verify should have run out of time: %s" % result.get("msg"))
        env = dict(os.environ, **fake.env())
        began = time.monotonic()
        subprocess.run([sys.executable, "-c", QUERY], env=env, check=True, capture_output=True)
        ritual = time.monotonic() - began
    finally:
        fake.clear("hang")
    return module, result, ritual


def summary(samples):
    return {"median_s": round(statistics.median(samples), 3), "min_s": round(min(samples), 3),
            "max_s": round(max(samples), 3), "samples_s": [round(s, 3) for s in samples]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--poll-interval", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slow-call", type=float, default=1.9, help="seconds per NVML call in the slow case")
    args = parser.parse_args()
    measured_on = provenance.begin("nvml_verify")
    slow_timeout = 1.0
    rng = random.Random(args.seed)
    lib_dir = build_library(REPO / "build" / "fake_nvml")
    with tempfile.TemporaryDirectory(prefix="bench-nvml-") as tmp:
        fake = FakeNvml(Path(tmp) / "nvml", lib_dir=lib_dir)
        fake.create(gpu_count=GPUS)
        module, ritual = [], []
        # Interleaved, so that a busy moment on the machine hits both alike.
        for _trial in range(args.trials):
            module.append(trial_module(fake, rng, args.poll_interval))
            ritual.append(trial_ritual(fake, rng))
        slow_module, slow_result, slow_ritual = slow_nvml(fake, args.slow_call, slow_timeout)
    report = {
        "benchmark": "nvml_verify: latency from the last holder's death to the checker's success",
        "gpus": GPUS, "trials": args.trials, "poll_interval_s": args.poll_interval, "seed": args.seed,
        "target_s": 2 * args.poll_interval,
        "module": summary(module),
        "ritual": dict(summary(ritual), command=RITUAL.replace('"$PY" -c "$QUERY"', "nvidia-smi-style query")),
        "ratio_ritual_over_module": round(statistics.median(ritual) / statistics.median(module), 1),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    report["measured_on"] = provenance.end(measured_on)
    report["module_meets_target"] = report["module"]["median_s"] < report["target_s"]
    report["slow_nvml"] = {
        "seconds_per_call": args.slow_call, "timeout_s": slow_timeout, "target_s": slow_timeout + 1,
        "module_answer_s": round(slow_module, 3), "module_waited_s": slow_result["waited_s"],
        "module_unfinished_call": slow_result["unfinished_call"],
        "ritual_one_query_s": round(slow_ritual, 3),
        "met": slow_module < slow_timeout + 1,
    }
    # The row `python -m bench` puts in its table; ratio = baseline / ours (how many times sooner).
    report["summary"] = [{
        "measure": "holder death -> clean reported, median",
        "ours_s": report["module"]["median_s"],
        "baseline": "query + sleep %d loop" % RITUAL_SLEEP,
        "baseline_s": report["ritual"]["median_s"],
        "ratio": report["ratio_ritual_over_module"],
        "target": "< 2 x poll_interval = %.2f s" % report["target_s"],
        "met": report["module_meets_target"],
    }, {
        "measure": "answer with timeout 1 s, NVML %.1f s a call" % args.slow_call,
        "ours_s": report["slow_nvml"]["module_answer_s"],
        "baseline": "one query pass, 8 GPUs",
        "baseline_s": report["slow_nvml"]["ritual_one_query_s"],
        "ratio": round(slow_ritual / slow_module, 1),
        "target": "< timeout + 1 s = %.1f s" % (slow_timeout + 1),
        "met": report["slow_nvml"]["met"],
    }]
    out = REPO / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "nvml_verify.json").write_text(json.dumps(report, indent=2) + "\n")
    print("release-detection latency, %d trials, %d GPUs (seconds from the last holder's death)" % (args.trials, GPUS))
    print("%-34s %8s %8s %8s" % ("checker", "median", "min", "max"))
    for name, label in (("ritual", "query + sleep %d loop" % RITUAL_SLEEP),
                        ("module", "nvml_verify (poll %gs)" % args.poll_interval)):
        row = report[name]
        print("%-34s %8.3f %8.3f %8.3f" % (label, row["median_s"], row["min_s"], row["max_s"]))
    print("ratio ritual / module: %.1fx; module target < %.2f s: %s" % (
        report["ratio_ritual_over_module"], report["target_s"], "met" if report["module_meets_target"] else "MISSED"))
    slow = report["slow_nvml"]
    print("slow NVML (%.1f s a call, 8 GPUs), timeout %g s: nvml_verify answered in %.2f s (target < %.1f s: %s);"
          " one query pass took %.2f s" % (slow["seconds_per_call"], slow["timeout_s"], slow["module_answer_s"],
                                           slow["target_s"], "met" if slow["met"] else "MISSED", slow["ritual_one_query_s"]))
    print("JSON: %s" % (out / "nvml_verify.json"))


if __name__ == "__main__":
    main()
