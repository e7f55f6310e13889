# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet playbooks' first task, once per run on the controller: is any host of the group
targeted, and is every role variable given one the roles know?

Ansible ends a run whose limit matches hosts, none of them in the play's group, with
"skipping: no hosts matched" and exit status 0: an AWX job with a wrong inventory "succeeds".
And a misspelled role variable (node_reset_grace_period) is ignored without a word. Both are
checked here, in Python, once per run (fewer tasks: docs/design.md#why-tasks-are-few).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._fleet_targets import no_target_message, targeted
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._fleet_targets import shown as _shown
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._playbook_variables import problems as playbook_problems
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_text import count_of
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import load_specs

ARGUMENT_SPEC = {
    "group": {"type": "str", "default": "gpu_nodes"},
}
# The roles whose variables are checked; a name with one of their prefixes must be one of theirs.
ROLES = ("node_reset", "inference_service")
# What the roles set for the user to read (facts), not variables to give; they are no misspelling.
PUBLISHED = ("node_reset_result", "inference_service_result", "inference_service_assessment",
             "inference_service_report_row")


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
        sentences.append("%s is not a variable of the %s role, and is ignored%s" % (
            _shown(name), role, ": did you mean %s?" % near[0] if near else
            " (ansible-doc -t role cleanslate.gpu.%s lists its variables)." % role))
    return sentences


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args, task_vars, result):
        group = args["group"]
        groups = task_vars.get("groups") or {}
        hosts = targeted(groups.get(group), task_vars.get("ansible_play_hosts_all"))
        if not hosts:
            raise AnsibleActionFail(no_target_message(group, task_vars.get("ansible_limit"), groups,
                                                      task_vars.get("ansible_inventory_sources")))
        # Before the next play's keywords read them (serial: fleet_serial): a failure here ends the run.
        bad = playbook_problems(task_vars, self._templar.template)
        if bad:
            raise AnsibleActionFail("\n".join(bad))
        # The variables as the first targeted host sees them: extra vars, play vars, its group
        # and host vars: one host's view, not every host's (docs/design.md#why-tasks-are-few).
        hostvars = task_vars.get("hostvars") or {}
        first = hostvars[hosts[0]] if hosts[0] in hostvars else {}
        names = list(first.keys()) if isinstance(first, Mapping) else []
        names += [name for name in task_vars if name not in names]
        unknown = unknown_variables(names, known_variables())
        if unknown:
            result["warnings"] = list(result.get("warnings") or []) + unknown
        result.update(changed=False, hosts=hosts, unknown_variables=unknown,
                      msg="%s of %s targeted" % (count_of(len(hosts), "host"), group))
        return result
