"""The fleet playbooks' own variables (fleet_serial...), checked by fleet_preflight in the first play:
every bad value is one sentence naming the variable, its value (one short line) and what is
accepted; every good one passes, as ansible-core then reads it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._playbook_variables import VARIABLES, problems, unread

REPO = Path(__file__).resolve().parents[2]
BY_NAME = {variable.name: variable for variable in VARIABLES}
HUGE = "9" * 100000
# Bad for every variable: wrong types, empty, templates that were not rendered, spaces and newlines.
BAD_FOR_ALL = [None, {}, {"a": 1}, "", " ", "{{ }}", "}", "\u00a0", "\u3000", "\n", float("nan"), -1,
               "-1", "abc", HUGE, 10 ** 30]
CASES = {
    "fleet_serial": {
        "good": [1, 2, "2", "1000000", "1%", "50%", "100%", [1, "10%", 5], "007"],
        "bad": BAD_FOR_ALL + [0, "0", "0%", "101%", "-5%", "1000001", 10 ** 7, True, False, [], [0], ["abc"],
                              1.5, 2.0, "2.5", "1e3", "inf", float("inf"), "nan", "%", "5 %", " 5", "5\n", "\u00a05",
                              "\u0665", "50%%", "2,5", ["1", None]],
    },
    "fleet_max_fail_percentage": {
        "good": [0, 100, 25, 33.3, "0", "100", "25", "12.5", "100.0"],
        "bad": BAD_FOR_ALL + [101, "101", 100.0001, -0.1, float("inf"), float("-inf"), "inf", "nan", True, False,
                              "1e1", " 5", "5\n", "\u00a05", "\u0665", "5%", [5]],
    },
    "fleet_force_reset": {
        "good": [True, False, 0, 1, "true", "false", "True", "FALSE", "yes", "no", "on", "off", "1", "0"],
        "bad": BAD_FOR_ALL + [2, "2", "y", "n", "t", "f", "truee", " true", "true\n", 1.0, "\u00a0true", [True], 1.5,
                              float("inf")],
    },
    "fleet_report_path": {
        "good": ["reports", "/var/tmp/reports", "reports/slice1", "my reports", "r\u00e9sum\u00e9s", "}",
                 "{{ }}"],
        "bad": [None, {}, [], ["reports"], True, 0, 5, 1.5, float("nan"), "", " ", "\n", "\u00a0", "\u3000",
                "a\0b"],
    },
}


def _params(kind):
    for name, cases in CASES.items():
        for value in cases[kind]:
            if kind == "bad" and name == "fleet_report_path" and isinstance(value, str) and value.strip():
                continue
            yield pytest.param(name, value, id="%s=%.30r" % (name, value))


def test_every_variable_of_the_table_has_its_cases():
    assert set(CASES) == set(BY_NAME)


@pytest.mark.parametrize("name, value", list(_params("good")))
def test_a_good_value_passes(name, value):
    assert problems({name: value}) == []


@pytest.mark.parametrize("name, value", list(_params("bad")))
def test_a_bad_value_is_one_short_sentence_naming_the_variable_and_what_is_accepted(name, value):
    sentences = problems({name: value, "unrelated": "abc"})
    assert len(sentences) == 1, sentences
    sentence = sentences[0]
    assert sentence.startswith("%s is " % name) and sentence.endswith(": it must be %s." % BY_NAME[name].accepts)
    assert "\n" not in sentence and "\0" not in sentence and len(sentence) < 400, sentence
    assert sentence.isprintable(), sentence


def test_the_sentence_of_fleet_serial_abc():
    assert problems({"fleet_serial": "abc"}) == [
        "fleet_serial is 'abc': it must be a whole number of hosts from 1 to 1000000, a percentage from 1% to"
        " 100%, or a list of them (one per batch, the last one repeated)."]


def test_a_huge_value_is_cut_and_counted():
    sentence = problems({"fleet_serial": HUGE})[0]
    assert "... (100002 characters)" in sentence


def test_each_bad_variable_is_its_own_sentence_and_an_absent_one_is_not_checked():
    assert len(problems({"fleet_serial": "abc", "fleet_max_fail_percentage": "x", "fleet_force_reset": "maybe",
                         "fleet_report_path": ""})) == 4
    assert problems({}) == []


def test_the_value_is_checked_as_rendered_and_a_template_that_fails_is_a_sentence():
    assert problems({"fleet_serial": "{{ two }}"}, render=lambda value: 2) == []
    assert len(problems({"fleet_serial": "{{ two }}"}, render=lambda value: "abc")) == 1

    def broken(value):
        raise ValueError("Syntax error in template:\n" + "x" * 1000)
    sentence, = problems({"fleet_serial": "{{ }}"}, render=broken)
    assert sentence.startswith("fleet_serial is '{{ }}', a template that does not render ('Syntax error in template:'")
    assert "xxx" not in sentence and sentence.endswith(BY_NAME["fleet_serial"].accepts + ".")


def test_each_variable_is_read_by_the_playbooks_it_names():
    for variable in VARIABLES:
        for playbook in variable.read_by:
            text = (REPO / "playbooks" / playbook).read_text()
            imported = "".join((REPO / "playbooks" / name).read_text() for name in
                               re.findall(r"import_(?:playbook|tasks): (\S+\.yml)", text))
            assert re.search(r"\b%s\b" % variable.name, text + imported), (variable.name, playbook)


def test_every_variable_the_fleet_playbooks_read_with_a_default_is_checked():
    """A playbook variable a user sets: a new one without a check would reach ansible-core unchecked.
    Those the playbooks set themselves (vars, set_fact: fleet_report_kind...) are not the user's."""
    text = "".join(path.read_text() for path in sorted((REPO / "playbooks").rglob("*.yml")))
    set_by_playbooks = set(re.findall(r"^\s+(fleet_\w+):", text, re.MULTILINE))
    read = set(re.findall(r"\b(fleet_\w+) \| default\(", text)) - set_by_playbooks
    assert read == set(BY_NAME), read ^ set(BY_NAME)


def test_a_keyword_variable_set_only_in_the_inventory_is_refused_and_one_given_where_serial_reads_it_is_not():
    """fleet_serial in group_vars: the playbooks' `serial` never sees it and runs every host in one batch."""
    host_view = {"fleet_serial": 2, "fleet_report_path": "reports", "ansible_host": "x"}
    sentence, = unread(host_view, given=set())
    assert sentence.startswith("fleet_serial is 2 in the inventory, where a play's keyword cannot read it")
    assert "-e fleet_serial=" in sentence
    # Given as an extra var or the play's var (an import_playbook's vars): serial reads it.
    assert unread(host_view, given={"fleet_serial"}) == []
    # The variables no keyword reads work from the inventory (a task reads them with the host's vars).
    assert unread({"fleet_report_path": "r", "fleet_force_reset": True, "fleet_max_fail_percentage": 5}, set()) == []
    assert unread({}, set()) == []
