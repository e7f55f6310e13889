"""The inference_args action as validate.yml calls it (issue 24): the secrets it is given decide
which secret files the unit gets, and each set secret must reach its 0600 file; the warnings are
shown; a refusal is one sentence, never a traceback; the role's settings come as one mapping."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action.inference_args import ActionModule
from tests.unit.test_inference_args import FLAGS, settings


class _Display:
    def __init__(self):
        self.warnings = []

    def warning(self, text):
        self.warnings.append(text)


def act(secrets=None, **overrides):
    action = ActionModule.__new__(ActionModule)
    action._display = _Display()
    values = settings(**overrides)
    values.pop("secrets_set")
    values["flag_dirs"] = [FLAGS]
    values["secrets"] = secrets or {}
    return action._display, action.act(values, {}, {})


def test_no_secret_set_gives_no_secret_file_entry_and_no_config_file():
    dummy, result = act()
    assert result["secret_environment"] == {} and result["secret_config"] == {}
    # An empty key is none: vLLM given an empty VLLM_API_KEY serves without one.
    dummy, result = act({"api_key": "", "hf_token": None})
    assert result["secret_environment"] == {}
    dummy, result = act(engine="sglang", unit="sglang.service")
    assert result["secret_config"] == {} and "--config" not in result["argv"]


@pytest.mark.parametrize("given, expected", [
    ({"hf_token": "hf_0123456789"}, {"HF_TOKEN": "hf_token"}),
    ({"api_key": "sk-0123456789"}, {"VLLM_API_KEY": "api_key"}),
    ({"environment": {"WANDB_API_KEY": "w-0123456789"}}, {"WANDB_API_KEY": "environment"}),
])
def test_each_secret_set_reaches_the_0600_environment_file(given, expected):
    dummy, result = act(given)
    assert result["secret_environment"] == expected


def test_sglangs_admin_key_reaches_its_secrets_file():
    dummy, result = act({"api_key": "sk-0123456789", "admin_api_key": "adm-0123456789"}, engine="sglang",
                        unit="sglang.service")
    assert result["secret_config"]["secrets"] == {"api-key": "api_key", "admin-api-key": "admin_api_key"}
    dummy, result = act({"admin_api_key": "adm-0123456789"}, engine="sglang", unit="sglang.service")
    assert result["secret_config"]["secrets"] == {"admin-api-key": "admin_api_key"}


def test_every_warning_is_shown():
    display, result = act(user="nobody")
    assert result["warnings"] and display.warnings == result["warnings"]
    assert "nobody is shared by other daemons" in display.warnings[0]


def test_an_engine_version_without_data_is_one_sentence_not_a_traceback():
    with pytest.raises(AnsibleActionFail) as caught:
        act(engine_version="0.9.2")
    assert str(caught.value.message).startswith("inference_service: inference_service_engine_version '0.9.2': "
                                                "no flag data for vllm 0.9.2; known versions: 0.31.0, 0.32.0, 0.33.0")


def refusal(**overrides) -> str:
    with pytest.raises(AnsibleActionFail) as caught:
        act(**overrides)
    return str(caught.value)


def test_a_key_pasted_into_the_served_name_is_refused_before_any_argv_is_returned_and_never_shown():
    """The hostile run: the key as the served name came back in the task's result (argv,
    command_line), printed by -v, before a later task refused it; SGLang's served-name rule even
    printed it in its sentence (it has spaces)."""
    key = "sg key $HOME 'single'"
    message = refusal(engine="sglang", unit="sglang.service", served_name=key,
                      secrets={"api_key": key})
    assert key not in message and "sg key" not in message and "********" in message
    assert all(line.startswith("inference_service: ") for line in message.splitlines())
    quiet = "hf_SeCrEt0123"
    message = refusal(served_name="llama-" + quiet, secrets={"hf_token": quiet})
    assert quiet not in message
    assert "inference_service_secrets.hf_token is in the command line" in message


def test_a_secret_in_an_innocently_named_environment_value_is_refused_by_its_name():
    value = "tok-7f3a"
    message = refusal(environment={"RUN_LABEL": "run " + value}, secrets={"environment": {"LABEL_TOKEN": value}})
    assert "inference_service_environment.RUN_LABEL holds the value of inference_service_secrets.environment." \
           "LABEL_TOKEN" in message and value not in message
