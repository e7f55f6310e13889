#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_report
short_description: Write the fleet report of a reset or verify run on the controller
version_added: 0.1.0
description:
  - Writes one report of a fleet run under O(dest) on the controller, as JSON (C(<kind>-<stamp>.json)) and as a Markdown
    table (C(<kind>-<stamp>.md)) with one row per host, then the hosts that are not ok with their problems.
  - Runs entirely on the controller, whatever host the task runs for; it never connects to a target.
  - The report play of C(cleanslate.gpu.reset) and C(cleanslate.gpu.verify) builds the rows from each host's
    C(node_reset_result) fact.
author:
  - cleanslate.gpu maintainers (@cleanslate)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Nothing is written; RV(markdown) holds the table that would be written.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  dest:
    description: Directory on the controller for the report files; created when missing.
    type: path
    required: true
  kind:
    description: Which run the report is of; the first part of the file names.
    type: str
    required: true
    choices: [reset, verify, reset_and_serve]
  stamp:
    description: Time stamp of the run, the second part of the file names, for example C(20261129T101500Z).
    type: str
    required: true
  rows:
    description:
      - One dictionary per host. The Markdown table reads C(host), C(status), C(ok), C(killed), C(mib_freed),
        C(shm_bytes_freed), C(bytecode_removed), C(seconds) and C(problems); the JSON keeps every key.
      - A row with a non-empty C(service) (the C(inference_service_result) of C(cleanslate.gpu.reset_and_serve)) adds
        the service columns (engine, ready s, first completion ms, acceptance, service status), and a service that is
        not V(ready) lists the host with the service's reason.
    type: list
    elements: dict
    required: true
notes:
  - Writing the report is not a change of any target, so the task reports C(changed=false) and a second reset of
    a clean fleet recaps C(changed=0) everywhere.
"""

EXAMPLES = r"""
- name: Write the report of this reset
  cleanslate.gpu.fleet_report:
    dest: "{{ playbook_dir }}/../reports"
    kind: reset
    stamp: "{{ now(utc=true, fmt='%Y%m%dT%H%M%SZ') }}"
    rows:
      - host: gpu-node-01
        status: ok
        ok: true
        killed: 9
        mib_freed: 565000
        shm_bytes_freed: 1048576
        bytecode_removed: 1
        seconds: 4.2
        problems: []
  run_once: true
  register: report

- name: Print it
  ansible.builtin.debug:
    msg: "{{ report.markdown }}"
  run_once: true
"""

RETURN = r"""
json_path:
  description: Path of the JSON report on the controller.
  returned: always
  type: str
  sample: /srv/ansible/reports/reset-20261129T101500Z.json
markdown_path:
  description: Path of the Markdown report on the controller.
  returned: always
  type: str
  sample: /srv/ansible/reports/reset-20261129T101500Z.md
markdown:
  description: The Markdown report, one list item per line.
  returned: always
  type: list
  elements: str
  sample: ["# Fleet reset report 20261129T101500Z", "", "| host | status | killed | MiB freed | shm freed | bytecode removed | seconds |"]
"""
