"""The GPU machine's servers of one node (tests/gpu/shared_node.py), checked here without a GPU:
a server and its workers are born in the cgroup named like their unit, the crash kills the API
server alone, the neighbour's snapshot stays equal while nothing touches it, and the cgroup is
gone afterwards. What the reset itself does is proven on the GPU machine (docs/gpu_proof.md) and
with simulated devices in tests/functional/test_gpu_reset*.py.

Runs in a private PID namespace: the crash and the cleanup signal processes."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.functional import pidns
from tests.gpu import scenarios, shared_node

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


def unit_cgroups() -> str | None:
    """None when a process can be moved into a new cgroup here (as each server moves itself), else why not."""
    cgroups = shared_node.UnitCgroups()
    try:
        path = cgroups.make("cleanslate-probe-%s.service" % uuid.uuid4().hex[:8])
        probe = subprocess.run(["sh", "-c", 'echo $$ > "$1/cgroup.procs"', "probe", path], capture_output=True,
                               text=True, check=False)
        return None if probe.returncode == 0 else "cannot move a process into a cgroup: %s" % probe.stderr.strip()
    except OSError as exc:
        return "cannot make a cgroup: %s" % exc
    finally:
        cgroups.remove()


def two_servers(ns, units, workdir):  # pylint: disable=unused-argument
    """PID 1 of the namespace: a server with two device-opening workers in each unit's cgroup; the first crashes."""
    started, cgroups = scenarios.Started(), shared_node.UnitCgroups()
    try:
        paths = [cgroups.make(unit) for unit in units]
        broken, healthy = (shared_node.start_server(started, scenarios.Path(workdir), path, "0", 2, "open-devices", 0)
                           for path in paths)
        out = {"broken": broken, "healthy": healthy, "made": [os.path.isdir(path) for path in paths],
               "cgroups": {str(pid): shared_node.cgroup_of(pid) for pid in broken["pids"] + healthy["pids"]}}
        before = shared_node.snapshot(healthy["pids"])
        shared_node.crash(started, broken["parent"])
        out.update(parent_alive=scenarios.alive(broken["parent"]),
                   workers_alive=[scenarios.alive(pid) for pid in broken["workers"]],
                   same=shared_node.snapshot(healthy["pids"]) == before,
                   identities=[v["identity"] for v in before.values()])
    finally:
        started.kill_all()
        cgroups.remove()
    out["removed"] = [not os.path.exists(path) for path in paths]
    # The next scenario starts its server under the same ready file's name; a worker it loses track of
    # is still killed with its cgroup.
    started, cgroups = scenarios.Started(), shared_node.UnitCgroups()
    try:
        again = shared_node.start_server(started, scenarios.Path(workdir), cgroups.make(units[0]), "0", 2,
                                         "open-devices", 0)
        out["again"] = [scenarios.identity(pid) and scenarios.identity(pid)[0] == again["parent"]
                        for pid in again["workers"]]
        started.pids.clear()
        cgroups.remove()
        out["again_left"] = [pid for pid in again["pids"] if scenarios.alive(pid)]
    finally:
        started.kill_all()
    return out


def test_servers_live_in_their_units_cgroups_and_a_crash_kills_the_api_server_alone(tmp_path):
    why_not = unit_cgroups()
    if why_not:
        pytest.skip(why_not)
    units = ["cleanslate-test-%s.service" % uuid.uuid4().hex[:8] for _unit in range(2)]
    out = pidns.run_in_pidns("tests.functional.test_gpu_shared_node:two_servers", units=units, workdir=str(tmp_path))
    assert out["made"] == [True, True]
    for unit, server in zip(units, (out["broken"], out["healthy"])):
        assert len(server["pids"]) == 3 and server["workers"] == server["pids"][1:]
        # every process, the workers too, is in its unit's cgroup: what spare_units matches on the GPU machine
        assert all(any(path.rsplit("/", 1)[-1] == unit for path in out["cgroups"][str(pid)])
                   for pid in server["pids"]), out["cgroups"]
    assert out["parent_alive"] is False and out["workers_alive"] == [True, True]
    assert out["same"] and all(out["identities"])
    assert out["removed"] == [True, True]
    assert out["again"] == [True, True], "the second server reported workers that are not its own"
    assert out["again_left"] == [], "a process was left in a removed unit's cgroup"


def test_the_two_gpu_servers_scenario_starts_nothing_on_one_gpu(tmp_path, fake_nvml_lib, monkeypatch):
    from tests.fixtures.fake_nvml import FakeNvml  # pylint: disable=import-outside-toplevel
    fake = FakeNvml(tmp_path / "nvml", lib_dir=fake_nvml_lib)
    fake.create(gpu_count=1)
    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    result = shared_node.shared_node_scenario("x", tmp_path, 2, "0", "1", "hold")
    assert result == {"scenario": "x", "skipped": "needs 2 GPUs, this machine has 1", "passed": True, "checks": {}}


def neighbour_without_context(ns, workdir, units, playbook):  # pylint: disable=unused-argument
    """PID 1 of the namespace: scenario 13's or 14's steps, with workers that open device files for the broken server too."""
    return shared_node.shared_node_scenario("cpu", scenarios.Path(workdir), 1, "0", None, "open-devices",
                                            broken_role="open-devices", units=tuple(units), playbook=playbook)


@pytest.mark.parametrize("playbook", [False, True], ids=["13-modules", "14-reset-yml"])
def test_scenario_13s_and_14s_steps_reset_the_broken_server_alone_here_too(tmp_path, fake_nvml_lib, monkeypatch,
                                                                           playbook):
    """The GPU machine's scenarios 13 and 14, run through on the CPU: the real gpu_reset (spare_units) and
    nvml_verify, or reset.yml with node_reset's variables (the fake NVML, one idle GPU), against two servers in
    their units' cgroups, whose workers match the engine's pattern. Here no /dev/nvidia* exists, so the one
    check about the neighbour's open device files cannot hold."""
    why_not = unit_cgroups()
    if why_not:
        pytest.skip(why_not)
    from tests.fixtures.fake_nvml import FakeNvml  # pylint: disable=import-outside-toplevel
    fake = FakeNvml(tmp_path / "nvml", lib_dir=fake_nvml_lib)
    fake.create(gpu_count=1)
    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    units = ["cleanslate-test-%s.service" % uuid.uuid4().hex[:8] for _unit in range(2)]
    # reset.yml's runs write their logs beside the scenario's work folder, and its report under reports/
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = pidns.run_in_pidns("tests.functional.test_gpu_shared_node:neighbour_without_context",
                                workdir=str(workdir), units=units, playbook=playbook)
    assert "error" not in result and "skipped" not in result, result.get("error") or result.get("skipped")
    checks = dict(result["checks"])
    assert checks.pop("the neighbour's worker still has the device files open") is False
    assert len(checks) == (8 if playbook else 9) and all(checks.values()), checks
    healthy = result["servers"][units[1]]
    if not playbook:
        assert sorted(item["pid"] for item in result["reset"]["spared"]) == sorted(healthy["pids"])
    assert sorted(result["preview_without_spare"]) == sorted(result["servers"][units[0]]["workers"] + healthy["pids"])
