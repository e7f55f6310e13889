# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet playbooks' first task, once per run on the controller: is any host of the group
targeted, and is every role variable given one the roles know?

Ansible ends a run whose limit matches hosts, none of them in the play's group, with
"skipping: no hosts matched" and exit status 0: an AWX job with a wrong inventory "succeeds".
And a misspelled role variable (node_reset_gpu_reset_gpu for node_reset_gpu_reset_gpus) would be
ignored, its default often the widest choice (every GPU): it stops the run here, before any host is
touched, unless cleanslate_allow_unknown_variables is true (plugin_utils/_unknown_variables.py). Both are
checked here, in Python, once per run (fewer tasks: docs/design.md#why-tasks-are-few).
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleActionFail
from ansible.utils.vars import load_extra_vars

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._fleet_targets import no_target_message, targeted
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._playbook_variables import problems as playbook_problems
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._playbook_variables import unread
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_text import count_of
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._unknown_variables import ALLOW, refusals

ARGUMENT_SPEC = {
    "group": {"type": "str", "default": "gpu_nodes"},
}


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args, task_vars, result):
        group = args["group"]
        groups = task_vars.get("groups") or {}
        hosts = targeted(groups.get(group), task_vars.get("ansible_play_hosts_all"))
        if not hosts:
            raise AnsibleActionFail(no_target_message(group, task_vars.get("ansible_limit"), groups,
                                                      task_vars.get("ansible_inventory_sources")))
        # The variables as the first targeted host sees them: extra vars, play vars, its group
        # and host vars: one host's view, not every host's (docs/design.md#why-tasks-are-few).
        hostvars = task_vars.get("hostvars") or {}
        first = hostvars[hosts[0]] if hosts[0] in hostvars else {}
        names = list(first.keys()) if isinstance(first, Mapping) else []
        names += [name for name in task_vars if name not in names]
        stops, unknown = refusals(names, self._templar.template(task_vars.get(ALLOW, False)))
        # Every refusal at once, before the next play's keywords read a playbook variable (serial:
        # fleet_serial): a failure here ends the run.
        # What a play keyword reads: extra vars (-e, AWX's) and play vars (an import_playbook's vars).
        given = set(load_extra_vars(self._loader)) | set(self._task.get_play().vars or {})
        bad = playbook_problems(task_vars, self._templar.template) + unread(task_vars, given) + stops
        if bad:
            raise AnsibleActionFail("\n".join(bad))
        if unknown:
            result["warnings"] = list(result.get("warnings") or []) + unknown
        result.update(changed=False, hosts=hosts, unknown_variables=unknown,
                      msg="%s of %s targeted" % (count_of(len(hosts), "host"), group))
        return result
