"""The fleet bench's code (bench/bench_fleet.py) on the session's three hosts: every run it
measures happens and cleans up after itself. The figures themselves live in `make bench`."""
from __future__ import annotations

import math

from bench import bench_fleet


def test_the_fleet_bench_measures_crashed_clean_and_ritual_runs_and_leaves_nothing_behind(fleet, tmp_path):
    (doc,) = bench_fleet.measure(fleet, tmp_path, repeat=1)
    runs = doc["median"]
    assert doc["hosts"] == 3 and doc["forks"] == 3
    # What each run did: the reset cleaned every crashed host, the second run had nothing to
    # do, and the ritual's ssh commands ran on every host.
    assert runs["crashed_1"]["statuses"] == ["ok"] and runs["crashed_1"]["killed"] > 0
    assert runs["crashed"]["statuses"] == ["ok"] and runs["crashed"]["killed"] > runs["crashed_1"]["killed"]
    assert runs["clean"]["statuses"] == ["ok"] and runs["clean"]["killed"] == 0
    assert runs["ritual"]["statuses"] == [0, 0, 0]
    for kind in ("crashed_1", "crashed", "clean"):
        run = runs[kind]
        assert 0 < run["main_cpu_s"] <= run["controller_cpu_s"], (kind, run)
        assert run["hosts_cpu_s"] > 0 and run["tasks_per_host"] > run["skipped_per_host"], (kind, run)
    assert runs["ritual"]["controller_cpu_s"] > 0
    extrapolation = doc["extrapolation"]
    assert math.isfinite(extrapolation["wall_s"]) and extrapolation["wall_s"] > extrapolation["host_module_s"]
    assert {row["measure"] for row in doc["summary"]} >= {"reset.yml, 3 crashed hosts: wall",
                                                          "3 crashed: controller CPU per host",
                                                          "200 crashed hosts, 8 cores: wall (extrap.)"}
    assert "| crashed | " in bench_fleet.table(doc)
    # The metrics are written in the measured runs (every host's file, the fleet hosts have Debian's
    # directory); the baseline, node_reset_metrics: false, writes nothing.
    files = {name: host.root / "var/lib/prometheus/node-exporter/cleanslate_gpu_node_reset.prom" for name, host in fleet.hosts.items()}
    assert all(path.exists() for path in files.values()), files
    written = files["node1"].stat().st_mtime_ns
    bench_fleet.crash(fleet, "node1")
    try:
        off = bench_fleet.reset(fleet, 1, tmp_path / "reports", tmp_path, "metrics-off", "node1", {"vars": {"node_reset_metrics": False}})
    finally:
        bench_fleet.uncrash_all(fleet)
    assert off["statuses"] == ["ok"] and off["killed"] > 0 and files["node1"].stat().st_mtime_ns == written
    # Issue 42: the steps task writes the metrics, so a crashed host costs the same tasks, and skips the same,
    # with metrics on as off.
    assert off["tasks_per_host"] == runs["crashed_1"]["tasks_per_host"], (off, runs["crashed_1"])
    assert off["skipped_per_host"] == runs["crashed_1"]["skipped_per_host"], (off, runs["crashed_1"])
    # Every host contact is counted: the metrics' write is the one ssh client more, in the steps task's worker.
    assert off["ssh_contacts"] > 0 and runs["crashed_1"]["ssh_contacts"] == off["ssh_contacts"] + 1, (off, runs["crashed_1"])
    assert runs["crashed"]["ssh_contacts"] == 3 * runs["crashed_1"]["ssh_contacts"], runs["crashed"]
    assert "host contacts (ssh clients) per host: crashed %.1f" % runs["crashed_1"]["ssh_contacts"] in bench_fleet.table(doc)
    # Its cgroup is gone (so are the ssh masters that were in it) and its host_vars are removed.
    assert not any(path.exists() for path, _v2 in bench_fleet.Cgroup(f"{fleet.cgroup_top}/bench-controller").dirs)
    assert not list((fleet.inventory.parent / "host_vars").glob("*.yml"))
