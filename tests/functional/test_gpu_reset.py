"""cleanslate.gpu.gpu_reset against real processes and real signals: the crashed node, NVML
hints, children, protection, zombies, survivors and scoping.

Every process signalled here runs in a private PID namespace with the module that signals it
(tests/functional/pidns.py, scenarios in gpu_reset_ns.py): a module gone wrong can only reach
what the test started. Device files are the simulator's or plain files under tmp_path, never
the real /dev/nvidia*. Inputs, evidence and signalling have files of their own
(test_gpu_reset_inputs.py, test_gpu_reset_evidence.py, test_gpu_reset_signals.py).
"""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from tests.fixtures.fake_nvml import FakeNvml
from tests.functional import pidns
from tests.functional.gpu_reset_ns import NO_NVML, cuda, dev_files, globs
from tests.run_module import run_module

HOLDERS = "tests.functional.gpu_reset_ns:holders_then_runs"
NODE = "tests.functional.gpu_reset_ns:crashed_node_runs"
HOLDER_ROLES = ("worker", "orphan_worker", "term_ignorer", "unpinned_worker", "forked_child")
CLIENT_ROLES = ("monitor", "init_only", "persistenced")

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


@pytest.fixture
def dev(tmp_path):
    return dev_files(tmp_path / "dev")


def reset(holders, runs, **kwargs):
    return pidns.run_in_pidns(HOLDERS, holders=holders, runs=runs, **kwargs)


# --- the crashed node -------------------------------------------------------------------

def node(lib_dir, *runs):
    """The crashed node, reset as `runs` say; (manifest, [(result, {pid: alive})])."""
    out = pidns.run_in_pidns(NODE, lib_dir=str(lib_dir), runs=list(runs) or [{}])
    return out["manifest"], [(run["result"], dict((int(p), a) for p, a in run["alive"].items())) for run in out["runs"]]


def _role(manifest, role):
    return manifest["processes"][role]


def _pids(manifest, *roles):
    return set(e["pid"] for role in roles for e in _role(manifest, role))


def test_crashed_node_every_holder_dies_and_bystanders_survive(fake_nvml_lib):
    manifest, [(result, alive)] = node(fake_nvml_lib)
    assert result["rc"] == 0, result.get("msg")
    assert result["changed"] is True
    assert result["nvml"] == "ok"
    for pid in _pids(manifest, "api_server", *HOLDER_ROLES):
        assert not alive[pid], pid
    for pid in _pids(manifest, "bystander", "shm_mapper", *CLIENT_ROLES):
        assert alive[pid], pid
    how = dict((k["pid"], k["signal"]) for k in result["killed"])
    ignorer = _role(manifest, "term_ignorer")[0]["pid"]
    assert how.pop(ignorer) == "SIGKILL"
    assert set(how.values()) == {"SIGTERM"}
    orphan = _role(manifest, "orphan_worker")[0]
    assert orphan["pid"] in how
    assert result["survivors"] == []
    # Device files open and none mapped, or mapped with no memory (CUDA initialised, no context):
    # GPU clients, left alone. nvidia-persistenced is one too, so nothing needs protecting here.
    assert sorted(c["pid"] for c in result["clients"]) == sorted(_pids(manifest, *CLIENT_ROLES))
    assert result["protected"] == []
    targets = dict((t["pid"], t) for t in result["targets"])
    assert targets[orphan["pid"]]["gpus"] == orphan["gpus"]
    assert targets[orphan["pid"]]["gpu_memory_mib"] == orphan["mib"]
    unpinned = _role(manifest, "unpinned_worker")[0]
    assert targets[unpinned["pid"]]["gpus"] == unpinned["gpus"]  # NVML narrows its mappings to its context
    assert targets[_role(manifest, "api_server")[0]["pid"]]["reason"] == "cmdline"
    # The forked child: not listed, but NVML lists its dead parent on its GPU.
    forked = _role(manifest, "forked_child")[0]
    assert (targets[forked["pid"]]["gpus"], targets[forked["pid"]]["reason"]) == (forked["gpus"], "device")
    assert "gpu_memory_mib" not in targets[forked["pid"]]
    assert "without nvidia-uvm" in targets[forked["pid"]]["evidence"]
    assert "no live process it lists" in targets[forked["pid"]]["evidence"]


def test_second_run_changes_nothing(fake_nvml_lib):
    _manifest, [(first, _alive), (again, _after)] = node(fake_nvml_lib, {}, {})
    assert first["changed"] is True
    assert again["rc"] == 0
    assert again["changed"] is False
    assert again["targets"] == [] and again["killed"] == []


def test_memory_before_is_what_the_holders_had_per_gpu(fake_nvml_lib):
    """The "before" of the role's MiB freed comes from gpu_reset's own NVML reading."""
    manifest, [(first, _alive), (again, _after)] = node(fake_nvml_lib, {}, {})
    expected = dict((gpu, 0) for gpu in range(manifest["gpu_count"]))
    for entries in manifest["processes"].values():
        for entry in entries:
            for gpu in entry["gpus"]:
                expected[gpu] += entry["mib"]
    assert dict((g["index"], g["memory_used_mib"]) for g in first["memory_before"]) == expected
    assert dict((g["index"], g["memory_used_mib"]) for g in again["memory_before"]) == dict((g, 0) for g in expected)


def test_check_mode_lists_targets_and_kills_nothing(fake_nvml_lib):
    manifest, [(result, alive)] = node(fake_nvml_lib, {"check": True, "diff": True})
    assert result["rc"] == 0 and result["changed"] is True
    assert set(t["pid"] for t in result["targets"]) == _pids(manifest, "api_server", *HOLDER_ROLES)
    assert result["killed"] == []
    assert all(alive.values())
    # diff: before lists every process that maps a device file and every target (the API server,
    # found by its command line, maps none), after only the one that holds no memory (CUDA
    # initialised without a context)
    init_only = _role(manifest, "init_only")[0]["pid"]
    assert result["diff"]["after"].startswith("%d " % init_only)
    assert len(result["diff"]["after"].splitlines()) == 1
    before = result["diff"]["before"].splitlines()
    assert len(before) == len(_pids(manifest, "init_only", "api_server", *HOLDER_ROLES))
    # Each target with its pid, name, reason and command line.
    for target in result["targets"]:
        line = next(line for line in before if line.startswith("%d " % target["pid"]))
        assert line == "%d %s: %s -- stop, %s (%s): %s" % (
            target["pid"], target["name"], ", ".join(target["devices"]) or "no device file", target["reason"],
            target["evidence"], target["cmdline"]), line
    api = _role(manifest, "api_server")[0]["pid"]
    assert any(line.startswith("%d " % api) and "no device file -- stop, cmdline (command line matches" in line
               for line in before), before


def test_api_server_dies_only_when_a_pattern_names_it(fake_nvml_lib):
    manifest, [(without, alive_without), (named, alive_named)] = node(fake_nvml_lib, {"pattern": False}, {})
    api = _role(manifest, "api_server")[0]["pid"]
    assert without["rc"] == 0
    assert api not in [t["pid"] for t in without["targets"]]
    assert alive_without[api]
    assert [t["reason"] for t in named["targets"] if t["pid"] == api] == ["cmdline"]
    assert not alive_named[api]


def test_gpus_selection_spares_holders_of_other_gpus(fake_nvml_lib):
    manifest, [(result, alive)] = node(fake_nvml_lib, {"params": {"gpus": ["1"]}, "pattern": False})
    assert result["rc"] == 0, result.get("msg")
    holders = [e for role in HOLDER_ROLES for e in _role(manifest, role)]
    on_gpu1 = [e["pid"] for e in holders if 1 in e["gpus"]]
    elsewhere = [e["pid"] for e in holders if 1 not in e["gpus"]]
    assert on_gpu1 and elsewhere
    assert sorted(t["pid"] for t in result["targets"]) == sorted(on_gpu1)
    assert not any(alive[pid] for pid in on_gpu1)
    assert all(alive[pid] for pid in elsewhere)
    # the unpinned worker maps nvidia1 too, but its context is on another GPU
    assert _role(manifest, "unpinned_worker")[0]["pid"] in elsewhere


def test_gpu_uuid_selects_through_nvml(tmp_path, fake_nvml_lib):
    uuid1 = FakeNvml(tmp_path / "uuids").create(gpu_count=4)[1]  # UUIDs follow from name and index
    _manifest, [(result, _alive)] = node(fake_nvml_lib, {"check": True, "params": {"gpus": [uuid1]},
                                                         "pattern": False})
    assert result["rc"] == 0, result.get("msg")
    assert set(g for t in result["targets"] for g in t["gpus"]) == {1}


# --- NVML hints -------------------------------------------------------------------------

def test_dead_parent_listed_by_nvml_kills_the_forked_child_not_the_reused_pid(dev, fake_nvml_lib):
    # The parent maps nothing, forks a child that holds GPU 0, and exits. NVML keeps listing
    # the parent's pid; here that pid "now belongs" to an unrelated process, which we stand
    # in with a live bystander that holds no device.
    parent = {"key": "parent", "exits": True, "children": [cuda(dev, [0], key="child")],
              "nvml": [{"holder": "child", "gpu": 0, "mib": 30000, "listed_as": "reused"}]}
    out = reset([parent, {"key": "reused"}], [{"params": {"device_paths": globs(dev)}}], nvml=8,
                lib_dir=str(fake_nvml_lib))
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert result["nvml"] == "ok"
    assert [t["pid"] for t in result["targets"]] == [out["holders"]["child"]["pid"]]
    assert out["runs"][0]["alive"] == {"child": False, "reused": True, "parent": False}


def test_nvml_listed_holder_of_a_device_outside_device_paths_is_a_target(tmp_path, dev, fake_nvml_lib):
    other = tmp_path / "container-dev"
    other.mkdir()
    (other / "nvidia2").touch()
    holders = [{"key": "listed", "map": [str(other / "nvidia2")], "nvml": [{"gpu": 2, "mib": 1000}]},
               {"key": "listed_no_device", "open": [str(other / "nvidia2")], "nvml": [{"gpu": 3, "mib": 1000}]}]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}], nvml=8, lib_dir=str(fake_nvml_lib))
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert [(t["pid"], t["reason"], t["gpus"]) for t in result["targets"]] == [(out["holders"]["listed"]["pid"], "nvml", [2])]
    assert out["runs"][0]["alive"] == {"listed": False, "listed_no_device": True}


def test_without_nvml_the_device_files_are_enough(dev):
    out = reset([cuda(dev, [3], key="holder")], [{"params": {"device_paths": globs(dev)}}])
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert result["nvml"].startswith("unavailable: ")
    assert [(t["pid"], t["gpus"], t["reason"]) for t in result["targets"]] == [(out["holders"]["holder"]["pid"], [3], "device")]
    assert "gpu_memory_mib" not in result["targets"][0]
    assert out["runs"][0]["alive"] == {"holder": False}


# --- children, protection, zombies, survivors ------------------------------------------

def test_children_of_a_target_die_unless_include_children_is_off(dev):
    # The children are started anew (fork and exec): they map nothing, as a worker that has not
    # initialised CUDA yet; only their parent's evidence makes them targets.
    holders = [cuda(dev, [0], key="spared_parent", children=[{"key": "spared_child", "fresh": True}]),
               cuda(dev, [1], key="parent", children=[{"key": "child", "fresh": True}])]
    runs = [{"params": {"device_paths": [str(dev / "nvidia0")], "include_children": False}},
            {"params": {"device_paths": globs(dev)}}]
    out = reset(holders, runs)
    off, on = out["runs"]
    pid = dict((key, entry["pid"]) for key, entry in out["holders"].items())
    assert [t["pid"] for t in off["result"]["targets"]] == [pid["spared_parent"]]
    assert off["alive"]["spared_child"] and not off["alive"]["spared_parent"]
    reasons = dict((t["pid"], t["reason"]) for t in on["result"]["targets"])
    assert reasons == {pid["parent"]: "device", pid["child"]: "child"}  # spared_child's parent is gone now
    assert not on["alive"]["parent"] and not on["alive"]["child"]


def test_protected_holder_and_its_children_are_spared(tmp_path, dev):
    # A holder named like the persistence daemon: spared, and its child is not a target only
    # because its excluded parent holds a device (exclusions come before children).
    daemon = tmp_path / "nvidia-persistenced"
    daemon.symlink_to(sys.executable)
    holder = {"key": "daemon", "python": str(daemon), "open": [str(dev / "nvidiactl")], "map": [str(dev / "nvidiactl")],
              "children": [{"key": "child", "fresh": True}]}
    out = reset([holder], [{"params": {"device_paths": globs(dev)}}])
    result = out["runs"][0]["result"]
    assert result["rc"] == 0 and result["changed"] is False
    assert result["targets"] == []
    assert [(p["pid"], p["reason"]) for p in result["protected"]] == [(out["holders"]["daemon"]["pid"], "protect_names")]
    assert out["runs"][0]["alive"] == {"daemon": True, "child": True}


def test_zombie_counts_as_gone(dev):
    # The child holds the device and exits on SIGTERM; its parent never reaps it, so it stays
    # a zombie. That must count as gone at once: no SIGKILL, no survivor.
    holder = {"key": "parent", "children": [cuda(dev, [0], key="child")]}
    # grace_period 5: long enough that a zombie counted alive ends in SIGKILL, short enough that it fails fast.
    out = reset([holder], [{"params": {"device_paths": globs(dev), "include_children": False, "grace_period": 5,
                                       "kill_timeout": 1}}])
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert [(k["pid"], k["signal"]) for k in result["killed"]] == [(out["holders"]["child"]["pid"], "SIGTERM")]
    assert out["runs"][0]["alive"] == {"parent": True, "child": False}


@pytest.fixture
def frozen_cgroup():
    """A cgroup-v1 freezer group of our own: its frozen tasks sleep uninterruptibly (state D)
    and do not die on SIGKILL until thawed, like a process stuck in a driver call."""
    base = Path("/sys/fs/cgroup/freezer")
    if not (base / "cgroup.procs").exists():
        pytest.skip("no cgroup-v1 freezer hierarchy here to make a process that survives SIGKILL")
    group = base / ("cleanslate-gpu-reset-%s" % uuid.uuid4().hex[:12])
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip("cannot create a freezer cgroup: %s" % exc)
    yield group
    (group / "freezer.state").write_text("THAWED")
    _dissolve(base, [group])


def _dissolve(base, groups):
    """Move any process left in our cgroups back to the hierarchy's root, then remove them."""
    for group in groups:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (base / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # it exited meanwhile
        group.rmdir()


def test_process_that_survives_sigkill_fails_the_task_with_its_reason(dev, frozen_cgroup):
    out = reset([cuda(dev, [2], key="stuck")], [{"params": {"device_paths": globs(dev), "grace_period": 0.2,
                                                            "kill_timeout": 0.5}}],
                cgroups={"stuck": str(frozen_cgroup)}, frozen=str(frozen_cgroup))
    result = out["runs"][0]["result"]
    pid = out["holders"]["stuck"]["pid"]
    assert result["rc"] != 0 and result["failed"] is True
    assert [(s["pid"], s["state"], s["devices"], s["signalled"]) for s in result["survivors"]] == [
        (pid, "D", sorted([str(dev / "nvidia2"), str(dev / "nvidiactl"), str(dev / "nvidia-uvm")]), ["SIGTERM", "SIGKILL"])]
    assert result["survivors"][0]["action"] == "reboot or GPU reset required"
    assert "pid %d" % pid in result["msg"] and "reboot or GPU reset required" in result["msg"]


# --- scoping ---------------------------------------------------------------------------

@pytest.fixture
def lxc_cgroups():
    """Two cgroups of our own shaped like Proxmox containers: .../lxc/129/ns and .../lxc/130/ns
    under a unique name, in the controller-less name=systemd hierarchy."""
    base = Path("/sys/fs/cgroup/systemd")
    if not (base / "cgroup.procs").exists():
        pytest.skip("no name=systemd cgroup hierarchy here")
    top = base / ("cleanslate-gpu-reset-%s" % uuid.uuid4().hex[:12])
    groups = {vmid: top / "lxc" / vmid / "ns" for vmid in ("129", "130")}
    try:
        for group in groups.values():
            group.mkdir(parents=True)
    except OSError as exc:
        pytest.skip("cannot create cgroups: %s" % exc)
    yield top, groups
    nested = set(group for ns in groups.values() for group in (ns, ns.parent, ns.parent.parent, top))
    _dissolve(base, sorted(nested, key=lambda group: -len(group.parts)))  # children before parents


def test_cgroup_scope_spares_a_holder_in_another_container(dev, lxc_cgroups):
    top, groups = lxc_cgroups
    holders = [cuda(dev, [0], key="inside"), cuda(dev, [1], key="other")]
    scope = "/%s/lxc/129/" % top.name
    out = reset(holders, [{"params": {"device_paths": globs(dev), "cgroup": scope}}],
                cgroups={"inside": str(groups["129"]), "other": str(groups["130"])})
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert [t["pid"] for t in result["targets"]] == [out["holders"]["inside"]["pid"]]
    assert out["runs"][0]["alive"] == {"inside": False, "other": True}


def test_users_scope(dev):
    runs = [{"params": {"device_paths": globs(dev), "users": ["nobody"]}},
            {"params": {"device_paths": globs(dev), "users": ["0"]}}]
    out = reset([cuda(dev, [0], key="holder")], runs)
    nobody, mine = out["runs"]
    assert nobody["result"]["rc"] == 0 and nobody["result"]["targets"] == [] and nobody["alive"]["holder"]
    assert [t["pid"] for t in mine["result"]["targets"]] == [out["holders"]["holder"]["pid"]]
    assert not mine["alive"]["holder"]


# --- what needs no process -------------------------------------------------------------

def test_device_glob_matching_nothing_is_nothing_to_do(tmp_path):
    result = run_module("gpu_reset", {"device_paths": [str(tmp_path / "nothing" / "nvidia*")], "grace_period": 1},
                        env=NO_NVML)
    assert result["rc"] == 0
    assert result["changed"] is False and result["targets"] == []


def test_missing_psutil_names_the_library_and_kills_nothing(tmp_path, dev):
    # An interpreter on which `import psutil` fails, as on a host without it: the real
    # interpreter with psutil's import blocked before the module file runs.
    python = tmp_path / "python-without-psutil"
    python.write_text("#!/bin/sh\nexec %s -c 'import runpy, sys; sys.modules[\"psutil\"] = None; "
                      "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name=\"__main__\")' \"$@\"\n"
                      % sys.executable)
    python.chmod(0o755)
    out = reset([cuda(dev, [0], key="holder")], [{"params": {"device_paths": globs(dev)}, "python": str(python)}])
    result = out["runs"][0]["result"]
    assert result["rc"] != 0
    assert "psutil" in result["msg"] and "Failed to import the required Python library" in result["msg"]
    assert out["runs"][0]["alive"] == {"holder": True}
