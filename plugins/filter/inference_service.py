# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference_service role's check of its own variables: types, choices and the range of each
number setting (module_utils/_settings.py), one sentence per bad variable (its value hidden when
the spec says no_log); where a secret's value would be shown to others, named without the value
(the comparison is plugin_utils/_secret_checks.py's); and each plugin's arguments from the role's
variables (inference_service_plugin_args).

Each sentence names one variable, its value and its rule, and only the rules that variable
breaks: ansible-core's own validation task would print the whole argument spec instead."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import secret_values as _secret_values
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec, _rotation
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._engine_check import engine_problem
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._secret_checks import (
    CONTROL, SECRET_MIN_CHARS, forms as _forms, inference_service_secret_problems, secret_masker, short_secret_problems)
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._serve_command import (
    not_texts, served_name_fault, unit_fault, value_sentence)

# The operator's texts that others read besides the command line and the environment's values, and
# where: a secret in one is refused before the first host contact (the host check's own command line
# carries the unit, the config_dir, the executable and the user, and the module logs it).
VISIBLE = (
    ("inference_service_unit", "the unit's name is in its world-readable file's name, every journal line's "
                               "identifier, the metrics and the report"),
    ("inference_service_config_dir", "the directory is in the unit file, the command line and the output"),
    ("inference_service_executable", "the executable is in the unit file and every user's ps"),
    ("inference_service_venv", "the venv is in the unit file and every user's ps"),
    ("inference_service_user", "the user's name is in the unit file and every user's ps"),
    ("inference_service_served_name", "the served name is in the unit file, every user's ps, /v1/models, the "
                                      "metrics and the report"),
    ("inference_service_model", "the model is in the unit file, every user's ps and the report"),
    ("inference_service_host", "the address is in the unit file, every user's ps and the report"),
    ("inference_service_metrics_dir", "the directory is in the output"),
)
# Names that the unit file or the output show: the environment's variables, the secrets' own.
VISIBLE_NAMES = (("inference_service_environment", "its variable names are in the unit file"),
                 ("inference_service_secrets.environment", "its variable names are in the output"))


def spec() -> dict:
    """The role's argument spec, read on first use: Ansible imports every filter file of the
    collection in a worker that needs one of them, and the node_reset role's workers need none of this."""
    return _role_spec.load_spec("inference_service")


def inference_service_problems(values):
    """Why the role's variables cannot be used: one sentence per bad variable, [] when none."""
    if not isinstance(values, Mapping):
        raise TypeError("inference_service_problems expects a mapping of the role's variables, got %s"
                        % type(values).__name__)
    problems = number_problems(values)
    skip = tuple(setting.variable for setting in _settings.SETTINGS if setting.range)
    extra = values.get("inference_service_extra_args")
    if isinstance(extra, list) and any(isinstance(item, bool) or not isinstance(item, (str, int, float))
                                       for item in extra):
        # Not the whole list: an item may be a secret flag's value that no secret declares.
        problems.append("inference_service_extra_args has %s: it must be a list of texts (each flag and each value "
                        "its own item)." % not_texts(extra))
        skip += ("inference_service_extra_args",)
    metrics_dir = values.get("inference_service_metrics_dir")
    if "inference_service_metrics_dir" in values and (not isinstance(metrics_dir, str) or not metrics_dir.startswith("/")
                                                      or CONTROL.search(metrics_dir)):
        problems.append("inference_service_metrics_dir is %s: a path must be absolute (start with /), on one line."
                        % _role_spec.shown(metrics_dir))
        skip += ("inference_service_metrics_dir",)
    secrets = values.get("inference_service_secrets")
    mask = secret_masker(secrets if isinstance(secrets, Mapping) else {})
    named = _secret_values(secrets if isinstance(secrets, Mapping) else {})
    holders = secret_holders(values, named)
    # A name that holds a secret gets that sentence alone (change the secret), not the name rule's too.
    name_problems = _name_problems(values, mask, skip={variable for variable, dummy, dummy2 in holders})
    problems += name_problems.values()
    problems += _role_spec.spec_problems(spec(), values, skip=skip + tuple(name_problems))
    problems += short_secret_problems(named) + [holder_sentence(*holder) for holder in holders]
    problems += _rotation.problems(values.get("inference_service_rotation"), values.get("inference_service_rotation_server"))
    # A sentence shows the value it refuses: never a secret's, wherever it was pasted (a key inside
    # an extra argument list that holds a null is refused as a whole list).
    return mask(problems)


def number_problems(values: Mapping) -> list:
    """A sentence for each number variable outside its setting's range (module_utils/_settings.py);
    a text (-e gives texts) is read as a number first."""
    return [sentence for sentence in (setting.range.sentence(setting.variable, values[setting.variable], convert=True)
                                      for setting in _settings.SETTINGS
                                      if setting.range and setting.variable in values) if sentence]


def inference_service_plugin_args(values, plugin):
    """The options `plugin` (inference_args, inference_ready, or "inference_ready probe") takes from
    the role's variables by name (__inference_service_checked), as one mapping for its `settings`
    option: the table of settings (module_utils/_settings.py) says which, under which option."""
    if not isinstance(values, Mapping):
        raise TypeError("inference_service_plugin_args expects a mapping of the role's variables, got %s"
                        % type(values).__name__)
    if plugin not in _settings.PLUGINS:
        raise ValueError("inference_service_plugin_args: no plugin %r (%s)" % (plugin, ", ".join(_settings.PLUGINS)))
    return _settings.plugin_args(values, plugin)


def _name_problems(values: Mapping, mask, skip=frozenset()) -> dict:
    """{variable: sentence} of the names the role puts into unit file paths, systemctl's arguments,
    the journal, every request and every /metrics line, checked here, first, so that no task (the
    host's look at the unit runs before the command line is built) receives a name the role refuses.
    A text only: another type is the type check's. The value is masked before it is cut."""
    found = {}
    for variable, fault in (("inference_service_served_name", served_name_fault),
                            ("inference_service_unit", unit_fault)):
        value = values.get(variable)
        if isinstance(value, str) and variable not in skip:
            sentence = value_sentence(variable, value, fault(value), mask)
            if sentence:
                found[variable] = sentence + "."
    return found


def _compared(named: list) -> list:
    """The secrets long enough to compare: [(name, its forms)]."""
    return [(name, _forms(value)) for name, value in named if len(value) >= SECRET_MIN_CHARS]


def secret_holders(values: Mapping, named: list) -> list:
    """Where a secret was pasted into a text of VISIBLE or a name of VISIBLE_NAMES: [(variable, the
    secret's name, who reads that variable)], one per variable and secret. `named`: [(name, value)]
    of _secret_values."""
    texts = [(variable, why, [values.get(variable)]) for variable, why in VISIBLE]
    secrets = values.get("inference_service_secrets")
    for variable, why in VISIBLE_NAMES:
        holder = values.get(variable) if variable.count(".") == 0 else \
            (secrets.get("environment") if isinstance(secrets, Mapping) else None)
        texts.append((variable, why, list(holder) if isinstance(holder, Mapping) else []))
    return [(variable, name, why) for name, forms in _compared(named) for variable, why, items in texts
            if any(isinstance(item, (str, int, float)) and any(form in str(item) for form in forms) for item in items)]


def holder_sentence(variable: str, name: str, why: str) -> str:
    """The refusal of a variable that holds a secret's value: names both, never any part of the value."""
    return ("%s holds the value of inference_service_secrets.%s: %s, read by every user of the host; change the "
            "secret or %s." % (variable, name, why, variable))


def visible_secret_problems(values: Mapping, named: list) -> list:
    """The sentences of secret_holders."""
    return [holder_sentence(*holder) for holder in secret_holders(values, named)]


def inference_service_engine_problem(dry_run, args):
    """Why the engine's own check on the host (inference_dry_run's result) refuses the server whose
    command line is `args` (inference_args' result): one sentence, "" when it does not."""
    return engine_problem(dry_run, args)


class FilterModule:
    """The inference_service role's checks."""

    def filters(self):
        return {"inference_service_problems": inference_service_problems,
                "inference_service_engine_problem": inference_service_engine_problem,
                "inference_service_plugin_args": inference_service_plugin_args,
                "inference_service_secret_problems": inference_service_secret_problems}
