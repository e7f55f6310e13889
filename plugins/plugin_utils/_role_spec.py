# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A role's variables checked against its meta/argument_specs.yml and its number rules, in
Python, one sentence per bad variable naming it, its value and its rule.

The playbooks run the roles by their tasks files, without ansible-core's own validation task,
whose failure prints the whole argument spec (some 6 KB) after the one line that matters and
ends the host before the fleet report. The roles' first task checks the same rules here."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping

import yaml

from ansible.module_utils.common.validation import (check_type_bool, check_type_dict, check_type_float,
                                                    check_type_int, check_type_list, check_type_str)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TYPE_CHECKS = {"str": check_type_str, "path": check_type_str, "bool": check_type_bool, "int": check_type_int,
               "float": check_type_float, "list": check_type_list, "dict": check_type_dict}
TYPE_WORDS = {"str": "a text", "path": "a path", "bool": "true or false", "int": "a whole number",
              "float": "a number", "list": "a list", "dict": "a mapping of names to values"}
# The same, for the items of a list.
ITEM_WORDS = {"str": "texts", "path": "paths", "bool": "true or false values", "int": "whole numbers",
              "float": "numbers", "list": "lists", "dict": "mappings of names to values"}
HIDDEN = "(hidden)"


# libyaml's parser where PyYAML has it: the pure-Python one took 12 ms of the controller's CPU per
# read, and every task that uses a filter of this collection is a fresh worker process that reads
# the spec again (docs/fleet_scale.md).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def load_specs(role: str) -> dict:
    """Every entry point of a role, from the collection's roles/ROLE/meta/argument_specs.yml, read
    once per process (callers must not change it)."""
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_LOADER)["argument_specs"]


def load_spec(role: str, entry: str = "main") -> dict:
    """The options of a role's entry point."""
    return load_specs(role)[entry]["options"]


def shown(value) -> str:
    """The value as Ansible's to_json shows it (non-ASCII escaped): one line, whatever it holds."""
    return json.dumps(value, default=str)


def as_list(value) -> list:
    """A list variable as Ansible reads `-e name=a,b`: a string is split at commas."""
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        return [value]
    return list(value)


def as_number(value):
    """float(value), or None: a boolean, None, or anything float() refuses is no number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def number_problems(rules, values, zero_allowed=()) -> list:
    """rules: (variable, minimum, exclusive minimum, maximum, the rule in words); a value given
    with -e is a string, converted first; NaN fails every comparison, so every range."""
    problems = []
    for name, minimum, above, maximum, rule in rules:
        if name not in values:
            continue
        value = values.get(name)
        number = as_number(value)
        good = number is not None and (
            (name in zero_allowed and number == 0)
            or ((minimum is None or number >= minimum) and (above is None or number > above) and number <= maximum))
        if good and rule.startswith("a whole number") and number != int(number):
            good = False
        if not good:
            problems.append("%s is %s: it must be %s." % (name, shown(value), rule))
    return problems


def _converted(kind, value):
    """The value as ansible-core's argument spec converts it (str "5" to 5.0...), or raise."""
    if kind in ("str", "path") and not isinstance(value, str):
        # A number where text is wanted would be converted silently; a list, a mapping or a
        # boolean is a mistake.
        if isinstance(value, (bool, list, dict)) or value is None:
            raise TypeError(kind)
    return TYPE_CHECKS[kind](value)


def spec_problems(spec, values, skip=()) -> list:
    """Types, choices and list items of `spec` (a role's options): one sentence per bad variable.
    A variable of the spec marked no_log is named without its value."""
    problems = []
    for name, option in spec.items():
        if name in skip or name not in values:
            continue
        value, kind = values[name], option.get("type", "str")
        if value is None and option.get("default") is None:
            continue  # not given: the role's "unset"
        given = HIDDEN if option.get("no_log") else shown(value)
        try:
            converted = _converted(kind, value)
            items = converted if kind == "list" else [converted]
            if kind == "list" and option.get("elements"):
                items = [_converted(option["elements"], item) for item in items]
        except (TypeError, ValueError, OverflowError):
            what = TYPE_WORDS.get(kind, kind)
            if kind == "list" and option.get("elements"):
                what += " of %s" % ITEM_WORDS.get(option["elements"], option["elements"])
            problems.append("%s is %s: it must be %s." % (name, given, what))
            continue
        choices = option.get("choices")
        if choices and any(item not in choices for item in items):
            problems.append("%s is %s: %s must be one of %s." % (
                name, given, "each item" if kind == "list" else "it", ", ".join(map(str, choices))))
    return problems
