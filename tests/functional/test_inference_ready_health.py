"""The gate's look at the health endpoint, against fake engines (tests/functional/fake_engines.py)
run as real processes on 127.0.0.1: a slow answer is not a dead server, and the URL it is given
is the only place a request goes."""
from __future__ import annotations

from tests.functional.fake_engines import fake_engine, serving
from tests.run_module import run_module


def look(port, **params):
    args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "mode": "probe",
            "poll_interval": 0.1}
    args.update(params)
    return run_module("inference_ready", args)


def test_a_health_endpoint_slower_than_health_timeout_is_slow_not_unhealthy():
    with fake_engine({"/health": {"delay": 3}}) as port:
        result = look(port, health_timeout=0.5)
    assert result["rc"] == 0 and result["verdict"] == "slow" and result["healthy"] is False, result
    assert result["last_seen"] == "/health accepted the connection but gave no answer within 0.5 s"
    assert result["polls"] == 2  # a second look before the verdict


def test_a_closed_port_is_unhealthy_and_says_connection_refused():
    with fake_engine({}) as port:
        pass  # the port is closed again
    result = look(port, health_timeout=0.5)
    assert result["rc"] == 0 and result["verdict"] == "unhealthy" and result["last_seen"] == "connection refused"
    assert result["polls"] == 2


def test_vllm_answering_health_in_6_s_is_healthy_with_the_default_timeout():
    with fake_engine({"/health": {"delay": 6}}) as port:
        result = look(port)
    assert result["rc"] == 0 and result["verdict"] == "healthy" and result["healthy"] is True, result
    assert result["last_seen"] == "HTTP 200" and result["polls"] == 1


def test_gate_mode_waits_through_a_slow_health_answer():
    with fake_engine(dict(serving(), **{"/health": {"delay": 1}})) as port:
        # Gate mode: a slow health answer is "not ready yet", polled again, never a failure.
        result = look(port, mode="gate", health_timeout=0.2, wait=0.5)
    assert result["rc"] == 0 and result["state"] == "waiting" and result["verdict"] == "slow", result
