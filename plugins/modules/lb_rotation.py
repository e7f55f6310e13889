#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: lb_rotation
short_description: Take servers out of a load balancer's rotation, draining them first, and put them back
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
  - With O(servers), one run moves several servers of O(backend). HAProxy's state of them all is read in one
    exchange, a name HAProxy does not have is refused before any of them is changed, and those taken out drain side
    by side, each going to C(maint) as soon as its own sessions end, all that are left when O(drain_timeout_s) passed
    (one wait, however many servers). A hook runs once per server, one after another. What was done to each server
    is in RV(servers).
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
    description: The server's name on the balancer (HAProxy's C(server) line's name). Exactly one of O(server) and
      O(servers) is given.
    type: str
  servers:
    description: The names of several servers on the balancer, each at most once, moved in one run (see above).
    type: list
    elements: str
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

- name: Take two servers out together, their drains side by side
  cleanslate.gpu.lb_rotation:
    servers: [node1-vllm-a, node1-vllm-b]
    backend: vllm
    state: out
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
  returned: with O(server)
  type: str
  sample: ready
state_after:
  description: The server's state after (in check mode, what it would be); V(unknown) with a hook.
  returned: with O(server)
  type: str
  sample: maint
sessions_at_maint:
  description: The server's current sessions when it went to maintenance, 0 after a clean drain; sessions cut when
    O(drain_timeout_s) passed. 0 when it did not go to maintenance.
  returned: with O(server)
  type: int
  sample: 0
drained_s:
  description: Seconds spent waiting for the server's sessions to end.
  returned: with O(server)
  type: float
  sample: 4.2
taken_out_by_us:
  description: Whether this module's marker was there before (it took the server out earlier).
  returned: with O(server)
  type: bool
  sample: false
servers:
  description:
    - With O(servers), what was done to each server, in their order, with the keys the result has with O(server)
      (C(changed), C(state_before), C(state_after), C(sessions_at_maint), C(drained_s), C(taken_out_by_us)), its
      C(server) name, and its own sentence in C(msg) (empty for a server a failure left untouched).
  returned: with O(servers)
  type: list
  elements: dict
  sample:
    - {server: node1-vllm-a, changed: true, state_before: ready, state_after: maint, sessions_at_maint: 0,
       drained_s: 4.2, taken_out_by_us: false, msg: vllm/node1-vllm-a drained in 4.2 s and is in maintenance}
msg:
  description: What was done, or why it failed, in one sentence; with O(servers), each server's sentence, joined by
    C(; ).
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


def server_names(params) -> list:
    """The servers this run moves: O(servers), or O(server) alone."""
    return list(params["servers"]) if params["servers"] is not None else [params["server"]]


def input_problems(params):
    haproxy = params["balancer"] == "haproxy"
    problems = []
    several = params["servers"] is not None
    if several and not params["servers"]:
        problems.append("servers is empty: name at least one server")
    names = server_names(params)
    for index, name in enumerate(names):
        fault = name_fault(name, params["balancer"])
        if fault:
            problems.append("%s %s: %s" % ("servers[%d]" % index if several else "server", _shown(name), fault))
        elif name in names[:index]:
            problems.append("servers lists %s twice" % _shown(name))
    backend = params["backend"]
    fault = name_fault(backend, params["balancer"]) if backend != "" or haproxy else None
    if fault:
        problems.append("backend %s: %s" % (_shown(backend), fault))
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


class Server:
    """One server's transition: its names, its marker, and what was done to it."""

    def __init__(self, params, server):
        self.server = server
        self.name = "%s/%s" % (params["backend"], server) if params["backend"] else server
        self.marker = os.path.join(params["marker_dir"], quote("%s/%s" % (params["backend"], server), safe=""))
        self.result = {"changed": False, "state_before": "unknown", "state_after": "unknown", "sessions_at_maint": 0,
                       "drained_s": 0.0, "taken_out_by_us": False}
        self.sentence = ""

    def say(self, template, *values):
        """The sentence of what was done: `template` with the server's name first, then `values`."""
        self.sentence = template % ((self.name,) + values)


class Rotation:
    """One transition of the servers of one backend on one balancer, the marker kept beside each."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.check = module.check_mode
        self.several = self.params["servers"] is not None
        self.servers = [Server(self.params, name) for name in server_names(self.params)]
        params = self.params
        self.mask = Masker([str(value) for value in params["headers"].values()]
                           + argument_secrets(params["command"] or []) + argument_secrets([params["url"] or ""]))

    def _results(self):
        """The result's keys of the servers: each under O(servers), or the one server's at the top."""
        if not self.several:
            return dict(self.servers[0].result)
        return {"changed": any(server.result["changed"] for server in self.servers),
                "servers": [dict(server.result, server=server.server, msg=self.mask(server.sentence))
                            for server in self.servers]}

    def fail(self, sentence):
        self.module.fail_json(msg=self.mask(sentence), **self._results())

    def done(self):
        result = self._results()
        result["msg"] = self.mask("; ".join(server.sentence for server in self.servers))
        if self.module._diff:
            result["diff"] = {side: "".join("%s: %s\n" % (server.name, server.result[key]) for server in self.servers)
                              for side, key in (("before", "state_before"), ("after", "state_after"))}
        self.module.exit_json(**result)

    # The marker: this module took the server out.
    def _write_marker(self, server):
        os.makedirs(self.params["marker_dir"], mode=0o700, exist_ok=True)
        record = {"backend": self.params["backend"], "server": server.server, "balancer": self.params["balancer"],
                  "taken_out_at": time.time()}
        fd = os.open(server.marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)

    def _remove_marker(self, server):
        try:
            os.unlink(server.marker)
        except FileNotFoundError:
            pass

    def marker_op(self, operation, server):
        if self.check:
            return
        try:
            operation(server)
        except OSError as exc:
            self.fail("the rotation marker %s could not be %s: %s"
                      % (server.marker, "written" if operation == self._write_marker else "removed", exc.strerror or exc))

    def run(self):
        problem = trusted_directory_problem(self.params["marker_dir"], owners=(os.geteuid(),), missing_ok=True)
        if problem:
            self.fail("marker_dir: " + problem)
        for server in self.servers:
            server.result["taken_out_by_us"] = os.path.lexists(server.marker)
        try:
            if self.params["balancer"] == "haproxy":
                self.haproxy()
            else:
                self.hooks()
        except (_haproxy.HaproxyError, HookError) as exc:
            self.fail(str(exc))
        self.done()

    def call(self, function, *args):
        params = self.params
        return function(params["socket"], params["backend"], *(args + (params["timeout_s"],)))

    def haproxy(self):
        """Every server's state in one read; those to take out drain side by side."""
        states = self.call(_haproxy.admin_states, [server.server for server in self.servers])
        draining = []
        for server in self.servers:
            bits = states[server.server]
            server.result["state_before"] = server.result["state_after"] = _haproxy.state_name(bits)
            if self.params["state"] == "out":
                if self.start_drain(server, bits):
                    draining.append(server)
            elif self.params["state"] == "restored" and not server.result["taken_out_by_us"]:
                server.say("%s was not taken out by this module: left as it is")
            else:
                self.put_back(server, bits)
        self.drain(draining)

    def start_drain(self, server, bits):
        """Sets the server to drain; whether it is draining now (not in maintenance already, not check mode)."""
        result = server.result
        if bits & _haproxy.FORCED_MAINT:
            server.say("%s is in maintenance already")
            return False
        result["changed"], result["state_after"] = True, "maint"
        if self.check:
            server.say("%s would be drained and put in maintenance")
            return False
        if result["state_before"] == "ready" or result["taken_out_by_us"]:
            self.marker_op(self._write_marker, server)
        if not bits & _haproxy.FORCED_DRAIN:
            self.call(_haproxy.set_state, server.server, "drain")
        result["state_after"] = "drain"
        return True

    def drain(self, draining):
        """Each draining server goes to maintenance as soon as its own sessions end, or all that are left at
        drain_timeout_s: one wait for the servers together, however many there are."""
        started = time.monotonic()
        while draining:
            open_now = self.call(_haproxy.sessions, [server.server for server in draining])
            waited = time.monotonic() - started
            for server in [one for one in draining if not open_now[one.server] or waited >= self.params["drain_timeout_s"]]:
                self.call(_haproxy.set_state, server.server, "maint")
                draining.remove(server)
                result = server.result
                result["drained_s"], result["state_after"] = round(waited, 1), "maint"
                result["sessions_at_maint"] = open_now[server.server]
                if result["sessions_at_maint"]:
                    server.say("%s still had %d sessions after %s s of drain: put in maintenance, cutting them",
                               result["sessions_at_maint"], self.params["drain_timeout_s"])
                else:
                    server.say("%s drained in %s s and is in maintenance", result["drained_s"])
            if draining:
                time.sleep(POLL_S)

    def put_back(self, server, bits):
        result = server.result
        if not bits & (_haproxy.FORCED_MAINT | _haproxy.FORCED_DRAIN):
            result["changed"] = result["taken_out_by_us"]
            self.marker_op(self._remove_marker, server)
            server.say("%s is in rotation already")
            return
        result["changed"], result["state_after"] = True, "ready"
        if not self.check:
            self.call(_haproxy.set_state, server.server, "ready")
            self.marker_op(self._remove_marker, server)
        server.say("%s would be back in rotation" if self.check else "%s is back in rotation")

    def hooks(self):
        """The hook once per server, one after another (a hook's balancer has no drain to wait for here)."""
        params = self.params
        transition = "out" if params["state"] == "out" else "in"
        for server in self.servers:
            if params["state"] == "restored" and not server.result["taken_out_by_us"]:
                server.say("%s was not taken out by this module: left as it is")
                continue
            if self.check:
                server.result["changed"] = True
                server.sentence = "the %s hook would be run to take %s %s" % (params["balancer"], server.server, transition)
                continue
            if transition == "out":
                self.marker_op(self._write_marker, server)
            if params["balancer"] == "command":
                run_command(params["command"], transition, server.server, params["timeout_s"], self.mask)
            else:
                post(params["url"], params["headers"], {"server": server.server, "state": transition,
                                                        "backend": params["backend"]}, params["timeout_s"], self.mask)
            server.result["changed"] = True
            if transition == "in":
                self.marker_op(self._remove_marker, server)
            server.sentence = "the %s hook took %s %s of rotation" % (params["balancer"], server.server,
                                                                      "out" if transition == "out" else "back into")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            server=dict(type="str"),
            servers=dict(type="list", elements="str"),
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
        mutually_exclusive=[("server", "servers")],
        required_one_of=[("server", "servers")],
        required_if=[("balancer", "haproxy", ["backend"]), ("balancer", "command", ["command"]),
                     ("balancer", "http", ["url"])],
        supports_check_mode=True,
    )
    fail_on_problems(module, input_problems(module.params))
    Rotation(module).run()


if __name__ == "__main__":
    main()
