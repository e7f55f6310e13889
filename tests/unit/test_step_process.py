"""module_utils/_step_process.py: a module's main() in a forked child, the way reset_steps runs each
step. What the parent gets back when the step answers, prints junk first, raises, exits without an
answer or dies by a signal, and that nothing the step sets reaches the parent (or the next step)."""
from __future__ import annotations

import json
import os
import signal
import sys

from ansible.module_utils import basic

from ansible_collections.cleanslate.gpu.plugins.module_utils._step_process import internal_settings, run_module_main

STATE = {"set_by_a_step": None}


def _answers_its_arguments():
    """A step that answers with what it was given, as AnsibleModule reads it."""
    print("\n" + json.dumps({"changed": False, "args": json.loads(basic._ANSIBLE_ARGS)["ANSIBLE_MODULE_ARGS"]}))
    sys.exit(0)


def _junk_then_answer():
    sys.stdout.write("a library's banner\n{not json\n")
    print(json.dumps({"changed": True, "said": "after the junk"}))
    sys.exit(0)


def _raises():
    sys.stdout.write("half a line")
    raise ValueError("a bug in the step")


def _exits_silently():
    sys.exit(3)


def _dies_by_a_signal():
    signal.raise_signal(signal.SIGKILL)


def _sets_state():
    STATE["set_by_a_step"] = "leaked"
    os.environ["CLEANSLATE_STEP_LEAK"] = "leaked"
    print(json.dumps({"changed": False}))
    sys.exit(0)


def test_the_step_gets_its_arguments_and_the_tasks_settings_under_its_own_name():
    answer = run_module_main(_answers_its_arguments, "cleanslate.gpu.shm_clean", {"path": "/dev/shm"},
                             {"_ansible_check_mode": True, "_ansible_diff": False})
    assert answer["args"] == {"path": "/dev/shm", "_ansible_check_mode": True, "_ansible_diff": False,
                              "_ansible_module_name": "cleanslate.gpu.shm_clean"}


def test_the_settings_are_the_ansible_keys_only():
    assert internal_settings({"_ansible_check_mode": True, "path": "/x", "_ansible_verbosity": 3}) == \
        {"_ansible_check_mode": True, "_ansible_verbosity": 3}


def test_lines_printed_before_the_answer_are_skipped():
    assert run_module_main(_junk_then_answer, "cleanslate.gpu.gpu_reset", {}, {}) == \
        {"changed": True, "said": "after the junk"}


def test_an_exception_is_the_steps_failure_and_the_parent_goes_on():
    answer = run_module_main(_raises, "cleanslate.gpu.gpu_reset", {}, {})
    assert answer["failed"] is True and answer["msg"] == "ValueError: a bug in the step", answer
    assert "Traceback" in answer["exception"]


def test_an_exit_without_an_answer_or_a_death_by_signal_is_a_failure_with_its_rc():
    answer = run_module_main(_exits_silently, "cleanslate.gpu.nvml_verify", {}, {})
    assert answer["failed"] is True and answer["rc"] == 3, answer
    assert answer["msg"] == "cleanslate.gpu.nvml_verify ended with rc 3 and printed no result"
    answer = run_module_main(_dies_by_a_signal, "cleanslate.gpu.nvml_verify", {}, {})
    assert answer["failed"] is True and answer["rc"] == 128 + signal.SIGKILL, answer


def test_nothing_a_step_sets_reaches_the_parent():
    run_module_main(_sets_state, "cleanslate.gpu.evidence", {}, {})
    assert STATE["set_by_a_step"] is None
    assert "CLEANSLATE_STEP_LEAK" not in os.environ
