# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The range of every number the collection takes, and the reset modules' ranges. Private to this collection.

A Range is one number rule: its bounds, its unit, whether it is whole, in words (words()) and as one
sentence for a value outside it (sentence()). Every range has an upper bound: past it a typo (1e10)
would stall a play for years.

RANGES is the reset half of the table (the serve half is _settings.py, whose entries hold a Range
each): each reset module checks its options against it (problem(), the sentence of
_checks.number_problem) before anything is read or signalled, and the node_reset role checks its
variable node_reset_<module>_<option> against the same entry on the controller
(plugins/filter/node_reset.py, words()), before any step runs: the role and the module cannot
disagree on a range.
"""

from __future__ import annotations

import json
import math

from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import number_problem


class Range:
    """minimum (inclusive) or above (exclusive), maximum (inclusive), the unit, whole numbers only;
    `zero` what 0 means where it means something else ("the engine's own"), `kind` the words for
    the number ("a share"), `note` words after the rule ("a week")."""

    def __init__(self, minimum=None, above=None, maximum=None, unit="", whole=False, zero=None, kind=None, note=None):
        if maximum is None or (minimum is None) == (above is None):
            raise ValueError("a range has a maximum and one lower bound (minimum or above)")
        self.minimum, self.above, self.maximum = minimum, above, maximum
        self.unit, self.whole, self.zero, self.kind, self.note = unit, whole, zero, kind, note

    def words(self) -> str:
        """The rule in words: 'a whole number of seconds from 0 to 3600'."""
        kind = self.kind or ("a whole number" if self.whole else "a number")
        if self.unit:
            kind += " of " + self.unit
        low = "%s (%s)" % (self.minimum, self.zero) if self.zero else self.minimum
        text = ("%s above %s, at most %s" % (kind, self.above, self.maximum) if self.above is not None
                else "%s from %s to %s" % (kind, low, self.maximum))
        return text + (" (%s)" % self.note if self.note else "")

    def holds(self, value) -> bool:
        """Whether value is a number within the range (bool is no number; NaN fails every bound)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if (self.minimum is not None and value < self.minimum) or (self.above is not None and value <= self.above):
            return False
        return value <= self.maximum and (not self.whole or value == int(value))

    def sentence(self, name: str, value, convert=False):
        """'NAME is VALUE: it must be WORDS.' when value is outside the range, else None. With
        convert, a text is read as a number first (-e gives texts)."""
        number = value
        if convert and isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if self.holds(number):
            return None
        return "%s is %s: it must be %s." % (name, json.dumps(value, default=str), self.words())


# module -> option -> Range
RANGES = {
    "gpu_reset": {
        # An hour: longer than any server's shutdown, short enough for poll() and a play.
        "grace_period": Range(minimum=0, maximum=3600, unit="seconds"),
        # 0 is a choice: SIGKILL, then no wait beyond a process already on its way out (_procs.SETTLE_S).
        "kill_timeout": Range(minimum=0, maximum=3600, unit="seconds"),
    },
    "shm_clean": {
        # Ten years: anything above is a mistake, not a policy.
        "min_age": Range(minimum=0, maximum=315360000, unit="seconds"),
    },
    "pycache_purge": {
        "probe_timeout": Range(above=0, maximum=86400, unit="seconds"),
    },
    "nvml_verify": {
        # A reset waits minutes, not days.
        "timeout": Range(minimum=0, maximum=86400, unit="seconds"),
        # Longer than `timeout` is one read: nothing is lost, so the bound is only against typos.
        "poll_interval": Range(above=0, maximum=3600, unit="seconds"),
        "call_timeout": Range(above=0, maximum=3600, unit="seconds"),
        # 1 TiB: above any GPU's memory.
        "max_memory_used_mib": Range(minimum=0, maximum=1048576, unit="MiB", whole=True),
        # NVML enumerates at most 1024 devices per host in any driver release so far.
        "expected_count": Range(minimum=1, maximum=1024, unit="GPUs", whole=True),
    },
}


def problem(module, option, value):
    """One sentence when `value` is outside the option's range (the module's own check), else None."""
    rule = RANGES[module][option]
    return number_problem(option, value, minimum=rule.minimum, above=rule.above, maximum=rule.maximum, unit=rule.unit)


def words(rule):
    """The rule in words, for a sentence that names a role variable: 'a number of seconds from 0 to 3600'."""
    return rule.words()
