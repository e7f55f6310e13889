# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference_service role's check of its own variables: types, choices and the ranges of
the gate's settings, one sentence per bad variable (its value hidden when the spec says no_log).

The ranges were one assertion whose message listed all nine rules and values whatever was
wrong; the types were ansible-core's validation task, which printed the whole argument spec."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec

# (variable, minimum, exclusive minimum, maximum, the rule in words); -e gives strings, converted first.
NUMBERS = (
    ("inference_service_ready_timeout", 0, None, 604800, "a whole number of seconds from 0 to 604800 (a week)"),
    ("inference_service_poll_interval", None, 0, 3600, "a number of seconds above 0, at most 3600"),
    ("inference_service_health_timeout", 0, None, 3600,
     "a number of seconds from 0 (the engine's own) to 3600"),
    ("inference_service_stable_s", 0, None, 3600, "a number of seconds from 0 to 3600"),
    ("inference_service_progress_interval", 1, None, 86400, "a whole number of seconds from 1 to 86400"),
    ("inference_service_smoke_completions", 1, None, 100, "a whole number of completions from 1 to 100"),
    ("inference_service_smoke_max_tokens", 1, None, 1048576, "a whole number of tokens from 1 to 1048576"),
    ("inference_service_min_acceptance_rate", 0, None, 1, "a share from 0 to 1 (0.3 is 30%)"),
    ("inference_service_restart_sec", 0, None, 86400, "a whole number of seconds from 0 to 86400"),
    ("inference_service_start_limit_burst", 1, None, 10000, "a whole number of starts from 1 to 10000"),
    ("inference_service_start_limit_interval", 1, None, 604800, "a whole number of seconds from 1 to 604800"),
)


def spec() -> dict:
    """The role's argument spec, read on first use: Ansible imports every filter file of the
    collection in a worker that needs one of them, and the node_reset role's workers need none of this."""
    return _role_spec.load_spec("inference_service")


def inference_service_problems(values):
    """Why the role's variables cannot be used: one sentence per bad variable, [] when none."""
    if not isinstance(values, Mapping):
        raise TypeError("inference_service_problems expects a mapping of the role's variables, got %s"
                        % type(values).__name__)
    return (_role_spec.number_problems(NUMBERS, values)
            + _role_spec.spec_problems(spec(), values, skip=tuple(rule[0] for rule in NUMBERS)))


class FilterModule:
    """The inference_service role's checks."""

    def filters(self):
        return {"inference_service_problems": inference_service_problems}
