"""tools/compare_engines.py's count (issue 37): the role's verdict is the host's (flag data, then the
engine's own check), and a line the engine's check could not judge is never agreement.

The engines themselves are not installed here (tools/engine_venvs.sh, about 7 GB): these tests feed
the tool's count and the check's program the answers and the engine classes they would get.
"""
from __future__ import annotations

import argparse
import sys
import types

import pytest

from tools import compare_engines as ce
from ansible_collections.cleanslate.gpu.plugins.module_utils import _engine_dry_run


def case(role=True, kind="edge", name="--x 1 (valid value 1)"):
    return {"name": name, "kind": kind, "role": role, "problems": [] if role else ["the role's rule"],
            "args": ["--x", "1"], "spec": None}


RAN_OK = {"ran": True, "ok": True, "why": ""}
RAN_REFUSED = {"ran": True, "ok": False, "why": "ValueError: the engine's words"}
NOT_RUN = {"ran": False, "ok": None, "why": "needs a GPU: RuntimeError: Failed to infer device type"}


def one(role, parser, check, kind="edge"):
    return ce.tally("vllm 0.33.0", [case(role, kind)], [parser], [check])


@pytest.mark.parametrize("role", [True, False])
@pytest.mark.parametrize("parser", [(True, ""), (False, "vllm serve: error: invalid int value")])
def test_a_check_that_could_not_run_is_listed_never_counted_as_agreement(role, parser):
    for kind in ("edge", "configuration"):
        row = one(role, parser, NOT_RUN, kind)
        assert row["agree"] == 0
        assert not row["role_only"] and not row["engine_only"]
        assert row["not_run"] == ["--x 1 (valid value 1): needs a GPU: RuntimeError: Failed to infer device type"]
        assert row["checked"] == 0 and row["cases"] == 1


def test_a_line_the_role_takes_and_the_engines_check_refuses_is_refused_on_the_host():
    row = one(True, (True, ""), RAN_REFUSED, "configuration")
    assert row["agree"] == 1 and not row["role_only"] and row["checked"] == 1
    assert row["flag_data_role_only"] == 1  # what the flag data alone would have let through


def test_the_engine_refuses_what_its_parser_refuses_even_where_its_check_took_it():
    row = one(True, (False, "vllm serve: error: no"), RAN_OK)
    assert row["role_only"] == ["--x 1 (valid value 1): vllm serve: error: no"]
    assert row["agree"] == 0


def test_the_role_refusing_what_the_engine_takes_is_engine_only():
    row = one(False, (True, ""), RAN_OK)
    assert row["engine_only"] == ["--x 1 (valid value 1): the role's rule"]
    assert row["flag_data_role_only"] == 0


def test_without_the_check_the_parsers_verdict_counts():
    assert one(True, (False, "error: x"), None)["role_only"] == ["--x 1 (valid value 1): error: x"]
    assert one(False, (False, "error: x"), None)["agree"] == 1


def test_the_check_runs_wherever_it_could_change_the_count():
    assert ce.needs_check(case(False, "configuration"), (False, "error"))
    assert ce.needs_check(case(True), (False, "error"))
    assert ce.needs_check(case(False), (True, ""))
    assert not ce.needs_check(case(False), (False, "error"))


@pytest.mark.parametrize("answer, ran, ok", [
    ({"ok": True, "error_type": "", "error": ""}, True, True),
    ({"ok": False, "error_type": "ValidationError", "error": "max_model_len (32768) is greater"}, True, False),
    ({"ok": False, "error_type": "LocalEntryNotFoundError", "error": "no snapshot", "model_missing": True}, False, None),
    ({"ok": False, "error_type": "RuntimeError", "error": "Failed to infer device type"}, False, None),
    ({"ok": False, "error_type": "ModuleNotFoundError", "error": "No module named 'gguf'"}, False, None),
    ({"not_run": "no answer in 120 s (killed)"}, False, None),
])
def test_what_counts_as_the_check_having_judged_the_line(answer, ran, ok):
    check = ce.check_of(answer)
    assert (check["ran"], check["ok"]) == (ran, ok)
    assert check["why"] or ok


def test_the_machines_device_is_the_comparisons_never_the_roles():
    args = ["--model-path", "/m", "--device", "cuda"]
    request = ce.dry_run_request("sglang", args)
    assert request["argv"] == ["--device", "cpu"] + args  # the line's own --device comes last and wins
    assert ce.dry_run_request("vllm", ["/m"])["argv"] == ["serve", "/m"]
    assert ce.dry_run_env("vllm")["VLLM_TARGET_DEVICE"] == "cpu"
    assert "VLLM_TARGET_DEVICE" not in ce.dry_run_env("sglang")
    assert "--device" not in open(_engine_dry_run.__file__, encoding="utf-8").read()


def test_sglang_server_args_are_resolved_before_they_are_checked(monkeypatch):
    """SGLang 0.5.21 and later leave ServerArgs unresolved until resolve_once(); check_server_args()
    on an unresolved one fails on every line (a TypeError), which the host would take as a refusal."""
    calls = []

    class ServerArgs:
        def resolve_once(self):
            calls.append("resolve_once")

        def check_server_args(self):
            if "resolve_once" not in calls:
                raise TypeError("argument of type 'NoneType' is not iterable")
            calls.append("check_server_args")

    def prepare_server_args(argv):
        calls.append(list(argv))
        return ServerArgs()

    module = types.ModuleType("sglang.srt.server_args")
    module.prepare_server_args = prepare_server_args
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", module)
    monkeypatch.setattr(argparse.ArgumentParser, "error", argparse.ArgumentParser.error)  # restored after
    _engine_dry_run.check_sglang(["serve", "--model-path", "/m", "--config", "/etc/keys.yaml"])
    assert calls == [["--model-path", "/m"], "resolve_once", "check_server_args"]


def test_what_only_the_engines_check_refuses_is_listed_as_such():
    row = one(True, (True, ""), RAN_REFUSED)
    assert row["check_only"] == ["--x 1 (valid value 1): ValueError: the engine's words"]
    assert one(True, (False, "error: x"), RAN_REFUSED)["check_only"] == []  # the parser's already
    assert "none" in ce.render([row, one(True, (True, ""), RAN_OK)])


@pytest.mark.parametrize("words", [
    "ValueError: --enable-watermark requires --device cuda, got 'cpu'",
    "AssertionError: Multi-item scoring requires flashinfer ... Current backends: prefill=torch_native",
    "ValueError: ... but you explicitly specified 'intel_amx'.",
    "ValueError: --enable-deepseek-v4-fp4-indexer requires SM100, SM120, or gfx95 GPUs",
    "ValidationError: 1 validation error for ModelConfig Value error, Sleep mode is not supported on current platform.",
    "ValueError: Non-integer device ID 'x' is not supported by cpu.",
])
def test_a_refusal_that_only_says_this_machine_has_no_gpu_is_not_a_verdict(words):
    error_type, error = words.split(": ", 1)
    assert ce.check_of({"ok": False, "error_type": error_type, "error": error})["ran"] is False
