"""The gate with a unit, against fake engines (real processes on 127.0.0.1) and systemctl and
journalctl stand-ins (tests/functional/fake_systemd.py; there is no systemd here): whose answer
counts on the port, the unit read again after the smoke test, and the journal of the gated
invocation on a failure."""
from __future__ import annotations

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
