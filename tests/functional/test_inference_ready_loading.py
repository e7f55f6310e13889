"""Issue 37, 4: a server that systemd's own restart (Restart=always) is loading is not dead. A
rerun of reset_and_serve.yml 14 s after `kill -9` saw "connection refused", called the server
unhealthy and reset the load in progress. The probe now calls a unit whose current invocation
started within the gate's start deadline (`timeout`, inference_service_ready_timeout), whose main
process lives and whose port refuses connections `loading` (not to be reset); past the deadline,
or with its main process dead, it is unhealthy as before. The stand-in engine loads (its port
bound, refusing) until its hold file goes; systemctl is the stand-in of fake_systemd.py, its
MainPID the stand-in's own pid and its start time set on CLOCK_MONOTONIC, which every process
shares."""
from __future__ import annotations

import re
import time

from tests.functional.fake_systemd import INVOCATION, FakeSystemd, unit
from tests.functional.standin import engine, node  # noqa: F401  # pylint: disable=unused-import
from tests.run_module import run_module

UNIT = "gate-test.service"


def own_cgroup():
    with open("/proc/self/cgroup") as handle:  # the stand-in's, which it inherits from us
        return handle.read().strip().splitlines()[-1].split(":", 2)[2]


def started_ago(seconds):
    """ExecMainStartTimestampMonotonic of an invocation that started `seconds` ago (microseconds)."""
    return str(int((time.monotonic() - seconds) * 1e6))


def look(systemd, port, **params):
    args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "unit": UNIT,
            "mode": "probe", "poll_interval": 0.1, "timeout": 600}
    args.update(params)
    return run_module("inference_ready", args, env=systemd.env)


def test_a_unit_loading_its_model_after_a_restart_is_loading_not_unhealthy(node, tmp_path):  # noqa: F811
    hold = node["tmp"] / "loading"
    hold.touch()
    with engine(node, "vllm", ["--served-model-name", "llama"], STANDIN_LOAD_S=0, STANDIN_HOLD_FILE=hold) as served:
        pid = served.proc.pid
        active = FakeSystemd(tmp_path / "active", [unit(MainPID=str(pid), ExecMainStartTimestampMonotonic=started_ago(14),
                                                        ControlGroup=own_cgroup())])
        activating = FakeSystemd(tmp_path / "activating", [unit(
            MainPID=str(pid), ActiveState="activating", SubState="start",
            ExecMainStartTimestampMonotonic=started_ago(14), ControlGroup=own_cgroup())])
        loading = look(active, served.port)
        starting = look(activating, served.port)
        hold.unlink()
        served.wait_ready()
        loaded = look(active, served.port)
    assert loading["rc"] == 0 and loading["verdict"] == "loading", loading
    assert loading["healthy"] is False and loading["needs_reset"] is False, loading
    # 14 s and what the machine took to start the module (a loaded machine: a few seconds).
    assert re.match(r"started 1[4-9] s ago, main pid %d alive, connection refused: the model is loading \(the unit "
                    r"started within inference_service_ready_timeout, 600 s\)$" % pid, loading["last_seen"]), loading
    assert 14 <= loading["loading_s"] < 30
    assert starting["verdict"] == "loading" and starting["needs_reset"] is False, starting
    # Once it listens, the same invocation is healthy: the loading window changes nothing else.
    assert loaded["verdict"] == "healthy" and loaded["needs_reset"] is False, loaded


def test_a_unit_started_long_ago_with_nothing_listening_is_unhealthy(node, tmp_path):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"], STANDIN_FAULT="never_ready") as served:
        systemd = FakeSystemd(tmp_path, [unit(MainPID=str(served.proc.pid), ControlGroup=own_cgroup(),
                                              ExecMainStartTimestampMonotonic=started_ago(120))])
        past = look(systemd, served.port, timeout=60)
        within = look(systemd, served.port, timeout=600)
    assert past["verdict"] == "unhealthy" and past["needs_reset"] is True, past
    assert past["last_seen"] == "connection refused"
    assert within["verdict"] == "loading", within  # the control: the same unit within the deadline


def test_a_dead_main_process_is_unhealthy_however_recent_the_start(node, tmp_path):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"], STANDIN_FAULT="never_ready") as served:
        gone = FakeSystemd(tmp_path / "gone", [unit(MainPID="0", ExecMainStartTimestampMonotonic=started_ago(5))])
        # A pid that does not live (the stand-in's, after it was killed) is as dead as MainPID=0.
        pid = served.proc.pid
        served.proc.kill()
        served.proc.wait()
        exited = FakeSystemd(tmp_path / "exited", [unit(MainPID=str(pid), ExecMainStartTimestampMonotonic=started_ago(5))])
        waiting = FakeSystemd(tmp_path / "auto-restart", [unit(
            MainPID="0", ActiveState="activating", SubState="auto-restart", ExecMainStartTimestampMonotonic=started_ago(5))])
        results = [look(one, served.port) for one in (gone, exited, waiting)]
    for result in results:
        assert result["rc"] == 0 and result["verdict"] == "unhealthy" and result["needs_reset"] is True, result
    assert results[2]["last_seen"].startswith("unit %s died (activating, auto-restart" % UNIT), results[2]


def test_the_gate_adopts_the_loading_invocation_and_waits_for_it(node, tmp_path):  # noqa: F811
    """gate.yml passes the look's invocation (loading_baseline) to a gate that did not restart the
    unit: the gate waits through the refusals and passes once that invocation answers; a new
    invocation instead (the load died and systemd started another) fails it."""
    hold = node["tmp"] / "loading"
    hold.touch()
    with engine(node, "vllm", ["--served-model-name", "llama"], STANDIN_LOAD_S=0, STANDIN_HOLD_FILE=hold) as served:
        state = unit(MainPID=str(served.proc.pid), ControlGroup=own_cgroup(),
                     ExecMainStartTimestampMonotonic=started_ago(14))
        systemd = FakeSystemd(tmp_path / "same", [state])
        other = FakeSystemd(tmp_path / "other", [dict(state, InvocationID="0" * 32)])
        baseline = {"invocation_id": INVOCATION, "n_restarts": 0}
        gate_args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % served.port, "served_name": "llama", "unit": UNIT,
                     "poll_interval": 0.1, "completions": 1, "stable_s": 0.2, "baseline": baseline}
        waiting = run_module("inference_ready", dict(gate_args, wait=1), env=systemd.env)
        restarted = run_module("inference_ready", dict(gate_args, wait=1), env=other.env)
        hold.unlink()
        ready = run_module("inference_ready", dict(gate_args, wait=30), env=systemd.env)
    assert waiting["rc"] == 0 and waiting["state"] == "waiting" and waiting["last_seen"] == "connection refused", waiting
    assert restarted["rc"] == 1 and restarted["msg"].startswith(
        "unit %s restarted (a new invocation, main pid %d) while waiting" % (UNIT, served.proc.pid)), restarted
    assert ready["rc"] == 0 and ready["state"] == "ready" and ready["baseline"] == baseline, ready
