# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What stops a role in a user's own play before anything runs: the role's variables as the
variable_checks role (the roles' dependency) sees them.

ansible-core inserts its own validation task before the first task of a role's entry point
(`roles: [cleanslate.gpu.node_reset]`, include_role's tasks_from), and its failure is a raw type
error followed by the whole argument spec. A role's dependencies run before that task: there,
whatever ansible-core would refuse is refused first, in the role's own sentences (one per bad
variable), and so is a variable name with the role's prefix that no role knows."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import inference_service_problems
from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import node_reset_problems
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._unknown_variables import PUBLISHED, ROLES, refusals


def core_refused(role: str, values: Mapping) -> list:
    """The variables of `values` that ansible-core's validation task would refuse (the role's
    meta/argument_specs.yml, whose entry points share one set of options), each checked alone."""
    spec = _role_spec.load_spec(role)
    refused = []
    for name in sorted(set(spec) & set(values)):
        if ArgumentSpecValidator({name: spec[name]}).validate({name: values[name]}).error_messages:
            refused.append(name)
    return refused


def role_variable_refusals(values, role, allow_unknown=False, pve_host_known=True):
    """One sentence per reason to stop the role before anything runs, [] when it may run.

    `values` maps the names with the role's prefix to their values. An unknown name stops it
    unless `allow_unknown` (cleanslate_allow_unknown_variables) is true. A value ansible-core would
    refuse stops it with every sentence of the role's own check (all its bad variables at once); a
    value only the role refuses (a range) is left to the role, which reports the host `invalid`."""
    if not isinstance(values, Mapping):
        raise TypeError("role_variable_refusals expects a mapping of the role's variables, got %s" % type(values).__name__)
    if role not in ROLES:
        raise ValueError("role_variable_refusals knows the roles %s, not %r" % (", ".join(ROLES), role))
    stops, dummy = refusals(values, allow_unknown)
    settings = {name: value for name, value in values.items() if name not in PUBLISHED}
    refused = core_refused(role, settings)
    if not refused:
        return stops
    problems = (node_reset_problems(settings, pve_host_known) if role == "node_reset"
                else inference_service_problems(settings))
    # A refusal the role's own words do not name (they should): named without its value, which may be a secret.
    problems += ["%s is not what the role takes: ansible-doc -t role cleanslate.gpu.%s shows its type." % (name, role)
                 for name in refused if not any(problem.startswith(name + " ") for problem in problems)]
    return problems + stops


class FilterModule:
    """The check of a role's variables in a user's own play."""

    def filters(self):
        return {"role_variable_refusals": role_variable_refusals}
