"""The per-instance cost of reset_and_serve.yml (issue 26): one host, one broken server, served
alone or beside three healthy neighbours.

    .venv/bin/python bench/bench_instances.py [--repeat 2]

Boots one systemd host with eight simulated GPUs (tests/integration/fleet) and the stand-in
engine, as tests/integration/test_several_servers_fleet.py does. Then, R times, alternately:

  one    vllm-a.service (GPUs 0,1) is the host's only server, declared with the single-service
         variables (no inference_service_instances): served healthy (untimed, unless the timed
         run just before served the same layout), its API server killed while its TP workers
         hold GPUs 0,1 (the stand-in's dead_api), then the timed run
  four   the same vllm-a.service declared as one of four instances (b, c, d on GPUs 2-7, healthy
         and served, untimed first), vllm-a broken the same way, then the timed run
  last   (only with --layouts) the four instances, vllm-d broken instead: the broken server
         declared after its three healthy neighbours
  two    (only with --layouts) the four instances, vllm-a and vllm-c broken: "serving again" is
         the later of the two
  all    (only with --layouts) the four instances, all broken (a node that crashed): "serving
         again" is the last of the four

The timed run is `ansible-playbook playbooks/reset_and_serve.yml -l node1`, wall clock from
start to exit, the host warm (its SSH reached just before by the untimed run or the timed run
before, as a fleet's hosts are), its host contacts (ssh clients started, bench/ssh_contacts.py) and
the moment the broken server serves again (the gate's first /health 200 plus its first completion;
the last of them where two are broken).
The cost of an instance is (four - one) / 3: what each healthy neighbour adds to the reset of one
broken server (it is assessed, spared, rendered and its gate's looks run).

  --versus CHECKOUT   each timed run again with that checkout's playbook (its roles and collection
                      link), the server broken again before it, on the same host in the same round:
                      two trees measured under the same load
  --layouts L,L       the layouts each round runs: one and four (the default), and any of last, two, all
  --load-s S          the broken servers' next start loads S seconds (a model's load; default: the
                      stand-in's 1 s of the fleet tests)

JSON: build/bench/instances.json (every run, the medians, the ratio, the cost per instance, and
each other tree's medians).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# pylint: disable=wrong-import-position
from tests.fixtures.fake_nvml import build_library  # noqa: E402
from tests.integration.conftest import HOST_NVML_LIB, HOST_TESTS  # noqa: E402
from tests.integration.fleet import Fleet, engines  # noqa: E402
from tests.integration.test_several_servers_fleet import (  # noqa: E402
    GPUS, HOST, INSTANCES, Node, break_api, fault_file, unit)
from bench import provenance  # noqa: E402
from bench.ssh_contacts import contact_times, ssh_counter  # noqa: E402

OUT = REPO / "build" / "bench" / "instances.json"
# Each layout's instances and those broken in it.
LAYOUTS = {"one": (("a",), ("a",)), "four": (tuple(INSTANCES), ("a",)), "last": (tuple(INSTANCES), ("d",)),
           "two": (tuple(INSTANCES), ("a", "c")), "all": (tuple(INSTANCES), tuple(INSTANCES))}


def timed_run(node: Node, layout: str, served: bool, repo: Path = REPO, load_s=None) -> dict:
    """Serve the layout healthy (untimed) unless the last timed run `served` its instances, break its
    broken ones, then time `repo`'s reset_and_serve.yml."""
    names, broken = LAYOUTS[layout]
    if not served:
        others = [unit(name) for name in INSTANCES if name not in names]
        node.run(["systemctl", "disable", "--now", *others], check=False)
        proc, dummy = node.play(names=names)
        if proc.returncode != 0:
            raise RuntimeError(f"{layout}: serving healthy failed:\n{proc.stdout[-4000:]}")
    for name in broken:
        break_api(node, name)
    # The stand-in reads its fault file at each start: the timed run's start of each broken server loads load_s.
    loads = [node.fleet.hosts[HOST].root / fault_file(name).lstrip("/") for name in broken] if load_s else []
    for path in loads:
        path.write_text(json.dumps({"load_s": load_s}))
    wrapper, ssh_log = ssh_counter(node.workdir)
    env = dict(os.environ, ANSIBLE_SSH_EXECUTABLE=str(wrapper), BENCH_SSH_LOG=str(ssh_log))
    started = time.monotonic()
    proc, report = node.play(names=names, repo=repo, env=env)
    wall = time.monotonic() - started
    for path in loads:
        path.unlink()
    if proc.returncode != 0 or any(node.health(name) != 200 for name in broken):
        raise RuntimeError(f"{layout} ({repo}): the timed run failed:\n{proc.stdout[-4000:]}")
    (host,) = [row for row in report["hosts"] if row["host"] == HOST]
    # The broken servers served again: the gate's first /health 200 plus its first completion, on CLOCK_MONOTONIC,
    # which the nspawn host shares with this machine (as bench_inference_service.py reads it).
    services = [next((row["service"] for row in host.get("instances", []) if row["unit"] == unit(name)),
                     host.get("service")) for name in broken]
    return {"layout": layout, "tree": str(repo), "wall_s": round(wall, 2), "load": round(os.getloadavg()[0], 2),
            "serving_s": round(max(service["ready_monotonic"] + (service["first_completion_ms"] or 0) / 1000.0
                                   for service in services) - started, 2),
            "host_contacts": len(contact_times(ssh_log)),
            "instances_reset": [row["unit"] for row in host.get("instances", []) if row.get("reset")] or [unit(name) for name in broken],
            "host_module_s": host.get("seconds")}


def measure(repeat: int, versus=(), layouts=("one", "four"), load_s=None) -> dict:
    lib = build_library(REPO / "build" / "fake_nvml")
    workdir = Path(tempfile.mkdtemp(prefix="bench-instances-"))
    fleet = Fleet(workdir / "fleet", hosts=1, gpus=GPUS, copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: lib})
    fleet.up()
    node = None
    trees = [REPO, *versus]
    try:
        engines.install(fleet.hosts[HOST].root, gpus=GPUS)
        node = Node(fleet, workdir)
        runs = []
        for index in range(repeat):
            for layout in (layouts if index % 2 == 0 else layouts[::-1]):
                for repo in trees:
                    # Each run starts with the layout the run before ended with: that timed run left
                    # it served healthy (its exit and vllm-a's /health checked), as the untimed run would.
                    served = bool(runs) and LAYOUTS[runs[-1]["layout"]][0] == LAYOUTS[layout][0]
                    runs.append(timed_run(node, layout, served=served, repo=repo, load_s=load_s))
                    print(json.dumps(runs[-1]), flush=True)
    finally:
        # The node's HAProxy runs on this machine, the fleet's files under workdir: neither outlives the bench.
        if node is not None:
            node.haproxy.stop()
        fleet.down()
        shutil.rmtree(workdir, ignore_errors=True)

    def medians(tree, key="wall_s"):
        mine = [run for run in runs if run["tree"] == str(tree)]
        return {layout: statistics.median(run[key] for run in mine if run["layout"] == layout) for layout in layouts}
    median, contacts, serving = medians(REPO), medians(REPO, "host_contacts"), medians(REPO, "serving_s")
    per_extra = round((median["four"] - median["one"]) / (len(INSTANCES) - 1), 2)
    doc = {"repeat": repeat, "runs": runs, "median_wall_s": median, "median_host_contacts": contacts,
           "median_serving_s": serving,
           "ratio_four_to_one": round(median["four"] / median["one"], 2), "per_extra_instance_s": per_extra,
           # `python -m bench`'s rows: the run beside three healthy neighbours against the same run alone.
           "summary": [{"measure": "serve: 1 broken of 4 instances", "ours_s": median["four"],
                        "baseline": "the same server alone", "baseline_s": median["one"],
                        "ratio": round(median["four"] / median["one"], 2), "target": None, "met": None},
                       {"measure": "serve: each healthy instance adds", "ours_s": per_extra, "baseline": None,
                        "baseline_s": None, "ratio": None, "target": None, "met": None}],
           "versus": {}}
    for tree in versus:
        theirs = medians(tree)
        doc["versus"][str(tree)] = {"median_wall_s": theirs, "median_host_contacts": medians(tree, "host_contacts"),
                                    "median_serving_s": medians(tree, "serving_s")}
        doc["summary"] += [{"measure": "serve: %s, vs another tree" % layout, "ours_s": median[layout],
                            "baseline": str(tree), "baseline_s": theirs[layout],
                            "ratio": round(median[layout] / theirs[layout], 2), "target": None, "met": None}
                           for layout in layouts]
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 2: what docs/inference_service.md quotes; each round costs about 2 min at load 2.
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--versus", metavar="CHECKOUT", action="append", default=[],
                        help="also time another checkout's reset_and_serve.yml in each round, on the same host")
    parser.add_argument("--load-s", type=float, default=None,
                        help="seconds the broken servers' next start loads (default: the stand-in's 1 s)")
    parser.add_argument("--layouts", default="one,four",
                        help="the layouts each round runs, of %s (one and four make the per-instance figures)"
                        % ", ".join(LAYOUTS))
    args = parser.parse_args()
    layouts = tuple(args.layouts.split(","))
    if not {"one", "four"} <= set(layouts) or not set(layouts) <= set(LAYOUTS):
        parser.error("--layouts must hold one and four, and may add last, two and all; got %r" % args.layouts)
    if args.load_s is not None and not 0 < args.load_s < 3600:
        parser.error("--load-s must be a number of seconds above 0 and below 3600; got %r" % args.load_s)
    versus = provenance.versus_checkouts(parser, args.versus)
    measured_on = provenance.begin("instances", versus=versus)
    doc = dict(measure(args.repeat, versus, layouts, args.load_s), load_s=args.load_s,
               measured_on=provenance.end(measured_on))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"vllm-a serving again: {doc['median_serving_s']['one']:.1f} s alone, {doc['median_serving_s']['four']:.1f} s "
          "beside three")
    print(f"one broken server alone: {doc['median_wall_s']['one']:.1f} s; beside three healthy: "
          f"{doc['median_wall_s']['four']:.1f} s ({doc['ratio_four_to_one']:.2f}x); "
          f"{doc['per_extra_instance_s']:.2f} s per healthy instance (median of {args.repeat}); host contacts "
          f"{doc['median_host_contacts']['one']:g} alone, {doc['median_host_contacts']['four']:g} beside three; {OUT}")
    if "last" in layouts:
        print(f"vllm-d, declared after three healthy neighbours, serving again: {doc['median_serving_s']['last']:.1f} s; "
              f"end of the run {doc['median_wall_s']['last']:.1f} s")
    if "two" in layouts:
        print(f"vllm-a and vllm-c broken, both serving again: {doc['median_serving_s']['two']:.1f} s; "
              f"end of the run {doc['median_wall_s']['two']:.1f} s")
    if "all" in layouts:
        print(f"all four broken, all serving again: {doc['median_serving_s']['all']:.1f} s; "
              f"end of the run {doc['median_wall_s']['all']:.1f} s")
    for tree, theirs in doc["versus"].items():
        for layout in ("last", "two", "all"):
            if layout in layouts:
                print(f"{tree}: {layout}: serving again at {theirs['median_serving_s'][layout]:.1f} s, "
                      f"end {theirs['median_wall_s'][layout]:.1f} s")
        print(f"{tree}: alone {theirs['median_wall_s']['one']:.1f} s ({theirs['median_host_contacts']['one']:g} contacts, "
              f"serving again at {theirs['median_serving_s']['one']:.1f} s), beside three {theirs['median_wall_s']['four']:.1f} s "
              f"({theirs['median_host_contacts']['four']:g} contacts, serving again at {theirs['median_serving_s']['four']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
