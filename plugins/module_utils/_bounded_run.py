# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A program run as another user, bounded in time and output, its whole process group killed at the
end. Private to this collection.

Used by inference_dry_run, whose check runs the engine's Python (another user's code): Popen, not
module.run_command, which has no timeout, no bound on output and shares the module's process group
(ansible-test's validate-modules refuses Popen in a module file, so it lives here, as
_pyc_probe.run_bounded does for pycache_purge)."""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import time


PR_SET_PDEATHSIG = 1


def program_env():
    """The environment of a program a reset runs as root (systemctl, journalctl, dmesg, py-spy): the
    task's PATH (root's, from Ansible) and the C locale, whose messages are read and matched, and
    nothing else of the task's: node_reset_environment (NVML's library path, a preload) is for the
    GPU reads only."""
    return {"PATH": os.environ.get("PATH") or "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "LANG": "C",
            "SYSTEMD_PAGER": ""}


def _dies_with_parent():
    """A preexec function: the child gets SIGKILL when this process dies (killed by a signal it cannot
    catch, or a dropped connection), so the check never outlives the module that bounds it. Set after
    the child's setuid (which clears it), before exec (which keeps it)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec():
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the module died between the fork and here
            os._exit(1)
    return preexec


def run_as_user(argv, data, entry, env, timeout, output_max):
    """(status or None, stdout, stderr, timed_out): argv as the user of the pwd entry `entry` (with
    its groups: initgroups, setgid, setuid, done by Popen in the child before exec; as it is when
    this process is that user already), data on its stdin, env as its whole environment, its cwd the
    user's home (or / when there is none), each stream read up to output_max bytes (the rest drained
    and dropped), for at most timeout seconds; its whole process group is killed at the end, before
    its leader is reaped (the group's id cannot have been reused)."""
    as_user = {}
    if os.geteuid() == 0:
        groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}
    cwd = entry.pw_dir if os.path.isdir(entry.pw_dir) else "/"
    # Not module.run_command: it has no timeout, no bound on output and shares the module's
    # process group; the check gets a session of its own, killed whole.
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=ansible-bad-function
                            stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True, close_fds=True,
                            preexec_fn=_dies_with_parent(), **as_user)
    deadline = time.monotonic() + timeout
    kept = {proc.stdout: b"", proc.stderr: b""}
    selector = selectors.DefaultSelector()
    for stream in kept:
        os.set_blocking(stream.fileno(), False)
        selector.register(stream, selectors.EVENT_READ)
    os.set_blocking(proc.stdin.fileno(), False)
    selector.register(proc.stdin, selectors.EVENT_WRITE)
    pending, timed_out, exited_at = data, False, None
    try:
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is not None and now - exited_at > 2:
                break  # something the check left in its group holds the pipes: killed below
            for key, dummy in selector.select(min(0.2, deadline - now)):
                stream = key.fileobj
                if stream is proc.stdin:
                    try:
                        pending = pending[os.write(stream.fileno(), pending[:65536]):]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        pending = b"" if isinstance(exc, BrokenPipeError) else pending
                    if not pending:
                        selector.unregister(stream)
                        stream.close()
                    continue
                try:
                    chunk = os.read(stream.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(stream)
                    continue
                room = output_max - len(kept[stream])
                if room > 0:
                    kept[stream] += chunk[:room]
            if exited_at is None and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                exited_at = time.monotonic()
    finally:
        # The leader is not reaped yet: its pid, the group's id, cannot have been reused.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        status = proc.wait()
        selector.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if not stream.closed:
                stream.close()
    return (None if timed_out else status), kept[proc.stdout], kept[proc.stderr], timed_out
