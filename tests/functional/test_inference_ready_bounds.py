"""The engine's answers and the unit's journal are the engine's words, not ours: each fake engine
(tests/functional/fake_engines.py, a real process) answers endlessly, trickles, lists more models
than a failure can quote or nests its JSON deeper than a parser goes, and the gate reads each
answer to a bound that fits it, within its timeout, and says one sentence; what it quotes is
masked, then cut. Each module run has a deadline of its own: today's main held the gate on every
endless or trickling answer here until that deadline."""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.functional.fake_engines import fake_engine, serving
from tests.functional.fake_systemd import FakeSystemd, unit
from tests.run_module import run_module

KEY = "sk-b0unds-Secret-key"
# Long enough for a gate that reads to its bounds (1 MiB over loopback, two 1 s health looks),
# far shorter than an endless answer, or one that trickles for 40 s.
MODULE_S = 30


def run(routes, **params):
    """(the module's answer, seconds it took)."""
    with fake_engine(routes) as port:
        args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "wait": 10,
                "poll_interval": 0.1, "completions": 1, "request_timeout": 2, "api_key": KEY}
        args.update(params)
        started = time.monotonic()
        result = run_module("inference_ready", args, timeout=MODULE_S)
    return result, time.monotonic() - started


def said_plainly(result):
    """One sentence of ours, short, with no traceback and no piece of the key anywhere."""
    text = json.dumps(result)
    assert "MODULE FAILURE" not in text and "Traceback" not in text, result["msg"][:500]
    assert KEY[:6] not in text, "a piece of the key is in the result"
    assert "\n" not in result.get("msg", "") and len(result.get("msg", "")) < 2000, result.get("msg", "")[:500]


@pytest.mark.parametrize("path, route, message", [
    ("/v1/models", {"text": '{"data": [' + '{"id": "x"}, ' * 1000, "endless": True},
     "GET /v1/models answered more than 1 MiB, more than an engine's answer"),
    ("/v1/completions", {"text": '{"choices": [{"text": "' + "Paris " * 1000, "endless": True},
     "POST /v1/completions answered more than 1 MiB, more than an engine's answer"),
    ("/v1/models", {"text": "[" * 10000, "endless": True},  # nested without end
     "GET /v1/models answered more than 1 MiB, more than an engine's answer"),
    ("/v1/models", {"status": 500, "text": "<p>%s</p>" % KEY * 100, "endless": True},  # an error page, endless
     "GET /v1/models answered HTTP 500: <p>********</p><p>"),
    ("/v1/completions", {"status": 503, "text": "overloaded " * 100, "endless": True},
     "POST /v1/completions answered HTTP 503: overloaded overloaded"),
])
def test_an_endless_answer_is_read_to_its_bound_only(path, route, message):
    result, took = run(dict(serving(), **{path: route}))
    assert result["rc"] == 1 and result["msg"].startswith(message), result["msg"][:500]
    said_plainly(result)
    assert took < MODULE_S


@pytest.mark.parametrize("path, asked", [("/v1/models", "GET /v1/models"),
                                         ("/v1/completions", "POST /v1/completions")])
def test_an_answer_that_trickles_in_fails_within_request_timeout(path, asked):
    route = dict(serving()[path], trickle_s=0.5)  # every byte within the 2 s timeout, the whole in 40 s and more
    result, took = run(dict(serving(), **{path: route}))
    assert result["rc"] == 1 and result["msg"] == "%s: the answer did not end within 2 s" % asked, result
    said_plainly(result)
    assert took < 15


def test_a_health_answer_that_trickles_is_slow_and_an_endless_one_is_unhealthy():
    """A health answer begun but not ended within health_timeout is a busy server's (slow: never
    reset for it); an endless one is no engine's (unhealthy), read to 16 KiB only."""
    trickle = dict(serving(), **{"/health": {"text": "healthy and well" * 2, "trickle_s": 0.4}})
    result, took = run(trickle, mode="probe", health_timeout=1)
    assert result["rc"] == 0 and result["verdict"] == "slow", result
    assert result["last_seen"] == "/health began its answer but did not end it within 1 s", result
    assert took < 10
    endless = dict(serving(), **{"/health": {"text": "ok " * 1000, "endless": True}})
    result, took = run(endless, mode="probe", health_timeout=1)
    assert result["rc"] == 0 and result["verdict"] == "unhealthy", result
    assert result["last_seen"] == "/health answered more than 16 KiB, more than a health answer", result
    assert took < MODULE_S


def test_a_huge_model_list_is_quoted_cut_and_masked():
    """20000 models, none the served one: the failure names 12 of them, each cut to 100 characters
    after the key in one of them was masked (cut first, its first characters would be left)."""
    ids = ["x" * 95 + KEY] + ["model-%05d" % index for index in range(19999)]
    listing = {"object": "list", "data": [{"id": name, "object": "model"} for name in ids]}
    result, dummy = run(dict(serving(), **{"/v1/models": {"json": listing}}))
    assert result["rc"] == 1, result["msg"][:500]
    assert result["msg"].startswith("GET /v1/models does not list 'llama' (it lists ['%s" % ("x" * 95 + "*****"))
    assert result["msg"].endswith("'model-00010'] and 19988 more)"), result["msg"][-200:]
    assert "(%d more characters)" % (95 + len("********") - 100) in result["msg"]
    said_plainly(result)


def test_json_nested_deeper_than_the_parser_goes_is_one_sentence():
    result, dummy = run(dict(serving(), **{"/v1/completions": {"text": "[" * 200000}}))
    assert result["rc"] == 1 and result["msg"].startswith(
        "the server answered something that is not the OpenAI JSON: maximum recursion depth exceeded"), result
    said_plainly(result)


def test_a_journal_line_is_masked_then_cut(tmp_path):
    """The service writes its journal: a line of 100000 characters (journald keeps such lines) is
    quoted to 2000, the key near the cut masked whole, the other lines as they are."""
    line = "E" * 1995 + KEY + "F" * 98000
    systemd = FakeSystemd(tmp_path, [unit(ActiveState="failed", SubState="failed", Result="exit-code")],
                          ["first line", line, "last line"])
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "wait": 5,
            "poll_interval": 0.1, "unit": "gate-test.service", "api_key": KEY}
    result = run_module("inference_ready", args, env=systemd.env, timeout=MODULE_S)
    quoted = "E" * 1995 + "*****... (%d more characters)" % (len(line) - len(KEY) + 8 - 2000)
    assert result["rc"] == 1 and result["journal"] == ["first line", quoted, "last line"], result["journal"][1][-80:]
    assert result["msg"].endswith("\nfirst line\n%s\nlast line" % quoted)
    assert KEY[:6] not in json.dumps(result)
