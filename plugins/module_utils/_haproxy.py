# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""HAProxy's runtime API on its admin socket, one command per connection. Private to this collection.

HAProxy splits what it reads on `;` and newlines into commands, so a name sent to it must be one
word of HAProxy's own name characters (_rotation_names.name_fault): anything else is refused before a connection is
opened. Each exchange sends one command and a newline, then reads to the end, bounded in size and
time; every failure is a HaproxyError with one sentence.
"""

from __future__ import annotations

import os
import socket
import stat
import time

ANSWER_MAX = 4 * 1024 * 1024
# srv_admin_state bits (show servers state): forced by the runtime API, or inherited, set by the
# configuration, a DNS resolution or a hostname; any of them keeps the server out of rotation.
FORCED_MAINT, FORCED_DRAIN = 0x01, 0x08
ANY_MAINT, ANY_DRAIN = 0x01 | 0x02 | 0x04 | 0x20 | 0x40, 0x08 | 0x10


class HaproxyError(Exception):
    """One sentence about a failed exchange with HAProxy."""


def _shown(text, limit=200):
    """HAProxy's answer as one line of plain ASCII, cut."""
    line = " ".join(text.split()).encode("ascii", "backslashreplace").decode("ascii")
    return line if len(line) <= limit else line[:limit - 1] + "…"


def exchange(path, command, timeout):
    """HAProxy's answer to one command on the unix socket `path`, read to the end."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise HaproxyError("%s is not a socket: name HAProxy's admin socket (its `stats socket ... level admin`)" % path)
    except FileNotFoundError:
        raise HaproxyError("there is no HAProxy socket at %s: is HAProxy running with `stats socket %s level admin`?" % (path, path))
    except OSError as exc:
        raise HaproxyError("HAProxy's socket %s cannot be examined: %s" % (path, exc.strerror or exc))
    deadline = time.monotonic() + timeout
    answer = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            conn.sendall(command.encode("ascii") + b"\n")
            while True:
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = conn.recv(65536)
                if not chunk:
                    break
                answer += chunk
                if len(answer) > ANSWER_MAX:
                    raise HaproxyError("HAProxy's answer to `%s` on %s is over %d bytes" % (command, path, ANSWER_MAX))
    except socket.timeout:
        raise HaproxyError("HAProxy did not answer `%s` on %s within %s s" % (command, path, timeout))
    except PermissionError:
        raise HaproxyError("permission denied on HAProxy's socket %s: run as a user its `stats socket` line lets in" % path)
    except OSError as exc:
        raise HaproxyError("HAProxy's socket %s refused `%s`: %s" % (path, command, exc.strerror or exc))
    return answer.decode("utf-8", "replace")


def _refusal(answer, backend, server):
    """HAProxy's refusal as one sentence, or '' when the answer is no refusal."""
    first = answer.strip().splitlines()[0] if answer.strip() else ""
    if first in ("No such backend.", "Can't find backend.", "No such proxy."):
        return "HAProxy has no backend %s" % backend
    if first == "No such server.":
        return "HAProxy's backend %s has no server %s" % (backend, server)
    if first.startswith("Permission denied"):
        return "HAProxy refused the command: its socket's `stats socket` line needs `level admin`"
    return ""


def _ask(path, command, backend, server, timeout):
    """HAProxy's answer to `command` about backend/server; its refusal raised as one sentence."""
    answer = exchange(path, command, timeout)
    refusal = _refusal(answer, backend, server)
    if refusal:
        raise HaproxyError(refusal)
    return answer


def _first_missing(found, backend, servers):
    """HAProxy's refusal for the first server of `servers` that its answer has no row of."""
    for server in servers:
        if server not in found:
            raise HaproxyError("HAProxy's backend %s has no server %s" % (backend, server))


def admin_states(path, backend, servers, timeout):
    """{server: srv_admin_state bits} of each of `servers`, from one `show servers state <backend>`."""
    servers = list(servers)
    answer = _ask(path, "show servers state %s" % backend, backend, servers[0], timeout)
    lines = answer.splitlines()
    header = next((line[1:].split() for line in lines if line.startswith("#")), [])
    if "be_name" not in header or "srv_name" not in header or "srv_admin_state" not in header:
        raise HaproxyError("HAProxy answered `show servers state %s` with something unexpected: %s" % (backend, _shown(answer)))
    at = {name: header.index(name) for name in ("be_name", "srv_name", "srv_admin_state")}
    found = {}
    for line in lines:
        fields = line.split()
        if len(fields) == len(header) and fields[at["be_name"]] == backend and fields[at["srv_name"]] in servers:
            if not fields[at["srv_admin_state"]].isdigit():
                raise HaproxyError("HAProxy answered `show servers state %s` with something unexpected: %s"
                                   % (backend, _shown(answer)))
            found[fields[at["srv_name"]]] = int(fields[at["srv_admin_state"]])
    _first_missing(found, backend, servers)
    return found


def state_name(bits) -> str:
    """maint, drain or ready: where the admin state keeps the server."""
    return "maint" if bits & ANY_MAINT else "drain" if bits & ANY_DRAIN else "ready"


def sessions(path, backend, servers, timeout):
    """{server: current sessions} of each of `servers` (scur of one `show stat <backend> 4 -1`, the servers' rows)."""
    servers = list(servers)
    answer = _ask(path, "show stat %s 4 -1" % backend, backend, servers[0], timeout)
    lines = answer.splitlines()
    header = lines[0].lstrip("# ").split(",") if lines and lines[0].startswith("#") else []
    if not {"pxname", "svname", "scur"} <= set(header):
        raise HaproxyError("HAProxy answered `show stat %s 4 -1` with something unexpected: %s" % (backend, _shown(answer)))
    at = {name: header.index(name) for name in ("pxname", "svname", "scur")}
    found = {}
    for line in lines[1:]:
        fields = line.split(",")
        if len(fields) > at["scur"] and fields[at["pxname"]] == backend and fields[at["svname"]] in servers:
            if not fields[at["scur"]].isdigit():
                raise HaproxyError("HAProxy's stats give server %s/%s no session count: %s"
                                   % (backend, fields[at["svname"]], _shown(line)))
            found[fields[at["svname"]]] = int(fields[at["scur"]])
    _first_missing(found, backend, servers)
    return found


def set_state(path, backend, server, state, timeout):
    """`set server <backend>/<server> state <state>`; HAProxy answers an empty line when done."""
    answer = exchange(path, "set server %s/%s state %s" % (backend, server, state), timeout)
    if answer.strip():
        raise HaproxyError(_refusal(answer, backend, server) or "HAProxy answered `set server %s/%s state %s` with: %s"
                           % (backend, server, state, _shown(answer)))
