"""The AWX configuration as code (awx/configure.yml, awx/vars.yml, awx/surveys/): every survey
question sets a variable that the template's playbook or the roles really read, with a type and
choices they accept. AWX itself cannot run here (docs/awx.md says what is tested and how)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
AWX = REPO / "awx"
# AWX's survey types and the argument-spec types that accept each answer as AWX sends it.
COMPATIBLE = {"text": {"str", "raw"}, "textarea": {"str", "raw"}, "password": {"str", "raw"},
              "integer": {"int", "raw"}, "float": {"float", "raw"}, "multiplechoice": {"str", "raw"},
              "multiselect": {"list", "raw"}}


def _unsafe(loader, node):
    return loader.construct_scalar(node)


class _Loader(yaml.SafeLoader):
    """awx/vars.yml holds one `!unsafe` string (an expression AWX templates, not this playbook)."""


_Loader.add_constructor("!unsafe", _unsafe)
VARS = yaml.load((AWX / "vars.yml").read_text(), Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
TEMPLATES = VARS["cleanslate_awx_job_templates"]


def _role_options() -> dict:
    """{variable: its options} over every entry point of every role (the first one that declares it)."""
    options = {}
    for spec in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        for entry in (yaml.safe_load(spec.read_text())["argument_specs"] or {}).values():
            for name, option in (entry.get("options") or {}).items():
                options.setdefault(name, option)
    return options


ROLE_OPTIONS = _role_options()


def _questions():
    for template in TEMPLATES:
        survey = yaml.safe_load((AWX / "surveys" / template["survey"]).read_text())
        for question in survey["spec"]:
            yield pytest.param(template, question, id="%s:%s" % (template["survey"], question["variable"]))


def test_the_three_job_templates_run_playbooks_that_exist_with_surveys_that_exist():
    assert [t["playbook"] for t in TEMPLATES] == ["playbooks/reset.yml", "playbooks/verify.yml",
                                                  "playbooks/reset_and_serve.yml"]
    for template in TEMPLATES:
        assert (REPO / template["playbook"]).is_file() and (AWX / "surveys" / template["survey"]).is_file()


@pytest.mark.parametrize("template, question", list(_questions()))
def test_each_survey_variable_is_read_with_a_compatible_type(template, question):
    variable, kind = question["variable"], question["type"]
    assert kind in COMPATIBLE, question
    playbook = (REPO / template["playbook"]).read_text()
    if variable in ROLE_OPTIONS:
        option = ROLE_OPTIONS[variable]
        assert option.get("type", "str") in COMPATIBLE[kind], (variable, option.get("type"), kind)
        if kind == "multiplechoice":
            assert option.get("choices"), "%s has no choices in the role: a free answer is valid" % variable
            assert set(question["choices"]) <= set(option["choices"]), (question["choices"], option["choices"])
            assert question["default"] in option["choices"]
    elif variable.startswith("fleet_"):
        # A playbook variable: the template's playbook (or the play it imports) reads it.
        assert re.search(r"\b%s\b" % variable, playbook), "%s does not read %s" % (template["playbook"], variable)
        if variable == "fleet_max_fail_percentage":
            assert kind == "integer" and 0 <= question["min"] <= question["max"] <= 100
    else:
        # A helper of the template's own extra variables (AWX templates them after the survey).
        extra = yaml.safe_dump(template.get("extra_vars") or {})
        unread = "%s is read by neither the roles, the playbook nor the template's extra variables" % variable
        assert re.search(r"\b%s\b" % variable, extra), unread
        for name in template.get("extra_vars") or {}:
            assert name in ROLE_OPTIONS, name
    if kind in ("text", "textarea", "password") and "max" in question:
        assert question.get("min", 0) <= question["max"]
        # An empty default of a required question makes AWX ask for an answer; any other must fit.
        assert not question["default"] or question["min"] <= len(str(question["default"])) <= question["max"]
