# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One module's main() in a forked child of this module's process, as the module's own process
would run it: its own arguments (with the task's `_ansible_*` settings), its own AnsibleModule,
its own warnings and exit. cleanslate.gpu.reset_steps runs the reset's steps this way: one host
contact and one interpreter for all of them instead of one each (issue 42), and still nothing one
step sets (a global, a signal handler, an exit) reaches the next.

The answer is read as plain JSON: what ansible-core 2.19 tags in it (warnings, deprecations) stays
a mapping with its tag, which the controller decodes when this module's answer reaches it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from ansible.module_utils import basic


def internal_settings(raw_params):
    """The task's settings ansible-core passes every module (`_ansible_check_mode`, `_ansible_diff`,
    `_ansible_verbosity`, `_ansible_no_log` ...), from this module's raw parameters."""
    return {key: value for key, value in raw_params.items() if key.startswith("_ansible_")}


def _child(main, module_args, write_fd):
    """In the child: the module reads module_args, prints to the pipe, and the child ends
    here, whatever the module does. Never returns."""
    code = 1
    try:
        os.dup2(write_fd, 1)
        os.close(write_fd)
        # Whatever stood for stdout in the parent (a test's capture, a wrapper): fd 1 is the pipe.
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # pylint: disable=consider-using-with
        # What AnsiballZ hands a module's own process (basic._load_params reads it).
        basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": module_args}).encode("utf-8")
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException as exc:  # pylint: disable=broad-exception-caught
        # What a module's own process would answer for an exception it did not catch.
        # On a line of its own: the module may have printed part of a line before it failed.
        sys.stdout.write("\n" + json.dumps({"failed": True, "msg": "%s: %s" % (type(exc).__name__, exc),
                                            "exception": traceback.format_exc()}) + "\n")
    finally:
        # os._exit, not sys.exit: the exit must not unwind into the parent's frames (AnsiballZ
        # removes its payload on the way out, which the parent still runs from).
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _answer(output, rc, module_name):
    """The module's answer from what the child printed: the last line that parses as a JSON
    object, as ansible-core skips lines a module prints before its result."""
    text = output.decode("utf-8", errors="replace")
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict):
                return answer
    return {"failed": True, "rc": rc, "module_stdout": text[-4000:],
            "msg": "%s ended with rc %d and printed no result" % (module_name, rc)}


def run_module_main(main, module_name, params, settings):
    """Run main() in a child with params and the task's settings; returns its answer once the
    child has ended."""
    module_args = dict(settings, **params)
    module_args["_ansible_module_name"] = module_name
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(main, module_args, write_fd)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        output = pipe.read()
    status = os.waitpid(pid, 0)[1]
    rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    return _answer(output, rc, module_name)
