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

The timed run is `ansible-playbook playbooks/reset_and_serve.yml -l node1`, wall clock from
start to exit, the host warm (its SSH reached just before by the untimed run or the timed run
before, as a fleet's hosts are). The cost of an instance is (four - one) / 3: what each healthy neighbour adds to
the reset of one broken server (it is assessed, spared, rendered and its gate's looks run).

JSON: build/bench/instances.json (every run, the medians, the ratio, the cost per instance).
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
    GPUS, HOST, INSTANCES, Node, break_api, unit)
from bench import provenance  # noqa: E402

OUT = REPO / "build" / "bench" / "instances.json"
LAYOUTS = {"one": ("a",), "four": tuple(INSTANCES)}


def timed_run(node: Node, layout: str, served: bool) -> dict:
    """Serve the layout healthy (untimed) unless the last timed run `served` it, break vllm-a, then
    time reset_and_serve.yml."""
    names = LAYOUTS[layout]
    if not served:
        others = [unit(name) for name in INSTANCES if name not in names]
        node.run(["systemctl", "disable", "--now", *others], check=False)
        proc, dummy = node.play(names=names)
        if proc.returncode != 0:
            raise RuntimeError(f"{layout}: serving healthy failed:\n{proc.stdout[-4000:]}")
    break_api(node, "a")
    started = time.monotonic()
    proc, report = node.play(names=names)
    wall = time.monotonic() - started
    if proc.returncode != 0 or node.health("a") != 200:
        raise RuntimeError(f"{layout}: the timed run failed:\n{proc.stdout[-4000:]}")
    (host,) = [row for row in report["hosts"] if row["host"] == HOST]
    return {"layout": layout, "wall_s": round(wall, 2), "load": round(os.getloadavg()[0], 2),
            "instances_reset": [row["unit"] for row in host.get("instances", []) if row.get("reset")] or [unit("a")],
            "host_module_s": host.get("seconds")}


def measure(repeat: int) -> dict:
    lib = build_library(REPO / "build" / "fake_nvml")
    workdir = Path(tempfile.mkdtemp(prefix="bench-instances-"))
    fleet = Fleet(workdir / "fleet", hosts=1, gpus=GPUS, copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: lib})
    fleet.up()
    node = None
    try:
        engines.install(fleet.hosts[HOST].root, gpus=GPUS)
        node = Node(fleet, workdir)
        runs = []
        for index in range(repeat):
            for layout in (("one", "four") if index % 2 == 0 else ("four", "one")):
                # Each round starts with the layout the round before ended with: that timed run left
                # it served healthy (its exit and vllm-a's /health checked), as the untimed run would.
                runs.append(timed_run(node, layout, served=bool(runs) and runs[-1]["layout"] == layout))
                print(json.dumps(runs[-1]), flush=True)
    finally:
        # The node's HAProxy runs on this machine, the fleet's files under workdir: neither outlives the bench.
        if node is not None:
            node.haproxy.stop()
        fleet.down()
        shutil.rmtree(workdir, ignore_errors=True)
    median = {layout: statistics.median(run["wall_s"] for run in runs if run["layout"] == layout) for layout in LAYOUTS}
    per_extra = round((median["four"] - median["one"]) / (len(INSTANCES) - 1), 2)
    return {"repeat": repeat, "runs": runs, "median_wall_s": median,
            "ratio_four_to_one": round(median["four"] / median["one"], 2), "per_extra_instance_s": per_extra,
            # `python -m bench`'s rows: the run beside three healthy neighbours against the same run alone.
            "summary": [{"measure": "serve: 1 broken of 4 instances", "ours_s": median["four"],
                         "baseline": "the same server alone", "baseline_s": median["one"],
                         "ratio": round(median["four"] / median["one"], 2), "target": None, "met": None},
                        {"measure": "serve: each healthy instance adds", "ours_s": per_extra, "baseline": None,
                         "baseline_s": None, "ratio": None, "target": None, "met": None}]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 2: what docs/inference_service.md quotes; each round costs about 2 min at load 2.
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    measured_on = provenance.begin("instances")
    doc = dict(measure(args.repeat), measured_on=provenance.end(measured_on))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"one broken server alone: {doc['median_wall_s']['one']:.1f} s; beside three healthy: "
          f"{doc['median_wall_s']['four']:.1f} s ({doc['ratio_four_to_one']:.2f}x); "
          f"{doc['per_extra_instance_s']:.2f} s per healthy instance (median of {args.repeat}); {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
