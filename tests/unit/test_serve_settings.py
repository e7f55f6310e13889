"""The table of serve settings (plugins/module_utils/_settings.py) is what the plugins, the role and
the command line read: the action specs are built from it, the documented options say the same, the
role passes each plugin its settings through one filter, every range has an upper bound and holds in
each check that reads it."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.action.inference_args import ARGUMENT_SPEC as ARGS_SPEC
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import (
    inference_service_plugin_args, inference_service_problems)
from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings
from ansible_collections.cleanslate.gpu.plugins.modules.inference_ready import ARGUMENT_SPEC as READY_SPEC
from tests.unit.test_inference_args import build, refused, settings
from tests.unit.test_inference_service_problems import _service_values
from tools import gen_serve_settings

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "roles" / "inference_service" / "tasks"
RANGED = [setting for setting in _settings.SETTINGS if setting.range]
ON_THE_COMMAND_LINE = [setting for setting, dummy in _settings.passed(_settings.ARGS) if setting.range]
# The keys of a documented option that its argument spec says too.
COMPARED = ("type", "elements", "default", "choices", "required")


def documented(module: str) -> dict:
    text = (REPO / "plugins" / "modules" / ("%s.py" % module)).read_text(encoding="utf-8")
    return yaml.safe_load(text.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])["options"]


def said(options: dict) -> dict:
    return {name: {key: option[key] for key in COMPARED if option.get(key) is not None}
            for name, option in options.items()}


@pytest.mark.parametrize("module, spec", [("inference_args", ARGS_SPEC), ("inference_ready", READY_SPEC)])
def test_the_documented_options_are_the_built_spec(module, spec):
    """The stub documented secrets_set and said secrets were never passed, while the action took them."""
    assert said(documented(module)) == said(spec)


def test_each_plugins_spec_is_its_settings_and_every_setting_reaches_a_plugin_under_its_option():
    assert set(_settings.argument_spec(_settings.ARGS)) <= set(ARGS_SPEC)
    assert set(_settings.argument_spec(_settings.GATE, _settings.PROBE)) <= set(READY_SPEC)
    assert ARGS_SPEC["secrets"]["no_log"] and READY_SPEC["api_key"]["no_log"] and READY_SPEC["secrets"]["no_log"]
    for setting in _settings.SETTINGS:
        if setting.flags:  # what reaches the command line is built by inference_args
            assert _settings.ARGS in [one.plugin for one in setting.passes], setting.name


@pytest.mark.parametrize("tasks, plugin", [("validate.yml", _settings.ARGS), ("gate.yml", _settings.GATE),
                                           ("assess.yml", _settings.PROBE)])
def test_the_role_passes_each_plugin_its_settings_through_the_filter_and_spells_only_what_the_play_computed(
        tasks, plugin):
    """A key spelled in the task and also in the settings would be refused at run time (given twice)."""
    module = "cleanslate.gpu.%s" % plugin.split()[0]
    task = [task for block in yaml.safe_load((TASKS / tasks).read_text()) for task in block.get("block", [block])
            if module in task][0]
    args = task[module]
    settings = args["settings"]
    if settings == "{{ __inference_service_look.settings }}":
        # The probe's arguments are one mapping of the role's vars (the several servers' probe keeps each one's).
        settings = yaml.safe_load((TASKS.parent / "vars" / "main.yml").read_text())["__inference_service_look"]["settings"]
    assert settings == "{{ __inference_service_checked | cleanslate.gpu.inference_service_plugin_args('%s') }}" % plugin
    assert set(args) & set(_settings.argument_spec(plugin)) == set()


def test_the_filter_gives_each_plugin_its_options_from_the_roles_variables():
    values = _service_values(inference_service_secrets={"api_key": "sk-0123456789", "environment": {"W": "w-0123456789"}},
                             inference_service_ready_timeout=60)
    gate = inference_service_plugin_args(values, _settings.GATE)
    assert gate["timeout"] == 60 and gate["api_key"] == "sk-0123456789"
    assert gate["secrets"] == ["sk-0123456789", "w-0123456789"] and gate["max_tokens"] == 16
    assert set(gate) == set(_settings.argument_spec(_settings.GATE))
    probe = inference_service_plugin_args(values, _settings.PROBE)
    assert set(probe) == {"engine", "unit", "api_key", "secrets", "health_timeout", "poll_interval", "timeout",
                          "hung_after", "prompt"}
    args = inference_service_plugin_args(values, _settings.ARGS)
    assert args["secrets"] == values["inference_service_secrets"] and args["port"] == 8000
    assert set(args) == set(_settings.argument_spec(_settings.ARGS))
    with pytest.raises(ValueError, match="no plugin 'inference_host'"):
        inference_service_plugin_args(values, "inference_host")


def test_every_range_has_an_upper_bound():
    assert RANGED and all(math.isfinite(setting.range.maximum) for setting in RANGED)


def _outside(rule):
    """Values just outside the range on each side, and the edges that are inside."""
    step = 1 if rule.whole else 0.5
    low = rule.above if rule.above is not None else rule.minimum
    return [rule.maximum + step, low - step] + ([low] if rule.above is not None else []), \
        [rule.maximum] + ([low] if rule.above is None else [])


@pytest.mark.parametrize("setting", RANGED, ids=[setting.name for setting in RANGED])
def test_the_roles_check_refuses_each_variable_just_outside_its_tables_range_with_its_words(setting):
    bad, good = _outside(setting.range)
    for value in bad + ["%s" % bad[0], math.nan]:
        assert inference_service_problems(_service_values(**{setting.variable: value})) == [
            "%s is %s: it must be %s." % (setting.variable, json.dumps(value), setting.range.words())]
    for value in good + [str(good[0])]:  # -e gives texts
        assert inference_service_problems(_service_values(**{setting.variable: value})) == []


@pytest.mark.parametrize("setting", ON_THE_COMMAND_LINE, ids=[setting.name for setting in ON_THE_COMMAND_LINE])
def test_the_command_builder_refuses_each_number_just_outside_its_tables_range(setting):
    bad, good = _outside(setting.range)
    for value in bad:
        assert refused(**{setting.name: value}) == "%s is %s: it must be %s." % (
            setting.variable, json.dumps(value), setting.range.words())
    for value in good:
        build(**dict({setting.name: value}, **({"extra_args": []})))


def test_a_flag_left_off_at_zero_is_still_the_roles_and_a_float_is_written_as_python_reads_it():
    built = build(gpu_memory_fraction=0.9, max_model_len=0)
    assert built["argv"][built["argv"].index("--gpu-memory-utilization") + 1] == "0.9"
    assert "--max-model-len" not in built["argv"]
    assert "--max-model-len" in refused(extra_args=["--max-model-len", "4096"])
    assert settings()["max_model_len"] == 0


def test_the_roles_defaults_and_spec_and_the_stubs_options_are_the_tables():
    """tools/gen_serve_settings.py writes them: a setting changed without running it fails here."""
    stale = [str(path) for path, text in gen_serve_settings.generated(REPO).items()
             if path.read_text(encoding="utf-8") != text]
    assert stale == [], "run tools/gen_serve_settings.py: %s" % stale
    assert set(gen_serve_settings.STUBS) <= set(gen_serve_settings.generated(REPO))


def _table(*settings):
    return SimpleNamespace(__file__="_settings.py", passed=lambda plugin: [
        (setting, one) for setting in settings for one in setting.passes if one.plugin == plugin])


def test_a_stub_option_is_its_passs_description_else_its_settings_and_the_gates_and_probes_option_is_described_once():
    own = _settings.Setting("a", passes=(_settings.Pass(_settings.GATE, description=("The gate's.",), version_added="9.0.0"),
                                         _settings.Pass(_settings.PROBE)), description=("The role's.",))
    plain = _settings.Setting("b", passes=(_settings.Pass(_settings.GATE),), description=("The role's b.",))
    assert gen_serve_settings.described(_table(own, plain), [_settings.GATE, _settings.PROBE]) == {
        "a": (("The gate's.",), "9.0.0"), "b": (("The role's b.",), None)}
    twice = _settings.Setting("a", passes=(_settings.Pass(_settings.GATE, description=("One.",)),
                                           _settings.Pass(_settings.PROBE, description=("Two.",))))
    with pytest.raises(SystemExit, match="the option a of inference_ready and inference_ready probe is described by "
                                         "more than one of its passes"):
        gen_serve_settings.described(_table(twice), [_settings.GATE, _settings.PROBE])
    with pytest.raises(SystemExit, match="the option b of inference_args has no description"):
        gen_serve_settings.described(_table(_settings.Setting("b", passes=(_settings.Pass(_settings.ARGS),))),
                                     [_settings.ARGS])


def test_the_stubs_block_is_written_inside_documentation_and_the_hand_written_options_stay():
    path = next(iter(gen_serve_settings.STUBS))
    text = (REPO / path).read_text(encoding="utf-8")
    settings = gen_serve_settings.table(REPO)
    written = gen_serve_settings.stub_text(text, path, settings, [settings.ARGS])
    assert "  flag_dirs:\n" in written.split("# BEGIN generated by", maxsplit=1)[0] and written == text
    outside = text.replace('  # END generated by tools/gen_serve_settings.py\n', '').replace(
        '\nEXAMPLES = r"""\n', '\nEXAMPLES = r"""\n  # END generated by tools/gen_serve_settings.py\n')
    with pytest.raises(SystemExit, match="the block of tools/gen_serve_settings.py must lie in DOCUMENTATION"):
        gen_serve_settings.stub_text(outside, path, settings, [settings.ARGS])
