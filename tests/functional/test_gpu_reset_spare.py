"""gpu_reset on a node that runs several servers: spare_units and spare_gpus keep the healthy
neighbours' processes out of the reset, whatever else points at them (a matching command line, a
selected GPU held too, a target as parent), and report them in `spared` and in the diff.

The units are real cgroups (systemd's cgroup-v1 hierarchy, name=systemd, which holds no
controller) shaped as systemd lays out units: <top>/system.slice/vllm-b.service. Everything
runs in a private PID namespace (tests/functional/pidns.py); the device files are plain files.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.functional import pidns
from tests.functional.gpu_reset_ns import cuda, dev_files, globs
from tests.functional.test_gpu_reset import _dissolve

SCENARIO = "tests.functional.gpu_reset_ns:holders_then_runs"
API = "vllm serve --api"  # what both servers' API processes have in their command line
# The cgroups, under <top>: the two servers' units, and names that contain vllm-b.service without
# being it (a component that only starts or ends with it).
GROUPS = ("system.slice/vllm-a.service", "system.slice/vllm-b.service", "x/vllm-b.service2",
          "system.slice/vllm-b.serviceX", "system.slice/x-vllm-b.service")

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


@pytest.fixture
def dev(tmp_path):
    return dev_files(tmp_path / "dev")


@pytest.fixture
def units():
    """{relative name: cgroup directory} of GROUPS, under a unique top of the name=systemd hierarchy."""
    base = Path("/sys/fs/cgroup/systemd")
    if not (base / "cgroup.procs").exists():
        pytest.skip("no name=systemd cgroup hierarchy here")
    top = base / ("cleanslate-gpu-spare-%s" % uuid.uuid4().hex[:12])
    groups = {name: top / name for name in GROUPS}
    try:
        for group in groups.values():
            group.mkdir(parents=True)
    except OSError as exc:
        pytest.skip("cannot create cgroups: %s" % exc)
    yield {name: str(group) for name, group in groups.items()}
    nested = {group for name in GROUPS for group in [top / name, *(top / name).parents] if top in (group, *group.parents)}
    _dissolve(base, sorted(nested, key=lambda group: -len(group.parts)))  # children before parents


def api(key, **spec):
    """An API server: no device file, its command line matches API."""
    return dict({"key": key, "name": key.replace("_", "-"), "argv_extra_hex": [API.encode().hex()]}, **spec)


def reset(holders, runs, **kwargs):
    out = pidns.run_in_pidns(SCENARIO, holders=holders, runs=runs, **kwargs)
    return out, [run["result"] for run in out["runs"]]


def test_a_spared_unit_keeps_its_gpu_holder_and_its_api_server_while_the_broken_one_goes(dev, units):
    """Server a (unit vllm-a.service, GPU 0) crashed, server b (vllm-b.service, GPU 2) is healthy.
    The reset covers every GPU and a pattern both API servers match: only spare_units keeps b's
    worker and API server, and the diff shows them spared, with why."""
    holders = [cuda(dev, [0], key="a_worker", name="a-worker"), api("a_api"),
               cuda(dev, [2], key="b_worker", name="b-worker"), api("b_api")]
    params = {"device_paths": globs(dev), "cmdline_patterns": [API], "spare_units": ["vllm-b.service"]}
    out, (check, done) = reset(holders, [{"params": params, "check": True, "diff": True}, {"params": params, "diff": True}],
                               cgroups={"a_worker": units["system.slice/vllm-a.service"],
                                        "a_api": units["system.slice/vllm-a.service"],
                                        "b_worker": units["system.slice/vllm-b.service"],
                                        "b_api": units["system.slice/vllm-b.service"]})
    pid = {key: entry["pid"] for key, entry in out["holders"].items()}
    spared = [{"pid": pid[key], "name": key.replace("_", "-"), "why": "in unit vllm-b.service"} for key in ("b_worker", "b_api")]
    for result in (check, done):
        assert result["rc"] == 0, result.get("msg")
        assert sorted(t["pid"] for t in result["targets"]) == sorted([pid["a_worker"], pid["a_api"]])
        assert sorted(result["spared"], key=lambda s: s["pid"]) == sorted(spared, key=lambda s: s["pid"])
        lines = {int(line.split()[0]): line for line in result["diff"]["before"].splitlines()}
        for key in ("b_worker", "b_api"):
            assert lines[pid[key]].endswith(" -- spared, in unit vllm-b.service"), lines
        assert " -- stop, " in lines[pid["a_worker"]] and " -- stop, cmdline " in lines[pid["a_api"]]
        assert pid["b_worker"] not in [c["pid"] for c in result["clients"]]
    assert out["runs"][0]["alive"] == {"a_worker": True, "a_api": True, "b_worker": True, "b_api": True}
    assert out["runs"][1]["alive"] == {"a_worker": False, "a_api": False, "b_worker": True, "b_api": True}
    after = {int(line.split()[0]) for line in done["diff"]["after"].splitlines()}
    assert after == {pid["b_worker"], pid["b_api"]}


def test_a_unit_is_a_whole_cgroup_path_component(dev, units):
    """vllm-b.service spares the unit of that name only: not vllm-b.service2, vllm-b.serviceX or
    x-vllm-b.service, whose paths contain it as text."""
    lookalikes = ("x/vllm-b.service2", "system.slice/vllm-b.serviceX", "system.slice/x-vllm-b.service")
    holders = [cuda(dev, [1], key=name, name="lookalike") for name in lookalikes]
    out, (result,) = reset(holders, [{"params": {"device_paths": globs(dev), "spare_units": ["vllm-b.service"]}}],
                           cgroups={name: units[name] for name in lookalikes})
    assert result["rc"] == 0, result.get("msg")
    assert result["spared"] == []
    assert out["runs"][0]["alive"] == dict.fromkeys(lookalikes, False)


def test_a_spared_process_is_never_reached_as_a_child_nor_lets_its_children_be(dev, units):
    """Server a's API server (a target by its command line) has a child in vllm-b.service, which
    has a child of its own, outside any unit and with no evidence. Children are followed from the
    target, but never into or through the spared process: both children live."""
    grandchild = {"key": "grandchild", "name": "grandchild", "fresh": True}
    holders = [api("a_api", children=[{"key": "b_child", "name": "b-child", "fresh": True, "children": [grandchild]}])]
    out, (result,) = reset(holders, [{"params": {"device_paths": globs(dev), "cmdline_patterns": [API],
                                                 "spare_units": ["vllm-b.service"]}}],
                           cgroups={"b_child": units["system.slice/vllm-b.service"]})
    assert result["rc"] == 0, result.get("msg")
    assert [t["pid"] for t in result["targets"]] == [out["holders"]["a_api"]["pid"]]
    assert [(s["pid"], s["why"]) for s in result["spared"]] == [(out["holders"]["b_child"]["pid"], "in unit vllm-b.service")]
    assert out["runs"][0]["alive"] == {"a_api": False, "b_child": True, "grandchild": True}


def test_a_holder_of_a_spared_gpu_is_never_a_target_whatever_else_points_at_it(dev):
    """gpus 0 and 1 are reset, 2 and 3 belong to a healthy neighbour. A process that holds GPU 0
    and GPU 2, one that holds GPU 1 and 3 and matches the pattern, and a child of a target that
    holds GPU 1 and 2 are all spared; the holder of GPU 0 alone goes."""
    holders = [cuda(dev, [0], key="worker", name="worker", children=[cuda(dev, [1, 2], key="child", name="child", fresh=True)]),
               cuda(dev, [0, 2], key="both", name="both"),
               cuda(dev, [1, 3], key="matching", name="matching", argv_extra_hex=[API.encode().hex()])]
    params = {"device_paths": globs(dev), "gpus": ["0", "1"], "spare_gpus": ["2", "3"], "cmdline_patterns": [API]}
    out, (result,) = reset(holders, [{"params": params, "diff": True}])
    assert result["rc"] == 0, result.get("msg")
    pid = {key: entry["pid"] for key, entry in out["holders"].items()}
    assert [t["pid"] for t in result["targets"]] == [pid["worker"]]
    assert sorted((s["pid"], s["why"]) for s in result["spared"]) == sorted(
        [(pid["child"], "holds spared GPU 2"), (pid["both"], "holds spared GPU 2"), (pid["matching"], "holds spared GPU 3")])
    assert out["runs"][0]["alive"] == {"worker": False, "child": True, "both": True, "matching": True}
