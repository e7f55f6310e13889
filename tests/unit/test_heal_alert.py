"""What the heal reads of an alert (plugins/plugin_utils/_heal_alert.py) and what the heal_breaker
action does with it, run as ansible-core runs it (task_vars holding the event as extra vars hold
it): every field fuzzed with template syntax, quotes, Unicode spaces, newlines, surrogates, huge
values and wrong types; each comes back a plain str by the one rule, the host's secrets masked
in the result, the state and the metrics file; the state and metrics directories checked."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace
from urllib.parse import quote_plus

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action import heal_breaker as action
from ansible_collections.cleanslate.gpu.plugins.action.heal_breaker import ActionModule
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._heal_alert import FIELD_LIMIT, FIELDS, field_text, read_alert

try:  # ansible-core 2.19 and later: extra vars' strings carry the tag that makes them templates
    from ansible._internal._datatag._tags import TrustedAsTemplate
    from ansible.module_utils._internal._datatag import AnsibleTagHelper
except ImportError:  # 2.17, 2.18: plain strings (their registered results are marked unsafe instead)
    TrustedAsTemplate = AnsibleTagHelper = None

API_KEY, HF_TOKEN, INSTANCE_KEY, SPECIAL = "sk-canary-Q7xv2", "hf_canary_tok9", "inst-canary-key4", "p@ss/w rd+1\"'"
SECRETS = [{"api_key": API_KEY, "hf_token": HF_TOKEN}, {"environment": {"OTHER": INSTANCE_KEY, "PW": SPECIAL}}]
MASK = Masker([API_KEY, HF_TOKEN, INSTANCE_KEY, SPECIAL])
HOSTILE = [
    "{{ lookup('pipe', 'id') }}", "{% for x in range(9) %}{{ x }}{% endfor %}", "}}", "}", "{#", "'\"`$(id)`\\",
    "a\u2003b\u00a0c\u200bd\u202ee", "line\nnext\r\x00\x1b[31m\x7f", "bad\udcffsurrogate\ud800", "\U0001f600 ok",
    "x" * 10 ** 6, "{{" * 300, "", " ", "@/%$",
]
WRONG_TYPES = [None, 5, 2.5, float("nan"), True, [], ["node1"], {}, {"a": "{{ 1 }}"}, b"bytes"]


def tagged(value):
    """A string as ansible-core holds an extra var (trusted as a template), where it can."""
    return TrustedAsTemplate().tag(value) if TrustedAsTemplate and isinstance(value, str) else value


def event_with(name, value, host="gpu1"):
    event = {"status": "firing", "labels": {"host": host, "alertname": "CleanslateGpuEngineDown"},
             "fingerprint": "ab12", "startsAt": "2026-12-02T01:00:00Z", "meta": {"received_at": "t"}}
    where = event
    for key in FIELDS[name][:-1]:
        where = where.setdefault(key, {})
    where[FIELDS[name][-1]] = value
    return event


def obeys_the_rule(text):
    assert type(text) is str  # pylint: disable=unidiomatic-typecheck  # not a subclass: no tag
    assert len(text) <= FIELD_LIMIT and text.isprintable(), text[:300]
    if AnsibleTagHelper:
        assert not AnsibleTagHelper.tags(text)
    for secret in (API_KEY, HF_TOKEN, INSTANCE_KEY, SPECIAL, quote_plus(SPECIAL)):
        assert secret not in text and secret[:6] not in text, text


@pytest.mark.parametrize("value", HOSTILE + WRONG_TYPES, ids=lambda value: repr(value)[:40])
@pytest.mark.parametrize("name", sorted(FIELDS))
def test_every_field_is_plain_bounded_text(name, value):
    fields = read_alert(tagged(event_with(name, tagged(value))), MASK)
    assert set(fields) == set(FIELDS)
    for text in fields.values():
        obeys_the_rule(text)
    if not isinstance(value, str):
        assert fields[name] == ""
    elif value.isprintable() and len(value) <= FIELD_LIMIT:
        assert fields[name] == value  # `{{ ... }}` kept as the literal text it is


@pytest.mark.parametrize("value, text", [
    ("a\u2003b", "a\\u2003b"), ("x\ny", "x\\ny"), ("\x00", "\\x00"), ("bad\udcffs", "bad\\udcffs"),
    ("rtl\u202e", "rtl\\u202e"), ("caf\u00e9 \U0001f600", "caf\u00e9 \U0001f600"), ("q'\"\\", "q'\"\\"),
    ("x" * 300, "x" * (FIELD_LIMIT - 1) + "\u2026"), ("\n" * 200, "\\n" * 127 + "\\\u2026"),
])
def test_the_rule_escapes_what_does_not_print_and_cuts_long_values(value, text):
    assert field_text(tagged(value), MASK) == text


@pytest.mark.parametrize("value", [
    API_KEY, "Bearer " + API_KEY, json.dumps({"k": HF_TOKEN}), repr("x'" + INSTANCE_KEY), "%s%%%s" % (API_KEY, HF_TOKEN),
    "x" * (FIELD_LIMIT - 3) + API_KEY,  # a cut would keep a secret's head if it came before the masking
    "https://x/?k=" + quote_plus(SPECIAL), json.dumps(SPECIAL), "\n" + API_KEY + "\u2003", API_KEY * 1000,
], ids=lambda value: repr(value)[:40])
@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_secret_in_any_field_is_masked_whole(name, value):
    fields = read_alert(event_with(name, tagged(value)), MASK)
    obeys_the_rule(fields[name])
    assert "**" in fields[name]  # the mark, cut or whole


def test_a_secret_spelled_like_an_escape_is_masked_after_the_escapes():
    secret = "ab\\u2003cd"  # the key holds a backslash: the escape of the alert's U+2003 spells it
    assert field_text("ab\u2003cd", Masker([secret])) == "********"


class Run(ActionModule):
    """The real action, as ansible-core constructs it for a task that runs on the controller."""

    def __init__(self, args, check_mode=False):
        task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, action="cleanslate.gpu.heal_breaker",
                               delegate_to="localhost")
        super().__init__(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")), None, None, None)


def run(tmp_path, event, check_mode=False, **args):
    args = dict({"host": "gpu1", "path": str(tmp_path / "state" / "breaker.json"), "metrics_dir": str(tmp_path / "metrics"),
                 "secrets": SECRETS, "configured_units": [""]}, **args)
    task_vars = {"inventory_hostname": "gpu1", "ansible_eda": tagged({"event": event})} if event is not None else {}
    return Run(args, check_mode).run(task_vars=task_vars)


def written(tmp_path) -> str:
    return "".join(path.read_text(encoding="utf-8", errors="replace")
                   for path in sorted(tmp_path.rglob("*")) if path.is_file())


def test_the_action_keeps_no_tag_no_template_and_no_secret_anywhere(tmp_path):
    (tmp_path / "metrics").mkdir()
    hostile = "{{ lookup('pipe', 'touch %s') }}{%% if 1 %%}%s{%% endif %%}\n%s" % (tmp_path / "ran", API_KEY, HF_TOKEN)
    event = {"labels": {"host": tagged("gpu1"), "alertname": tagged(hostile), "unit": tagged("")},
             "fingerprint": tagged(hostile + INSTANCE_KEY), "startsAt": tagged(hostile), "meta": {"received_at": tagged(hostile)}}
    result = run(tmp_path, event)
    assert result["allowed"] and result["metrics_written"], result
    for text in result["trigger"].values():
        obeys_the_rule(text)
    assert result["trigger"]["alertname"].startswith("{{ lookup('pipe', 'touch ")
    assert "{% if 1 %}********{% endif %}\\n********" in result["trigger"]["alertname"]
    shown = json.dumps(result) + written(tmp_path)
    assert not any(secret in shown for secret in (API_KEY, HF_TOKEN, INSTANCE_KEY, json.dumps(SPECIAL)[1:-1]))
    assert "{{ lookup('pipe', 'touch " in written(tmp_path)  # recorded as the literal text
    assert not (tmp_path / "ran").exists()


def test_the_action_compares_the_raw_host_and_unit_exactly(tmp_path):
    assert "the alert names no host" in run(tmp_path, None)["reason"]
    refused = run(tmp_path, {"labels": {"host": tagged("gpu1\u2003"), "alertname": API_KEY}})
    assert refused["reason"].startswith("gpu1: not healed, the alert names host 'gpu1\\u2003'")
    refused = run(tmp_path, {"labels": {"host": "gpu1", "alertname": API_KEY, "unit": "x%s.service" % API_KEY}},
                  configured_units=["vllm.service"])
    assert "the alert ******** is about x********.service, but the host serves vllm.service" in refused["reason"]
    assert not (tmp_path / "state").exists()


def test_an_unreadable_state_is_said_once(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "breaker.json").write_text("garbage")
    with pytest.raises(AnsibleActionFail) as caught:
        run(tmp_path, {"labels": {"host": "gpu1"}})
    message = str(caught.value.message)
    assert message.count("cannot be read") == 1 and message.count("Expecting value") == 1, message


def test_a_state_or_metrics_directory_others_may_steer_is_refused_before_anything(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    cases = [({"path": str(tmp_path / "link" / "breaker.json")}, "path: directory %s is not safe to write in: %s is a symbolic link"
              % (tmp_path / "link", tmp_path / "link")),
             ({"path": str(tmp_path / "link" / "new" / "breaker.json")}, "%s is a symbolic link" % (tmp_path / "link")),
             ({"metrics_dir": str(tmp_path / "link")}, "metrics_dir: directory %s is not safe to write in: %s is a symbolic link"
              % (tmp_path / "link", tmp_path / "link")),
             ({"metrics_dir": str(tmp_path / "open")}, "metrics_dir: directory %s is not safe to write in: %s may be written by others"
              % (tmp_path / "open", tmp_path / "open"))]
    for check_mode in (False, True):
        for options, words in cases:
            with pytest.raises(AnsibleActionFail) as caught:
                run(tmp_path, {"labels": {"host": "gpu1"}}, check_mode, **options)
            assert words in str(caught.value.message), caught.value.message
    assert os.listdir(real) == [] and os.listdir(tmp_path / "open") == [] and not (tmp_path / "state").exists()
    # A metrics directory that does not exist still writes no file, and heals.
    assert run(tmp_path, {"labels": {"host": "gpu1"}}, metrics_dir=str(tmp_path / "none"))["allowed"]


def test_the_default_metrics_directory_is_written_only_where_no_one_else_may_write(tmp_path):
    """heal_metrics_dir unset: a default directory others may steer (Debian's blackbox exporter
    gives /var/lib/prometheus to its user) writes no file and the heal goes on with a warning;
    set to that directory, the heal is refused (above)."""
    (tmp_path / "open" / "node-exporter").mkdir(parents=True)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "safe").mkdir()
    unset = {"metrics_dir": None}
    directory, warning = action.metrics_directory(unset, str(tmp_path / "open" / "node-exporter"))
    assert directory == "" and "heal_metrics_dir is not set" in warning and "may be written by others" in warning
    assert action.metrics_directory(unset, str(tmp_path / "safe")) == (str(tmp_path / "safe"), "")
    assert action.metrics_directory({"metrics_dir": str(tmp_path / "open")}, str(tmp_path / "safe")) == (str(tmp_path / "open"), "")
    assert action.metrics_directory({"metrics_dir": ""}, str(tmp_path / "safe")) == ("", "")


def test_an_opened_breaker_quotes_the_resets_problems_as_stored_masked_and_never_templated(tmp_path):
    """state=open reads node_reset_result.problems from the host's variables itself: a kernel log
    line carrying a template stays text, a secret in it is masked (a `detail: "{{ node_reset_result.problems
    | join }}"` argument would be rendered by ansible-core before 2.19, which loses the unsafe mark on join)."""
    line = "NVRM: Xid (PCI:0000:2a:00): 79, {{ lookup('pipe', 'touch %s') }} %s" % (tmp_path / "ran", API_KEY)
    task_vars = {"inventory_hostname": "gpu1",
                 "node_reset_result": {"status": "needs_reboot", "problems": ["GPU 0 needs a reboot: " + line]}}
    args = {"host": "gpu1", "path": str(tmp_path / "state" / "breaker.json"), "metrics_dir": "", "secrets": SECRETS,
            "configured_units": [""], "state": "open", "cause": "needs_reboot"}
    result = Run(args).run(task_vars=task_vars)
    assert result["open"] and "{{ lookup('pipe', 'touch %s') }}" % (tmp_path / "ran") in result["reason"], result
    assert API_KEY not in written(tmp_path) + json.dumps(result) and not (tmp_path / "ran").exists()
    for stored in ({}, {"node_reset_result": "text"}, {"node_reset_result": {"problems": "text"}}):
        assert action.reset_problems(stored) == ""
