"""The gate's reading of /metrics, an answer nobody vouches for: the stand-in engine (tests/sim/engine,
labelling its metrics with the served name as the engines' prometheus_client does) serving names
that hold the format's own characters, through the inference_ready action and module as Ansible
runs them (the module in its own interpreter); and fake engines (fake_engines.py) answering
hostile /metrics bodies: one sentence, never a crash, never a figure the body cannot support."""
from __future__ import annotations

import json
import random
import re
import time
from types import SimpleNamespace

import pytest

from ansible_collections.cleanslate.gpu.plugins.action.inference_ready import ActionModule
from ansible_collections.cleanslate.gpu.plugins.modules.inference_ready import METRICS_MAX_BYTES
from tests.functional.fake_engines import fake_engine, serving, vllm_metrics
from tests.functional.standin import engine, node  # noqa: F401  # pylint: disable=unused-import
from tests.run_module import run_module

SPEC = '{"method": "ngram", "num_speculative_tokens": 4}'
SGLANG_SPEC = ["--enable-metrics", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--decode-log-interval", "5"]
EM = "\u2003"
HOSTILE_NAMES = ["x}%s999%s" % (EM, EM), "llama}"]  # issue 35: read as 100 %, and as no counters


class Gate(ActionModule):
    """The action, whose module runs as Ansible runs it (tests/run_module.py): a fresh interpreter."""

    def __init__(self, args):
        task = SimpleNamespace(args=args, async_val=0, check_mode=False, action="cleanslate.gpu.inference_ready")
        super().__init__(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")), None, None, None)

    def _execute_module(self, module_name=None, module_args=None, task_vars=None, **dummy):
        return run_module(module_name.rsplit(".", 1)[-1], module_args)


def gated(port, served_name, engine_name="vllm", **args):
    call = {"engine": engine_name, "url": "http://127.0.0.1:%d" % port, "served_name": served_name,
            "speculative": True, "min_acceptance_rate": 0.3, "timeout": 60, "poll_interval": 0.1,
            "completions": 2, "max_tokens": 25}
    call.update(args)
    return Gate(call).run(task_vars={"inventory_hostname": "gpu1"})


@pytest.mark.parametrize("served_name", HOSTILE_NAMES)
def test_a_served_name_holding_the_formats_characters_is_read_as_data_and_the_floor_applies(node, served_name):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", served_name, "--speculative-config", SPEC],
                STANDIN_FAULT="low_acceptance") as served:
        served.wait_ready()
        result = gated(served.port, served_name)
    spec = result["speculation"]
    # What the engine accepts (15 %, in whole tokens: 29 of 200), not 100 %, and not unknown.
    assert spec["available"] and spec["acceptance_rate"] == pytest.approx(0.15, abs=0.01), spec
    assert spec["acceptance_rate"] == round(spec["accepted_tokens"] / spec["draft_tokens"], 4) and spec["drafts"] == 50
    assert result["status"] == "degraded" and not result.get("failed"), result
    shown = re.match(r"speculative decoding accepts ([0-9.]+)% of drafted tokens, below "
                     r"inference_service_min_acceptance_rate 30%: ", result["reason"])
    assert shown and 13 <= float(shown.group(1)) <= 16, result["reason"]


def test_sglang_gauges_under_a_hostile_served_name_are_read_too(node):  # noqa: F811
    served_name = HOSTILE_NAMES[0]
    with engine(node, "sglang", ["--served-model-name", served_name] + SGLANG_SPEC,
                STANDIN_FAULT="low_acceptance") as served:
        served.wait_ready()
        result = gated(served.port, served_name, engine_name="sglang", completions=3)
    assert result["speculation"]["available"], result  # 2 of 15 drafted tokens in the last window of 5 steps
    assert result["speculation"]["acceptance_rate"] == pytest.approx(0.15, abs=0.02), result
    assert result["status"] == "degraded", result


def test_the_counters_of_another_model_name_are_not_the_served_ones():
    spec = gate_body(vllm_metrics(10, 100, 90, model="other"))["speculation"]
    assert spec == {"available": False, "note": "/metrics has vllm:spec_decode_* counters, but none with "
                                                "model_name='llama', the served name"}
    # Beside the served name's own, another's are left out of the sums: 15 %, not (15 + 90) / 200.
    mine, other = vllm_metrics(10, 100, 15).split("\n"), vllm_metrics(10, 100, 90, model="other").split("\n")
    both = "".join("%s\n%s\n%s\n" % (mine[index], mine[index + 1], other[index + 1]) for index in (0, 2, 4))
    spec = gate_body(both)["speculation"]
    assert spec["available"] and spec["acceptance_rate"] == 0.15 and spec["draft_tokens"] == 100, spec


def gate_body(body, engine_name="vllm", module_timeout=180, **route):
    """The module's answer for a /metrics of body (text, or None with route's body_hex)."""
    route = dict({"content_type": "text/plain"}, **route, **({} if body is None else {"text": body}))
    routes = dict(serving(), **{"/metrics": route})
    with fake_engine(routes) as port:
        args = {"engine": engine_name, "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "wait": 10,
                "poll_interval": 0.1, "completions": 1, "speculative": True, "request_timeout": 5}
        answer = run_module("inference_ready", args, timeout=module_timeout)
    assert answer["rc"] == 0 and answer["state"] == "ready", answer
    text = json.dumps(answer)
    assert "MODULE FAILURE" not in text and "Traceback" not in text, answer
    return answer


GOOD = vllm_metrics(10, 100, 15)
HOSTILE = [  # (a /metrics body, what the note says): each leaves the acceptance unknown
    (GOOD.replace('model_name="llama"} 15', 'model_name="llama} 15'), "is not the Prometheus text format (line 6: "),
    (GOOD.replace('model_name="llama"}', 'model_name="llama"}%s999%s' % (EM, EM), 1),
     "is not the Prometheus text format (line 2: "),
    (GOOD + GOOD.split("\n")[-2] + "\n", "is not the Prometheus text format (line 7: metric "
                                         "vllm:spec_decode_num_accepted_tokens_total is given twice"),  # 30 % if summed
    (GOOD[:-3], "does not end with a line feed"),  # cut short: "1" of "15"
    (GOOD.replace(" 100\n", " 1e2\r\n"), "is not the Prometheus text format (line 4: "),
    ("<html><body>502 Bad Gateway</body></html>\n", "is not the Prometheus text format (line 1: "),
    ('a{m="%s"} 1\n' % ("}" * (METRICS_MAX_BYTES + 1)), "answered more than 8 MiB"),
    ("".join('a{i="%d"} 1\n' % index for index in range(100001)), "line 100001: more than 100000 samples"),
    ("", "/metrics has no vllm:spec_decode_* counters (is --disable-log-stats set?)"),
]


@pytest.mark.parametrize("body, note", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_metrics_body_leaves_the_acceptance_unknown_with_one_sentence(body, note):
    spec = gate_body(body)["speculation"]
    assert spec["available"] is False and "acceptance_rate" not in spec and note in spec["note"], spec
    assert "\n" not in spec["note"] and len(spec["note"]) < 300, spec


def test_an_endless_metrics_answer_is_read_to_8_mib_only():
    started = time.monotonic()
    spec = gate_body('a{m="%s"} 1\n' % ("}" * 65536), endless=True, module_timeout=30)["speculation"]
    assert spec == {"available": False, "note": "/metrics answered more than 8 MiB, more than an engine's metrics"}
    assert time.monotonic() - started < 30


def test_non_utf8_bytes_and_a_body_that_trickles_in_are_unknown_too():
    body = GOOD.replace("llama", "llam\xe1").encode("latin-1")
    spec = gate_body(None, body_hex=body.hex())["speculation"]
    assert spec == {"available": False, "note": "/metrics is not the Prometheus text format (byte %d is not UTF-8)"
                                                % (body.index(b"\xe1") + 1)}
    started = time.monotonic()
    spec = gate_body(GOOD, trickle_s=0.5)["speculation"]  # a byte each half second, each within the timeout
    assert spec == {"available": False, "note": "/metrics: the answer did not end within 5 s"}, spec
    assert time.monotonic() - started < 20


def test_garbage_bodies_are_one_sentence_never_a_crash_never_a_figure():
    """A fuzz: bodies of real counters with the format's characters put in, half of them inside the
    model_name label's value (where a served name goes). The gate either reads the figure the served
    name's samples hold (15 %) or says it does not know, in one sentence. (Today's main read three of
    these twelve bodies as another rate.)"""
    rng = random.Random(1)
    pieces = ["{", "}", '"', "\\", "\n", EM, " ", "999", "#", "=", ",", "\x00", "NaN", "1e9", "llama",
              "}%s999%s" % (EM, EM), '"} 999\n']
    bodies = []
    for dummy in range(12):
        chars = list(GOOD)
        for dummy in range(rng.randint(1, 3)):
            text = "".join(chars)
            inside = [at + len('model_name="') for at in range(len(text)) if text.startswith('model_name="', at)]
            where = rng.choice(inside) if inside and rng.random() < 0.5 else rng.randrange(len(chars))
            chars.insert(where, rng.choice(pieces))
        bodies.append("".join(chars))
    routes = dict(serving(), **{"/metrics": {"texts": bodies, "content_type": "text/plain"}})
    with fake_engine(routes) as port:
        for body in bodies:
            args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "wait": 10,
                    "completions": 1, "speculative": True}
            answer = run_module("inference_ready", args)
            assert answer["rc"] == 0 and answer["state"] == "ready", answer
            assert "Traceback" not in json.dumps(answer), answer
            spec = answer["speculation"]
            assert "\n" not in spec.get("note", ""), spec
            if spec["available"]:
                assert spec["acceptance_rate"] == 0.15, (body, spec)
