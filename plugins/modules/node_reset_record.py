#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_reset_record
short_description: Record node_reset_result and write it for node_exporter's textfile collector, in one task
version_added: 0.6.0
description:
  - Computes the C(cleanslate.gpu.node_reset) role's result from its steps' results, as the filter
    C(cleanslate.gpu.node_reset_result) does, and sets it as the host's fact C(node_reset_result).
  - With O(metrics_dir), and a host that answered, writes that result on the host as
    M(cleanslate.gpu.textfile_metrics) would in a task of its own (the metric families of C(cleanslate.gpu.metric_families)),
    with the task's check mode and diff mode.
  - A metrics file that cannot be written never changes the reset's outcome, the task neither fails nor changes;
    a warning says why, and RV(metrics) holds the module's answer.
  - One task instead of two, so that a host with metrics on costs the controller no more tasks than one without
    (the collection's C(docs/fleet_scale.md)). The role's C(tasks/result.yml) runs it.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - cleanslate.gpu.attributes
  - cleanslate.gpu.attributes.action
attributes:
  check_mode:
    details: The metrics are not written; M(cleanslate.gpu.textfile_metrics) says what it would write.
  diff_mode:
    support: full
    details: The diff of the metrics file, when it is written.
options:
  steps:
    description: The registered result of each step of the role, by the step's name (the filter's first argument).
    type: dict
    required: true
  result:
    description:
      - The filter's other arguments (C(host), C(kind), C(read_only), C(failed_step), C(failed_result), C(invalid),
        C(started), C(unit), C(units)).
    type: dict
    required: true
  metrics_dir:
    description: The collector's directory on the host. Omitted, no metrics are written.
    type: path
  metrics_later:
    description: The caller writes the metrics later (the fact C(__node_reset_metrics_pending) says so).
    type: bool
    default: false
seealso:
  - module: cleanslate.gpu.textfile_metrics
"""

EXAMPLES = r"""
- name: Collect the results into node_reset_result and write them for node_exporter
  cleanslate.gpu.node_reset_record:
    steps:
      gpu_reset: "{{ reset.steps.gpu_reset }}"
    result:
      host: "{{ inventory_hostname }}"
    metrics_dir: /var/lib/node_exporter/textfile_collector
"""

RETURN = r"""
ansible_facts:
  description: C(node_reset_result), the role's result (see the role's documentation), and C(__node_reset_metrics_pending).
  returned: always
  type: dict
metrics:
  description:
    - The answer of M(cleanslate.gpu.textfile_metrics); C({skipped, true}) when nothing was to be written (no
      O(metrics_dir), or a host that did not answer). C(unreachable) and C(msg) when the host stopped answering.
  returned: always
  type: dict
  sample: {changed: true, path: /var/lib/node_exporter/textfile_collector/cleanslate_gpu_node_reset.prom}
"""
