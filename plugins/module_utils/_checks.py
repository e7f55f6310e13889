# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one shape of the input checks AnsibleModule cannot express. Private to this collection.

Each module has input_problems(params) returning a list of sentences, one per bad value,
computed before anything is read, signalled or removed; main() hands that list to
fail_on_problems(), which fails the task with all of them and touches nothing. Types,
choices and which options are required (required, required_one_of, mutually_exclusive) stay
in the argument spec.

A value that only the host can refuse (a GPU selector naming a GPU the host does not have)
is found where the host is read, before anything is signalled or changed: it raises
InputProblem there, and main() fails the task with it through fail_on_problems too.
"""

from __future__ import annotations

import math
import re

# systemd's unit name characters, an instance after @, and UNIT_NAME_MAX.
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]*)?")
UNIT_NAME_MAX = 255
# The units that hold processes: each has a cgroup whose name is a component of its processes' cgroup paths.
PROCESS_UNIT_SUFFIXES = (".service", ".scope", ".slice")


class InputProblem(ValueError):
    """One sentence about an option value that the host refuses (see the module docstring)."""


def number_problem(option, value, minimum=None, above=None, maximum=None, unit=""):
    """One sentence if value is not a finite number within the bounds, else None.

    minimum is inclusive, above exclusive; maximum inclusive. NaN and infinities are always
    refused: a NaN compares false with everything, so it would slip through every range check.
    """
    suffix = (" " + unit) if unit else ""
    of_unit = (" of " + unit) if unit else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "%s must be a number%s, got %r" % (option, of_unit, value)
    if isinstance(value, float) and not math.isfinite(value):
        return "%s must be a finite number%s, got %s" % (option, of_unit, value)
    if minimum is not None and value < minimum:
        return "%s must be %s or more%s, got %s" % (option, minimum, suffix, value)
    if above is not None and value <= above:
        return "%s must be more than %s%s, got %s" % (option, above, suffix, value)
    if maximum is not None and value > maximum:
        return "%s must be %s or less%s, got %s" % (option, maximum, suffix, value)
    return None


def fail_on_problems(module, problems, **result):
    """Fail the task with every problem, one sentence each, if there is any."""
    problems = [p for p in problems if p]
    if problems:
        module.fail_json(msg="; ".join(problems), **result)


def is_unit_name(name, holds_processes=False):
    """Whether name is a systemd unit name on one line; with holds_processes, also with the suffix
    of a unit that has processes (a name without one means NAME.service to systemctl, but never
    matches a cgroup path)."""
    return (isinstance(name, str) and 0 < len(name) <= UNIT_NAME_MAX and not name.startswith(".")
            and _UNIT_NAME.fullmatch(name) is not None and (not holds_processes or name.endswith(PROCESS_UNIT_SUFFIXES)))
