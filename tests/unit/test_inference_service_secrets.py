"""Where a secret's value would be shown to others (cleanslate.gpu.inference_service_secret_problems,
the role's "Check the secrets' values"): the command line every user reads in /proc and the
world-readable unit file, compared raw, never against the shell-quoted line. Every sentence
names the secret and the place and never holds the value."""
from __future__ import annotations

import json

import pytest

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import (
    FilterModule, inference_service_secret_problems)
from tests.unit.test_inference_args import build

EAGLE3 = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-70B", "num_speculative_tokens": 3}


def problems(secrets, **overrides):
    found = inference_service_secret_problems(secrets, build(**overrides))
    for sentence in found:
        for value in _values(secrets):
            for form in (value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
                assert form not in sentence, "a sentence shows a secret: %r" % sentence
    return found


def _values(secrets):
    values = [str(secrets[key]) for key in ("api_key", "hf_token", "admin_api_key") if secrets.get(key)]
    return values + [str(value) for value in (secrets.get("environment") or {}).values() if str(value)]


def test_a_quote_in_a_secret_no_longer_hides_it_from_the_check():
    """sk'X is shell-quoted 'sk'"'"'X' in command_line: the old check searched that text. (A served
    name may hold no quote at all now: the argument is a chat template's.)"""
    built = build(extra_args=["--chat-template", "sk'X-live-1"])
    assert "sk'X-live-1" not in built["command_line"]
    found = problems({"api_key": "sk'X-live-1"}, extra_args=["--chat-template", "sk'X-live-1"])
    assert len(found) == 1 and found[0].startswith("inference_service_secrets.api_key is in the command line (argument ")
    assert "the value of --chat-template (inference_service_extra_args)), which every user of the host reads" in found[0]


@pytest.mark.parametrize("secret", ["sk$HOME", "sk%i", "sk\\n", 'sk"X', "sk`id`", "sk;rm", "clé-ü-ключ", "sk X",
                                    "sk@host/path", "-sk", "sk=1", "sk'\"\\$%"])
def test_a_secret_inside_an_argument_is_found_whatever_it_holds(secret):
    secret += "-live-key"  # a secret is 8 characters or more
    found = problems({"hf_token": secret}, extra_args=["--chat-template", "before " + secret + " after"])
    assert len(found) == 1
    assert found[0].startswith("inference_service_secrets.hf_token is in the command line (argument ")
    assert "the value of --chat-template (inference_service_extra_args)" in found[0]


def test_a_secret_equal_to_a_whole_argument_is_found():
    found = problems({"admin_api_key": "llama-70b"}, served_name="llama-70b")
    assert len(found) == 1 and "inference_service_served_name" in found[0]


@pytest.mark.parametrize("secret", ['ab"cd', "ab\\cd", "ключ-42", "emoji-\U0001F511", "tab\\tnot"])
def test_a_secret_in_the_speculative_config_is_found_as_json_escapes_it(secret):
    secret += "-live-key"
    spec = dict(EAGLE3, model="org/draft-" + secret)
    argv = build(speculative=spec)["argv"]
    assert any(json.dumps(secret)[1:-1] in item for item in argv)  # escaped there, not raw
    found = problems({"hf_token": secret}, speculative=spec)  # an API key must be ASCII; a token need not
    assert len(found) == 1 and "the value of --speculative-config (inference_service_speculative)" in found[0]


def test_a_secret_in_the_model_is_named_as_the_model():
    found = problems({"api_key": "tok42-live"}, model="org/tok42-live-model")
    assert "argument 2, the model (inference_service_model)" in found[0]
    found = problems({"api_key": "tok42-live"}, model="org/tok42-live-model", engine="sglang", unit="sglang.service")
    assert "the value of --model-path (inference_service_model)" in found[0]


def test_a_secret_in_the_executable_path_is_named_as_the_executable():
    found = problems({"hf_token": "tok42-live"}, venv="/opt/tok42-live")
    assert "(the executable (inference_service_executable or inference_service_venv))" in found[0]


def test_a_secret_in_an_option_name_is_named_by_position_only():
    found = inference_service_secret_problems({"api_key": "xyz-live"}, {"argv": [
        "/bin/vllm", "serve", "m", "--xyz-live", "xyz-live-2", "--a=xyz-live"]})
    assert ["(argument 3)" in found[0], "(argument 4)" in found[1], "(argument 5, the value of --a (" in found[2]] \
        == [True, True, True]
    assert not any("--xyz" in sentence for sentence in found)


def test_a_declared_secret_in_a_plain_environment_value_is_refused_by_the_variable_name():
    token = "hf_AbCdEf123456"
    found = problems({"hf_token": token}, environment={"HF_HUB_ENDPOINT_AUTH": "Bearer " + token})
    assert found == ["inference_service_environment.HF_HUB_ENDPOINT_AUTH holds the value of "
                     "inference_service_secrets.hf_token: the unit file and --diff show it to every user; move it to "
                     "inference_service_secrets.environment."]


def test_a_secret_environment_value_in_the_command_line_is_named_by_its_variable():
    found = problems({"environment": {"WANDB_API_KEY": "wandb-12345"}},
                     secrets_set={"environment": ["WANDB_API_KEY"]}, extra_args=["--chat-template", "x wandb-12345"])
    assert len(found) == 1 and found[0].startswith("inference_service_secrets.environment.WANDB_API_KEY is in")


@pytest.mark.parametrize("secret", ["sk-live\nX", "sk-live\rX", "sk-live\x00X", "sk-live\x1bX", "sk-live\x7fX",
                                    "\t-0123456"])
def test_a_secret_holding_a_control_character_is_refused(secret):
    assert problems({"api_key": secret}) == [
        "inference_service_secrets.api_key holds a control character, which would end its line in the secrets file."]


def test_an_all_digit_secret_read_as_a_number_is_still_compared():
    assert "inference_service_secrets.api_key is in the command line" in problems({"api_key": 12345678},
                                                                                  served_name="m12345678")[0]


def test_a_non_utf8_secret_is_compared_as_given():
    args = {"argv": ["/usr/local/bin/vllm", "serve", "m", "--chat-template", "a sk-live\udcff b"], "environment": {}}
    found = inference_service_secret_problems({"hf_token": "sk-live\udcff"}, args)
    assert len(found) == 1 and "argument 4" in found[0] and "\udcff" not in found[0]


@pytest.mark.parametrize("secrets", [{}, {"api_key": ""}, {"api_key": None}, {"hf_token": "", "environment": {}},
                                     {"environment": {"X_TOKEN": ""}}, {"environment": None}, {"api_key": False}])
def test_unset_or_empty_secrets_are_not_found_everywhere(secrets):
    assert problems(secrets, served_name="llama") == []


def test_secrets_that_appear_nowhere_pass():
    assert problems({"api_key": "sk-live-0123456789", "hf_token": "hf_0123456789",
                     "environment": {"WANDB_API_KEY": "w-0123456789"}},
                    secrets_set={"environment": ["WANDB_API_KEY"], "api_key": True, "hf_token": True},
                    speculative=EAGLE3, environment={"NCCL_DEBUG": "WARN"}) == []


def test_every_problem_of_every_secret_is_reported_at_once():
    found = problems({"api_key": "aaa1-live", "hf_token": "bbb2-live\n", "environment": {"W_KEY": "ccc3-live"}},
                     served_name="aaa1-live", extra_args=["--chat-template", "ccc3-live"],
                     environment={"NCCL_X": "aaa1-live"})
    assert len(found) == 4


@pytest.mark.parametrize("secrets, args", [("sk", {}), ({"api_key": "x"}, "argv"), (None, {}), (["x"], {})])
def test_wrong_types_are_a_programming_error(secrets, args):
    with pytest.raises(TypeError):
        inference_service_secret_problems(secrets, args)


def test_the_filter_is_registered_for_the_role():
    assert FilterModule().filters()["inference_service_secret_problems"] is inference_service_secret_problems


def test_an_api_key_no_http_header_can_carry_is_refused_without_showing_it():
    """The hostile run: a key with a euro sign passed validation, then crashed the health probe
    ('latin-1' codec can't encode ...) and the run ended without a report."""
    found = problems({"api_key": "cl\u00e9-\u20ac-key", "admin_api_key": "ok-key-1"})
    assert found == ["inference_service_secrets.api_key holds a character outside ASCII, which no HTTP "
                     "Authorization header can carry."]
