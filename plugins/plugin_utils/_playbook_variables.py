# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet playbooks' own variables (not the roles'), each with its default, what it accepts and
the playbooks that read it; and their check, one sentence per bad value.

fleet_preflight checks them in the first play, which ends the run before ansible-core reads one:
`serial: "{{ fleet_serial }}"` is turned into a number by ansible-core's pct_to_int, outside any
error handling (`abc` was a traceback and exit 250, a huge number a loop without end), and
`| float` and `| bool` make a mistyped value 0 or false without a word. tools/gen_variables_table.py
writes README.md's table of these variables from VARIABLES. No import of ansible here: the
generator loads this file by its path."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

# Hosts per batch: more than any fleet, and small enough that ansible-core's batching loop
# (one step per host of the batch size) ends at once.
MAX_SERIAL = 1000000
SERIAL = re.compile(r"([0-9]{1,7})(%?)")
PERCENTAGE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")
# ansible-core's `bool` filter's words (any case); anything else is false, with a deprecation warning.
BOOLEAN_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")
# The longest value a sentence shows; the rest is counted.
SHOWN_CHARACTERS = 80


class PlaybookVariable(NamedTuple):
    name: str
    default: str
    accepts: str
    description: str
    read_by: tuple
    valid: Callable
    # Read by a play keyword (serial), which sees extra vars and play vars only: set in the
    # inventory, it is ignored without a word.
    keyword: bool = False


def _batch_size(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 1 <= value <= MAX_SERIAL
    match = SERIAL.fullmatch(value) if isinstance(value, str) else None
    return bool(match) and 1 <= int(match.group(1)) <= (100 if match.group(2) else MAX_SERIAL)


def serial_ok(value) -> bool:
    """A batch size as ansible-core's `serial` reads it, or a non-empty list of them."""
    if isinstance(value, list):
        return bool(value) and all(_batch_size(item) for item in value)
    return _batch_size(value)


def percentage_ok(value) -> bool:
    """A number from 0 to 100, or its decimal text (`| float` reads anything else as 0)."""
    if isinstance(value, str) and PERCENTAGE.fullmatch(value):
        value = float(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 100


def boolean_ok(value) -> bool:
    """What ansible-core's `bool` filter reads without coercing."""
    if isinstance(value, (bool, int)):
        return value in (0, 1)
    return isinstance(value, str) and value.lower() in BOOLEAN_WORDS


def directory_ok(value) -> bool:
    """fleet_report's rule for its dest: a text that is not blank and holds no NUL."""
    return isinstance(value, str) and bool(value.strip()) and "\0" not in value


FLEET = ("reset.yml", "verify.yml", "reset_and_serve.yml")
VARIABLES = (
    PlaybookVariable("fleet_serial", "100%", "a whole number of hosts from 1 to %d, a percentage from 1%% to 100%%,"
                     " or a list of them (one per batch, the last one repeated)" % MAX_SERIAL,
                     "hosts per batch; give it with `-e`, an AWX survey or an `import_playbook`'s vars: a play's"
                     " `serial` does not read the inventory's variables, so one set there stops the run", FLEET, serial_ok, keyword=True),
    PlaybookVariable("fleet_max_fail_percentage", "100", "a number from 0 to 100",
                     "stop the rollout after a batch in which more than this share of hosts are not ok; the later"
                     " hosts are reported `not run`", ("reset.yml", "reset_and_serve.yml"), percentage_ok),
    PlaybookVariable("fleet_force_reset", "false", "true or false (yes/no, on/off, 1/0)",
                     "reset every host, the healthy ones too", ("reset_and_serve.yml",), boolean_ok),
    PlaybookVariable("fleet_report_path", "reports", "a directory: a text that is not blank and holds no NUL",
                     "the directory of the fleet report, relative to the directory `ansible-playbook` runs in",
                     FLEET + ("merge_reports.yml",), directory_ok),
)


def shown(value) -> str:
    """The value as one line of at most SHOWN_CHARACTERS (repr escapes newlines, non-printable
    and non-UTF-8 characters), and how long it was when cut."""
    text = repr(str(value) if isinstance(value, str) else value)
    return text if len(text) <= SHOWN_CHARACTERS else "%s... (%d characters)" % (text[:SHOWN_CHARACTERS], len(text))


def problems(variables, render=lambda value: value) -> list:
    """One sentence per variable of VARIABLES that `variables` holds with a bad value, rendered first
    with `render` as ansible-core renders the playbooks' keywords (a template from -e is one)."""
    sentences = []
    for variable in VARIABLES:
        if variable.name not in variables:
            continue
        raw = variables[variable.name]
        try:
            value = render(raw)
        except Exception as exc:  # noqa: B902 - a template fails as it may (syntax, undefined, a lookup): a bad value
            sentences.append("%s is %s, a template that does not render (%s): it must be %s." % (
                variable.name, shown(raw), shown(str(exc).split("\n", 1)[0]), variable.accepts))
            continue
        if not variable.valid(value):
            sentences.append("%s is %s: it must be %s." % (variable.name, shown(value), variable.accepts))
    return sentences


def unread(variables, given) -> list:
    """One sentence per keyword variable that `variables` (a host's view) holds but `given` (the
    names of the extra vars and of the play's vars, all a play keyword reads) does not: one set in
    the inventory, which the playbooks' `serial` would ignore (fleet_serial: 2 in group_vars ran
    every host in one batch)."""
    return ["%s is %s in the inventory, where a play's keyword cannot read it: the playbooks would run every"
            " targeted host in one batch. Give it with -e %s=... or an AWX survey or extra variable instead."
            % (variable.name, shown(variables[variable.name]), variable.name)
            for variable in VARIABLES if variable.keyword and variable.name in variables and variable.name not in given]
