#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_verdict
short_description: Fail a host that is not ok, or count it unreachable, without contacting it
version_added: 0.1.0
description:
  - Runs entirely on the controller; the fleet playbooks' last play runs it for each host whose result is not ok.
  - Marks the host unreachable when O(status) is C(unreachable) (ansible-playbook then exits with 4), else failed
    (exit status 2), with O(msg) as the message. The host is not contacted again; a host the run already found
    silent would otherwise cost one more connection time-out.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - cleanslate.gpu.attributes
  - cleanslate.gpu.attributes.action
attributes:
  check_mode:
    details: The same verdict; it never changes anything.
  diff_mode:
    support: none
options:
  status:
    description: The host's status, as in C(node_reset_result.status).
    type: str
    required: true
  msg:
    description: The sentence the failure shows.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Fail the hosts that are not ok
  cleanslate.gpu.fleet_verdict:
    status: "{{ node_reset_result.status | default('not run') }}"
    msg: "{{ inventory_hostname }} is {{ node_reset_result.status | default('not run') }}"
"""

RETURN = r"""
msg:
  description: O(msg).
  returned: always
  type: str
  sample: gpu-a01 is unreachable
"""
