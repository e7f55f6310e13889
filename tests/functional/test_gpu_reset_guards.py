"""gpu_reset's guarding decisions, one test each, at the level where each is made: who is
protected (by which of its names), who is in scope with `gpus` (a target's children), who a
later round signals (the identity is pid and start time), how long the kill phase waits, and
what makes the scan after a round look again. Each test fails when its decision is broken in
the way named in its docstring (tests/mutations/gpu_reset.yml and _procs.yml hold those bugs).

Every process runs, with the module that signals it, in a private PID namespace
(tests/functional/pidns.py; scenarios in gpu_reset_ns.py and gpu_reset_guards_ns.py).
"""
from __future__ import annotations

import os
import sys

import pytest

from tests.functional import pidns
from tests.functional.gpu_reset_ns import client, cuda, dev_files, globs

SCENARIO = "tests.functional.gpu_reset_ns:holders_then_runs"
GUARDS = "tests.functional.gpu_reset_guards_ns"

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


def reset(holders, runs, **kwargs):
    return pidns.run_in_pidns(SCENARIO, holders=holders, runs=runs, **kwargs)


@pytest.fixture
def dev(tmp_path):
    return dev_files(tmp_path / "dev")


def test_a_protected_daemon_that_renamed_its_comm_is_still_protected_by_argv0(tmp_path, dev):
    """nvidia-persistenced run as /usr/bin/nvidia-persistenced, whose threads or a prctl gave it
    another comm (what psutil's name then says too): only argv[0]'s base name still carries the
    protected name, and it must be enough. Bug: comparing comm and psutil's name only kills it."""
    daemon = tmp_path / "nvidia-persistenced"
    daemon.symlink_to(sys.executable)
    holders = [cuda(dev, [0], key="daemon", python=str(daemon), name="nvpd-worker"),
               cuda(dev, [1], key="server", name="vllm-server")]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}])
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert out["runs"][0]["alive"] == {"daemon": True, "server": False}
    assert [(p["pid"], p["name"], p["reason"]) for p in result["protected"]] == [
        (out["holders"]["daemon"]["pid"], "nvpd-worker", "protect_names")]


def test_a_protected_daemon_whose_comm_and_argv0_both_changed_is_still_protected_by_its_executable(tmp_path, dev):
    """The executable is nvidia-persistenced (a hard link of the interpreter: /proc/PID/exe names
    the link), started with another argv[0] (exec -a) and renamed by prctl: its executable's base
    name is the one name left, and protect_names compares it too. Bug: comparing comm, psutil's
    name and argv[0] only kills the daemon."""
    daemon = tmp_path / "nvidia-persistenced"
    os.link(os.path.realpath(sys.executable), daemon)
    launcher = tmp_path / "launcher"
    launcher.write_text('#!/bin/bash\nexec -a nvpd %s "$@"\n' % daemon)
    launcher.chmod(0o755)
    holders = [cuda(dev, [0], key="daemon", python=str(launcher), name="nvpd-worker"),
               cuda(dev, [1], key="server", name="vllm-server")]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}])
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert out["runs"][0]["alive"] == {"daemon": True, "server": False}
    assert [(p["pid"], p["reason"]) for p in result["protected"]] == [(out["holders"]["daemon"]["pid"], "protect_names")]


def test_with_gpus_the_children_of_a_target_that_hold_no_device_are_stopped_too(dev):
    """Resetting GPU 1: its server's tokenizer and API workers (started anew, mapping nothing)
    are targets as its children, since no GPU is known for them; GPU 0's server and its worker
    are left alone. Bug: judging a child as if it needed a selected GPU of its own (needs_gpu)
    leaves the workers running beside a server that is gone."""
    holders = [cuda(dev, [1], key="server", name="server-1",
                    children=[{"key": "tokenizer", "fresh": True}, {"key": "api", "fresh": True}]),
               cuda(dev, [0], key="neighbour", name="server-0", children=[{"key": "neighbour_worker", "fresh": True}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev), "gpus": ["1"]}}])
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    pid = {key: entry["pid"] for key, entry in out["holders"].items()}
    assert sorted((t["pid"], t["reason"]) for t in run["result"]["targets"]) == sorted(
        [(pid["server"], "device"), (pid["tokenizer"], "child"), (pid["api"], "child")])
    assert run["alive"] == {"server": False, "tokenizer": False, "api": False, "neighbour": True,
                            "neighbour_worker": True}


def test_a_new_holder_that_reuses_the_pid_of_a_signalled_target_is_signalled_in_the_next_round(dev):
    """The target exits on SIGTERM; before the scan after the round reads the processes, a new
    process that maps GPU 0 takes its pid. It is another process (another start time): the next
    round stops it. Bug: remembering the signalled targets by pid alone leaves it holding the GPU
    while the task succeeds."""
    holder = cuda(dev, [0], key="server", name="server")
    newcomer = cuda(dev, [0], key="newcomer", name="newcomer")
    out = pidns.run_in_pidns(GUARDS + ":reused_pid_after_the_round", holder=holder, newcomer=newcomer,
                             device_paths=globs(dev))
    result, target, reused = out["result"], out["target"], out["newcomer"]
    assert reused is not None, "the module never reached the scan after the round: %s" % result
    assert reused["pid"] == target["pid"] and reused["starttime"] != target["starttime"]
    assert result["rc"] == 0, result.get("msg")
    assert [(t["pid"], t["name"], t["round"]) for t in result["targets"]] == [
        (target["pid"], "server", 1), (target["pid"], "newcomer", 2)]
    assert out["newcomer_alive"] is False


def test_kill_timeout_is_counted_from_sigkill_even_when_the_grace_period_is_longer():
    """A target that ignores SIGTERM and, once SIGKILLed, stays in the kernel (state D) for half
    a second: with grace_period 2 and kill_timeout 2 it is waited for and reported gone after
    SIGKILL. Bug: counting kill_timeout from the first SIGTERM leaves no wait after SIGKILL when
    grace_period >= kill_timeout, and the process is reported a survivor (the task fails)."""
    out = pidns.run_in_pidns(GUARDS + ":lingering_after_sigkill", grace_period=2, kill_timeout=2, linger=0.5)
    outcome = out["outcome"]
    assert out["went_at"] is not None, "the target never went: %s" % out
    assert outcome["survivors"] == [], "reported a survivor %.2f s after the start, though it went at %.2f s" % (
        out["returned_at"], out["went_at"])
    assert [(e["pid"], e["signal"]) for e in outcome["ended"]] == [(out["target"]["pid"], "SIGKILL")]
    assert 2.0 <= outcome["ended"][0]["seconds"] < 4.0


def test_a_target_still_on_its_way_out_when_kill_timeout_ends_is_killed_not_a_survivor():
    """kill_timeout 0: the SIGKILLed target is still runnable (state R) for half a second while
    the kernel tears it down. It is given that time and reported gone after SIGKILL. Bug: no time
    after kill_timeout (SETTLE_S 0) reports it a survivor and fails the task over a process that
    is dying."""
    out = pidns.run_in_pidns(GUARDS + ":lingering_after_sigkill", grace_period=0, kill_timeout=0, linger=0.5,
                             state="R")
    outcome = out["outcome"]
    assert outcome["survivors"] == [], "reported a survivor %.2f s after the start, though it went at %s s" % (
        out["returned_at"], out["went_at"])
    assert [(e["pid"], e["signal"]) for e in outcome["ended"]] == [(out["target"]["pid"], "SIGKILL")]


def test_a_respawned_api_server_that_maps_nothing_makes_the_scan_after_a_round_look_again(dev):
    """The API server (found by cmdline_patterns, mapping nothing) detaches a successor on SIGTERM
    (fork, setsid, fork; the middle process exits), born after the scan that follows the round
    listed /proc (a seccomp gate makes that happen every time). The successor has the server's
    command line and maps nothing: the scan must look again and a second round stop it. Bug:
    only newcomers that map a device make it look again, and the task ends with the server's
    successor running."""
    tag = "cleanslate-test-respawned-api-server"
    holder = {"key": "server", "name": "api-server", "term_detaches": {"name": "successor"}}
    out = pidns.run_in_pidns("tests.functional.gpu_reset_ns:detached_successor_gated", holder=holder,
                             device_paths=globs(dev), watch=[], params={"cmdline_patterns": [tag]},
                             argv_extra=[tag])
    result = out["result"]
    assert len(out["released"]) == 1, "the module never reached the scan after the round: %s" % result
    assert result["rc"] == 0, result.get("msg")
    assert [(t["name"], t["reason"], t["round"]) for t in result["targets"]] == [
        ("api-server", "cmdline", 1), ("successor", "cmdline", 2)]
    assert out["living"] == [], "the successor still runs: pids %s" % out["living"]


def test_an_api_server_that_initialised_cuda_without_memory_is_still_a_target_of_its_pattern(dev, fake_nvml_lib):
    """The API server named by cmdline_patterns initialised CUDA without a context: it maps
    GPU 0 and nvidiactl, and NVML accounts for all the memory elsewhere, so by the device files
    it is a client. The pattern still makes it a target (a client matched by cmdline_patterns is
    one, RV(clients) says). Bug: a process that maps a device file is never judged by the pattern,
    and the API server whose workers were stopped lives on."""
    tag = "cleanslate-test-api-server-with-cuda"
    holders = [cuda(dev, [0], uvm=False, key="api", name="api-server", argv_extra_hex=[tag.encode().hex()]),
               cuda(dev, [1], key="worker", name="worker", nvml=[{"gpu": 1, "mib": 5000}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev), "cmdline_patterns": [tag]}}], nvml=4,
                lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    pid = {key: entry["pid"] for key, entry in out["holders"].items()}
    assert sorted((t["pid"], t["reason"]) for t in run["result"]["targets"]) == sorted(
        [(pid["api"], "cmdline"), (pid["worker"], "device")])
    api = [t for t in run["result"]["targets"] if t["pid"] == pid["api"]][0]
    assert "without nvidia-uvm" in api["evidence"] and "command line matches" in api["evidence"]
    assert run["result"]["clients"] == []
    assert run["alive"] == {"api": False, "worker": False}


def test_a_few_mib_the_driver_counts_beyond_the_listed_shares_make_no_client_a_holder(dev, fake_nvml_lib):
    """The real driver counts as used a few MiB more than the shares it lists: that is no memory
    of a hidden process, so the CUDA probe (maps GPU 0 without a context, listed nowhere) stays a
    client while the listed server on GPU 0 is stopped. Bug: any memory above the listed shares
    (UNATTRIBUTED_MIB 0) makes every unlisted mapper of that GPU its holder."""
    holders = [cuda(dev, [0], uvm=False, key="probe", name="cuda-probe"),
               cuda(dev, [0], key="server", name="server", nvml=[{"gpu": 0, "mib": 5000}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}], nvml=4, lib_dir=str(fake_nvml_lib),
                faults=[{"fault": "stuck_memory", "gpu": 0, "mib": 20}])
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert [t["pid"] for t in run["result"]["targets"]] == [out["holders"]["server"]["pid"]]
    assert [c["pid"] for c in run["result"]["clients"]] == [out["holders"]["probe"]["pid"]]
    assert run["alive"] == {"probe": True, "server": False}


def test_an_unpinned_holder_is_spared_only_for_the_spared_gpu_it_holds_not_for_one_it_maps(dev, fake_nvml_lib):
    """The broken server on GPU 0 sees every GPU (maps GPUs 0 to 3) and NVML lists it on GPU 0
    only; the neighbour on spared GPU 2 is listed there. Resetting GPU 0 with spare_gpus [2]
    stops the server and spares the neighbour. Bug: judging spare_gpus by the GPUs a process maps
    spares the broken server, since it maps GPU 2 too."""
    holders = [cuda(dev, [0, 1, 2, 3], key="server", name="server", nvml=[{"gpu": 0, "mib": 5000}]),
               cuda(dev, [2], key="neighbour", name="neighbour", nvml=[{"gpu": 2, "mib": 5000}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev), "gpus": ["0"], "spare_gpus": ["2"]}}], nvml=4,
                lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    assert [(t["pid"], t["gpus"]) for t in run["result"]["targets"]] == [(out["holders"]["server"]["pid"], [0])]
    assert run["alive"] == {"server": False, "neighbour": True}


def test_a_dead_worker_left_a_zombie_is_no_target_of_its_parents_reset(dev):
    """A crashed engine: one worker died and its parent never reaped it (a zombie), the other
    lives. The zombie holds nothing and cannot be signalled: it is not a target (targets lists
    what is stopped), the live worker is. Bug: judging a child without looking at its state lists
    the zombie as a target, one that is neither killed nor a survivor."""
    holders = [cuda(dev, [0], key="server", name="server",
                    children=[{"key": "dead_worker", "exits": True}, {"key": "worker", "fresh": True}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev)}}])
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    pid = {key: entry["pid"] for key, entry in out["holders"].items()}
    assert sorted((t["pid"], t["reason"]) for t in run["result"]["targets"]) == sorted(
        [(pid["server"], "device"), (pid["worker"], "child")])
    assert sorted(k["pid"] for k in run["result"]["killed"]) == sorted([pid["server"], pid["worker"]])


def test_a_pattern_target_that_maps_nothing_is_in_scope_whatever_gpu_nvml_wrongly_lists_it_on(dev, fake_nvml_lib):
    """Resetting GPU 1: its API server (cmdline_patterns; it opens the device files to query NVML,
    maps none) has a pid that NVML lists on GPU 0 (the listing is another process's: a reused pid,
    or a pid of another namespace). A listing without a mapping is no evidence, so no GPU is known
    for the server and it is a target; GPU 0's holder is left alone. Bug: taking NVML's GPUs for a
    process that maps nothing puts the API server on GPU 0, out of scope, and it survives."""
    tag = "cleanslate-test-api-server-listed-elsewhere"
    holders = [client(dev, key="api", name="api-server", argv_extra_hex=[tag.encode().hex()]),
               cuda(dev, [1], key="worker", name="worker", nvml=[{"gpu": 1, "mib": 5000}]),
               cuda(dev, [0], key="other", name="other", nvml=[{"gpu": 0, "mib": 100, "listed_as": "api"}])]
    out = reset(holders, [{"params": {"device_paths": globs(dev), "gpus": ["1"], "cmdline_patterns": [tag]}}], nvml=4,
                lib_dir=str(fake_nvml_lib))
    run = out["runs"][0]
    assert run["result"]["rc"] == 0, run["result"].get("msg")
    pid = {key: entry["pid"] for key, entry in out["holders"].items()}
    assert sorted((t["pid"], t["reason"], tuple(t["gpus"])) for t in run["result"]["targets"]) == sorted(
        [(pid["api"], "cmdline", ()), (pid["worker"], "device", (1,))])
    assert run["alive"] == {"api": False, "worker": False, "other": True}
