"""Secrets never leave the gate, in any of the forms engines print them: a fake engine
(tests/functional/fake_engines.py, a real process) echoes the key in its error answers as SGLang
logs it (a Python repr), as JSON, shell-quoted and URL-encoded, and cut at the point where the
gate stops quoting an answer."""
from __future__ import annotations

import json
import re
import shlex
from urllib.parse import quote, quote_plus

import pytest

from tests.functional.fake_engines import SGLANG_ARGS_LINE, fake_engine, serving
from tests.run_module import run_module

# Both ends are marked so that a piece of the key cut at either end is still found.
SECRET = "zq7 key $HOME 'single' \"double\" back\\slash q8x"
ADMIN = "ad9-admin\\'ad9"


def forms(secret):
    return [secret, repr(secret), json.dumps(secret), shlex.quote(secret), quote(secret, safe=""), quote_plus(secret),
            re.sub("%[0-9A-F]{2}", lambda escape: escape.group().lower(), quote(secret, safe=""))]


def echoed(secret):
    """An answer body that carries the key in every form, the last one across offset 300."""
    text = " ".join([SGLANG_ARGS_LINE % (secret, ADMIN)] + forms(secret))
    return text + " " + "." * max(0, 300 - len(text) - len(secret) // 2) + secret


@pytest.mark.parametrize("option", ["api_key", "secrets"])
def test_no_form_of_a_secret_survives_in_a_failure(option):
    given = {"api_key": SECRET} if option == "api_key" else {"secrets": [SECRET, ADMIN]}
    with fake_engine(dict(serving(), **{"/v1/models": {"status": 500, "text": echoed(SECRET)}})) as port:
        result = run_module("inference_ready", dict(given, engine="sglang", url="http://127.0.0.1:%d" % port,
                                                    served_name="llama", wait=5, poll_interval=0.1))
    assert result["rc"] == 1 and result["msg"].startswith("GET /v1/models answered HTTP 500"), result
    text = result["msg"] + json.dumps(result)
    assert "********" in result["msg"]
    assert "zq7" not in text and "q8x" not in text, result["msg"]
    assert ("ad9" in text) == (option == "api_key")  # the admin key is hidden when it is given


def test_a_secret_in_a_completion_is_masked_before_it_is_cut():
    routes = serving(text=" " * 190 + SECRET)  # the returned completion is cut at 200 characters
    with fake_engine(routes) as port:
        result = run_module("inference_ready", {"engine": "vllm", "url": "http://127.0.0.1:%d" % port,
                                                "served_name": "llama", "wait": 5, "completions": 1,
                                                "secrets": [SECRET]})
    assert result["rc"] == 0 and result["completion"].strip() == "********", result
