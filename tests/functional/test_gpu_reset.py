"""cleanslate.gpu.gpu_reset against real processes and real signals.

Every process signalled here was started by the test (directly or through the crashed-node
simulator), and every run is scoped to the test's own device files and command-line
patterns under tmp_path: the module is never pointed at the real /dev/nvidia*.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.run_module import run_module
from tests.sim.procinfo import same_process

# A real holder: opens the files it is given, optionally ignores SIGTERM, optionally forks a
# child that opens its own files (and then the parent may exit, leaving the child orphaned).
HOLDER = r"""
import json, os, signal, sys, time
spec = json.loads(sys.argv[1])
if spec.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
held = [open(p, "rb") for p in spec.get("open", [])]
def report(data):
    # One write() per line: parent and forked child share the pipe, and print() may split a line.
    os.write(1, (json.dumps(data) + "\n").encode())
child = None
if "child" in spec:
    child = os.fork()
    if child == 0:
        if spec["child"].get("ignore_term"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        held = [open(p, "rb") for p in spec["child"].get("open", [])]
        report({"pid": os.getpid()})
        time.sleep(600)
        os._exit(0)
report({"pid": os.getpid(), "child": child})
if spec.get("parent_exits"):
    os._exit(0)
time.sleep(600)
"""

FAST = {"grace_period": 2, "kill_timeout": 20}


class Holders(object):
    """Processes started by one test, killed (by pid, never by name) at its end."""

    def __init__(self):
        self.procs = []
        self.pids = []

    def start(self, **spec):
        """Start a holder without a child; returns its pid."""
        return self.start_with_child(**spec)[0]

    def start_with_child(self, **spec):
        """Start a holder; returns (pid, child pid or None)."""
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(spec)], stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        lines = [json.loads(proc.stdout.readline())]
        if "child" in spec:
            lines.append(json.loads(proc.stdout.readline()))
        mine = [line for line in lines if "child" in line][0]
        child = mine["child"]
        self.pids.append((proc.pid, _created(proc.pid)))
        if child:
            self.pids.append((child, _created(child)))
        return proc.pid, child

    def alive(self, pid):
        return any(same_process(p, t) for p, t in self.pids if p == pid)

    def stop(self):
        for pid, started in self.pids:
            if same_process(pid, started):
                os.kill(pid, 9)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # our own child: killing it through its Popen cannot hit another process
            proc.wait()


def _created(pid):
    from tests.sim.procinfo import create_time
    return create_time(pid)


@pytest.fixture
def holders():
    started = Holders()
    yield started
    started.stop()


@pytest.fixture
def dev(tmp_path):
    """Device files of a fake node with 4 GPUs, plain files under tmp_path."""
    directory = tmp_path / "dev"
    directory.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (directory / name).touch()
    return directory


def _globs(directory):
    return [str(directory / "nvidia[0-9]*"), str(directory / "nvidiactl"), str(directory / "nvidia-uvm*")]


def _no_nvml():
    # Make sure no libnvidia-ml is found, whatever the caller's environment says.
    return {"LD_LIBRARY_PATH": "/nonexistent-cleanslate-test"}


# --- the crashed node -------------------------------------------------------------------

def _role(manifest, role):
    return manifest["processes"][role]


def _alive(entry):
    return same_process(entry["pid"], entry["create_time"])


def _reset(manifest, check=False, diff=False, **params):
    args = {"device_paths": manifest["device_paths"], "cmdline_patterns": [manifest["api_server_pattern"]]}
    args.update(FAST)
    args.update(params)
    return run_module("gpu_reset", args, check=check, diff=diff, env=manifest["nvml"]["env"])


def test_crashed_node_every_holder_dies_and_bystanders_survive(crashed_node):
    result = _reset(crashed_node)
    assert result["rc"] == 0, result.get("msg")
    assert result["changed"] is True
    assert result["nvml"] == "ok"
    holders = _role(crashed_node, "worker") + _role(crashed_node, "orphan_worker") + _role(crashed_node, "term_ignorer")
    for entry in holders + _role(crashed_node, "api_server"):
        assert not _alive(entry), entry
    for role in ("bystander", "persistenced", "shm_mapper"):
        assert _alive(_role(crashed_node, role)[0]), role
    how = dict((k["pid"], k["signal"]) for k in result["killed"])
    ignorer = _role(crashed_node, "term_ignorer")[0]["pid"]
    assert how.pop(ignorer) == "SIGKILL"
    assert set(how.values()) == {"SIGTERM"}
    orphan = _role(crashed_node, "orphan_worker")[0]
    assert orphan["pid"] in how
    assert result["survivors"] == []
    persistenced = _role(crashed_node, "persistenced")[0]["pid"]
    assert {"pid": persistenced, "reason": "protect_names"}.items() <= result["protected"][0].items()
    targets = dict((t["pid"], t) for t in result["targets"])
    assert targets[orphan["pid"]]["gpus"] == orphan["gpus"]
    assert targets[orphan["pid"]]["gpu_memory_mib"] == orphan["mib"]
    assert targets[_role(crashed_node, "api_server")[0]["pid"]]["reason"] == "cmdline"


def test_second_run_changes_nothing(crashed_node):
    assert _reset(crashed_node)["changed"] is True
    again = _reset(crashed_node)
    assert again["rc"] == 0
    assert again["changed"] is False
    assert again["targets"] == [] and again["killed"] == []


def test_memory_before_is_what_the_holders_had_per_gpu(crashed_node):
    """The "before" of the role's MiB freed comes from gpu_reset's own NVML reading."""
    expected = dict((gpu, 0) for gpu in range(crashed_node["gpu_count"]))
    for entries in crashed_node["processes"].values():
        for entry in entries:
            for gpu in entry["gpus"]:
                expected[gpu] += entry["mib"]
    first = _reset(crashed_node)
    assert dict((g["index"], g["memory_used_mib"]) for g in first["memory_before"]) == expected
    assert dict((g["index"], g["memory_used_mib"]) for g in _reset(crashed_node)["memory_before"]) == dict(
        (gpu, 0) for gpu in expected)


def test_check_mode_lists_targets_and_kills_nothing(crashed_node):
    result = _reset(crashed_node, check=True, diff=True)
    assert result["rc"] == 0 and result["changed"] is True
    expected = set(e["pid"] for role in ("worker", "orphan_worker", "term_ignorer", "api_server")
                   for e in _role(crashed_node, role))
    assert set(t["pid"] for t in result["targets"]) == expected
    assert result["killed"] == []
    for entries in crashed_node["processes"].values():
        for entry in entries:
            assert _alive(entry), entry
    # diff: before lists every holder, after only the protected one that would remain
    persistenced = _role(crashed_node, "persistenced")[0]["pid"]
    assert result["diff"]["after"].startswith("%d " % persistenced)
    assert len(result["diff"]["after"].splitlines()) == 1
    assert len(result["diff"]["before"].splitlines()) == 7


def test_api_server_dies_only_when_a_pattern_names_it(crashed_node):
    api = _role(crashed_node, "api_server")[0]
    without = _reset(crashed_node, cmdline_patterns=[])
    assert without["rc"] == 0
    assert api["pid"] not in [t["pid"] for t in without["targets"]]
    assert _alive(api)
    named = _reset(crashed_node)
    assert [t["reason"] for t in named["targets"] if t["pid"] == api["pid"]] == ["cmdline"]
    assert not _alive(api)


def test_gpus_selection_spares_holders_of_other_gpus(crashed_node):
    result = _reset(crashed_node, gpus=["1"], cmdline_patterns=[])
    assert result["rc"] == 0, result.get("msg")
    on_gpu1 = [e for role in ("worker", "orphan_worker", "term_ignorer") for e in _role(crashed_node, role)
               if 1 in e["gpus"]]
    elsewhere = [e for role in ("worker", "orphan_worker", "term_ignorer") for e in _role(crashed_node, role)
                 if 1 not in e["gpus"]]
    assert on_gpu1 and elsewhere
    assert set(t["pid"] for t in result["targets"]) == set(e["pid"] for e in on_gpu1)
    assert not any(_alive(e) for e in on_gpu1)
    assert all(_alive(e) for e in elsewhere)
    # holders of nvidia0 only are spared: the orphan and worker 0
    assert any(e["gpus"] == [0] for e in elsewhere)


def test_gpu_uuid_selects_through_nvml(crashed_node):
    from tests.fixtures.fake_nvml import FakeNvml
    uuid1 = FakeNvml(crashed_node["nvml"]["state_dir"]).uuids[1]
    result = _reset(crashed_node, check=True, gpus=[uuid1], cmdline_patterns=[])
    assert result["rc"] == 0, result.get("msg")
    assert set(g for t in result["targets"] for g in t["gpus"]) == {1}


# --- NVML hints -------------------------------------------------------------------------

def test_dead_parent_listed_by_nvml_kills_the_forked_child_not_the_reused_pid(dev, holders, fake_nvml):
    # The parent opens nothing, forks a child that holds GPU 0, and exits. NVML keeps
    # listing the parent's pid; here that pid "now belongs" to an unrelated process, which we
    # stand in with a live bystander of ours that holds no device.
    child = holders.start_with_child(open=[], child={"open": [str(dev / "nvidia0"), str(dev / "nvidiactl")]},
                                     parent_exits=True)[1]
    reused = holders.start()
    fake_nvml.register(child, 0, 30000, reported_pid=reused)
    result = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev)), env=fake_nvml.env())
    assert result["rc"] == 0, result.get("msg")
    assert result["nvml"] == "ok"
    assert [t["pid"] for t in result["targets"]] == [child]
    assert not holders.alive(child)
    assert holders.alive(reused)


def test_nvml_listed_holder_of_a_device_outside_device_paths_is_a_target(tmp_path, dev, holders, fake_nvml):
    other = tmp_path / "container-dev"
    other.mkdir()
    (other / "nvidia2").touch()
    listed = holders.start(open=[str(other / "nvidia2")])
    listed_no_device = holders.start()
    fake_nvml.register(listed, 2, 1000)
    fake_nvml.register(listed_no_device, 3, 1000)
    result = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev)), env=fake_nvml.env())
    assert result["rc"] == 0, result.get("msg")
    assert [(t["pid"], t["reason"], t["gpus"]) for t in result["targets"]] == [(listed, "nvml", [2])]
    assert not holders.alive(listed)
    assert holders.alive(listed_no_device)


def test_without_nvml_the_device_files_are_enough(dev, holders):
    pid = holders.start(open=[str(dev / "nvidia3")])
    result = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev)), env=_no_nvml())
    assert result["rc"] == 0, result.get("msg")
    assert result["nvml"].startswith("unavailable: ")
    assert [(t["pid"], t["gpus"], t["reason"]) for t in result["targets"]] == [(pid, [3], "device")]
    assert "gpu_memory_mib" not in result["targets"][0]
    assert not holders.alive(pid)


# --- children, protection, zombies, survivors ------------------------------------------

def test_children_of_a_target_die_unless_include_children_is_off(dev, holders):
    spared_parent, spared_child = holders.start_with_child(open=[str(dev / "nvidia0")], child={"open": []})
    off = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev), include_children=False), env=_no_nvml())
    assert [t["pid"] for t in off["targets"]] == [spared_parent]
    assert holders.alive(spared_child) and not holders.alive(spared_parent)

    parent, child = holders.start_with_child(open=[str(dev / "nvidia1")], child={"open": []})
    on = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev)), env=_no_nvml())
    reasons = dict((t["pid"], t["reason"]) for t in on["targets"])
    assert reasons[parent] == "device" and reasons[child] == "child"
    assert not holders.alive(parent) and not holders.alive(child)


def test_protected_holder_and_its_children_are_spared(tmp_path, dev, holders):
    # A holder named like the persistence daemon: spared, and its child is not a target
    # only because its excluded parent holds a device (exclusions come before children).
    persistenced = tmp_path / "nvidia-persistenced"
    persistenced.symlink_to(sys.executable)
    spec = {"open": [str(dev / "nvidiactl")], "child": {"open": []}}
    proc = subprocess.Popen([str(persistenced), "-c", HOLDER, json.dumps(spec)], stdout=subprocess.PIPE, text=True)
    holders.procs.append(proc)
    lines = [json.loads(proc.stdout.readline()), json.loads(proc.stdout.readline())]
    child = [line for line in lines if "child" in line][0]["child"]
    holders.pids += [(proc.pid, _created(proc.pid)), (child, _created(child))]
    result = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev)), env=_no_nvml())
    assert result["rc"] == 0 and result["changed"] is False
    assert result["targets"] == []
    assert [(p["pid"], p["reason"]) for p in result["protected"]] == [(proc.pid, "protect_names")]
    assert holders.alive(proc.pid) and holders.alive(child)


def test_zombie_counts_as_gone(dev, holders):
    # The child holds the device and exits on SIGTERM; its parent never reaps it, so it stays
    # a zombie. That must count as gone at once: no SIGKILL, no survivor.
    parent, child = holders.start_with_child(child={"open": [str(dev / "nvidia0")]})
    result = run_module("gpu_reset", dict(device_paths=_globs(dev), include_children=False, grace_period=30,
                                          kill_timeout=1), env=_no_nvml())
    assert result["rc"] == 0, result.get("msg")
    assert [(k["pid"], k["signal"]) for k in result["killed"]] == [(child, "SIGTERM")]
    assert holders.alive(parent)


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


def test_process_that_survives_sigkill_fails_the_task_with_its_reason(dev, holders, frozen_cgroup):
    pid = holders.start(open=[str(dev / "nvidia2")])
    (frozen_cgroup / "cgroup.procs").write_text(str(pid))
    (frozen_cgroup / "freezer.state").write_text("FROZEN")
    try:
        result = run_module("gpu_reset", dict(device_paths=_globs(dev), grace_period=0.2, kill_timeout=0.5),
                            env=_no_nvml())
    finally:
        (frozen_cgroup / "freezer.state").write_text("THAWED")
    assert result["rc"] != 0 and result["failed"] is True
    assert [(s["pid"], s["state"], s["devices"]) for s in result["survivors"]] == [(pid, "D", [str(dev / "nvidia2")])]
    assert result["survivors"][0]["action"] == "reboot or GPU reset required"
    assert "pid %d" % pid in result["msg"] and "reboot or GPU reset required" in result["msg"]
    holders.procs[-1].wait(timeout=60)  # SIGKILL is delivered once thawed


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


def test_cgroup_scope_spares_a_holder_in_another_container(dev, holders, lxc_cgroups):
    top, groups = lxc_cgroups
    inside = holders.start(open=[str(dev / "nvidia0")])
    other = holders.start(open=[str(dev / "nvidia1")])
    (groups["129"] / "cgroup.procs").write_text(str(inside))
    (groups["130"] / "cgroup.procs").write_text(str(other))
    scope = "/%s/lxc/129/" % top.name
    result = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev), cgroup=scope), env=_no_nvml())
    assert result["rc"] == 0, result.get("msg")
    assert [t["pid"] for t in result["targets"]] == [inside]
    assert not holders.alive(inside) and holders.alive(other)


def test_users_scope(dev, holders):
    pid = holders.start(open=[str(dev / "nvidia0")])
    nobody = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev), users=["nobody"]), env=_no_nvml())
    assert nobody["rc"] == 0 and nobody["targets"] == [] and holders.alive(pid)
    mine = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev), users=[str(os.getuid())]), env=_no_nvml())
    assert [t["pid"] for t in mine["targets"]] == [pid] and not holders.alive(pid)


# --- bad input: one clear message, nothing killed ---------------------------------------

@pytest.mark.parametrize("params, message", [
    ({"cmdline_patterns": ["vllm serve ("]}, "not a valid regular expression"),
    ({"grace_period": -1}, "grace_period must be zero or more seconds"),
    ({"kill_timeout": -0.5}, "kill_timeout must be zero or more seconds"),
    ({"grace_period": "soon"}, "grace_period"),
    ({"gpus": ["7"]}, "GPU indices 0, 1, 2, 3"),
    ({"gpus": ["GPU-0000"]}, "UUIDs need NVML"),
    ({"device_paths": ["dev/nvidia*"]}, "not an absolute path"),
])
def test_bad_input_fails_clearly_and_kills_nothing(dev, holders, params, message):
    pid = holders.start(open=[str(dev / "nvidia0")])
    args = dict(FAST, device_paths=_globs(dev))
    args.update(params)
    result = run_module("gpu_reset", args, env=_no_nvml())
    assert result["rc"] != 0 and result["failed"] is True
    assert message in result["msg"]
    assert holders.alive(pid)


def test_unknown_gpu_with_nvml_lists_the_valid_ones(dev, holders, fake_nvml):
    pid = holders.start(open=[str(dev / "nvidia0")])
    result = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev), gpus=["9"]), env=fake_nvml.env())
    assert result["rc"] != 0
    assert "0-7" in result["msg"] and fake_nvml.uuids[0] in result["msg"]
    assert holders.alive(pid)


def test_device_glob_matching_nothing_is_nothing_to_do(tmp_path):
    result = run_module("gpu_reset", dict(FAST, device_paths=[str(tmp_path / "nothing" / "nvidia*")]), env=_no_nvml())
    assert result["rc"] == 0
    assert result["changed"] is False and result["targets"] == []


def test_missing_psutil_names_the_library_and_kills_nothing(tmp_path, dev, holders):
    # An interpreter on which `import psutil` fails, as on a host without it: the real
    # interpreter with psutil's import blocked before the module file runs.
    python = tmp_path / "python-without-psutil"
    python.write_text("#!/bin/sh\nexec %s -c 'import runpy, sys; sys.modules[\"psutil\"] = None; "
                      "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name=\"__main__\")' \"$@\"\n"
                      % sys.executable)
    python.chmod(0o755)
    pid = holders.start(open=[str(dev / "nvidia0")])
    result = run_module("gpu_reset", dict(FAST, device_paths=_globs(dev)), env=_no_nvml(), python=str(python))
    assert result["rc"] != 0
    assert "psutil" in result["msg"] and "Failed to import the required Python library" in result["msg"]
    assert holders.alive(pid)


# --- pid reuse between planning and signalling ------------------------------------------

def _start_at_pid(pid, tries=200):
    """A bystander (sleep) started with exactly this pid through ns_last_pid, or None."""
    for _attempt in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
                handle.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def test_a_target_whose_pid_is_reused_after_planning_is_not_signalled(dev, holders, monkeypatch):
    # The holder is planned as a target, then exits; its pid goes to an unrelated process
    # before the signals. The identity (start time) must be the one planned, not the newcomer's.
    import time as _time
    from ansible_collections.cleanslate.gpu.plugins.modules import gpu_reset

    if os.geteuid() != 0:
        pytest.skip("needs root to steer the next pid through ns_last_pid")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; h = open(sys.argv[1], 'rb'); "
                               "print('ready', flush=True); time.sleep(600)", str(dev / "nvidia0")],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready"
    pid = holder.pid
    newcomer = []
    original_plan = gpu_reset.Planner.plan

    def plan_then_reuse(self):
        reasons = original_plan(self)
        assert pid in reasons
        holder.kill()
        holder.wait()
        _time.sleep(0.05)  # start times count clock ticks: the newcomer starts in a later tick
        newcomer.append(_start_at_pid(pid))
        return reasons

    monkeypatch.setattr(gpu_reset.Planner, "plan", plan_then_reuse)

    class Module(object):
        check_mode = False
        _diff = False
        params = dict(device_paths=_globs(dev), gpus=[], cmdline_patterns=[], cgroup=None, users=None,
                      protect_names=gpu_reset.DEFAULT_PROTECT_NAMES, include_children=True,
                      grace_period=0.5, kill_timeout=5)

    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent-cleanslate-test")
    try:
        gpu_reset.run(Module(), _time.monotonic())
        if newcomer[0] is None:
            pytest.skip("could not start a process with the freed pid")
        assert newcomer[0].poll() is None, "the process that took over the planned target's pid was signalled"
    finally:
        if newcomer and newcomer[0] is not None:
            newcomer[0].kill()
            newcomer[0].wait()
