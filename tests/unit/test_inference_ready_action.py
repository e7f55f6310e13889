"""The inference_ready action's decisions (plugins/action/inference_ready.py), with Ansible's
_execute_module stubbed by answers a test gives: the status from the acceptance and the floor,
the rounds to the deadline, the progress line between them."""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from ansible_collections.cleanslate.gpu.plugins.action.inference_ready import ActionModule
from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings

ARGS = {"engine": "vllm", "url": "http://127.0.0.1:8000", "served_name": "llama", "unit": "vllm.service"}
UNIT = {"ActiveState": "activating", "SubState": "start", "MainPID": "4242", "NRestarts": "0"}


class Stubbed(ActionModule):
    """The action with the module's answers given by `answer(module_args)`; the calls are kept."""

    def __init__(self, args, answer):
        task = SimpleNamespace(args=args, async_val=0, check_mode=False, action="cleanslate.gpu.inference_ready")
        connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))
        super().__init__(task, connection, None, None, None)
        self.answer = answer
        self.calls = []

    def _execute_module(self, module_name=None, module_args=None, task_vars=None, **dummy):
        self.calls.append(dict(module_args))
        return self.answer(module_args)


def run(answer, **args):
    action = Stubbed(dict(ARGS, **args), answer)
    return action.run(task_vars={"inventory_hostname": "gpu1"}), action.calls


def ready(speculation=None, **extra):
    result = {"state": "ready", "healthy": True, "verdict": "healthy", "polls": 1, "changed": False}
    if speculation is not None:
        result["speculation"] = speculation
    result.update(extra)
    return lambda module_args: dict(result)


def test_ready_without_speculation_is_ready():
    result, calls = run(ready())
    assert result["status"] == "ready" and result["reason"] == "" and "warnings" not in result
    assert len(calls) == 1


def test_below_the_floor_is_degraded_with_a_warning_or_a_failure():
    result, dummy = run(ready({"available": True, "acceptance_rate": 0.15}), min_acceptance_rate=0.3)
    assert result["status"] == "degraded" and result["warnings"] == [result["reason"]]
    assert result["reason"].startswith("speculative decoding accepts 15% of drafted tokens, below "
                                       "inference_service_min_acceptance_rate 30%")
    failed, dummy = run(ready({"available": True, "acceptance_rate": 0.15}), min_acceptance_rate=0.3,
                        fail_on_degraded=True)
    assert failed["failed"] and failed["msg"] == failed["reason"] and failed["status"] == "degraded"


@pytest.mark.parametrize("rate, floor, shown", [
    (0.2996, 0.3, ("29.96", "30")),
    (0.29999, 0.3, ("29.999", "30")),
    (0.2999999, 0.3, ("29.99999", "30")),
    (0.305, 0.3055, ("30.50", "30.55")),  # never fewer decimals than the floor shows
    (0.1, 0.9, ("10", "90")),
])
def test_at_the_floor_the_two_numbers_shown_differ(rate, floor, shown):
    result, dummy = run(ready({"available": True, "acceptance_rate": rate}), min_acceptance_rate=floor)
    assert result["status"] == "degraded"
    assert tuple(re.findall(r"([0-9.]+)%", result["reason"])) == shown, result["reason"]


def test_at_or_above_the_floor_is_ready():
    for rate in (0.3, 0.31):
        result, dummy = run(ready({"available": True, "acceptance_rate": rate}), min_acceptance_rate=0.3)
        assert result["status"] == "ready" and result["reason"] == ""


def test_unknown_acceptance_is_ready_with_the_note_as_a_warning():
    note = "/metrics reports more accepted than drafted tokens (300 accepted of 100), which cannot be"
    result, dummy = run(ready({"available": False, "note": note}), min_acceptance_rate=0.3)
    assert result["status"] == "ready" and result["reason"] == "acceptance rate unknown: " + note
    assert result["warnings"] == [result["reason"]]


def waiting(module_args):
    """A module round that waits its whole `wait`, as the module does while the model loads."""
    time.sleep(module_args["wait"])
    return {"state": "waiting", "healthy": False, "verdict": "unhealthy", "last_seen": "connection refused",
            "polls": 3, "unit": UNIT, "baseline": {"invocation_id": "a" * 32, "n_restarts": 0},
            "journal": ["loading"] if module_args["with_journal"] else None}


def test_waiting_rounds_go_on_to_the_deadline_then_fail_with_the_last_journal(capsys):
    started = time.monotonic()
    result, calls = run(waiting, timeout=2, progress_interval=1)
    assert 1.9 <= time.monotonic() - started < 3.5
    assert 2 <= len(calls) <= 3 and calls[-1]["with_journal"] and not calls[0]["with_journal"]
    assert calls[1]["baseline"] == {"invocation_id": "a" * 32, "n_restarts": 0}  # the first round's, passed on
    assert result["failed"] and result["msg"].startswith("http://127.0.0.1:8000 not ready after 2 s (the deadline")
    assert result["msg"].endswith("; its last journal lines:\nloading") and result["polls"] == 3 * len(calls)
    assert "gpu1: waiting for http://127.0.0.1:8000 (unit vllm.service activating/start, pid 4242, restarts 0)" \
        in capsys.readouterr().out


def test_at_the_deadline_the_cause_from_the_journal_comes_before_the_tail():
    """Issue 37, 5: the error lines of the invocation (journal_errors) first, then its tail."""
    def loading_then_failing(module_args):
        answer = waiting(module_args)
        if module_args["with_journal"]:
            answer["journal_errors"] = ["RuntimeError: No working C++ compiler found"]
        return answer

    result, dummy = run(loading_then_failing, timeout=1, progress_interval=1)
    assert result["failed"] and result["msg"].endswith(
        "; the cause, from the journal:\nRuntimeError: No working C++ compiler found\nits last journal lines:\nloading"), \
        result["msg"]


def test_a_module_failure_ends_the_rounds_at_once():
    def died(module_args):
        return {"failed": True, "msg": "unit vllm.service died (failed, failed, result exit-code, exit status 1)",
                "polls": 2}
    result, calls = run(died, timeout=600, progress_interval=1)
    assert len(calls) == 1 and result["failed"] and result["msg"].startswith("unit vllm.service died")
    assert "status" not in result


def test_the_new_options_reach_the_module_and_the_actions_own_do_not():
    result, calls = run(ready(), health_timeout=12.5, stable_s=3, secrets=["s"], validate_certs=False,
                        ca_path="/etc/ca.pem", timeout=60, progress_interval=5, min_acceptance_rate=0.2,
                        fail_on_degraded=True)
    assert result["status"] == "ready"
    sent = calls[0]
    assert {key: sent[key] for key in ("health_timeout", "stable_s", "secrets", "validate_certs", "ca_path")} == {
        "health_timeout": 12.5, "stable_s": 3, "secrets": ["s"], "validate_certs": False, "ca_path": "/etc/ca.pem"}
    assert not {"timeout", "progress_interval", "min_acceptance_rate", "fail_on_degraded"} & set(sent)


SECRET = "zq7 'quoted' key"


def echoing(module_args):
    """A round that waits and echoes the key in what it saw, as a server's error body may."""
    answer = waiting(module_args)
    answer["last_seen"] = "/health HTTP 401 for key %r" % SECRET
    return answer


def test_the_progress_line_and_the_deadline_message_show_no_secret(capsys):
    result, dummy = run(echoing, timeout=1, progress_interval=1, secrets=[SECRET], api_key="k3y-zq7")
    out = capsys.readouterr().out
    assert "zq7" not in out and "zq7" not in result["msg"]
    assert '/health HTTP 401 for key "********"' in result["msg"]


def test_the_progress_lines_printed_between_rounds_show_no_secret(capsys):
    result, calls = run(echoing, timeout=3, progress_interval=1, secrets=[SECRET])
    out = capsys.readouterr().out
    assert len(calls) >= 2 and out.count("gpu1: waiting for") >= 1, out  # lines were printed
    assert "zq7" not in out and '/health HTTP 401 for key "********"' in out, out


@pytest.mark.parametrize("state", ["slow", "unproven"])
def test_a_server_left_running_that_is_slow_or_unproven_ends_the_gate_at_once_with_its_status(state):
    """Issue 35, 9: the module's first round says the server the run left running is slow (or
    unproven): the gate ends there, its status that state with the module's reason as a warning,
    not failed; it never calls again until the deadline (an hour by default)."""
    reason = "/health accepted the connection but gave no answer within 2 s: this run did not start unit vllm.service"
    answer = {"state": state, "healthy": False, "verdict": state, "polls": 1, "changed": False, "reason": reason,
              "last_seen": "/health accepted the connection but gave no answer within 2 s", "unit": UNIT}
    started = time.monotonic()
    result, calls = run(lambda module_args: dict(answer), timeout=3, progress_interval=1)
    assert len(calls) == 1 and time.monotonic() - started < 5
    assert not result.get("failed") and result["status"] == state and result["reason"] == reason, result
    assert result["warnings"] == ["%s: %s" % (state, reason)]
    # The module's waiting state is no such end: the rounds go on (to the deadline, here 0 s).
    waiting, dummy = run(lambda module_args: dict(answer, state="waiting"), timeout=0)
    assert waiting["failed"] and "not ready after 0 s" in waiting["msg"], waiting


@pytest.mark.parametrize("option", ["timeout", "progress_interval", "min_acceptance_rate"])
def test_the_options_the_action_reads_are_refused_above_the_tables_bound_before_any_call(option):
    """The action read timeout 1e10 (a gate of 300 years) and a floor of 30 (meant as 30 %)."""
    rule = _settings.option_ranges(_settings.GATE)[option]
    result, calls = run(ready(), **{option: rule.maximum + 1})
    assert result["failed"] and calls == []
    assert result["msg"] == "%s is %s: it must be %s." % (option, rule.maximum + 1, rule.words())
    result, calls = run(ready(), **{option: str(rule.maximum)})  # -e gives texts
    assert not result.get("failed") and len(calls) == 1, result


def test_the_roles_settings_come_as_one_mapping_and_an_option_given_twice_is_refused():
    answered = ready()
    result, calls = run(answered, settings={"poll_interval": 2.5, "api_key": "sk-0123456789"})
    assert calls[0]["poll_interval"] == 2.5 and calls[0]["api_key"] == "sk-0123456789" and "settings" not in calls[0]
    result, calls = run(answered, settings={"unit": "other.service"})
    assert result["failed"] and calls == [] and result["msg"] == "an option given both in settings and on its own: unit"
