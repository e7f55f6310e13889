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
  - With O(hosts), builds each host's row from its C(node_reset_result) fact, set by the C(cleanslate.gpu.node_reset)
    role. It computes the MiB freed per GPU (NVML v2 "used" before the reset minus after it, each GPU followed by its UUID), the
    GPUs lost during the reset, and the seconds of each step as its module measured them. A host without that fact is
    reported V(not run).
  - The report play of C(cleanslate.gpu.reset) and C(cleanslate.gpu.verify) (C(playbooks/fleet_report.yml)) calls it
    with every host of the run.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - cleanslate.gpu.attributes
  - cleanslate.gpu.attributes.action
attributes:
  check_mode:
    details:
      - The report is written all the same (it is a file of the controller, not a change of any target), named
        C(<kind>-check-<stamp>), with C(check_mode) true in the JSON; its columns say what a reset would stop and remove,
        and each row lists C(would_stop).
  diff_mode:
    support: none
options:
  dest:
    description:
      - Directory on the controller for the report files; created when missing.
      - A relative path is under the controller's current directory (where C(ansible-playbook) runs); the playbooks
        default to C(reports), so that a playbook run by its FQCN never writes inside the installed collection.
    type: path
    required: true
  kind:
    description:
      - Which run the report is of (for example V(reset) or V(verify)); the first part of the file names.
      - A lower-case name of letters, digits, C(-) and C(_), at most 32 characters.
    type: str
    required: true
  stamp:
    description:
      - Time stamp of the run, the second part of the file names, for example C(20261129T101500Z); letters, digits,
        C(-) and C(_) only.
      - When not given, the controller's current UTC time in that form; when a report of that kind and second is already
        there (runs ending together, such as parallel heals), the next free name, C(<kind>-<stamp>-2), C(-3), ...
    type: str
  hosts:
    description:
      - Inventory names of the hosts to report, in this order; each row is built from the host's C(node_reset_result)
        fact.
      - 'Row keys: C(host), C(status), C(ok), C(reset_ok) (the verdict of node_reset alone, which O(rows) never change),
        C(fails_host) (node_reset_result''s rule of what fails the host - not ok, except GPUs in use after a reset in
        check mode), C(changed), C(killed) (in a read-only run: what a reset would stop),
        C(mib_freed), C(mib_freed_per_gpu) (by GPU index before the reset; a GPU without a reading after it has no
        entry), C(gpus_lost) (C({index, uuid})), C(shm_bytes_freed), C(shm_in_use) (each segment shm_clean kept because
        a live process maps or holds it, C({path, bytes, size, holders}) with each holder''s C({pid, name})),
        C(shm_leftovers) and C(tmp_leftovers) (each entry of shm_clean''s C(path) and C(tmp_path), C({path, done, why})
        with C(done) C(removed), C(would remove) or C(kept); a removed entry says whether nobody held it or it was held
        only by processes the reset stopped, a kept one its holder or shm_clean''s rule), C(stopped) (a real reset: one
        C({pid, name, cmdline, gpus, reason, signal, seconds}) per process it stopped, C(signal) V(SIGTERM) or
        V(SIGKILL), C(cmdline) with its secrets masked by gpu_reset), C(bytecode_removed), C(seconds),
        C(seconds_per_step), C(problems), C(evidence) (C({directory, not_kept}): where the host keeps the evidence taken
        before the reset signalled anything, null when none was kept, and what was not kept, one sentence each), and
        C(failed_step) when a step failed, C(mib_used) in a verify run; for the
        instances of a host with several servers, C(gpu_uuids) (UUID by index before the reset) and C(killed_gpus) (the
        GPU indices each killed process held).'
      - 'Each list of processes or leftovers keeps its first 50 entries, and C(stopped_left_out), C(would_stop_left_out),
        C(shm_leftovers_left_out) and C(tmp_leftovers_left_out) count the rest; a command line is cut after 300
        characters, saying how many more there were.'
      - 'In a read-only run (a verify run, or any run in check mode) each row also has C(would_stop), one
        C({pid, name, cmdline, gpus, reason}) per process a reset would stop, and C(mib_used) (MiB used per GPU index); the
        Markdown table titles its columns C(would stop), C(MiB used), C(shm would remove) and C(bytecode would remove),
        and lists each process a reset would stop under its host.'
      - 'Under the table the Markdown lists each segment kept in use with its size and holders (C(Kept in use)); per
        host how many of shm_clean''s leftovers were removed, each kept one with why and each one removed because the
        reset stopped its holder; then each process stopped (C(Stopped)) or that a reset would stop, one line each.'
      - C(seconds) is the sum of C(seconds_per_step), the times the host's modules measured; a skipped step has none.
    type: list
    elements: str
    default: []
  rows:
    description:
      - One dictionary per host, each with C(host). Its keys are added to the row of that host built from O(hosts)
        (a row of its own for another host). Every key is copied through to the JSON; C(problems) are appended and
        C(ok) is and-ed, so an added result can only make a host worse.
      - A host with several servers adds C(instances), one dictionary per server with C(unit), C(gpus) and C(reset);
        each gets C(host), C(stopped), C(killed) (the processes killed that held one of its GPUs) and C(mib_freed) (on
        its GPUs), the JSON lists them all under C(instances), and the Markdown adds a table of them (C(would reset)
        in a read-only run).
      - The Markdown table reads C(host), C(status), C(ok), C(killed), C(mib_freed), C(shm_bytes_freed),
        C(bytecode_removed), C(seconds) and C(problems), plus the keys of O(columns).
    type: list
    elements: dict
    default: []
  columns:
    description:
      - More columns of the Markdown table, after the standard ones, each C({key, title}); C(key) names a row key and
        C(title) (default the key) heads the column.
    type: list
    elements: dict
    default: []
  merge:
    description:
      - Fleet reports (JSON files written by this plugin, of the same O(kind)) whose rows become rows of this report,
        for example those of C(--limit) slices run side by side or of the slices of an AWX sliced job. Paths or glob
        patterns (C(reports/slice*/reset-*.json)).
      - A host in several of them keeps the row of the newest report (by its time stamp, the later file on a tie), so
        a slice run again replaces its earlier run; a host of O(hosts) gets the row built from its
        C(node_reset_result) instead. The rows of O(rows) are added after.
      - A pattern that matches no file, a file that is not such a report or a report of another kind fails the task
        with one sentence each, and nothing is written.
    type: list
    elements: path
    default: []
    version_added: 0.1.0
  not_run:
    description:
      - Why a host of O(hosts) without C(node_reset_result) was not run, for its row (for example that the rollout
        stopped). When not given, the row says the host failed or did not answer before the role's first step.
    type: str
  trigger:
    description:
      - What started the run when no person did, for example the alert of the heal rulebook (C(cleanslate.gpu.heal)
        passes C(by), C(alertname), C(fingerprint), C(starts_at), C(heals_in_window)), kept as C(trigger) in the JSON
        report and said in a line under the Markdown report's title.
    type: dict
    version_added: 0.2.0
notes:
  - Writing the report is not a change of any target, so the task reports C(changed=false) and a second reset of
    a clean fleet recaps C(changed=0) everywhere.
"""

EXAMPLES = r"""
- name: Write the report of a reset, one row per host from its node_reset_result
  cleanslate.gpu.fleet_report:
    dest: reports
    kind: reset
    hosts: "{{ ansible_play_hosts_all }}"
  delegate_to: localhost
  run_once: true
  register: report

- name: Print it
  ansible.builtin.debug:
    msg: "{{ report.markdown }}"
  run_once: true

- name: Add a column of another role's results to the same report
  cleanslate.gpu.fleet_report:
    dest: reports
    kind: reset_and_serve
    hosts: "{{ ansible_play_hosts_all }}"
    rows:
      - host: gpu-node-01
        service: ready
    columns:
      - key: service
        title: service
  delegate_to: localhost
  run_once: true

- name: Merge the reports of slices run side by side into one fleet report
  cleanslate.gpu.fleet_report:
    dest: /srv/reports
    kind: reset
    merge:
      - /srv/reports/slice*/reset-*.json
  run_once: true

- name: Write a report from rows built elsewhere
  cleanslate.gpu.fleet_report:
    dest: /srv/reports
    kind: reset
    stamp: 20261129T101500Z
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
rows:
  description: The rows written, one per host (see O(hosts) and O(rows) for the keys).
  returned: always
  type: list
  elements: dict
  sample: [{"host": "gpu-node-01", "status": "ok", "ok": true, "changed": true, "killed": 9, "mib_freed": 565000,
            "mib_freed_per_gpu": {"0": 282500, "1": 282500}, "gpus_lost": [], "shm_bytes_freed": 1048576,
            "bytecode_removed": 1, "seconds": 4.2, "seconds_per_step": {"gpu_reset": 3.1, "nvml_verify": 0.4},
            "problems": []}]
merged_from:
  description: The report files of O(merge) whose rows were read, in the order read.
  returned: always
  type: list
  elements: str
  sample: [/srv/reports/slice1/reset-20261129T101500Z.json, /srv/reports/slice2/reset-20261129T101502Z.json]
  version_added: 0.1.0
trigger:
  description: O(trigger) as given; empty when not given.
  returned: always
  type: dict
  sample: {"by": "cleanslate.gpu.heal", "alertname": "CleanslateGpuEngineDown", "fingerprint": "5c3a1e2f9d0b7a64"}
  version_added: 0.2.0
markdown:
  description: The Markdown report, one list item per line.
  returned: always
  type: list
  elements: str
  sample: ["# Fleet reset report 20261129T101500Z", "", "| host | status | killed | MiB freed | shm freed | bytecode removed | seconds |"]
"""
