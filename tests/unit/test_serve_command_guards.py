"""The builder's refusals of inference_service_extra_args (plugin_utils/_serve_command.py's check_extra and
the walk of _engine_flags.py it reads) at the edges the other tests leave: the item after an option
given with its value (--opt=value), and the bound on the number of items."""
from __future__ import annotations

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._serve_command import EXTRA_ARGS_MAX_ITEMS
from tests.unit.test_inference_args import build, refused

SECRET = "sk-guard-5f0e2b7c"
SGLANG = {"engine": "sglang", "model": "Qwen/Qwen2.5-7B-Instruct", "unit": "sglang.service"}


@pytest.mark.parametrize("extra, flag, owner", [
    (["--max-num-seqs=8", "--api-key", SECRET], "--api-key", "inference_service_secrets.api_key"),
    # A key that reads as an option: the walk must still see --api-key, or the key is named as an unknown option.
    (["--max-num-seqs=8", "--api-key", "-" + SECRET], "--api-key", "inference_service_secrets.api_key"),
    (["--max-model-len=4096", "--hf-token", "-" + SECRET], "--hf-token", "inference_service_secrets.hf_token"),
    (["--enable-prefix-caching", "--max-num-seqs=8", "--api-key=" + SECRET], "--api-key",
     "inference_service_secrets.api_key"),
])
def test_a_secret_flag_right_after_an_option_with_its_value_is_refused_without_its_value(extra, flag, owner):
    text = refused(extra_args=extra)
    assert "%s would put a secret on the command line" % flag in text and owner in text, text
    assert SECRET not in text


def test_an_sglang_admin_key_right_after_an_option_with_its_value_is_refused_without_its_value():
    text = refused(extra_args=["--max-running-requests=8", "--admin-api-key", "-" + SECRET], **SGLANG)
    assert "--admin-api-key would put a secret on the command line" in text and SECRET not in text, text


def test_a_role_owned_flag_right_after_an_option_with_its_value_is_refused():
    text = refused(extra_args=["--max-num-seqs=8", "--port", "9000"])
    assert "--port is set by the role; use inference_service_port" in text, text


def test_the_most_items_are_accepted_and_one_more_is_refused():
    # Each item a repeat of a switch the engine accepts again and again: only the count is at stake.
    most = ["--enable-prefix-caching"] * EXTRA_ARGS_MAX_ITEMS
    assert build(extra_args=most)["argv"][-1] == "--enable-prefix-caching"
    text = refused(extra_args=most + ["--enable-prefix-caching"])
    assert "has %d items: at most %d" % (EXTRA_ARGS_MAX_ITEMS + 1, EXTRA_ARGS_MAX_ITEMS) in text, text
