"""The readiness gate module (plugins/modules/inference_ready.py) run as Ansible runs it, against
the stand-in engine on this machine (no systemd unit here: the fleet tests cover the unit's death
and restarts). The stand-in helpers are in standin.py."""
from __future__ import annotations

import math
import threading
import time

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings
from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import ENGINES
from ansible_collections.cleanslate.gpu.plugins.modules.inference_ready import ARGUMENT_SPEC, OWN_RANGES, input_problems
from tests.functional.standin import engine, node  # noqa: F401  # pylint: disable=unused-import
from tests.run_module import run_module

SPEC = '{"method": "ngram", "num_speculative_tokens": 4}'


def gate(served, engine_name="vllm", **params):
    args = {"engine": engine_name, "url": "http://127.0.0.1:%d" % served.port, "served_name": "llama",
            "wait": 60, "poll_interval": 0.1, "completions": 2, "max_tokens": 25}
    args.update(params)
    return run_module("inference_ready", args)


def test_the_gate_waits_through_connection_refused_then_answers_with_the_smoke_test_and_acceptance(node):  # noqa: F811
    hold = node["tmp"] / "loading"
    hold.touch()
    with engine(node, "vllm", ["--served-model-name", "llama", "--speculative-config", SPEC],
                STANDIN_LOAD_S=0, STANDIN_HOLD_FILE=hold, STANDIN_ACCEPTANCE=0.25) as served:
        # A round of the gate (the action plugin runs the module in rounds) while the model loads.
        result = gate(served, speculative=True, wait=0.5)
        assert result["rc"] == 0 and result["state"] == "waiting" and result["last_seen"] == "connection refused"
        assert result["polls"] >= 1
        hold.unlink()  # loading ends; the next round waits for it and answers
        result = gate(served, speculative=True)
        assert result["rc"] == 0 and result["state"] == "ready" and result["healthy"], result
        assert result["models"] == ["llama"]
        assert result["completion"].strip() and len(result["completions_ms"]) == 2
        assert result["first_completion_ms"] == result["completions_ms"][0]
        spec = result["speculation"]
        assert spec["available"] and spec["source"] == "vllm:spec_decode_* counters"
        assert spec["drafts"] == 50 and spec["draft_tokens"] == 200 and spec["accepted_tokens"] == 50
        assert spec["acceptance_rate"] == 0.25 and spec["mean_acceptance_length"] == 2.0
        assert result["ready_monotonic"] >= served.state["ready_monotonic"]
        assert not result["changed"]


def test_a_wait_that_runs_out_returns_waiting_with_what_it_saw(node):  # noqa: F811
    with engine(node, "vllm", [], STANDIN_FAULT="never_ready") as served:
        result = gate(served, wait=0.5)
        assert result["rc"] == 0 and result["state"] == "waiting" and not result["healthy"]
        assert result["last_seen"] == "connection refused"


def test_a_server_that_opens_its_port_between_two_polls_is_polled_then_not_a_poll_interval_later(node):  # noqa: F811
    # The port opens after a delay; a gate slower to start than that (a loaded machine) finds it open at its
    # first poll and proves nothing, so the delay grows until the first poll met a refusal (2 polls).
    for delay in (0.5, 2, 5, 10):
        hold = node["tmp"] / "loading"
        hold.touch()
        with engine(node, "vllm", ["--served-model-name", "llama"], STANDIN_LOAD_S=0, STANDIN_HOLD_FILE=hold) as served:
            threading.Timer(delay, hold.unlink).start()
            started = time.monotonic()
            result = gate(served, poll_interval=60, wait=120, completions=1)
            took = time.monotonic() - started
        assert result["state"] == "ready", result
        if result["polls"] > 1:
            break
    assert result["polls"] == 2, "the gate's first poll came after the port opened at every delay: %r" % (result,)
    # The second poll was due 60 s after the first: the gate came back long before, at its answer.
    assert took < 30, (took, result)


def test_a_port_that_keeps_refusing_is_polled_at_the_poll_interval_only(node):  # noqa: F811
    with engine(node, "vllm", [], STANDIN_FAULT="never_ready") as served:
        result = gate(served, poll_interval=0.5, wait=1.2)
        # At 0, 0.5, 1.0 and the deadline at most (fewer when a poll is slow): the tries of the port between
        # polls are no polls.
        assert result["state"] == "waiting" and 2 <= result["polls"] <= 4, result


def test_sglang_is_ready_only_after_its_warmup_and_ready_endpoint(node):  # noqa: F811
    with engine(node, "sglang", ["--served-model-name", "llama"], STANDIN_WARMUP_S=3600) as served:
        served.wait_ready()
        result = gate(served, engine_name="sglang", wait=0.3)
        assert result["state"] == "waiting" and result["last_seen"] == "/health HTTP 503"
        probe = gate(served, engine_name="sglang", mode="probe")
        assert probe["rc"] == 0 and probe["healthy"] is False and probe["state"] == "unhealthy"


def test_the_api_key_is_sent_and_never_returned(node):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"], VLLM_API_KEY="k3y-$ecret") as served:
        served.wait_ready()
        refused = gate(served)
        assert refused["rc"] == 1 and "GET /v1/models answered HTTP 401" in refused["msg"]
        result = gate(served, api_key="k3y-$ecret")
        assert result["rc"] == 0 and result["state"] == "ready"
        assert "k3y-$ecret" not in str(result)


def test_a_served_name_the_server_does_not_list_fails_with_what_it_lists(node):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "other"]) as served:
        served.wait_ready()
        result = gate(served)
        assert result["rc"] == 1
        assert result["msg"] == "GET /v1/models does not list 'llama' (it lists ['other'])"


def test_missing_metrics_say_why_instead_of_a_rate(node):  # noqa: F811
    with engine(node, "sglang", ["--served-model-name", "llama", "--speculative-algorithm", "NGRAM"]) as served:
        served.wait_ready()
        result = gate(served, engine_name="sglang", speculative=True)
        assert result["rc"] == 0
        assert result["speculation"] == {"available": False, "note": "/metrics answered HTTP 404"}


def test_probe_of_a_closed_port_is_unhealthy_not_failed(node):  # noqa: F811
    with engine(node, "vllm", [], STANDIN_FAULT="never_ready") as served:
        result = gate(served, mode="probe")
        assert result["rc"] == 0 and result["healthy"] is False and result["last_seen"] == "connection refused"


@pytest.mark.parametrize("params, message", [
    ({"url": "ftp://127.0.0.1:1"}, "url must be http(s)://host[:port][/root/path]"),
    ({"url": "http://127.0.0.1:1/v1?x=1"}, "url must be http(s)://host[:port][/root/path]"),
    ({"url": "http://[127.0.0.1]:1"}, "url must be http(s)://host[:port][/root/path]"),
    ({"url": "http://127.0.0.1:0"}, "url must be http(s)://host[:port][/root/path]"),
    ({"poll_interval": 0}, "poll_interval is 0.0: it must be a number of seconds above 0, at most 3600"),
    ({"poll_interval": math.nan}, "poll_interval is NaN: it must be"),
    ({"wait": -1}, "wait is -1.0: it must be a number of seconds from 0 to 86400"),
    ({"wait": math.inf}, "wait is Infinity: it must be"),
    ({"completions": 0}, "completions is 0: it must be a whole number of completions from 1 to 100"),
    ({"max_tokens": -5}, "max_tokens is -5: it must be a whole number of tokens from 1 to 1048576"),
    ({"settings": {"poll_interval": 1}}, "settings is spread into options by the action plugin"),
    ({"xid": {"checks": ["xid"]}}, "xid is a second look of mode=probe; the gate (mode=gate) reads no Xid records"),
    ({"engine": "tgi"}, "value of engine must be one of: %s" % ", ".join(ENGINES)),
])
def test_bad_parameters_fail_before_any_request(params, message):
    args = {"engine": "vllm", "url": "http://127.0.0.1:9", "served_name": "m"}
    args.update(params)
    result = run_module("inference_ready", args)
    assert result["rc"] == 1 and message in result["msg"], result


# The module's numbers that are role settings take their ranges from the table; the others are its own.
UPPER = list(dict(_settings.option_ranges(_settings.GATE, _settings.PROBE), **OWN_RANGES).items())


@pytest.mark.parametrize("option, rule", UPPER, ids=[option for option, dummy in UPPER])
def test_every_number_above_its_upper_bound_is_one_sentence_before_any_request(option, rule):
    """The module took 1e10 seconds or a million completions: a typo stalled the gate for years."""
    above = rule.maximum + 1
    result = run_module("inference_ready", {"engine": "vllm", "url": "http://127.0.0.1:9", "served_name": "m",
                                            option: above})
    shown = float(above) if ARGUMENT_SPEC[option]["type"] == "float" else above  # as the spec converted it
    assert result["rc"] == 1 and result["msg"] == "%s is %s: it must be %s" % (option, shown, rule.words()), result
    defaults = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    assert input_problems(dict(defaults, **{option: rule.maximum})) == []


def test_sglang_gauges_before_their_first_window_leave_the_acceptance_unknown(node):  # noqa: F811
    """SGLang logs its acceptance gauges once every --decode-log-interval decode steps (40) and reads
    0 before: the gate's two completions of 25 tokens (20 steps at 50% of 3 drafts) do not fill a
    window, so a fresh server's acceptance is unknown, with why, never 0% (degraded)."""
    args = ["--served-model-name", "llama", "--enable-metrics", "--speculative-algorithm", "EAGLE3",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    with engine(node, "sglang", args, STANDIN_ACCEPTANCE=0.5) as served:
        served.wait_ready()
        result = gate(served, engine_name="sglang", speculative=True)
        assert result["rc"] == 0 and result["state"] == "ready", result
        spec = result["speculation"]
        assert spec["available"] is False and spec.get("acceptance_rate") is None, spec
        assert spec["note"].startswith("SGLang has not logged a window of decode steps yet"), spec
        assert "--decode-log-interval" in spec["note"]
    # With a window the smoke completions fill, the gauges are read.
    with engine(node, "sglang", args + ["--decode-log-interval", "5"], STANDIN_ACCEPTANCE=0.5) as served:
        served.wait_ready()
        spec = gate(served, engine_name="sglang", speculative=True)["speculation"]
        assert spec["available"] is True and abs(spec["acceptance_rate"] - 0.5) < 0.07, spec
        assert spec["source"] == "sglang:spec_accept_rate and sglang:spec_accept_length gauges"
