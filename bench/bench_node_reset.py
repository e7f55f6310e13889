"""reset.yml end to end on real systemd hosts over SSH (pipelining on, as ansible.cfg sets it).

Boots a fleet (tests/integration/fleet), crashes every host with tests.sim, and times:

  reset 1 host     ansible-playbook playbooks/reset.yml -l node1, the host crashed
  reset 3 hosts    the same with -l gpu_nodes, every host crashed
  clean 3 hosts    reset.yml again on the clean hosts: the role's fixed per-run cost
  ritual 3 hosts   the manual shell ritual over ssh, all hosts at once: fuser -TERM on the
                   devices, the same grace, fuser -KILL, pkill the API server, rm the shm
                   leftovers, delete the bytecode, one NVML read; it checks nothing

Grace period 3 s for both. Needs root (systemd-nspawn). JSON: build/bench/node_reset.json.

    .venv/bin/python bench/bench_node_reset.py [--repeat 1]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.fixtures.fake_nvml import build_library  # noqa: E402  pylint: disable=wrong-import-position
from tests.integration.conftest import HOST_NVML_LIB, HOST_PARENT, HOST_TESTS  # noqa: E402  pylint: disable=wrong-import-position
from tests.integration.fleet import Fleet  # noqa: E402  pylint: disable=wrong-import-position
from bench.bench_fleet import GRACE, crash, ritual_script  # noqa: E402  pylint: disable=wrong-import-position
from bench import provenance  # noqa: E402  pylint: disable=wrong-import-position

PLAYBOOK = [str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset.yml"]


def playbook(fleet, limit, reports):
    start = time.monotonic()
    proc = subprocess.run(PLAYBOOK + ["-i", str(fleet.inventory), "-l", limit, "-e", f"fleet_report_path={reports}"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"reset.yml failed:\n{proc.stdout[-4000:]}")
    return seconds


def ritual(fleet, manifests):
    procs = []
    start = time.monotonic()
    for name, manifest in manifests.items():
        procs.append(subprocess.Popen(["ssh", *fleet.ssh_options(), f"root@{fleet.hosts[name].address}",
                                       ritual_script(manifest)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for proc in procs:
        proc.wait()
    return time.monotonic() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    measured_on = provenance.begin("node_reset")
    out = REPO / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    lib = build_library(REPO / "build" / "fake_nvml")
    times = {"reset_1": [], "reset_3": [], "clean_3": [], "ritual_3": []}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        fleet = Fleet(Path(tmp) / "fleet", hosts=3, copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: lib})
        fleet.up()
        try:
            psmisc = fleet.run("node1", ["sh", "-c", "command -v fuser"], check=False).returncode == 0
            reports = Path(tmp) / "reports"
            for _round in range(args.repeat):
                crash(fleet, "node1")
                times["reset_1"].append(playbook(fleet, "node1", reports))
                manifests = {name: crash(fleet, name) for name in fleet.hosts}
                times["reset_3"].append(playbook(fleet, "gpu_nodes", reports))
                times["clean_3"].append(playbook(fleet, "gpu_nodes", reports))
                manifests = {name: crash(fleet, name) for name in fleet.hosts}
                times["ritual_3"].append(ritual(fleet, manifests))
            for name in fleet.hosts:
                fleet.run(name, ["python3", "-m", "tests.sim", "clean", "--root", str(fleet.hosts[name].shared / "sim")],
                          check=False, env={"PYTHONPATH": HOST_PARENT})
        finally:
            boot = dict(fleet.timings)
            fleet.down()
    med = {key: statistics.median(values) for key, values in times.items()}
    report = {"times_s": times, "median_s": med, "fleet_boot": boot, "grace_period_s": GRACE,
              "ritual_has_fuser": psmisc, "measured_on": provenance.end(measured_on),
              "summary": [
                  {"measure": "reset.yml, 1 crashed host", "ours_s": med["reset_1"], "baseline": None,
                   "baseline_s": None, "ratio": None, "target": "< 10 s per host", "met": med["reset_1"] < 10},
                  {"measure": "reset.yml, 3 crashed hosts", "ours_s": med["reset_3"], "baseline": "shell ritual over ssh",
                   "baseline_s": med["ritual_3"], "ratio": med["reset_3"] / med["ritual_3"],
                   "target": "< 10 s per host", "met": med["reset_3"] / 3 < 10},
                  {"measure": "reset.yml, 3 clean hosts (fixed cost)", "ours_s": med["clean_3"], "baseline": None,
                   "baseline_s": None, "ratio": None, "target": None, "met": None},
              ]}
    (out / "node_reset.json").write_text(json.dumps(report, indent=2))
    for key, value in med.items():
        print(f"{key:10s} {value:7.2f} s")
    print(f"fleet boot: {boot}")


if __name__ == "__main__":
    main()
