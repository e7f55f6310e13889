"""The Masker (plugins/module_utils/_secrets.py) on journal-like lines: a secret is hidden in every
form engines and tools print it, and nothing else changes."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from urllib.parse import quote, quote_plus

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import MARK, Masker

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
