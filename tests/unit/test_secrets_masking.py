"""The Masker (plugins/module_utils/_secrets.py) on journal-like lines: a secret is hidden in every
form engines and tools print it, and nothing else changes."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from urllib.parse import quote, quote_plus

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import MARK, Masker, masked_command_line

SECRETS = ["sg key $HOME 'single'", "zq7 both ' and \" and back\\slash q8x", "plain-token-q8x"]


def printf_q(text):
    """How bash's printf %q quotes it (a command line logged by a wrapper script)."""
    return subprocess.run(["bash", "-c", 'printf %q "$1"', "-", text], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.parametrize("secret", SECRETS)
def test_every_printed_form_of_a_secret_is_hidden(secret):
    lines = [
        "server_args=ServerArgs(model_path='m', api_key=%r, admin_api_key=%r, port=30000)" % (secret, secret),
        "[%r]" % ("api_key=%r" % secret),  # a repr of a line that held a repr
        json.dumps({"detail": "bad key %s" % secret}),
        json.dumps({"line": json.dumps({"key": secret})}),
        "ExecStart=/usr/bin/vllm serve m --api-key %s" % shlex.quote(secret),
        "exec vllm serve --api-key %s" % printf_q(secret),
        "GET /v1/models?key=%s and %s and %s" % (quote(secret, safe=""), quote_plus(secret), quote(secret)),
        "GET /?key=%s" % re.sub("%[0-9A-F]{2}", lambda escape: escape.group().lower(), quote(secret, safe="")),
    ]
    masked = Masker(SECRETS)(lines)
    core = secret.split()[0]
    for line, before in zip(masked, lines):
        assert MARK in line, (before, line)
        assert core not in line and "q8x" not in line, (before, line)


def test_text_without_a_secret_and_other_values_are_left_as_they_are():
    mask = Masker(SECRETS + [""])
    value = {"msg": "HTTP 503", "polls": 3, "ok": True, "lines": ["INFO ready", None], "rate": 0.5}
    assert mask(value) == value
    assert Masker([])("sg key $HOME 'single'") == "sg key $HOME 'single'"
    assert Masker([""])("anything") == "anything"


@pytest.mark.parametrize("argv, shown", [
    (["vllm", "serve", "m", "--api-key", "sk-q8x"], "vllm serve m --api-key " + MARK),
    (["vllm", "serve", "m", "--api-key=sk-q8x", "--hf-token", "hf_q8x"], "vllm serve m --api-key=%s --hf-token %s" % (MARK, MARK)),
    (["env", "HF_TOKEN=hf_q8x", "VLLM_API_KEY=sk-q8x", "vllm"], "env HF_TOKEN=%s VLLM_API_KEY=%s vllm" % (MARK, MARK)),
    (["sglang", "--admin-api-key", "-starts-with-a-dash"], "sglang --admin-api-key " + MARK),
    # The key given twice: hidden wherever it appears in the line, not only after its flag.
    (["x", "--api-key", "sk-q8x", "--url", "http://h/?key=sk-q8x"], "x --api-key %s --url http://h/?key=%s" % (MARK, MARK)),
    (["curl", "-H", "Authorization: Bearer tok-q8x", "https://user:pw-q8x@h/"],
     "curl -H Authorization: Bearer %s https://user:%s@h/" % (MARK, MARK)),
])
def test_a_command_lines_secrets_are_hidden_by_the_flag_that_names_them(argv, shown):
    assert masked_command_line(argv) == shown


def test_words_that_only_contain_a_secrets_name_and_a_flag_after_a_switch_stay():
    argv = ["vllm", "serve", "m", "--tokenizer", "t", "--max-num-batched-tokens", "8192", "--disable-auth", "--port", "80",
            "--ssl-keyfile", "/k.pem", "MAX_TOKENS=5"]
    assert masked_command_line(argv) == " ".join(argv)
