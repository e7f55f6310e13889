#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_preflight
short_description: Check what a fleet run targets, its playbook variables, and that no role variable is misspelled
version_added: 0.1.0
description:
  - Runs entirely on the controller, once per run (the fleet playbooks call it in their first play with C(run_once)).
  - >-
    Fails when no host of O(group) is targeted by the run (the inventory has none, or the limit matches none of them),
    with one sentence naming the group, the limit and the inventory. Without it, Ansible would print
    C(skipping: no hosts matched) and exit 0, and an AWX job with a wrong inventory would succeed.
  - >-
    Fails when a variable of the fleet playbooks themselves (C(fleet_serial), C(fleet_max_fail_percentage),
    C(fleet_force_reset), C(fleet_report_path)) has a value they cannot use, with one sentence per variable naming it,
    its value (one short line) and what it accepts; a template is rendered first, as the playbooks' keywords render
    it, and one that does not render is such a value. The fleet playbooks' first play runs it before the next play
    reads C(serial), which ansible-core turns into a number without error handling (C(abc) was a Python traceback).
    A C(fleet_serial) set in the inventory fails too: a play's C(serial) reads only extra vars and play vars, so the
    playbooks would run every targeted host in one batch.
  - >-
    Fails, before any host is touched, when a variable whose name starts with C(node_reset_) or C(inference_service_)
    is no variable of the C(cleanslate.gpu.node_reset) or C(cleanslate.gpu.inference_service) role (their
    C(meta/argument_specs.yml)) nor a fact they set, with one sentence per name naming the nearest known variable.
    Such a variable would be ignored, and a default is often the widest choice (C(node_reset_gpu_reset_gpu) for
    C(node_reset_gpu_reset_gpus) would reset every GPU). Names starting with C(__) (the roles' own) and names without
    those prefixes are not checked.
  - With the variable C(cleanslate_allow_unknown_variables) true, such names are only warned about, once each, and
    the run goes on; a value of it that is no boolean fails.
  - The variables checked are those the first targeted host of O(group) sees (extra vars, play vars, its group and host
    vars), not every host's, so that the check costs the same on one host or on a thousand.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - cleanslate.gpu.attributes
  - cleanslate.gpu.attributes.action
attributes:
  check_mode:
    details: Checks the same way; it never changes anything.
  diff_mode:
    support: none
options:
  group:
    description: The inventory group the run is for.
    type: str
    default: gpu_nodes
"""

EXAMPLES = r"""
- name: Check what the run targets
  hosts: all:localhost
  gather_facts: false
  tasks:
    - name: Fail when no GPU node is targeted or a role variable is misspelled
      cleanslate.gpu.fleet_preflight:
        group: gpu_nodes
      run_once: true
"""

RETURN = r"""
hosts:
  description: The targeted hosts of O(group), in the inventory's order.
  returned: success
  type: list
  elements: str
  sample: [gpu-node-01, gpu-node-02]
unknown_variables:
  description: >-
    One sentence per unknown role variable, when C(cleanslate_allow_unknown_variables) lets them pass (also shown as
    warnings).
  returned: success
  type: list
  elements: str
  sample: ["node_reset_grace_period is not a variable of the node_reset role: did you mean
            node_reset_gpu_reset_grace_period?"]
"""
