"""Issue 37: a hung server is told apart. vLLM's EngineCore process stopped (SIGSTOP) keeps /health
at 200 while completions never return: the probe called it healthy and reset_and_serve.yml left it
so. Now, once /health answered 200, the probe reads /metrics, sends one real 1-token completion
within hung_after, and reads /metrics again: answered is healthy, no answer while tokens were
generated is busy (left running), no answer and no token is hung (reset, needs_reset). The stand-in
engine plays each (its faults hung_engine and busy: tests/sim/engine/settings.py); SGLang without
--enable-metrics exposes no /metrics, where the deadline alone decides."""
from __future__ import annotations

import time

from tests.functional.standin import engine, node  # noqa: F401  # pylint: disable=unused-import
from tests.run_module import run_module


def started(node, engine_name, args, **env):  # noqa: F811
    """The stand-in, once it listens: the state file of an earlier one in the same test is removed first
    (wait_ready waits for that file)."""
    node["state"].unlink(missing_ok=True)
    return engine(node, engine_name, args, **env)


def look(served, engine_name="vllm", **params):
    args = {"engine": engine_name, "url": "http://127.0.0.1:%d" % served.port, "served_name": "llama",
            "mode": "probe", "poll_interval": 0.1, "hung_after": 1.5}
    args.update(params)
    started = time.monotonic()
    result = run_module("inference_ready", args)
    return result, time.monotonic() - started


def test_a_server_that_answers_the_1_token_completion_is_healthy(node):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"], VLLM_API_KEY="k3y-secret") as served:
        served.wait_ready()
        result, dummy = look(served, api_key="k3y-secret")
        before = served.post("/v1/completions", {"model": "llama", "prompt": "x", "max_tokens": 1}, key="k3y-secret")
    assert result["rc"] == 0 and result["verdict"] == "healthy" and result["needs_reset"] is False, result
    assert result["last_seen"].startswith("HTTP 200; a 1-token completion answered in "), result
    assert result["generation"]["answered"] is True and before[0] == 200
    assert "k3y-secret" not in str(result)


def test_a_saturated_server_that_generates_for_others_is_busy_not_hung(node):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"], STANDIN_FAULT="busy") as served:
        served.wait_ready()
        result, took = look(served)
    assert result["rc"] == 0 and result["verdict"] == "busy", result
    assert result["healthy"] is True and result["needs_reset"] is False and "healthy_monotonic" in result
    assert result["last_seen"].startswith("busy: /health answered 200 and a 1-token completion got no answer in 1.5 s, "
                                          "but the engine generated meanwhile ("), result
    generation = result["generation"]
    assert generation["answered"] is False and generation["after"]["tokens"] > generation["before"]["tokens"]
    assert took < 1.5 + 2 * 1.5 + 10  # the probe's bound: the completion's deadline and two reads of /metrics


def test_a_server_whose_health_answers_but_that_generates_nothing_is_hung_and_reset(node):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"], STANDIN_FAULT="hung_engine") as served:
        served.wait_ready()
        result, took = look(served)
    assert result["rc"] == 0 and result["verdict"] == "hung", result
    assert result["healthy"] is False and result["needs_reset"] is True and "healthy_monotonic" not in result
    assert result["last_seen"].startswith("hung: /health answered 200 but a 1-token completion got no answer in 1.5 s "
                                          "and no token was generated (0 tokens generated, 0 requests finished"), result
    assert result["generation"]["before"]["tokens"] == result["generation"]["after"]["tokens"] == 0
    assert took < 1.5 + 2 * 1.5 + 10


def test_without_metrics_the_completions_deadline_alone_decides_and_says_so(node):  # noqa: F811
    # SGLang serves /metrics only with --enable-metrics (the role always gives it; a hand-made unit may not).
    with engine(node, "sglang", ["--served-model-name", "llama"], STANDIN_FAULT="hung_engine") as served:
        served.wait_ready()
        hung, dummy = look(served, engine_name="sglang")
    with started(node, "sglang", ["--served-model-name", "llama"]) as served:
        served.wait_ready()
        answered, dummy = look(served, engine_name="sglang")
    assert hung["verdict"] == "hung" and hung["needs_reset"] is True, hung
    assert hung["last_seen"] == ("hung: /health answered 200 but a 1-token completion got no answer in 1.5 s; the "
                                 "server exposes no generation metrics (/metrics answered HTTP 404), so the "
                                 "completion's deadline alone decided"), hung
    assert answered["verdict"] == "healthy", answered


def test_sglang_with_its_metrics_is_told_apart_too(node):  # noqa: F811
    args = ["--served-model-name", "llama", "--enable-metrics"]
    with engine(node, "sglang", args, STANDIN_FAULT="busy") as served:
        served.wait_ready()
        busy, dummy = look(served, engine_name="sglang")
    with started(node, "sglang", args, STANDIN_FAULT="hung_engine") as served:
        served.wait_ready()
        hung, dummy = look(served, engine_name="sglang")
    assert busy["verdict"] == "busy", busy
    assert hung["verdict"] == "hung" and "no token was generated" in hung["last_seen"], hung
