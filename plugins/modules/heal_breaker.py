#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: heal_breaker
short_description: Decide whether an alert may heal a host, with a circuit breaker kept on the controller
version_added: 0.2.0
description:
  - The first task of the self-healing playbook C(cleanslate.gpu.heal) (docs/self_healing.md). Runs entirely on the
    controller; it never connects to a target.
  - With O(state=heal), refuses the heal when the alert (the rulebook's event, the variable C(ansible_eda.event))
    names another host than O(host), or none, or names a C(unit) label other than the unit the host is served with;
    then counts it against the host's circuit breaker. At most O(max_heals) heals within O(window_s) seconds; the next
    request opens the breaker, and every request while it is open is refused and starts the quiet period again. An
    open breaker closes at the first request O(quiet_s) seconds or more after the previous one, or with
    O(state=closed).
  - The alert is untrusted and never templated; pass nothing of it as an option. The action reads the event from its
    variables raw, and only its C(labels) (C(host), C(alertname), C(unit)), C(fingerprint), C(startsAt) and
    C(meta.received_at); anything else is ignored. Each is kept as plain text by one rule, a value that is not a string
    is empty, every secret of O(secrets) is masked, each character that is not printable (controls, newlines, format
    and surrogate characters, any space but U+0020) is written as its Python escape (C(\n), C(\u2003)), and the text
    is cut to 256 characters, the last one an ellipsis. The comparisons with O(host) and O(configured_units) are made
    on the alert's exact values.
  - The directory of O(path) and a O(metrics_dir) that is set, and each directory above them, must be real directories (no symbolic
    link) owned by root or by the user running the play, writable by no one else (a sticky directory such as C(/tmp)
    may be above them); otherwise the task fails with one sentence naming the directory at fault, in check mode too.
  - The state is one JSON file, O(path), changed under an exclusive lock (a C(.lock) file beside it) and written to a
    temporary name that is renamed over it, so heals of different hosts running at once never lose a count. A file
    that is not a breaker state is never overwritten; the task fails with one sentence naming it.
  - After each change, the whole state is written as node_exporter textfile metrics, C(cleanslate_gpu_heal.prom) in
    O(metrics_dir), when that directory exists.
  - An alert that began (C(startsAt)) before the host's last heal started is refused without being counted, since that
    heal answered it (a repeat of the alert, queued behind the rulebook's lock while the heal ran).
  - With O(state=open), opens the host's breaker at once, after a heal's reset ended O(cause) (a GPU whose kernel log
    holds an Xid that only a GPU reset, a reboot or service clears, none of which the collection does), since counting it
    toward O(max_heals) would reset the host and reload its model again for nothing. Such a breaker closes only with
    O(state=closed), never after O(quiet_s). The alert is not read. The reason quotes the host's reset problems (which
    GPU, which Xid line), read by the action from the host's C(node_reset_result) as stored, never templated; secrets
    of O(secrets) masked, cut to 2000 characters.
  - When the breaker opens, a warning C(cleanslate.gpu heal breaker opened) says why.
  - On a host of several servers (more than one O(configured_units)), an alert with a C(unit) label counts against that
    server's own breaker (host and unit), so crashes of one server never stop the heals of another; an alert without a
    unit counts against the host's breaker. The host's breaker, when open (its count, or O(state=open) for a GPU that
    needs a reboot), refuses every heal of the host, each unit's included.
  - With O(fleet_max_heals) or O(fleet_max_percent) set, a heal the host's breaker lets through is then counted by the
    fleet breaker, in the same state file under the same lock; at most that many hosts healed within O(fleet_window_s)
    (a host healed again in the window adds no host). The next host opens the fleet breaker; it and every later heal,
    of any host, is refused and kept in the state's list of hosts held back (host, unit, alert, time), and a warning
    C(cleanslate.gpu heal fleet breaker opened) says why. The fleet breaker closes only with O(state=closed) and
    O(fleet=true).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - cleanslate.gpu.attributes
  - cleanslate.gpu.attributes.action
attributes:
  check_mode:
    details: Decides on the state as it is and writes nothing (neither the state nor the metrics).
  diff_mode:
    support: none
options:
  path:
    description: The breaker's state file on the controller, an absolute path; its directory is created (mode 0700).
    type: str
    default: /var/lib/cleanslate-gpu/heal_breaker.json
  host:
    description: The inventory name of the host to heal (or whose breaker to close).
    type: str
    required: true
  state:
    description:
      - V(heal) decides and counts a heal; V(closed) closes the host's breakers (its own and each server's, or only
        O(unit)'s) and forgets their heals, or with O(fleet=true) the fleet's; V(open) opens the host's at once for
        O(cause).
    type: str
    choices: [heal, closed, open]
    default: heal
  cause:
    description:
      - With O(state=open), required; the status of the host's reset that no heal can change (node_reset's
        C(needs_reboot) or C(needs_service)).
    type: str
    choices: [needs_reboot, needs_service]
  secrets:
    description:
      - The host's secrets, masked in everything kept of the alert (the result, the state, the metrics and so the
        report), in every form a program prints them; each item a mapping of the role C(cleanslate.gpu.inference_service)'s
        secrets (C(inference_service_secrets), an instance's C(secrets)), whose C(api_key), C(hf_token),
        C(admin_api_key) and C(environment) values are masked. Anything else is ignored.
    type: list
    elements: raw
    default: []
  configured_units:
    description:
      - The units the host is served with, one per server (its C(inference_service_instances)' units, or its
        C(inference_service_unit)); an empty entry, or none given, is the C(cleanslate.gpu.inference_service) role's
        default C(inference_service_unit). An alert with another C(unit) label is refused.
    type: list
    elements: str
  max_heals:
    description: Heals of one host allowed within O(window_s); a whole number from 1 to 1000.
    type: raw
    default: 3
  window_s:
    description: The breaker's window in seconds, from 1 to 366 days.
    type: raw
    default: 3600
  quiet_s:
    description: Seconds without a request after which an open breaker closes at the next request; 1 to 366 days.
    type: raw
    default: 3600
  metrics_dir:
    description:
      - The controller's node_exporter textfile directory, absolute; V('') or a directory that does not exist writes no
        metrics file.
      - Not set, C(/var/lib/prometheus/node-exporter) when it exists and no one else may write it or a directory above
        it; otherwise no file and a warning, and the heal goes on (Debian's C(prometheus-blackbox-exporter) package
        gives C(/var/lib/prometheus) to its own user). A directory set here that others may write refuses the heal.
    type: str
  fleet_max_heals:
    description:
      - The fleet's cap, hosts healed within O(fleet_window_s); a whole number from 1 to 100000. Not set, and
        O(fleet_max_percent) not set either, no fleet cap.
    type: raw
  fleet_max_percent:
    description:
      - The fleet's cap as a percentage of O(fleet_size), from 1 to 100, rounded down to whole hosts (never below 1).
        With O(fleet_max_heals) too, the smaller cap wins.
    type: raw
  fleet_size:
    description: The hosts O(fleet_max_percent) is a share of; required with it (the heal playbook passes the hosts of C(gpu_nodes)).
    type: raw
  fleet_window_s:
    description: The fleet breaker's window in seconds, from 1 to 366 days.
    type: raw
    default: 3600
  fleet:
    description: With O(state=closed), close the fleet breaker and forget its heals and the hosts it held back, instead of the host's.
    type: bool
    default: false
  unit:
    description: With O(state=closed), close only this server's breaker on O(host).
    type: str
"""

EXAMPLES = r"""
- name: Count the heal against the host's circuit breaker
  cleanslate.gpu.heal_breaker:
    host: "{{ inventory_hostname }}"
    # The alert is read from ansible_eda.event by the action itself: never template it here.
    secrets: "{{ [inference_service_secrets | default({})] }}"
    max_heals: 3
    window_s: 3600
  delegate_to: localhost
  register: heal_breaker_decision

- name: Open the breaker of a host whose reset found a GPU that needs a reboot
  cleanslate.gpu.heal_breaker:
    host: "{{ inventory_hostname }}"
    state: open
    cause: "{{ node_reset_result.status }}"
  delegate_to: localhost
  when: node_reset_result.status in ['needs_reboot', 'needs_service']

- name: Count the heal against the fleet's cap too (at most 2 hosts, or 10 % of the fleet, within an hour)
  cleanslate.gpu.heal_breaker:
    host: "{{ inventory_hostname }}"
    fleet_max_heals: 2
    fleet_max_percent: 10
    fleet_size: "{{ groups['gpu_nodes'] | length }}"
    fleet_window_s: 3600
  delegate_to: localhost
  register: heal_breaker_decision

- name: Close the fleet breaker once a human has looked
  cleanslate.gpu.heal_breaker:
    host: "{{ inventory_hostname }}"
    state: closed
    fleet: true
  delegate_to: localhost
  run_once: true

- name: Close the breaker of a host a human fixed
  cleanslate.gpu.heal_breaker:
    host: gpu-node-07
    state: closed
  delegate_to: localhost
"""

RETURN = r"""
allowed:
  description: Whether the heal may run (O(state=heal)).
  returned: when O(state=heal)
  type: bool
  sample: true
open:
  description: Whether the breaker that decided (the host's, the server's, or the fleet's) is open after this request.
  returned: success
  type: bool
  sample: false
opened:
  description: Whether this request opened the breaker.
  returned: when O(state=heal) or O(state=open)
  type: bool
  sample: false
closed:
  description: Whether a quiet period closed the breaker before this request was counted.
  returned: when the request reached the breaker
  type: bool
  sample: false
heals:
  description: The host's heals within the window, this one included when allowed.
  returned: when the request reached the breaker
  type: int
  sample: 1
reason:
  description: Why the heal was refused (one sentence); empty when allowed. With O(state=open), why the breaker is open.
  returned: when O(state=heal) or O(state=open)
  type: str
  sample: gpu-node-07 was healed 3 times within 3600 s, the breaker is open, healing it stopped and the node is left as it is
    for a human
trigger:
  description: Who asked for the heal, from the alert, each field plain text by the rule above.
  returned: success
  type: dict
  sample: {"alertname": "CleanslateGpuEngineDown", "fingerprint": "5c3a1e2f9d0b7a64", "unit": "", "starts_at": "2026-12-02T01:00:00Z",
           "received_at": "2026-12-02T01:00:03.120Z"}
answered:
  description: True when the alert began before the host's last heal started (that heal answered it); nothing is counted.
  returned: when an earlier heal answered the alert
  type: bool
  sample: true
fleet_open:
  description: True when the fleet breaker refused the heal (the host is held back).
  returned: when the fleet breaker refused the heal
  type: bool
  sample: true
unit:
  description: The server whose breaker counted the heal, on a host of several servers.
  returned: when the alert's unit chose a server's breaker
  type: str
  sample: llama.service
was_open:
  description: Whether the breaker was open before O(state=closed).
  returned: when O(state=closed)
  type: bool
  sample: true
metrics_written:
  description: Whether C(cleanslate_gpu_heal.prom) was written.
  returned: success
  type: bool
  sample: true
"""
