"""Garbled answers and impossible figures, each from a fake engine (tests/functional/fake_engines.py)
run as a real process: the gate says one sentence (a failure, or the acceptance unknown with a
note), never a traceback and never a figure the answer cannot support."""
from __future__ import annotations

import json

import pytest

from tests.functional.fake_engines import fake_engine, serving, sglang_metrics, vllm_metrics
from tests.run_module import run_module


def gate(routes, engine="vllm", **params):
    with fake_engine(routes) as port:
        args = {"engine": engine, "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "wait": 10,
                "poll_interval": 0.1, "completions": 1}
        args.update(params)
        return run_module("inference_ready", args)


def said_plainly(result):
    """One sentence of ours: no module crash, no traceback anywhere in the result."""
    text = json.dumps(result)
    assert "MODULE FAILURE" not in text and "Traceback" not in text, result
    assert "\n" not in result["msg"], result["msg"]


@pytest.mark.parametrize("path, answer, message", [
    ("/v1/models", ["llama"], "GET /v1/models answered JSON that is not a list of models"),
    ("/v1/models", None, "GET /v1/models answered JSON that is not a list of models"),
    ("/v1/models", "llama", "GET /v1/models answered JSON that is not a list of models"),
    ("/v1/models", {"data": "llama"}, "GET /v1/models answered JSON that is not a list of models"),
    ("/v1/models", {"data": ["llama", 1]}, "GET /v1/models answered JSON that is not a list of models"),
    ("/v1/models", {"data": [{"id": ["llama"]}]}, "GET /v1/models answered JSON that is not a list of models"),
    ("/v1/completions", {"choices": [{"text": 42}]}, "POST /v1/completions answered JSON without a text choice"),
    ("/v1/completions", {"choices": "Paris"}, "POST /v1/completions answered JSON without a text choice"),
    ("/v1/completions", {"choices": [None]}, "POST /v1/completions answered JSON without a text choice"),
    ("/v1/completions", [{"text": "Paris"}], "POST /v1/completions answered JSON without a text choice"),
    ("/v1/completions", None, "POST /v1/completions answered JSON without a text choice"),
])
def test_a_garbled_answer_fails_the_gate_with_one_sentence(path, answer, message):
    result = gate(dict(serving(), **{path: {"json": answer}}))
    assert result["rc"] == 1 and result["msg"].startswith(message), result
    said_plainly(result)


def test_an_answer_that_is_not_json_fails_with_one_sentence():
    result = gate(dict(serving(), **{"/v1/models": {"text": "<html>busy</html>", "content_type": "text/html"}}))
    assert result["rc"] == 1 and result["msg"].startswith("the server answered something that is not the OpenAI JSON")
    said_plainly(result)


@pytest.mark.parametrize("engine, metrics, why", [
    ("vllm", vllm_metrics("NaN", 100, 50), "not a finite number"),
    ("vllm", vllm_metrics(10, "+Inf", 50), "not a finite number"),
    ("vllm", vllm_metrics(10, 100, "-Inf"), "not a finite number"),
    ("vllm", vllm_metrics(10, 100, -5), "negative"),
    ("vllm", vllm_metrics(-2, -6, -5), "negative"),  # -5 / -6 would read as 83 %
    ("vllm", vllm_metrics(10, 100, 300), "more accepted than drafted"),  # 300 %
    ("vllm", vllm_metrics(100, 10, 5), "fewer drafted tokens than drafts"),
    ("sglang", sglang_metrics("NaN", 2.0), "sglang:spec_accept_rate"),
    ("sglang", sglang_metrics(-0.2, 2.0), "sglang:spec_accept_rate"),
    ("sglang", sglang_metrics(1.5, 2.0), "sglang:spec_accept_rate"),
    ("sglang", sglang_metrics(0.5, 0.5), "sglang:spec_accept_length"),
    ("sglang", sglang_metrics(0.5, "+Inf"), "sglang:spec_accept_length"),
])
def test_impossible_speculation_figures_are_unknown_with_a_note_never_a_rate(engine, metrics, why):
    routes = dict(serving(), **{"/metrics": {"text": metrics, "content_type": "text/plain"}})
    result = gate(routes, engine=engine, speculative=True)
    assert result["rc"] == 0 and result["state"] == "ready", result
    spec = result["speculation"]
    assert spec["available"] is False and spec.get("acceptance_rate") is None, spec
    assert spec.get("mean_acceptance_length") is None and why in spec["note"], spec
    assert "Traceback" not in json.dumps(result)


def test_possible_figures_are_still_believed():
    routes = dict(serving(), **{"/metrics": {"text": vllm_metrics(10, 40, 30), "content_type": "text/plain"}})
    spec = gate(routes, speculative=True)["speculation"]
    assert spec["available"] and spec["acceptance_rate"] == 0.75 and spec["mean_acceptance_length"] == 4.0, spec


def test_an_sglang_window_where_no_draft_was_accepted_is_a_rate_of_0_not_unknown():
    """A logged window's length counts the bonus token (at least 1): a rate of 0 with a length of 1
    is speculation that never hits (degraded with a floor), unlike 0 and 0, a window not logged."""
    routes = dict(serving(), **{"/metrics": {"text": sglang_metrics(0.0, 1.0), "content_type": "text/plain"}})
    spec = gate(routes, engine="sglang", speculative=True)["speculation"]
    assert spec["available"] and spec["acceptance_rate"] == 0.0 and spec["mean_acceptance_length"] == 1.0, spec
    routes = dict(serving(), **{"/metrics": {"text": sglang_metrics(0.0, 0.0), "content_type": "text/plain"}})
    spec = gate(routes, engine="sglang", speculative=True)["speculation"]
    assert spec["available"] is False and spec["note"].startswith("SGLang has not logged a window"), spec


def test_a_model_whose_name_only_starts_with_the_served_name_is_not_the_served_model():
    # llama-70b-instruct answering for a gate that waits for llama-70b is another model.
    result = gate(serving(name="llama-70b-instruct"), served_name="llama-70b")
    assert result["rc"] == 1 and result["models"] == ["llama-70b-instruct"], result
    assert result["msg"] == "GET /v1/models does not list 'llama-70b' (it lists ['llama-70b-instruct'])"
