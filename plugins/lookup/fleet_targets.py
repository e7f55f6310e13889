# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet_targets
short_description: The hosts of a group that a run targets; an error when there are none
version_added: 0.1.0
description:
  - Returns the hosts of the group (the first term, C(gpu_nodes) if none) that the run's limit admits (all of them
    without C(--limit)), in the inventory's order.
  - Fails with one sentence naming the group, the limit and the inventory sources when there is none.
  - >-
    The fleet playbooks' first play takes its C(hosts) from this lookup. A play's C(hosts) is templated before the
    limit is applied, so the check holds whatever the inventory and limit are; a task could not, since a play whose
    hosts the limit removes is skipped (C(skipping: no hosts matched)) and the run ends with exit status 0.
  - The limit is read from C(ansible_limit) and applied as C(ansible-playbook --limit) applies it (patterns,
    C(&), C(!), C(@file)).
  - Under C(ansible-playbook --syntax-check), which runs nothing, no host is no error.
  - >-
    It also loads the collection's filter plugins in the process that templates it. Templated as a play's C(hosts), in
    the controller's main process, it spares every worker forked afterwards from importing them itself (about 90 ms of
    CPU a worker).
author:
  - cleanslate.gpu maintainers (@cleanslate)
options:
  _terms:
    description: The inventory group; one at most.
    type: list
    elements: str
    required: false
"""

EXAMPLES = r"""
- name: Check what the run targets
  hosts: "{{ query('cleanslate.gpu.fleet_targets', 'gpu_nodes') }}"
  gather_facts: false
  tasks:
    - name: Warn about misspelled role variables
      cleanslate.gpu.fleet_preflight:
        group: gpu_nodes
      run_once: true
"""

RETURN = r"""
_raw:
  description: The targeted hosts of the group, in the inventory's order.
  type: list
  elements: str
"""

from ansible import context
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._filters_preloaded import load_filters_before_forks
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._fleet_targets import limited, no_target_message, targeted


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        terms = list(terms or [])
        if len(terms) > 1 or (terms and (not isinstance(terms[0], str) or not terms[0])):
            raise AnsibleLookupError("fleet_targets takes one group name (a non-empty string), got %r" % (terms,))
        group = terms[0] if terms else "gpu_nodes"
        variables = variables or {}
        groups = variables.get("groups") or {}
        limit = variables.get("ansible_limit")
        hosts = targeted(groups.get(group), limited(groups, limit, self._loader))
        # `ansible-playbook --syntax-check` (and ansible-lint's) templates a play's hosts too, but
        # runs nothing: a check without an inventory is no run that would succeed doing nothing.
        if not hosts and not context.CLIARGS.get("syntax"):
            raise AnsibleLookupError(no_target_message(group, limit, groups, variables.get("ansible_inventory_sources")))
        load_filters_before_forks()
        return hosts
