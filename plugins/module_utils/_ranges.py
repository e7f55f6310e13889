# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The range of every number option of the reset modules, written once. Private to this collection.

Each module checks its options against RANGES (problem(), the sentence of _checks.number_problem)
before anything is read or signalled, and the node_reset role checks its variable
node_reset_<module>_<option> against the same entry on the controller (plugins/filter/node_reset.py,
words()), before any step runs: the role and the module cannot disagree on a range.

Every range has an upper bound: past it a typo (1e10) would stall a play for years.
"""

from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import number_problem

# module -> option -> {minimum (inclusive), above (exclusive), maximum (inclusive), unit, whole}
RANGES = {
    "gpu_reset": {
        # An hour: longer than any server's shutdown, short enough for poll() and a play.
        "grace_period": {"minimum": 0, "maximum": 3600, "unit": "seconds"},
        # 0 is a choice: SIGKILL, then no wait beyond a process already on its way out (_procs.SETTLE_S).
        "kill_timeout": {"minimum": 0, "maximum": 3600, "unit": "seconds"},
    },
    "shm_clean": {
        # Ten years: anything above is a mistake, not a policy.
        "min_age": {"minimum": 0, "maximum": 315360000, "unit": "seconds"},
    },
    "pycache_purge": {
        "probe_timeout": {"above": 0, "maximum": 86400, "unit": "seconds"},
    },
    "nvml_verify": {
        # A reset waits minutes, not days.
        "timeout": {"minimum": 0, "maximum": 86400, "unit": "seconds"},
        # Longer than `timeout` is one read: nothing is lost, so the bound is only against typos.
        "poll_interval": {"above": 0, "maximum": 3600, "unit": "seconds"},
        "call_timeout": {"above": 0, "maximum": 3600, "unit": "seconds"},
        # 1 TiB: above any GPU's memory.
        "max_memory_used_mib": {"minimum": 0, "maximum": 1048576, "unit": "MiB", "whole": True},
        # NVML enumerates at most 1024 devices per host in any driver release so far.
        "expected_count": {"minimum": 1, "maximum": 1024, "unit": "GPUs", "whole": True},
    },
}


def problem(module, option, value):
    """One sentence when `value` is outside the option's range (the module's own check), else None."""
    rule = RANGES[module][option]
    return number_problem(option, value, minimum=rule.get("minimum"), above=rule.get("above"),
                          maximum=rule.get("maximum"), unit=rule["unit"])


def words(rule):
    """The rule in words, for a sentence that names a role variable: 'a number of seconds from 0 to 3600'."""
    kind = "a whole number" if rule.get("whole") else "a number"
    if rule.get("above") is not None:
        return "%s of %s above %s, at most %s" % (kind, rule["unit"], rule["above"], rule["maximum"])
    return "%s of %s from %s to %s" % (kind, rule["unit"], rule["minimum"], rule["maximum"])
