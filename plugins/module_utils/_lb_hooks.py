# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The generic load-balancer hooks of lb_rotation: a command, or an HTTP call, per transition.
Private to this collection.

Each returns nothing when the balancer took the transition, and raises HookError with one sentence,
every secret masked, otherwise.
"""

from __future__ import annotations

import json
import os
import pwd

from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url
from ansible_collections.cleanslate.gpu.plugins.module_utils._bounded_run import run_as_user
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import trusted_program_problem

OUTPUT_MAX = 64 * 1024
LINE_MAX = 300


class HookError(Exception):
    """One sentence about a hook that did not take the transition."""


def _line(text, mask):
    """The first non-empty line of a program's output, masked and cut."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = mask(first.encode("ascii", "backslashreplace").decode("ascii") if not first.isprintable() else first)
    return first if len(first) <= LINE_MAX else first[:LINE_MAX - 1] + "…"


def run_command(argv, transition, server, timeout, mask):
    """argv + [transition, server], as this user, never through a shell; exit 0 = done. As root, only
    a program root owns in directories no one else may write."""
    program = argv[0]
    shown = mask(program)
    if not os.path.isabs(program):
        raise HookError("the hook command %s must be an absolute path" % shown)
    if not os.path.isfile(program):
        raise HookError("the hook command %s does not exist" % shown)
    if not os.access(program, os.X_OK):
        raise HookError("the hook command %s is not executable" % shown)
    # Root never runs a program another user could have replaced (the file, or a directory above it).
    refused = trusted_program_problem(program) if os.geteuid() == 0 else ""
    if refused:
        raise HookError("the hook command %s is not run as root: %s" % (shown, mask(refused)))
    try:
        status, out, err, timed_out = run_as_user(list(argv) + [transition, server], b"", pwd.getpwuid(os.geteuid()),
                                                  dict(os.environ), timeout, OUTPUT_MAX)
    except OSError as exc:
        raise HookError("the hook command %s could not start: %s" % (shown, exc.strerror or exc))
    if timed_out:
        raise HookError("the hook command %s did not finish within %s s" % (shown, timeout))
    if status != 0:
        said = _line(err.decode("utf-8", "replace"), mask) or _line(out.decode("utf-8", "replace"), mask)
        raise HookError("the hook command %s exited with %s%s" % (shown, status, (": " + said) if said else " and printed nothing"))


def post(url, headers, body, timeout, mask):
    """POST the JSON body to url; a 2xx answer = done."""
    sent = dict(headers)
    sent.setdefault("Content-Type", "application/json")
    try:
        response = open_url(url, method="POST", data=json.dumps(body), headers=sent, timeout=timeout,
                            follow_redirects="none")
        status = response.getcode()
    except HTTPError as exc:
        status = exc.code
    except (URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HookError("the hook URL %s could not be reached: %s" % (mask(url), mask(str(reason))))
    if not 200 <= status < 300:
        raise HookError("the hook URL %s answered HTTP %s" % (mask(url), status))
