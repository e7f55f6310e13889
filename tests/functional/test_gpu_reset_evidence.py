"""Whether and where a process holds GPU memory: gpu_reset decides from evidence tied to the
process (its mappings of the device files, NVML's list checked against them), never from open
device files alone, and compares device paths as the kernel shows them.

Every test runs its processes, and the module, in a private PID namespace (tests/functional/
pidns.py); the device files are plain files under tmp_path, shaped the way the real driver
shapes them (gpu_reset_ns.cuda, gpu_reset_ns.client).
"""
from __future__ import annotations

import os

import pytest

from tests.functional import pidns
from tests.functional.gpu_reset_ns import client, cuda, dev_files, globs

SCENARIO = "tests.functional.gpu_reset_ns:holders_then_runs"

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


def reset(holders, runs, **kwargs):
    return pidns.run_in_pidns(SCENARIO, holders=holders, runs=runs, **kwargs)


def targets(run):
    return sorted((t["pid"], tuple(t["gpus"]), t["reason"]) for t in run["result"]["targets"])


@pytest.fixture
def dev(tmp_path):
    return dev_files(tmp_path / "dev")


# --- item 3: pinned holders on two GPUs, with and without NVML ---------------------------

@pytest.mark.parametrize("with_nvml", [True, False])
def test_gpus_selection_stops_only_the_holder_of_that_gpu(dev, fake_nvml_lib, with_nvml):
    """Two servers on separate GPUs: each opens every device file (as the driver makes any
    process do) but maps only its own. Resetting GPU 1 must not touch GPU 0's server."""
    holders = [cuda(dev, [0], key="gpu0", nvml=[{"gpu": 0, "mib": 7000}]),
               cuda(dev, [1], key="gpu1", nvml=[{"gpu": 1, "mib": 9000}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev), "gpus": ["1"]}}],
                nvml=4 if with_nvml else None, lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert targets(run) == [(out["holders"]["gpu1"]["pid"], (1,), "device")]
    assert run["alive"] == {"gpu0": True, "gpu1": False}


@pytest.mark.parametrize("with_nvml", [True, False])
def test_a_monitor_that_opens_every_device_file_is_a_client_left_alone(dev, fake_nvml_lib, with_nvml):
    """An NVML monitor (not protected by name) opens every device file and maps none: it holds
    no GPU memory, so a reset of every GPU leaves it running and reports it as a client. Without
    NVML the mappings alone decide, and it maps nothing."""
    holders = [client(dev, key="monitor", name="gpu-monitor"),
               cuda(dev, [2], key="server", nvml=[{"gpu": 2, "mib": 5000}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}], nvml=4 if with_nvml else None,
                lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert [t["pid"] for t in run["result"]["targets"]] == [out["holders"]["server"]["pid"]]
    assert run["alive"] == {"monitor": True, "server": False}
    clients = run["result"]["clients"]
    assert [(c["pid"], c["name"]) for c in clients] == [(out["holders"]["monitor"]["pid"], "gpu-monitor")]
    assert clients[0]["devices"] == sorted(str(p) for p in dev.iterdir())


def test_an_unpinned_process_counts_for_the_gpu_nvml_lists_it_on(dev, fake_nvml_lib):
    """Every GPU visible, a context on GPU 2 only: it maps every GPU's file; NVML lists it on
    GPU 2, which narrows it there. Without NVML, the mappings alone decide: every GPU it maps."""
    holders = [cuda(dev, [0, 1, 2, 3], key="unpinned", nvml=[{"gpu": 2, "mib": 4000}])]
    runs = [{"params": {"device_paths": globs(dev), "gpus": ["1"]}},
            {"params": {"device_paths": globs(dev), "gpus": ["2"]}, "check": True}]
    out = reset(holders, runs, nvml=4, lib_dir=str(fake_nvml_lib))
    pid = out["holders"]["unpinned"]["pid"]
    spared, would = out["runs"]
    assert spared["result"]["rc"] == 0 and spared["result"]["targets"] == [] and spared["alive"]["unpinned"]
    assert targets(would) == [(pid, (2,), "device")]
    assert would["result"]["targets"][0]["gpu_memory_mib"] == 4000

    without = reset(holders, [{"params": {"device_paths": globs(dev), "gpus": ["1"]}, "check": True}])
    assert targets(without["runs"][0]) == [(without["holders"]["unpinned"]["pid"], (0, 1, 2, 3), "device")]


def test_a_forked_child_of_a_dead_parent_holds_the_gpu_nvml_lists_the_parent_on(dev, fake_nvml_lib):
    """The parent (every GPU visible, its context on GPU 1) forks after CUDA initialisation and
    dies; the child keeps its mappings of nvidia0 and nvidia1, and NVML keeps listing the dead
    parent on GPU 1. The child holds GPU 1: a reset of GPU 0 spares it (and GPU 0's own server),
    a reset of GPU 1 stops it."""
    parent = cuda(dev, [0, 1], key="parent", exits=True, children=[{"key": "child", "name": "forked-child"}],
                  nvml=[{"holder": "child", "gpu": 1, "mib": 3000, "listed_as": "parent"}])
    holders = [parent, cuda(dev, [0], key="gpu0", nvml=[{"gpu": 0, "mib": 6000}])]
    runs = [{"params": {"device_paths": globs(dev), "gpus": ["0"], "include_children": False}, "check": True},
            {"params": {"device_paths": globs(dev), "gpus": ["1"]}}]
    out = reset(holders, runs, nvml=4, lib_dir=str(fake_nvml_lib))
    child, gpu0 = out["holders"]["child"]["pid"], out["holders"]["gpu0"]["pid"]
    gpu0_reset, gpu1_reset = out["runs"]
    assert targets(gpu0_reset) == [(gpu0, (0,), "device")]
    assert gpu1_reset["result"]["rc"] == 0, gpu1_reset["result"].get("msg")
    assert targets(gpu1_reset) == [(child, (1,), "device")]
    assert gpu1_reset["alive"]["child"] is False and gpu1_reset["alive"]["gpu0"] is True


def test_a_stale_nvml_pid_reused_by_a_process_on_another_gpu_is_not_stopped(dev, fake_nvml_lib):
    """NVML lists pid P on GPU 0 (a dead parent's pid, whose forked child holds the memory), and
    P now belongs to a server pinned to GPU 1. P maps only nvidia1: the listing on GPU 0 is not
    its own, so a reset of GPU 0 stops the child and leaves P alone."""
    holders = [cuda(dev, [1], key="reuser", nvml=[{"gpu": 1, "mib": 8000}]),
               cuda(dev, [0], key="child", nvml=[{"gpu": 0, "mib": 2000, "listed_as": "reuser"}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev), "gpus": ["0"]}}], nvml=4,
                lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert targets(run) == [(out["holders"]["child"]["pid"], (0,), "device")]
    assert run["alive"] == {"reuser": True, "child": False}


def test_open_device_files_without_a_mapping_make_no_target_even_when_nvml_lists_the_pid(dev, fake_nvml_lib):
    """NVML lists a pid whose process opens every device file but maps none (a monitor that
    reused a dead holder's pid): no evidence of memory, so no target; it is a client."""
    holders = [client(dev, key="monitor", name="node-agent"),
               cuda(dev, [3], key="holder", nvml=[{"gpu": 3, "mib": 100, "listed_as": "monitor"}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev), "gpus": ["3"]}}], nvml=4,
                lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert [t["pid"] for t in run["result"]["targets"]] == [out["holders"]["holder"]["pid"]]
    assert run["alive"] == {"monitor": True, "holder": False}
    assert [c["pid"] for c in run["result"]["clients"]] == [out["holders"]["monitor"]["pid"]]


def test_cuda_initialised_without_a_context_is_a_client_unless_nvml_is_missing(dev, fake_nvml_lib):
    """CUDA initialised with no context maps the GPU files and nvidiactl (not nvidia-uvm) and
    holds no memory: with NVML it is a client left alone; without NVML the mappings alone
    decide, and it is stopped (the user asked for a reset and nothing tells otherwise)."""
    probe = cuda(dev, [0, 1, 2, 3], uvm=False, key="probe", name="cuda-probe")
    holders = [probe, cuda(dev, [1], key="server", nvml=[{"gpu": 1, "mib": 5000}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}], nvml=4, lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert [t["pid"] for t in run["result"]["targets"]] == [out["holders"]["server"]["pid"]]
    assert run["alive"] == {"probe": True, "server": False}
    [probe_client] = run["result"]["clients"]
    assert probe_client["pid"] == out["holders"]["probe"]["pid"]
    assert probe_client["maps"] == sorted(probe["map"])

    without = reset(holders, [{"params": {"device_paths": globs(dev)}, "check": True}])
    assert sorted(t["pid"] for t in without["runs"][0]["result"]["targets"]) == sorted(
        h["pid"] for h in without["holders"].values())


def test_memory_nvml_cannot_attribute_makes_an_unlisted_mapper_its_holder(dev, fake_nvml_lib):
    """Memory used on GPU 2 that no listed process accounts for (a container's hidden pid): the
    unlisted process that maps GPU 2 is its holder; the one that maps GPU 0 is a client."""
    holders = [cuda(dev, [2], key="hidden"), cuda(dev, [0], key="idle")]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}], nvml=4, lib_dir=str(fake_nvml_lib),
                faults=[{"fault": "stuck_memory", "gpu": 2, "mib": 4000}])
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert targets(run) == [(out["holders"]["hidden"]["pid"], (2,), "device")]
    assert "NVML shows memory on GPU 2 that no live process it lists accounts for" in \
        run["result"]["targets"][0]["evidence"]
    assert run["alive"] == {"hidden": False, "idle": True}
    assert [c["pid"] for c in run["result"]["clients"]] == [out["holders"]["idle"]["pid"]]


def test_a_child_forked_from_a_live_holder_is_stopped_once_its_parent_is_gone(dev, fake_nvml_lib):
    """The child shares its live parent's context: NVML lists the parent, so before the reset
    the child is a client. Once the parent is stopped, NVML lists the dead parent for the
    memory the child keeps alive, and the scan after the kill phase stops the child too (with
    include_children off, so only the evidence finds it)."""
    parent = cuda(dev, [1], key="parent", name="engine", children=[{"key": "child", "name": "fork"}],
                  nvml=[{"holder": "child", "gpu": 1, "mib": 1634, "listed_as": "parent"}])
    params = {"device_paths": globs(dev), "include_children": False}
    out = reset([parent], [{"params": params, "check": True}, {"params": params}], nvml=4,
                lib_dir=str(fake_nvml_lib))
    before, after = out["runs"]
    child = out["holders"]["child"]["pid"]
    assert [t["pid"] for t in before["result"]["targets"]] == [out["holders"]["parent"]["pid"]]
    assert [c["pid"] for c in before["result"]["clients"]] == [child]
    assert after["result"]["rc"] == 0, after["result"].get("msg")
    assert [(t["pid"], t["round"], t["gpus"]) for t in after["result"]["targets"]] == [
        (out["holders"]["parent"]["pid"], 1, [1]), (child, 2, [1])]
    assert after["alive"] == {"parent": False, "child": False}


# --- item 2: a kernel thread is what the kernel flags as one --------------------------------

def test_pid_2_in_a_container_is_an_ordinary_holder_and_so_are_its_children(dev):
    """In a container's PID namespace, pid 2 is often the inference server itself."""
    server = cuda(dev, [0], key="server", name="vllm-server", children=[{"key": "worker", "name": "worker"}])
    out = reset([server], [{"params": {"device_paths": globs(dev), "include_children": True}}])
    assert out["holders"]["server"]["pid"] == 2 and out["holders"]["worker"]["ppid"] == 2
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert sorted(t["pid"] for t in run["result"]["targets"]) == [2, out["holders"]["worker"]["pid"]]
    assert run["result"]["protected"] == []
    assert run["alive"] == {"server": False, "worker": False}


# --- item 7: device paths as the kernel shows them ------------------------------------------

def test_device_paths_through_symbolic_links_find_the_holders(tmp_path, dev):
    """/dev/char/195:0 is a link to ../nvidia0; a directory may be linked too. The kernel shows
    the real path in fd links and maps, so the given paths are resolved before comparing."""
    char = tmp_path / "char"
    char.mkdir()
    os.symlink("../dev/nvidia0", char / "195:0")
    os.symlink(str(dev), tmp_path / "devlink")
    holders = [cuda(dev, [0], key="gpu0"), cuda(dev, [1], key="gpu1")]
    runs = [{"params": {"device_paths": [str(char / "195:0")]}, "check": True},
            {"params": {"device_paths": [str(tmp_path / "devlink" / "nvidia[0-9]*")], "gpus": ["1"]}}]
    out = reset(holders, runs)
    by_char, by_dir = out["runs"]
    assert targets(by_char) == [(out["holders"]["gpu0"]["pid"], (0,), "device")]
    assert by_char["result"]["targets"][0]["devices"] == [str(dev / "nvidia0")]
    assert targets(by_dir) == [(out["holders"]["gpu1"]["pid"], (1,), "device")]
    assert by_dir["alive"] == {"gpu0": True, "gpu1": False}


# --- what counts as evidence, and for which GPU ---------------------------------------------

def test_a_mapping_whose_descriptor_was_closed_is_found(dev):
    """A CUDA context keeps its device files mapped; it needs no descriptor for that. A holder
    that closed every descriptor after mapping is found by its mappings alone."""
    holder = {"key": "holder", "name": "mapped-only", "close_mapped": True,
              "map": [str(dev / "nvidia0"), str(dev / "nvidiactl"), str(dev / "nvidia-uvm")]}
    out = reset([holder], [{"params": {"device_paths": globs(dev)}}])
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert targets(run) == [(out["holders"]["holder"]["pid"], (0,), "device")]
    assert run["result"]["targets"][0]["devices"] == sorted(holder["map"])
    assert run["result"]["clients"] == []
    assert run["alive"] == {"holder": False}


def test_with_gpus_a_process_mapping_only_nvidiactl_is_not_a_target(dev):
    """Without NVML the mappings alone decide. nvidiactl names no GPU: with gpus set, only a
    process mapping a selected GPU's file is a target; without gpus, any mapping process is."""
    holders = [{"key": "ctl_only", "name": "ctl-only", "open": sorted(str(p) for p in dev.iterdir()),
                "map": [str(dev / "nvidiactl")]},
               cuda(dev, [1], key="gpu1", name="gpu1-server")]
    runs = [{"params": {"device_paths": globs(dev)}, "check": True},
            {"params": {"device_paths": globs(dev), "gpus": ["1"]}}]
    out = reset(holders, runs)
    everything, gpu1 = out["runs"]
    pid = dict((key, entry["pid"]) for key, entry in out["holders"].items())
    assert targets(everything) == sorted([(pid["ctl_only"], (), "device"), (pid["gpu1"], (1,), "device")])
    assert gpu1["result"]["rc"] == 0, gpu1["result"].get("msg")
    assert targets(gpu1) == [(pid["gpu1"], (1,), "device")]
    assert gpu1["alive"] == {"ctl_only": True, "gpu1": False}


# --- what is never a target: this module's ancestors and pid 1 -------------------------------

def test_the_modules_ancestors_and_pid_1_are_protected_though_they_hold_a_gpu(dev):
    """Ansible runs the module under processes of its own (a shell, a become wrapper, a
    container's init): one of them holding a device file must survive, reported protected.
    Here PID 1 of the namespace maps nvidia0 and the interpreter wrapper that runs the module
    maps nvidia1; an ordinary holder of nvidia2 is the only target."""
    out = pidns.run_in_pidns("tests.functional.gpu_reset_ns:ancestors_holding_gpus", device_paths=globs(dev),
                             pid1_maps=str(dev / "nvidia0"), wrapper_maps=str(dev / "nvidia1"),
                             holder=cuda(dev, [2], key="holder", name="server"))
    result = out["result"]
    assert result["rc"] == 0, result.get("msg")  # the wrapper exited with the module's status: it lived
    assert targets({"result": result}) == [(out["holders"]["holder"]["pid"], (2,), "device")]
    assert [(p["pid"], p["reason"]) for p in result["protected"]] == [(1, "pid 1"), (out["wrapper"], "self")]
    assert out["alive"] == {"holder": False}
