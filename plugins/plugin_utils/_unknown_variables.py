# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which role variable names no role knows, with the nearest known name: for the fleet playbooks'
first task (fleet_preflight) and for the roles in a user's own play (variable_checks).

A misspelled variable would be ignored, and the roles' defaults are often the widest choice
(node_reset_gpu_reset_gpu=[1], for node_reset_gpu_reset_gpus, would reset every GPU): such a name
stops the run before anything is touched, unless ALLOW says unknown names are fine."""

from __future__ import annotations

import difflib
import json

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._fleet_targets import shown
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import load_specs

# The roles whose variables are checked; a name with one of their prefixes must be one of theirs.
ROLES = ("node_reset", "inference_service")
# What the roles set for the user to read (facts), not variables to give; they are no misspelling.
PUBLISHED = ("node_reset_result", "inference_service_result", "inference_service_assessment",
             "inference_service_report_row")
# The one variable that lets unknown names pass (a name of the user's own with a role's prefix).
ALLOW = "cleanslate_allow_unknown_variables"
STOPPED = ("Nothing was touched: correct the name, or set %s=true if the name is meant to be unknown to the roles."
           % ALLOW)


def known_variables() -> list:
    """Every variable of every entry point of ROLES (their meta/argument_specs.yml), and PUBLISHED."""
    names = set(PUBLISHED)
    for role in ROLES:
        for entry in load_specs(role).values():
            names.update((entry or {}).get("options") or {})
    return sorted(names)


def unknown_variables(names, known) -> list:
    """One sentence per name with a role's prefix that no role knows, with the nearest known name.

    The roles' own names (`__node_reset_*`, `__inference_service_*`) and every name without a
    role's prefix (fleet_*, ansible_*, the user's own) are not checked."""
    prefixes = tuple(role + "_" for role in ROLES)
    known = set(known)
    sentences = []
    for name in sorted({str(name) for name in names}):
        if not name.startswith(prefixes) or name in known:
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        role = next(role for role in ROLES if name.startswith(role + "_"))
        sentences.append("%s is not a variable of the %s role%s" % (
            shown(name), role, ": did you mean %s?" % near[0] if near else
            " (ansible-doc -t role cleanslate.gpu.%s lists its variables)." % role))
    return sentences


def refusals(names, allow=False) -> tuple:
    """(what stops the run, what is only said): the unknown names among `names` and STOPPED, unless
    ALLOW's value `allow` is true (then they are only said); a value of ALLOW that is no boolean stops."""
    try:
        allow = boolean(allow, strict=True)
    except TypeError:
        return ["%s is %s: it must be true or false." % (ALLOW, json.dumps(allow, default=str))], []
    unknown = unknown_variables(names, known_variables())
    if allow or not unknown:
        return [], unknown
    return unknown + [STOPPED], []
