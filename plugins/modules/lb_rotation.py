#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: lb_rotation
short_description: Take a server out of a load balancer's rotation, draining it first, and put it back
version_added: 0.2.0
description:
  - Runs on the load balancer's host (C(delegate_to) the host that has HAProxy's admin socket, or any host that can
    run the hook); it never contacts the server itself.
  - With O(balancer=haproxy), talks to HAProxy's runtime API on its admin socket O(socket) (a C(stats socket) line
    with C(level admin)), one command per connection. O(state=out) sets the server to C(drain) (no new requests, its
    current sessions go on), waits until HAProxy counts no current session on it (C(scur) of C(show stat)) or
    O(drain_timeout_s) passed, then sets it to C(maint); past the timeout the sessions still open are counted in
    RV(sessions_at_maint). O(state=in) sets it C(ready). The state is read first (C(srv_admin_state) of
    C(show servers state)); a server already where it is asked to be is not changed.
  - With O(balancer=command), runs O(command) with two more arguments, C(out) or C(in) and O(server), never through a
    shell; exit status 0 means done. With O(balancer=http), POSTs a JSON object of O(server) as C(server), C(out) or C(in) as
    C(state), and O(backend) as C(backend) to O(url) with O(headers); a 2xx answer means done. A hook's balancer has no state this module
    can read, so O(state=out) and O(state=in) always run it.
  - O(state=out) records that this module took the server out, in a marker file in O(marker_dir) (one per backend and
    server), unless HAProxy had the server in drain or maintenance already (someone else took it out).
    O(state=restored) puts the server back only when that marker is there, and otherwise changes nothing; O(state=in)
    and O(state=restored) remove the marker once the server is back.
  - The server and backend names go to the balancer as they are, over HAProxy's line protocol where C(;) and a newline
    start another command. With HAProxy, a name must be HAProxy's own kind (letters, digits, C(_), C(.), C(:) and C(-), at most 255);
    with a hook, printable ASCII without spaces or C(;). Any other name is refused before anything is opened.
  - Every failure is one sentence in C(msg); the secrets of O(headers) and those the O(command) or O(url) carries
    (a flag's C(--token) value, a URL's password) never reach the result.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details: With HAProxy, reads the state and returns what would change; sends no command that changes it, writes
      and removes no marker. A hook is not run.
  diff_mode:
    support: full
    details: The server's state before and after, as HAProxy has it (C(unknown) for a hook).
options:
  server:
    description: The server's name on the balancer (HAProxy's C(server) line's name).
    type: str
    required: true
  state:
    description:
      - V(out) takes the server out of rotation (HAProxy drains it first); V(in) puts it back; V(restored) puts it
        back only if this module took it out (the marker in O(marker_dir)), else changes nothing.
    type: str
    choices: [out, in, restored]
    required: true
  balancer:
    description: HAProxy's runtime API (V(haproxy)), or a hook for another balancer (V(command), V(http)).
    type: str
    choices: [haproxy, command, http]
    default: haproxy
  backend:
    description: The HAProxy backend that holds O(server); required with O(balancer=haproxy). Passed to the hooks in
      the JSON body (O(balancer=http)) and names the marker.
    type: str
    default: ""
  socket:
    description: HAProxy's admin socket on this host (a unix socket of a C(stats socket ... level admin) line).
    type: path
    default: /run/haproxy/admin.sock
  drain_timeout_s:
    description: Seconds O(state=out) waits for the server's current sessions to end before it goes to maintenance
      anyway; 0 to 3600.
    type: int
    default: 60
  command:
    description: With O(balancer=command), the hook's argument vector, its program an absolute path; it runs with
      C(out) or C(in) and O(server) appended, as the user running the module. As root, the program must be root's, in
      directories no one else may write (else it is refused, not run). Its output is masked for the
      secrets it carries, but Ansible shows a module's arguments in verbose output, so give the hook its secret in a
      file, not here.
    type: list
    elements: str
  url:
    description: With O(balancer=http), the http or https URL the transition is POSTed to (no redirect followed).
    type: str
  headers:
    description: With O(balancer=http), HTTP headers sent with the POST (an C(Authorization) token); never printed.
    type: dict
    default: {}
  timeout_s:
    description: Seconds allowed for the hook, or for each exchange on HAProxy's socket; more than 0, at most 3600.
    type: float
    default: 30
  marker_dir:
    description:
      - The directory of the markers, made mode 0700 when missing. It and each directory above it must be owned by
        root or the user running the module and writable by no one else.
    type: path
    default: /var/lib/cleanslate-gpu/rotation
notes:
  - The runtime API's changes last until HAProxy restarts or reloads; a reload puts every server back to its
    configured state unless HAProxy loads a C(server-state-file).
"""

EXAMPLES = r"""
- name: Take the server out of HAProxy's rotation, letting its requests finish for 2 minutes
  cleanslate.gpu.lb_rotation:
    server: node1-vllm-a
    backend: vllm
    state: out
    drain_timeout_s: 120
  delegate_to: lb1

- name: Put it back, only if this collection took it out
  cleanslate.gpu.lb_rotation:
    server: node1-vllm-a
    backend: vllm
    state: restored
  delegate_to: lb1

- name: Another balancer, through a command run as `lb-hook --pool a out node1-vllm-a`
  cleanslate.gpu.lb_rotation:
    server: node1-vllm-a
    balancer: command
    command: [/usr/local/bin/lb-hook, --pool, a]
    state: out
  delegate_to: localhost

- name: Another balancer, through its HTTP API
  cleanslate.gpu.lb_rotation:
    server: node1-vllm-a
    backend: vllm
    balancer: http
    url: https://lb.example/api/rotation
    headers:
      Authorization: "Bearer {{ lb_api_token }}"
    state: in
  delegate_to: localhost
"""

RETURN = r"""
state_before:
  description: The server's state before, V(ready), V(drain) or V(maint) as HAProxy has it; V(unknown) with a hook.
  returned: always
  type: str
  sample: ready
state_after:
  description: The server's state after (in check mode, what it would be); V(unknown) with a hook.
  returned: always
  type: str
  sample: maint
sessions_at_maint:
  description: The server's current sessions when it went to maintenance, 0 after a clean drain; sessions cut when
    O(drain_timeout_s) passed. 0 when it did not go to maintenance.
  returned: always
  type: int
  sample: 0
drained_s:
  description: Seconds spent waiting for the server's sessions to end.
  returned: always
  type: float
  sample: 4.2
taken_out_by_us:
  description: Whether this module's marker was there before (it took the server out earlier).
  returned: always
  type: bool
  sample: false
msg:
  description: What was done, or why it failed, in one sentence.
  returned: always
  type: str
  sample: vllm/node1-vllm-a drained in 4.2 s and is in maintenance
"""

import json
import os
import time
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cleanslate.gpu.plugins.module_utils import _haproxy
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import fail_on_problems, number_problem
from ansible_collections.cleanslate.gpu.plugins.module_utils._lb_hooks import HookError, post, run_command
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker, argument_secrets
from ansible_collections.cleanslate.gpu.plugins.module_utils._rotation_names import name_fault
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import trusted_directory_problem

POLL_S = 0.25


def _shown(value) -> str:
    return repr(value).encode("ascii", "backslashreplace").decode("ascii")


def input_problems(params):
    haproxy = params["balancer"] == "haproxy"
    problems = []
    for option in ("server", "backend"):
        name = params[option]
        if option == "backend" and name == "" and not haproxy:
            continue
        fault = name_fault(name, params["balancer"])
        if fault:
            problems.append("%s %s: %s" % (option, _shown(name), fault))
    problems.append(number_problem("drain_timeout_s", params["drain_timeout_s"], minimum=0, maximum=3600, unit="s"))
    problems.append(number_problem("timeout_s", params["timeout_s"], above=0, maximum=3600, unit="s"))
    if params["balancer"] == "command" and (not params["command"] or not os.path.isabs(params["command"][0])):
        problems.append("command must be a list whose first item is the hook program's absolute path")
    if params["balancer"] == "http" and not str(params["url"]).lower().startswith(("http://", "https://")):
        problems.append("url must be an http:// or https:// URL")
    if not all(isinstance(value, str) for value in params["headers"].values()):
        problems.append("headers: each value must be a string")
    if not os.path.isabs(params["marker_dir"]):
        problems.append("marker_dir must be an absolute path, got %s" % _shown(params["marker_dir"]))
    return problems


class Rotation:
    """One transition of one server, the marker kept beside it."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.check = module.check_mode
        params = self.params
        self.name = "%s/%s" % (params["backend"], params["server"]) if params["backend"] else params["server"]
        self.marker = os.path.join(params["marker_dir"], quote("%s/%s" % (params["backend"], params["server"]), safe=""))
        self.mask = Masker([str(value) for value in params["headers"].values()]
                           + argument_secrets(params["command"] or []) + argument_secrets([params["url"] or ""]))
        self.result = {"changed": False, "state_before": "unknown", "state_after": "unknown", "sessions_at_maint": 0,
                       "drained_s": 0.0, "taken_out_by_us": False}

    def fail(self, sentence):
        self.module.fail_json(msg=self.mask(sentence), **self.result)

    def done(self, sentence):
        result = dict(self.result, msg=self.mask(sentence))
        if self.module._diff:
            result["diff"] = {"before": "%s: %s\n" % (self.name, result["state_before"]),
                              "after": "%s: %s\n" % (self.name, result["state_after"])}
        self.module.exit_json(**result)

    # The marker: this module took the server out.
    def _write_marker(self):
        os.makedirs(self.params["marker_dir"], mode=0o700, exist_ok=True)
        record = {"backend": self.params["backend"], "server": self.params["server"], "balancer": self.params["balancer"],
                  "taken_out_at": time.time()}
        fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)

    def _remove_marker(self):
        try:
            os.unlink(self.marker)
        except FileNotFoundError:
            pass

    def marker_op(self, operation):
        if self.check:
            return
        try:
            operation()
        except OSError as exc:
            self.fail("the rotation marker %s could not be %s: %s"
                      % (self.marker, "written" if operation == self._write_marker else "removed", exc.strerror or exc))

    def run(self):
        problem = trusted_directory_problem(self.params["marker_dir"], owners=(os.geteuid(),), missing_ok=True)
        if problem:
            self.fail("marker_dir: " + problem)
        self.result["taken_out_by_us"] = os.path.lexists(self.marker)
        try:
            if self.params["state"] == "restored" and not self.result["taken_out_by_us"]:
                if self.params["balancer"] == "haproxy":
                    self.result["state_before"] = self.result["state_after"] = self.haproxy_state()[1]
                self.done("%s was not taken out by this module: left as it is" % self.name)
            if self.params["balancer"] == "haproxy":
                self.haproxy()
            else:
                self.hook()
        except (_haproxy.HaproxyError, HookError) as exc:
            self.fail(str(exc))

    def haproxy_state(self):
        bits = self.call(_haproxy.admin_state)
        return bits, _haproxy.state_name(bits)

    def call(self, function, *args):
        params = self.params
        return function(params["socket"], params["backend"], params["server"], *(args + (params["timeout_s"],)))

    def haproxy(self):
        bits, before = self.haproxy_state()
        result = self.result
        result["state_before"] = result["state_after"] = before
        if self.params["state"] == "out":
            if bits & _haproxy.FORCED_MAINT:
                self.done("%s is in maintenance already" % self.name)
            result["changed"], result["state_after"] = True, "maint"
            if self.check:
                self.done("%s would be drained and put in maintenance" % self.name)
            if before == "ready" or result["taken_out_by_us"]:
                self.marker_op(self._write_marker)
            if not bits & _haproxy.FORCED_DRAIN:
                self.call(_haproxy.set_state, "drain")
            result["state_after"] = "drain"
            started = time.monotonic()
            open_now = self.call(_haproxy.sessions)
            while open_now and time.monotonic() - started < self.params["drain_timeout_s"]:
                time.sleep(POLL_S)
                open_now = self.call(_haproxy.sessions)
            result["drained_s"] = round(time.monotonic() - started, 1)
            self.call(_haproxy.set_state, "maint")
            result["state_after"], result["sessions_at_maint"] = "maint", open_now
            if open_now:
                self.done("%s still had %d sessions after %s s of drain: put in maintenance, cutting them"
                          % (self.name, open_now, self.params["drain_timeout_s"]))
            self.done("%s drained in %s s and is in maintenance" % (self.name, result["drained_s"]))
        if not bits & (_haproxy.FORCED_MAINT | _haproxy.FORCED_DRAIN):
            result["changed"] = result["taken_out_by_us"]
            self.marker_op(self._remove_marker)
            self.done("%s is in rotation already" % self.name)
        result["changed"], result["state_after"] = True, "ready"
        if not self.check:
            self.call(_haproxy.set_state, "ready")
            self.marker_op(self._remove_marker)
        self.done("%s %s back in rotation" % (self.name, "would be" if self.check else "is"))

    def hook(self):
        params, result = self.params, self.result
        transition = "out" if params["state"] == "out" else "in"
        if self.check:
            result["changed"] = True
            self.done("the %s hook would be run to take %s %s" % (params["balancer"], params["server"], transition))
        if transition == "out":
            self.marker_op(self._write_marker)
        if params["balancer"] == "command":
            run_command(params["command"], transition, params["server"], params["timeout_s"], self.mask)
        else:
            post(params["url"], params["headers"], {"server": params["server"], "state": transition,
                                                    "backend": params["backend"]}, params["timeout_s"], self.mask)
        result["changed"] = True
        if transition == "in":
            self.marker_op(self._remove_marker)
        self.done("the %s hook took %s %s of rotation" % (params["balancer"], params["server"],
                                                          "out" if transition == "out" else "back into"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            server=dict(type="str", required=True),
            state=dict(type="str", required=True, choices=["out", "in", "restored"]),
            balancer=dict(type="str", default="haproxy", choices=["haproxy", "command", "http"]),
            backend=dict(type="str", default=""),
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
            drain_timeout_s=dict(type="int", default=60),
            command=dict(type="list", elements="str"),
            url=dict(type="str"),
            headers=dict(type="dict", default={}, no_log=True),
            timeout_s=dict(type="float", default=30),
            marker_dir=dict(type="path", default="/var/lib/cleanslate-gpu/rotation"),
        ),
        required_if=[("balancer", "haproxy", ["backend"]), ("balancer", "command", ["command"]),
                     ("balancer", "http", ["url"])],
        supports_check_mode=True,
    )
    fail_on_problems(module, input_problems(module.params))
    Rotation(module).run()


if __name__ == "__main__":
    main()
