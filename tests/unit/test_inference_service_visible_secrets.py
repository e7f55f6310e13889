"""A secret pasted into an operator's text that others read (issue 35, point 6): the unit's name,
config_dir, executable, venv, user, served name, model, host, metrics_dir, the environments' names
and the instances' units, refused by the role's first check, before any host contact, in one
sentence that names the variable and the secret and shows no part of the value. And the rules
around it: a secret under 8 characters is refused whole (never compared, so no sentence narrows
down where it occurs); the secrets' environment obeys the plain environment's refused names; the
command-line sentence names the variable behind the role's own flag."""
from __future__ import annotations

import pytest

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import (
    SECRET_MIN_CHARS, inference_service_problems, inference_service_secret_problems)
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_instances import inference_service_instances
from tests.unit.test_inference_args import build, refused
from tests.unit.test_inference_service_instances import variables
from tests.unit.test_inference_service_problems import _service_values

# Hostile secrets: Jinja, quotes, a Unicode space (U+2003), a newline, '%', '$', '/', '@', non-ASCII.
SECRETS = ["qZ7{{ lookup('pipe','id') }}xK", "qZ7'\"`xK9w", "qZ7\u2003xK9wv", "qZ7%i$HOMExK", "qZ7/@xK9wv",
           "qZ7{%xK9wv}", "ключ-qZ7xK9"]
# (variable, a text holding the secret s)
PLACES = [
    ("inference_service_unit", lambda s: s + ".service"),
    ("inference_service_config_dir", lambda s: "/etc/" + s),
    ("inference_service_executable", lambda s: "/opt/" + s + "/bin/vllm"),
    ("inference_service_venv", lambda s: "/opt/" + s),
    ("inference_service_user", lambda s: s),
    ("inference_service_served_name", lambda s: "llama-" + s),
    ("inference_service_model", lambda s: "org/" + s),
    ("inference_service_host", lambda s: s + ".example.com"),
    ("inference_service_metrics_dir", lambda s: "/var/lib/" + s),
]


def no_part_shown(sentences, secret):
    """No 4 characters of the secret in a row in any sentence (its marks, such as {{, may be)."""
    for sentence in sentences:
        for start in range(len(secret) - 3):
            assert secret[start:start + 4] not in sentence, (secret, sentence)


def visible(problems):
    return [problem for problem in problems if " holds the value of inference_service_secrets." in problem]


@pytest.mark.parametrize("variable, text", PLACES, ids=[place[0] for place in PLACES])
@pytest.mark.parametrize("secret", SECRETS)
def test_a_secret_in_a_visible_text_is_refused_by_name_without_any_part_of_it(variable, text, secret):
    key = "hf_token" if not secret.isascii() else "api_key"
    problems = inference_service_problems(_service_values(**{variable: text(secret),
                                                             "inference_service_secrets": {key: secret}}))
    found = visible(problems)
    assert len(found) == 1, problems
    assert found[0].startswith("%s holds the value of inference_service_secrets.%s: " % (variable, key))
    assert found[0].endswith("read by every user of the host; change the secret or %s." % variable)
    no_part_shown(problems, secret)


def test_a_secret_as_an_environment_variable_name_is_refused():
    secret = "WANDB_qZ7xK9wv"
    problems = inference_service_problems(_service_values(
        inference_service_environment={secret: "1"}, inference_service_secrets={
            "api_key": secret, "environment": {"X_" + secret: "other-qZ7xK9"}}))
    assert [problem.split(":")[0] for problem in visible(problems)] == [
        "inference_service_environment holds the value of inference_service_secrets.api_key",
        "inference_service_secrets.environment holds the value of inference_service_secrets.api_key"]
    no_part_shown(problems, secret)


def test_the_secrets_environment_value_and_the_token_are_compared_too():
    problems = inference_service_problems(_service_values(
        inference_service_unit="tok-qZ7xK9wv.service", inference_service_served_name="env-qZ7xK9wv",
        inference_service_secrets={"hf_token": "tok-qZ7xK9wv", "environment": {"S3_SECRET": "env-qZ7xK9wv"}}))
    assert [problem.split(":")[0] for problem in visible(problems)] == [
        "inference_service_unit holds the value of inference_service_secrets.hf_token",
        "inference_service_served_name holds the value of inference_service_secrets.environment.S3_SECRET"]


@pytest.mark.parametrize("secrets", [{"api_key": "sk-live-0123456789", "hf_token": "hf_0123456789abcdef"},
                                     {"environment": {"S3_SECRET": "w-0123456789"}}, {}])
def test_the_defaults_with_long_secrets_elsewhere_pass(secrets):
    assert inference_service_problems(_service_values(inference_service_secrets=secrets)) == []


@pytest.mark.parametrize("secret", ["s", "8", "0", "sk-1234", "\u2003" * 7, 1234567])
def test_a_short_secret_is_refused_whole_and_never_located(secret):
    """A one-character key is inside "vllm.service", "8000" and "serve": saying where it turned up
    would narrow it down, so it is refused by its length alone, in both checks."""
    problems = inference_service_problems(_service_values(inference_service_secrets={"api_key": secret}))
    assert problems == ["inference_service_secrets.api_key is shorter than %d characters: it can be guessed, and it "
                        "would turn up inside ordinary text; use a longer secret." % SECRET_MIN_CHARS]
    found = inference_service_secret_problems({"api_key": secret}, build(served_name="s80-sk-1234567"))
    assert problems[0] in found and not any(" is in the command line" in sentence for sentence in found)


def test_a_secret_of_exactly_the_minimum_is_compared():
    secret = "q" * (SECRET_MIN_CHARS - 1) + "Z"
    assert inference_service_problems(_service_values(inference_service_secrets={"api_key": secret})) == []
    assert visible(inference_service_problems(_service_values(
        inference_service_unit=secret + ".service", inference_service_secrets={"api_key": secret})))


def test_the_command_line_sentence_names_the_flags_own_variable():
    """A digit secret inside --max-model-len was said to be inference_service_extra_args'."""
    found = inference_service_secret_problems({"api_key": 12345678}, build(max_model_len=123456789))
    assert found == ["inference_service_secrets.api_key is in the command line (argument %d, the value of "
                     "--max-model-len (inference_service_max_model_len)), which every user of the host reads in /proc "
                     "and in the unit file: change the secret or that argument."
                     % (build(max_model_len=123456789)["argv"].index("--max-model-len") + 1)]
    found = inference_service_secret_problems({"api_key": 12345678},
                                              build(extra_args=["--max-num-seqs", "123456789"]))
    assert "--max-num-seqs (inference_service_extra_args)" in found[0]


def test_every_spelling_of_the_role_s_flags_is_named():
    variables_of = build(engine="sglang", unit="sglang.service")["flag_variables"]
    assert variables_of["--tp-size"] == variables_of["--tensor-parallel-size"] == \
        "inference_service_tensor_parallel_size"
    assert variables_of["--port"] == "inference_service_port"


@pytest.mark.parametrize("name", ["VLLM_PORT", "VLLM_HOST_IP"])
def test_the_secrets_environment_obeys_the_plain_environment_s_refused_names(name):
    plain = refused(environment={name: "1"})
    secret = refused(secrets_set={"environment": [name]})
    assert "inference_service_environment: %s is vLLM's address for its own internal communication" % name in plain
    assert "inference_service_secrets.environment: %s is vLLM's address for its own internal communication, not " \
           "the API's; set inference_service_port and inference_service_host" % name in secret


def test_an_instance_unit_holding_its_secret_is_named_by_index_only():
    secret = "qZ7{{ x }}xK9w"
    resolved = inference_service_instances(variables(
        {"unit": secret + ".service", "port": 8001, "environment": {"CUDA_VISIBLE_DEVICES": "0"},
         "secrets": {"api_key": secret}, "bogus": 1}))
    assert resolved["instances"] == []
    assert "inference_service_instances[0].bogus: unknown key." in resolved["problems"]
    assert "inference_service_instances[0].unit holds the value of inference_service_instances[0].secrets.api_key" \
        in "\n".join(resolved["problems"])
    no_part_shown(resolved["problems"], secret)


def test_an_instance_unit_holding_another_instance_s_secret_is_refused():
    secret = "qZ7\u2003xK9wv"
    resolved = inference_service_instances(variables(
        {"unit": "a.service", "port": 8001, "environment": {"CUDA_VISIBLE_DEVICES": "0"},
         "secrets": {"api_key": secret}},
        {"unit": "b-" + secret + ".service", "port": 8002, "environment": {"CUDA_VISIBLE_DEVICES": "1"}}))
    assert resolved["instances"] == []
    # The unit is no unit name either (U+2003): that rule's sentence, masked, may stand beside it.
    assert "inference_service_instances[1].unit holds the value of inference_service_instances[0].secrets.api_key" in [
        problem.split(":")[0] for problem in resolved["problems"]]
    assert all(problem.startswith("inference_service_instances[1].unit ") for problem in resolved["problems"])
    no_part_shown(resolved["problems"], secret)
