"""The gate with a unit, against fake engines (real processes on 127.0.0.1) and systemctl and
journalctl stand-ins (tests/functional/fake_systemd.py; there is no systemd here): whose answer
counts on the port, the unit read again after the smoke test, and the journal of the gated
invocation on a failure."""
from __future__ import annotations

import time

from tests.functional.fake_engines import fake_engine_process, serving
from tests.functional.fake_systemd import INVOCATION, FakeSystemd, unit
from tests.run_module import run_module

UNIT = "gate-test.service"
JOURNAL = ["INFO: Application startup complete.", "torch.OutOfMemoryError: CUDA out of memory."]


def gate(systemd, port, **params):
    args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "unit": UNIT, "wait": 10,
            "poll_interval": 0.1, "completions": 1, "stable_s": 0.2}
    args.update(params)
    return run_module("inference_ready", args, env=systemd.env)


def test_a_server_outside_the_units_cgroup_is_not_ready_and_is_named(tmp_path):
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/system.slice/gate-test.service")], JOURNAL)
    with fake_engine_process(serving()) as (port, pid):
        failed = gate(systemd, port)
        probe = gate(systemd, port, mode="probe")
    name = "port %d is held by pid %d (" % (port, pid)
    assert failed["rc"] == 1 and failed["msg"].startswith(name), failed
    assert "which is not a process of unit gate-test.service" in failed["msg"]
    assert failed["port_holder"]["pid"] == pid and "fake_engines" in failed["port_holder"]["name"]
    assert probe["rc"] == 0 and probe["verdict"] == "unhealthy" and probe["last_seen"].startswith(name), probe
    assert probe["port_holder"] == failed["port_holder"]


def test_a_server_in_the_units_cgroup_is_ready_and_read_again_stable_s_after(tmp_path):
    with open("/proc/self/cgroup") as handle:  # the fake engine's, which it inherits from us
        own = handle.read().strip().splitlines()[-1].split(":", 2)[2]
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup=own)], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        result = gate(systemd, port, stable_s=1.5)
        probe = gate(systemd, port, mode="probe")
    assert result["rc"] == 0 and result["state"] == "ready", result
    assert probe["verdict"] == "healthy" and "port_holder" not in probe
    reads = systemd.calls("systemctl")
    assert reads[-2]["monotonic"] >= result["ready_monotonic"] + 1.5  # the gate's last read, before the probe's


def test_a_unit_that_restarted_after_answering_fails_with_the_journal_of_the_invocation_that_answered(tmp_path):
    restarted = unit(ControlGroup="/", InvocationID="0" * 32, MainPID="5151")
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/"), restarted], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        result = gate(systemd, port)
    assert result["rc"] == 1 and result["msg"].startswith(
        "unit gate-test.service restarted (a new invocation, main pid 5151) after the server answered"), result
    assert result["journal"] == JOURNAL
    # A sync first (the engine's last lines may still be in journald's stream buffers), then the read.
    assert [call["argv"][1:] for call in systemd.calls("journalctl")][0] == ["--sync"]
    assert systemd.calls("journalctl")[-1]["argv"][-3:] == [
        "_SYSTEMD_INVOCATION_ID=" + INVOCATION, "+", "INVOCATION_ID=" + INVOCATION]


def test_a_crash_during_the_smoke_completions_shows_the_gated_invocations_journal(tmp_path):
    died = unit(ControlGroup="/", ActiveState="failed", SubState="failed", Result="signal", ExecMainStatus="6")
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/"), died], JOURNAL)
    with fake_engine_process(dict(serving(), **{"/v1/completions": {"exit": True}})) as (port, dummy):
        result = gate(systemd, port)
    assert result["rc"] == 1 and result["msg"].startswith("the server stopped answering during the smoke test"), result
    assert "; unit gate-test.service died (failed, failed, result signal, exit status 6)" in result["msg"]
    assert result["journal"] == JOURNAL and JOURNAL[-1] in result["msg"]
    assert systemd.calls("journalctl")[-1]["argv"][-1] == "INVOCATION_ID=" + INVOCATION


def test_with_stable_s_0_the_unit_is_still_read_after_the_smoke_test(tmp_path):
    # stable_s 0 asks for no wait, not for no check: a unit restarted during the smoke test fails.
    restarted = unit(ControlGroup="/", InvocationID="0" * 32, MainPID="5151")
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/"), restarted], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        result = gate(systemd, port, stable_s=0)
    assert result["rc"] == 1 and result["msg"].startswith(
        "unit gate-test.service restarted (a new invocation, main pid 5151) after the server answered"), result
    assert len(systemd.calls("systemctl")) >= 2


def test_a_unit_that_systemd_still_calls_activating_after_the_smoke_test_is_not_ready(tmp_path):
    # The server answers, but systemd has not finished starting the unit (ExecStartPost, no READY=1 yet).
    starting = unit(ControlGroup="/", ActiveState="activating", SubState="start")
    systemd = FakeSystemd(tmp_path, [starting], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        result = gate(systemd, port)
    assert result["rc"] == 1 and result["msg"].startswith(
        "unit gate-test.service is activating (start), not active after the server answered"), result
    assert result["journal"] == JOURNAL


def test_a_unit_that_restarted_between_two_rounds_fails_the_next_round(tmp_path):
    # The action passes the first round's baseline on; since then the unit runs another invocation,
    # or systemd counted a restart. The server answering now is not the one the gate started with.
    again = FakeSystemd(tmp_path / "invocation", [unit(ControlGroup="/", MainPID="5151")], JOURNAL)
    counted = FakeSystemd(tmp_path / "nrestarts", [unit(ControlGroup="/", NRestarts="1")], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        new_invocation = gate(again, port, baseline={"invocation_id": "a" * 32, "n_restarts": 0})
        restarted = gate(counted, port, baseline={"invocation_id": INVOCATION, "n_restarts": 0})
    assert new_invocation["rc"] == 1, new_invocation
    assert new_invocation["msg"].startswith(
        "unit gate-test.service restarted (a new invocation, main pid 5151) while waiting for the server")
    assert restarted["rc"] == 1 and restarted["msg"].startswith(
        "unit gate-test.service restarted (NRestarts 1) while waiting for the server"), restarted


def test_a_slow_foreign_server_on_the_units_port_is_named_by_the_probe_not_called_slow(tmp_path):
    # Only an unhealthy server is reset: a busy server that is not the unit's must not pass as merely slow.
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/system.slice/gate-test.service")], JOURNAL)
    with fake_engine_process({"/health": {"delay": 3}}) as (port, pid):
        probe = gate(systemd, port, mode="probe", health_timeout=0.5)
    assert probe["rc"] == 0 and probe["verdict"] == "unhealthy", probe
    assert probe["last_seen"].startswith("port %d is held by pid %d (" % (port, pid))
    assert probe["port_holder"]["pid"] == pid


def test_a_foreign_program_that_answers_no_200_is_named_at_once_not_after_the_deadline(tmp_path):
    """The hostile run: a listener outside the unit that answered garbage (or 404, 500) was taken
    for an engine still loading, and the gate waited out its whole deadline naming nobody."""
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/system.slice/gate-test.service")], JOURNAL)
    with fake_engine_process({"/health": {"status": 500, "text": "not an engine"}}) as (port, pid):
        failed = gate(systemd, port, wait=30)
    assert failed["rc"] == 1 and failed["msg"].startswith("port %d is held by pid %d (" % (port, pid)), failed
    assert failed["polls"] == 1  # named at the first look, not after 30 s of polls


def test_a_key_no_http_header_can_carry_is_one_sentence_before_any_request(tmp_path):
    """The hostile run: a key with a euro sign crashed the probe mid-request ('latin-1' codec
    can't encode character ... in position 11), which gave away a character and its place."""
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        for mode in ("probe", "gate"):
            result = gate(systemd, port, mode=mode, api_key="cl\u00e9-\u20ac-key")
            assert result["rc"] == 1 and result["msg"] == (
                "api_key holds a character outside ASCII, which no HTTP Authorization header can carry"), result
            assert "\u20ac" not in str(result) and "position" not in str(result)
    assert systemd.calls("systemctl") == []  # refused before anything was asked


def test_a_server_that_stops_answering_after_readiness_is_not_ready(tmp_path):
    """The hostile run: an engine stopped (SIGSTOP) after its smoke completions is still `active`
    to systemd, and the gate reported it ready; the last look now asks the server itself."""
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL)
    routes = serving()
    routes["/health"] = {"hang_after": 1, "hang_s": 30}
    with fake_engine_process(routes) as (port, dummy):
        result = gate(systemd, port, health_timeout=0.5, stable_s=0.2)
    assert result["rc"] == 1, result
    assert "stopped answering after it first did (/health accepted the connection but gave no answer within 0.5 s)" \
        in result["msg"], result["msg"]
    assert result["journal"] == JOURNAL


def look_then_gate(tmp_path, name, units, gate_params, look_units=None):
    """A probe (the assessment's look) then, 1 s later, a gate with stable_s 3 that is handed the
    look's record: (the look, the gate, the monotonic time of the gate's last unit read). `units`
    may be a function of the look's moment (the gated unit's states)."""
    looks = FakeSystemd(tmp_path / (name + "-look"), look_units or [unit(ControlGroup="/")], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        look = gate(looks, port, mode="probe")
        systemd = FakeSystemd(tmp_path / name, units(look["healthy_monotonic"]) if callable(units) else units, JOURNAL)
        time.sleep(1)
        seen = {"invocation_id": look["unit"]["InvocationID"], "monotonic": look["healthy_monotonic"]}
        result = gate(systemd, port, stable_s=3, healthy_seen=seen, **gate_params)
    return look, result, systemd.calls("systemctl")[-1]["monotonic"]


def started_at(moment):
    """The gated unit's states: its invocation started at `moment` (CLOCK_MONOTONIC seconds)."""
    return [unit(ControlGroup="/", ExecMainStartTimestampMonotonic=str(int(moment * 1e6)))]


def test_a_server_left_running_is_not_held_a_whole_window_again_after_the_look_that_saw_it_answer(tmp_path):
    """Four servers on a node, one broken: each healthy neighbour's gate waited its own 5 s after
    answering, though the assessment had seen the same invocation answer long before. The same
    for a server this run started with another, whose gate (its watch) saw it answer: the windows
    of the servers started together overlap."""
    for name, params in (("left-running", {}), ("started", {"started": True})):
        look, result, last_read = look_then_gate(tmp_path, name, lambda moment: started_at(moment - 2), params)
        assert look["verdict"] == "healthy" and look["healthy_monotonic"] <= result["ready_monotonic"], look
        assert result["rc"] == 0 and result["stable_since"] == "earlier look", (name, result)
        # The window is 3 s from the look, which was 1 s before the gate's first answer.
        assert look["healthy_monotonic"] + 3 <= last_read < result["ready_monotonic"] + 3, (name, look, result, last_read)


def test_a_server_started_or_restarted_since_the_look_gets_its_whole_window(tmp_path):
    # The look's moment says nothing about an invocation it did not see: one started after it (a watch
    # whose unit read raced a restart names the new invocation with the old one's answer), or one
    # systemd started since (a crash and Restart=, or someone's restart).
    for name, units, params in (("started", lambda moment: started_at(moment + 0.5), {"started": True}),
                                ("restarted", [unit(ControlGroup="/", InvocationID="c" * 32, MainPID="5151")], {})):
        dummy, result, last_read = look_then_gate(tmp_path, name, units, params)
        assert result["rc"] == 0 and result["stable_since"] == "first answer", (name, result)
        assert last_read >= result["ready_monotonic"] + 3, name


def test_a_server_that_dies_after_answering_fails_even_when_the_look_saw_it_answer(tmp_path):
    # The window may be over at the first answer; the unit is still read again after the smoke test.
    died = unit(ControlGroup="/", ActiveState="failed", SubState="failed", Result="signal", ExecMainStatus="9")
    dummy, result, dummy_read = look_then_gate(tmp_path, "died", [unit(ControlGroup="/"), died], {})
    assert result["rc"] == 1 and result["msg"].startswith(
        "unit gate-test.service died (failed, failed, result signal, exit status 9) after the server answered"), result


def test_a_record_that_is_not_a_looks_is_refused_before_any_request(tmp_path):
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL)
    bad = [{"invocation_id": INVOCATION}, {"invocation_id": INVOCATION, "monotonic": float("nan")},
           {"invocation_id": INVOCATION, "monotonic": float("inf")}, {"invocation_id": INVOCATION, "monotonic": -1},
           {"invocation_id": INVOCATION, "monotonic": True}, {"invocation_id": INVOCATION, "monotonic": "12"},
           {"invocation_id": INVOCATION.upper(), "monotonic": 1}, {"invocation_id": "$(reboot)\n", "monotonic": 1},
           {"invocation_id": INVOCATION, "monotonic": 1, "extra": "@/%"}]
    for seen in bad:
        result = gate(systemd, 1, healthy_seen=seen)
        assert result["rc"] == 1 and result["msg"].startswith(
            "healthy_seen must be empty or an earlier look's record: invocation_id (32 hexadecimal digits) and "
            "monotonic (a finite number of seconds, 0 or more), got "), (seen, result)
    assert systemd.calls("systemctl") == []


def test_a_looks_moment_after_the_gates_answer_is_not_used(tmp_path):
    # A clock from another boot (a reboot between the look and the gate would also change the
    # invocation) or a made-up value: the window counts from the gate's own answer.
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL)
    with fake_engine_process(serving()) as (port, dummy):
        result = gate(systemd, port, stable_s=1, healthy_seen={"invocation_id": INVOCATION, "monotonic": 1e12})
    assert result["rc"] == 0 and result["stable_since"] == "first answer", result
    assert systemd.calls("systemctl")[-1]["monotonic"] >= result["ready_monotonic"] + 1


def test_a_look_at_a_slow_or_foreign_server_records_no_moment_for_the_window(tmp_path):
    # Only a healthy answer from the unit's own process may start a neighbour's window early: a slow
    # server, or another program answering on the port, gives the gate nothing to count from.
    slow = FakeSystemd(tmp_path / "slow", [unit(ControlGroup="/")], JOURNAL)
    foreign = FakeSystemd(tmp_path / "foreign", [unit(ControlGroup="/system.slice/gate-test.service")], JOURNAL)
    with fake_engine_process({"/health": {"delay": 3}}) as (port, dummy):
        looked_slow = gate(slow, port, mode="probe", health_timeout=0.5)
    with fake_engine_process(serving()) as (port, dummy):
        looked_foreign = gate(foreign, port, mode="probe")
    assert looked_slow["verdict"] == "slow" and "healthy_monotonic" not in looked_slow, looked_slow
    assert looked_foreign["verdict"] == "unhealthy" and "healthy_monotonic" not in looked_foreign, looked_foreign


def test_a_unit_that_died_at_start_names_the_cause_from_the_journal_first_then_the_tail(tmp_path):
    """Issue 37, 5: the 20 lines of the tail were the API server's traceback frames; the cause,
    logged by vLLM's EngineCore process above them, now comes first (journal_errors)."""
    from tests.unit.test_inference_ready_journal_errors import VLLM_CAUSE, VLLM_START_FAILURE
    died = unit(ControlGroup="/", ActiveState="failed", SubState="failed", Result="exit-code", ExecMainStatus="1")
    systemd = FakeSystemd(tmp_path, [died], VLLM_START_FAILURE)
    with fake_engine_process({}) as (port, dummy):
        result = gate(systemd, port)
    assert result["rc"] == 1 and result["journal_errors"] == VLLM_CAUSE, result
    assert result["journal"] == VLLM_START_FAILURE[-20:]
    assert result["msg"].startswith(
        "unit gate-test.service died (failed, failed, result exit-code, exit status 1) while waiting for the server; "
        "the cause, from the journal:\n" + "\n".join(VLLM_CAUSE) + "\nits last journal lines:\n"), result["msg"]
    assert "--lines" in systemd.calls("journalctl")[-1]["argv"]
    assert systemd.calls("journalctl")[-1]["argv"][systemd.calls("journalctl")[-1]["argv"].index("--lines") + 1] == "2000"
