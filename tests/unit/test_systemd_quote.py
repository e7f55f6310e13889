"""What systemd hands the engine from the unit file the role writes (plugin_utils/_systemd_quote.py,
issue 24): ExecStart= expands $ and % and decodes C escapes; Environment= expands % and decodes
escapes but no $ (systemd.exec(5): no variable expansion there). Each word must arrive unchanged."""
from __future__ import annotations

import re

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._systemd_quote import environment_item, exec_line, quote
from tests.unit.test_inference_args import build

UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n", "\\t": "\t", "\\r": "\r", "\\a": "\a", "\\b": "\b", "\\f": "\f",
            "\\v": "\v", "%%": "%", "$$": "$"}


def systemd_reads(quoted: str, exec_start: bool) -> str:
    """The word systemd passes on, for the quoted items this module writes (systemd.syntax(7))."""
    assert quoted[0] == quoted[-1] == '"'
    body = quoted[1:-1]
    # An unescaped " inside would end the word; a lone % or (in ExecStart=) $ would be expanded.
    assert not re.search(r'(?<!\\)(\\\\)*"', body), quoted
    out, index = [], 0
    while index < len(body):
        pair = body[index:index + 2]
        if pair == "$$" and not exec_start:
            out.append("$")  # not special in Environment=: each $ is itself
            index += 1
            continue
        if pair in UNESCAPE:
            out.append(UNESCAPE[pair])
            index += 2
        elif body.startswith("\\x", index):
            out.append(chr(int(body[index + 2:index + 4], 16)))
            index += 4
        else:
            char = body[index]
            assert char != "%", "a lone %% is a specifier: %s" % quoted
            assert not (char == "$" and exec_start), "a lone $ is a variable in ExecStart=: %s" % quoted
            assert char != "\\", "a lone backslash starts an escape: %s" % quoted
            out.append(char)
            index += 1
    return "".join(out)


WORDS = ['say "$HOME" \\ ;', "100%", "%h/%i", "${HOME}", "$$", "a\\nb", '{"model": "x"}', "C:\\models\\x"]


@pytest.mark.parametrize("word", WORDS)
def test_an_argument_reaches_the_engine_unchanged(word):
    assert systemd_reads(quote(word), exec_start=True) == word


@pytest.mark.parametrize("value", WORDS + ["postgres://u@h/db?x=$y"])
def test_an_environment_value_reaches_the_engine_unchanged_with_its_dollars(value):
    line = environment_item("NAME", value)
    assert systemd_reads(line, exec_start=False) == "NAME=" + value
    if "$" in value:
        assert "$$" not in line or "$$" in value


def test_the_roles_environment_lines_keep_a_dollar_as_one_dollar():
    built = build(environment={"PROMPT_PREFIX": "cost: $5", "PATTERN": "a%b"})
    assert '"PATTERN=a%%b"' in built["environment_lines"]
    assert '"PROMPT_PREFIX=cost: $5"' in built["environment_lines"]


def test_each_argument_is_its_own_quoted_line():
    assert exec_line(["/bin/vllm", "serve", "a b"]) == '"/bin/vllm" \\\n    "serve" \\\n    "a b"'
