# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference_service role's check of its own variables: types, choices and the range of each
number setting (module_utils/_settings.py), one sentence per bad variable (its value hidden when
the spec says no_log); where a secret's value would be shown to others, named without the value;
and each plugin's arguments from the role's variables (inference_service_plugin_args).

The secrets are compared against the command line's items, not the shell-quoted line, where a
quote in a secret (sk'X is written 'sk'"'"'X') would hide it from the comparison."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker, secret_values as _secret_values
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._serve_command import (
    executable_path, not_texts, served_name_fault, unit_fault, value_sentence)

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Shorter, a secret is guessed in a moment, turns up inside ordinary text (a one-character key is in
# "8000" and in "serve"), and a sentence saying where it turned up would all but show it.
SECRET_MIN_CHARS = 8
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


def short_secret_problems(named: list) -> list:
    """A sentence for each secret shorter than SECRET_MIN_CHARS: refused whole, never compared (a
    sentence saying where a short one turned up would narrow it down)."""
    return ["inference_service_secrets.%s is shorter than %d characters: it can be guessed, and it would turn up "
            "inside ordinary text; use a longer secret." % (name, SECRET_MIN_CHARS)
            for name, value in named if len(value) < SECRET_MIN_CHARS]


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


def secret_masker(secrets):
    """A Masker of every value of the role's secrets mapping, in every form a program prints it. One
    shorter than SECRET_MIN_CHARS is refused before anything runs, and not masked in that refusal:
    it would turn every letter it matches in the sentences to stars."""
    return Masker([value for dummy, value in _secret_values(secrets if isinstance(secrets, Mapping) else {})
                   if len(value) >= SECRET_MIN_CHARS])


def _forms(value: str) -> set:
    """The value as the command line may hold it: raw, and as JSON writes it inside a string
    (--speculative-config: quotes, backslashes and non-ASCII escaped)."""
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}


def _argument(argv: list, index: int, secrets: list, flag_variables: Mapping) -> str:
    """Which argument argv[index] is, in words that show no secret."""
    if index == 0:
        return "the executable (inference_service_executable or inference_service_venv)"
    if index == 2 and argv[1] == "serve" and not argv[2].startswith("-"):
        return "argument 2, the model (inference_service_model)"
    previous = argv[index - 1].split("=", 1)[0]
    option = argv[index].split("=", 1)[0] if argv[index].startswith("--") and "=" in argv[index] else None
    flag = option or (previous if previous.startswith("-") else None)
    if flag is None or any(form in flag for _name, value in secrets for form in _forms(value)):
        return "argument %d" % index
    # The role's own flags by the variable that sets them (inference_args' flag_variables); any other
    # came from the extra arguments.
    variable = flag_variables.get(flag, "inference_service_extra_args")
    return "argument %d, the value of %s (%s)" % (index, flag, variable)


def inference_service_secret_problems(secrets, args):
    """Where a secret's value would be read by others, one sentence per problem, each naming
    the secret and the place, never the value: a secret holding a control character (it would
    end its line in the secrets file); a secret inside an argument of the command line (every
    user of the host reads it in /proc, and the unit file is world-readable), compared raw and
    as JSON escapes it; a secret inside a value of inference_service_environment (the unit
    file, and --diff). `args` is the result of cleanslate.gpu.inference_args."""
    if not isinstance(secrets, Mapping) or not isinstance(args, Mapping):
        raise TypeError("inference_service_secret_problems expects the secrets mapping and the inference_args result, "
                        "got %s and %s" % (type(secrets).__name__, type(args).__name__))
    named = _secret_values(secrets)
    argv = [str(item) for item in args.get("argv") or []]
    environment = args.get("environment") if isinstance(args.get("environment"), Mapping) else {}
    flag_variables = args.get("flag_variables") if isinstance(args.get("flag_variables"), Mapping) else {}
    problems = short_secret_problems(named)
    for name, value in named:
        if name in ("api_key", "admin_api_key") and not value.isascii():
            # An HTTP header carries no other text: no client could ever use the key.
            problems.append("inference_service_secrets.%s holds a character outside ASCII, which no HTTP "
                            "Authorization header can carry." % name)
        if CONTROL.search(value):
            problems.append("inference_service_secrets.%s holds a control character, which would end its line in "
                            "the secrets file." % name)
        if len(value) < SECRET_MIN_CHARS:
            continue  # refused whole above
        forms = _forms(value)
        for index, item in enumerate(argv):
            if any(form in item for form in forms):
                problems.append("inference_service_secrets.%s is in the command line (%s), which every user of the "
                                "host reads in /proc and in the unit file: change the secret or that argument."
                                % (name, _argument(argv, index, named, flag_variables)))
        for variable, text in sorted(environment.items()):
            if value in str(text):
                problems.append("inference_service_environment.%s holds the value of inference_service_secrets.%s: "
                                "the unit file and --diff show it to every user; move it to "
                                "inference_service_secrets.environment." % (variable, name))
    return problems


def inference_service_executable(variables: Mapping, engine: str) -> str:
    """The engine's executable the unit will run (the one the role asks for the engine's version)."""
    return executable_path({"executable": variables.get("inference_service_executable"),
                            "venv": variables.get("inference_service_venv")}, engine)


class FilterModule:
    """The inference_service role's checks."""

    def filters(self):
        return {"inference_service_problems": inference_service_problems,
                "inference_service_executable": inference_service_executable,
                "inference_service_plugin_args": inference_service_plugin_args,
                "inference_service_secret_problems": inference_service_secret_problems}
