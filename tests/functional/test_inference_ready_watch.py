"""Issue 42: the gate of one of several servers a run started together watches the others while it
holds its own stability window (inference_ready's `servers` in gate mode), so that their windows
overlap: each one seen answering from its own unit gets the record its own gate counts its window
from (healthy_seen); one that refuses, answers from another program, is not active or hangs gets
none, and the gate holds its own window neither shorter nor, for a hung one, longer.
Fake engines (real processes on 127.0.0.1) and systemctl stand-ins (tests/functional/fake_systemd.py)."""
from __future__ import annotations

import time

from tests.functional.fake_engines import fake_engine_process, serving
from tests.functional.fake_systemd import FakeSystemd, unit
from tests.functional.standin import free_port
from tests.functional.test_inference_ready_unit import JOURNAL, UNIT, gate


def watched(port, name, **params):
    return dict({"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama",
                 "unit": name, "poll_interval": 0.1}, **params)


def own_reads(systemd, name=UNIT) -> list:
    """The moments systemctl was asked about the unit `name`."""
    return [call["monotonic"] for call in systemd.calls("systemctl") if call["argv"][-1] == name]


def test_each_server_started_with_the_gated_one_is_recorded_only_when_its_own_unit_answers(tmp_path):
    by_unit = {UNIT: unit(ControlGroup="/"), "vllm-b.service": unit(ControlGroup="/", InvocationID="b" * 32),
               "vllm-d.service": unit(ControlGroup="/system.slice/vllm-d.service", InvocationID="d" * 32),
               "vllm-e.service": unit(ControlGroup="/", ActiveState="deactivating", SubState="stop-sigterm",
                                      InvocationID="e" * 32)}
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL, by_unit=by_unit)
    refused = free_port()
    with fake_engine_process(serving()) as (own, dummy), fake_engine_process(serving()) as (other, dummy):
        result = gate(systemd, own, stable_s=2, servers=[
            watched(other, "vllm-b.service"), watched(refused, "vllm-c.service"),
            watched(other, "vllm-d.service"), watched(other, "vllm-e.service")])
    assert result["rc"] == 0 and result["state"] == "ready" and result["stable_since"] == "first answer", result
    answers = result["servers"]
    units = [answer["unit"] for answer in answers]
    assert units == ["vllm-b.service", "vllm-c.service", "vllm-d.service", "vllm-e.service"], answers
    seen = answers[0]["healthy_seen"]
    assert seen["invocation_id"] == "b" * 32, answers[0]
    assert result["ready_monotonic"] <= seen["monotonic"] <= result["ready_monotonic"] + 2, (seen, result)
    # None of the others: nothing answers; another program answers on its port; its unit is stopping.
    assert [answer["healthy_seen"] for answer in answers[1:]] == [{}, {}, {}], answers
    assert answers[1]["last_seen"] == "connection refused", answers[1]
    assert "which is not a process of unit vllm-d.service" in answers[2]["last_seen"], answers[2]
    assert answers[3]["last_seen"] == "HTTP 200, but unit vllm-e.service is deactivating (stop-sigterm)", answers[3]
    # A server recorded is polled no more; the others until the window's end; the gated unit is read
    # again a whole window after its first answer.
    assert len(own_reads(systemd, "vllm-b.service")) == 1 and len(own_reads(systemd, "vllm-d.service")) > 3
    assert own_reads(systemd)[-1] >= result["ready_monotonic"] + 2


def test_a_server_whose_model_loads_during_the_window_is_recorded_when_it_first_answers(tmp_path):
    """A neighbour still loading when the window began: polled again until it answers, its record
    the moment of that answer, not of the window's start or end."""
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL)
    ready_at = time.monotonic() + 2
    loading = dict(serving(), **{"/health": {"ready_at": ready_at}})
    with fake_engine_process(serving()) as (own, dummy), fake_engine_process(loading) as (other, dummy):
        result = gate(systemd, own, stable_s=4, servers=[watched(other, "vllm-b.service")])
    assert result["rc"] == 0, result
    (answer,) = result["servers"]
    assert answer["healthy_seen"], answer
    assert ready_at <= answer["healthy_seen"]["monotonic"] <= max(ready_at, result["ready_monotonic"]) + 1, (
        ready_at, answer, result)


def test_a_hung_server_holds_the_gate_no_longer_than_its_window(tmp_path):
    """A neighbour that accepts the connection and never answers: each poll is cut at the window's
    end, so the gated server's gate ends with its window, not health_timeout later."""
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL)
    with fake_engine_process(serving()) as (own, dummy), \
            fake_engine_process({"/health": {"delay": 60}}) as (hung, dummy):
        result = gate(systemd, own, stable_s=1, servers=[watched(hung, "vllm-b.service", health_timeout=20)])
    assert result["rc"] == 0 and result["servers"][0]["healthy_seen"] == {}, result
    assert "accepted the connection but gave no answer within" in result["servers"][0]["last_seen"], result
    # Uncut, the poll would have held the gate 20 s.
    assert own_reads(systemd)[-1] < result["ready_monotonic"] + 1 + 10, result


def test_the_gate_watches_only_by_units(tmp_path):
    systemd = FakeSystemd(tmp_path, [unit(ControlGroup="/")], JOURNAL)
    no_unit = gate(systemd, 1, unit="", servers=[watched(1, "vllm-b.service")])
    server_without = gate(systemd, 1, servers=[watched(1, "vllm-b.service"), watched(1, "")])
    assert no_unit["rc"] == 1 and no_unit["msg"] == (
        "servers are watched by the gate (mode=gate) while it holds its unit's stability window: give unit, or look at "
        "them with mode=probe"), no_unit
    assert server_without["rc"] == 1 and server_without["msg"] == (
        "servers[1]: the gate watches a server's unit, whose invocation its record names: give unit"), server_without
    assert systemd.calls("systemctl") == []
