"""The validation's decision with the engine's own check (issue 37, point 3): which checks a
server's command line got (the flag data's on the controller, the engine's on the host) and what
refuses the host. A version without flag data is built unchecked and served when the engine's check
passes; the engine's refusal is the host's `invalid` reason in its own words."""
from __future__ import annotations

import pytest

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import inference_service_engine_problem
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_result import (
    inference_service_report_row, inference_service_result)
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_check, _engine_flags, _serve_command
from tests.unit.test_inference_args import FLAGS, settings

REFUSAL = "Error: --enable-auto-tool-choice requires --tool-call-parser"
PASSED = {"changed": False, "ran": True, "ok": True, "refusal": "", "why_not_run": ""}
REFUSED = {"changed": False, "ran": True, "ok": False, "refusal": REFUSAL, "error_type": "TypeError", "why_not_run": ""}
NOT_RUN = {"changed": False, "ran": False, "ok": False, "refusal": "",
           "why_not_run": "the check ran past its timeout of 180 seconds and its process group was killed"}
SKIPPED_OFF = {"changed": False, "skipped": True, "false_condition": "inference_service_engine_dry_run | bool"}
SKIPPED_ROOT = {"changed": False, "skipped": True, "false_condition": "inference_service_user | length > 0"}


def built(version, **overrides) -> dict:
    values = settings(engine_version=version, **overrides)
    return _serve_command.build(values, _engine_flags.EngineFlags(
        _engine_flags.load([FLAGS], values["engine"], values["engine_version"], unchecked=True)))


def test_a_version_with_flag_data_is_checked_by_it_and_says_so():
    args = built("0.33.0")
    assert args["flag_data"] == "passed" and args["engine_version"] == "0.33.0"
    assert not any("no flag data" in warning for warning in args["warnings"])


def test_a_version_without_flag_data_is_built_unchecked_with_a_note_when_the_engine_will_decide():
    args = built("0.34.0", extra_args=["--an-option-only-0.34-has", "1", "--max-num-seqs", "8"])
    assert args["flag_data"] == "no data" and args["engine_version"] == "0.34.0"
    assert args["argv"][-4:] == ["--an-option-only-0.34-has", "1", "--max-num-seqs", "8"]
    assert ("vllm 0.34.0 has no flag data: its command line is built with vllm 0.33.0's flag names and not checked on "
            "the controller; the engine's own check on the host decides") in args["warnings"]


def test_a_version_without_flag_data_still_keeps_secrets_and_the_roles_flags_off_the_command_line():
    with pytest.raises(_serve_command.ServeConfigError) as caught:
        built("0.34.0", extra_args=["--api-key", "sk-not-here-1234", "--port", "9000"])
    problems = caught.value.problems
    assert any("--api-key would put a secret on the command line" in problem for problem in problems)
    assert any("--port is set by the role" in problem for problem in problems)
    assert all("sk-not-here-1234" not in problem for problem in problems)


def test_without_the_engines_check_a_version_without_flag_data_is_refused_as_before():
    with pytest.raises(_engine_flags.FlagError, match="no flag data for vllm 0.34.0"):
        _engine_flags.load([FLAGS], "vllm", "0.34.0")


@pytest.mark.parametrize("dry_run, flag_data, problem, engine", [
    # No flag data: served only when the engine's check passes.
    (PASSED, "no data", "", "passed"),
    (REFUSED, "no data", "vLLM 0.34.0 refuses the configuration, in its own words: " + REFUSAL, "refused"),
    (NOT_RUN, "no data", "vLLM 0.34.0 has no flag data and its own check could not run (the check ran past its "
                         "timeout of 180 seconds and its process group was killed): nothing checked the command "
                         "line; fix the check or give a version with flag data", "not run: " + NOT_RUN["why_not_run"]),
    (SKIPPED_ROOT, "no data", "vLLM 0.34.0 has no flag data and its own check could not run (the server runs as root "
                              "(inference_service_user is empty) and the engine's code never runs as root for a "
                              "check): nothing checked the command line; fix the check or give a version with flag "
                              "data", None),
    # Flag data passed: the engine's refusal still refuses; a check that could not run does not.
    (PASSED, "passed", "", "passed"),
    (REFUSED, "passed", "vLLM 0.34.0 refuses the configuration, in its own words: " + REFUSAL, "refused"),
    (NOT_RUN, "passed", "", "not run: " + NOT_RUN["why_not_run"]),
    (SKIPPED_OFF, "passed", "", "not run: inference_service_engine_dry_run is false"),
    (SKIPPED_ROOT, "passed", "", "not run: the server runs as root (inference_service_user is empty) and the "
                                 "engine's code never runs as root for a check"),
])
def test_what_refuses_the_host_and_which_checks_ran(dry_run, flag_data, problem, engine):
    args = {"engine": "vllm", "engine_version": "0.34.0", "argv": ["/opt/vllm/bin/vllm", "serve", "m"],
            "flag_data": flag_data}
    assert inference_service_engine_problem(dry_run, args) == problem
    checks = _engine_check.checks(dry_run, args)
    assert checks["flag_data"] == flag_data
    if engine is not None:
        assert checks["engine"] == engine


def test_a_refusal_of_the_flag_data_means_the_engines_check_did_not_run():
    failed_args = {"failed": True, "msg": "inference_service: inference_service_extra_args: --nope is not an option"}
    assert _engine_check.checks({}, failed_args) == {
        "flag_data": "refused", "engine": "not run: the flag data refused the command line"}


def test_the_engines_refusal_is_the_hosts_invalid_reason_and_the_report_row_says_which_checks_ran():
    reason = "inference_service: on gpu-a01, vLLM 0.34.0 refuses the configuration, in its own words: " + REFUSAL
    args = {"engine": "vllm", "engine_version": "0.34.0", "argv": ["/opt/vllm/bin/vllm", "serve", "m"],
            "flag_data": "no data"}
    result = inference_service_result({"args": args, "dry_run": REFUSED}, "gpu-a01", engine="vllm", unit="vllm.service",
                                      failed_stage="validate", failed_result={"msg": reason})
    assert (result["status"], result["stage"], result["reason"]) == ("failed", "validate", reason)
    assert result["checks"] == {"flag_data": "no data", "engine": "refused"}
    assert inference_service_report_row(result)["service_checks"] == "flag data no data, engine refused"


def test_a_served_host_without_flag_data_carries_its_checks():
    args = {"engine": "vllm", "engine_version": "0.34.0", "argv": ["/opt/vllm/bin/vllm", "serve", "m"],
            "flag_data": "no data", "command_line": "/opt/vllm/bin/vllm serve m"}
    result = inference_service_result({"args": args, "dry_run": PASSED, "gate": {"status": "ready"}}, "gpu-a01",
                                      engine="vllm", unit="vllm.service")
    assert result["ok"] and result["checks"] == {"flag_data": "no data", "engine": "passed"}
    assert inference_service_report_row(result)["service_checks"] == "flag data no data, engine passed"
