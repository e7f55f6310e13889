"""A node's servers out of HAProxy's rotation: in one cleanslate.gpu.lb_rotation run, against one run per server.

Debian's HAProxy in front of N local servers (default 4, tests/haproxy.py), the module run as Ansible
runs it (fresh interpreter, JSON in and out), side by side in each round:

  one run     lb_rotation with `servers`: the servers' state read once, their drains side by side
              (what the role does since issue 42's thirteenth pass for the servers a run resets)
  per server  lb_rotation with `server`, once per server, one after another (what the role did before)

in two cases: each server holds one open request for longer than the drain timeout (a hung or busy
server: every drain waits its timeout), and idle servers (nothing to wait for: the cost is the runs
and the exchanges). Each measurement has a HAProxy and servers of its own, started and stopped outside
its time, every server ready at its start: a HAProxy whose servers had sessions cut at maintenance a few
times queued later requests without sending them on. The JSON goes to build/bench/rotation.json.

    .venv/bin/python bench/bench_rotation.py [--servers 4] [--drain-timeout-s 2] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.haproxy import BACKEND, HAProxy, Upstream  # noqa: E402  pylint: disable=wrong-import-position
from tests.run_module import run_module  # noqa: E402  pylint: disable=wrong-import-position
from bench import provenance  # noqa: E402  pylint: disable=wrong-import-position

WAYS = ("one run", "per server")


def hold_one_request_each(lb, upstreams):
    """One open /slow request on each server (round robin sends N requests in a row to N servers); the threads."""
    for upstream in upstreams.values():
        upstream.entered.clear()
        upstream.released.clear()
    threads = [threading.Thread(target=lambda: lb.get("/slow"), daemon=True) for dummy in upstreams]
    for thread in threads:
        thread.start()
    if not all(upstream.entered.wait(30) for upstream in upstreams.values()):
        raise SystemExit("a request through HAProxy never reached its server: %s" % lb.log_path.read_text()[-2000:])
    return threads


def take_out(way, lb, names, markers, drain_timeout_s):
    """Seconds to take every server out, the one way or the other; each run must succeed."""
    base = {"backend": BACKEND, "state": "out", "socket": lb.socket, "marker_dir": markers,
            "drain_timeout_s": drain_timeout_s}
    calls = [dict(base, servers=names)] if way == "one run" else [dict(base, server=name) for name in names]
    started = time.monotonic()
    for params in calls:
        result = run_module("lb_rotation", params)
        if result["rc"] != 0:
            raise SystemExit("lb_rotation failed: %s" % result.get("msg"))
    return time.monotonic() - started


def measure(way, case, names, drain_timeout_s):
    """Seconds to take the servers out `way`, in `case`, behind a HAProxy and servers of its own (started and
    stopped outside the time): HAProxy keeps what earlier cut sessions did to its servers' connections."""
    upstreams = {name: Upstream(name) for name in names}
    workdir = Path(tempfile.mkdtemp(prefix="cleanslate-bench-rotation-"))
    lb = HAProxy(workdir, {name: "127.0.0.1:%d" % upstream.port for name, upstream in upstreams.items()}, checks=False)
    threads = []
    try:
        threads = hold_one_request_each(lb, upstreams) if case == "held" else []
        return take_out(way, lb, names, str(workdir / "markers"), drain_timeout_s)
    finally:
        for upstream in upstreams.values():
            upstream.release()
        for thread in threads:
            thread.join(30)
        lb.stop()
        for upstream in upstreams.values():
            upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--drain-timeout-s", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    measured_on = provenance.begin("rotation")
    names = ["node1-vllm-%d" % index for index in range(args.servers)]
    times = {case: {way: [] for way in WAYS} for case in ("held", "idle")}
    for round_index in range(args.repeat):
        for case in ("held", "idle"):
            for way in (WAYS if round_index % 2 == 0 else WAYS[::-1]):
                seconds = measure(way, case, names, args.drain_timeout_s)
                times[case][way].append(round(seconds, 3))
                print("round %d, %s servers, %s: %.2f s" % (round_index + 1, case, way, seconds), flush=True)
    median = {case: {way: statistics.median(values) for way, values in ways.items()} for case, ways in times.items()}
    report = {"servers": args.servers, "drain_timeout_s": args.drain_timeout_s, "repeat": args.repeat, "times_s": times,
              "median_s": median, "measured_on": provenance.end(measured_on)}
    label = {"held": "each holding a request past the %d s drain timeout" % args.drain_timeout_s, "idle": "idle"}
    report["summary"] = [{
        "measure": "%d servers out of HAProxy's rotation, %s" % (args.servers, label[case]),
        "ours_s": median[case]["one run"], "baseline": "one lb_rotation run per server",
        "baseline_s": median[case]["per server"],
        "ratio": round(median[case]["one run"] / median[case]["per server"], 2),
        "target": "under 2 drain timeouts" if case == "held" else "-",
        "met": median[case]["one run"] < 2 * args.drain_timeout_s if case == "held" else None,
    } for case in ("held", "idle")]
    out = REPO / "build" / "bench" / "rotation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for row in report["summary"]:
        print("%s: one run %.2f s, one run per server %.2f s (%.2fx)"
              % (row["measure"], row["ours_s"], row["baseline_s"], row["ratio"]))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
