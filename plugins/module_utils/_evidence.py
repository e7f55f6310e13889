# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What explains a failure, kept on the host before a reset signals the processes that hold it.
Private to this collection; used by the evidence module.

A Kept directory is made fresh for one run (mode 0700, root's, in a base that trusted_directory
accepts), every file in it new (O_EXCL, O_NOFOLLOW, mode 0600), each cut at file_max bytes and the
whole at dir_max. Everything written is untrusted text (a journal, a stack, a command line):
masked (_secrets.Masker) and made safe (safe_text) before it is written, never interpreted.

Time is bounded twice: each program run (journalctl, py-spy) by the item timeout, all of them
together by the deadline; what did not fit is one line in the summary, never a delay of the reset.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import time

from ansible_collections.cleanslate.gpu.plugins.module_utils._bounded_run import program_env, run_as_user

# Control characters but newline and tab: a terminal escape in a log stays text (\x1b).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_LABEL = re.compile(r"[^A-Za-z0-9@._-]")
CUT_MARK = "\n... (cut at %d bytes)\n"


def safe_text(raw):
    """Bytes of an untrusted program's output as text: each byte that is not UTF-8 as \\xNN, each
    control character but newline and tab as \\xNN."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    return _CONTROL.sub(lambda match: "\\x%02x" % ord(match.group()), text)


def run_label(units, when):
    """The run directory's name: the UTC time, then the first unit (or `processes`), safe as a name."""
    name = _LABEL.sub("_", units[0] if units else "processes")[:64]
    return "%s-%s" % (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when)), name)


class Kept(object):
    """One run's directory: files written under the size bounds, programs run under the time bounds."""

    def __init__(self, base, label, mask, file_max, dir_max, item_timeout, deadline_s):
        self.mask, self.file_max, self.dir_max, self.item_timeout = mask, file_max, dir_max, item_timeout
        self.deadline = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self.files, self.notes, self.used = [], [], 0
        # Missing levels of the base are made root's, 0700 (the umask can only take bits away).
        os.makedirs(base, mode=0o700, exist_ok=True)
        for attempt in range(100):
            path = os.path.join(base, label if attempt == 0 else "%s.%d" % (label, attempt))
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            os.chmod(path, 0o700)
            self.path = path
            return
        raise OSError("no free name for %s in %s" % (label, base))

    def left(self):
        """Seconds the next program may run: the item timeout, or what is left of the deadline."""
        return max(0.0, min(self.item_timeout, self.deadline - time.monotonic()))

    def note(self, sentence):
        self.notes.append(self.mask(safe_text(sentence)))

    def write(self, name, text):
        """Write text (masked, made safe) as a new file `name`, cut at file_max bytes and at what is
        left of dir_max; records it in files. Returns nothing: a failure to write is a note."""
        data = self.mask(safe_text(text)).encode("utf-8")
        room = max(0, min(self.file_max, self.dir_max - self.used))
        cut = len(data) > room
        if cut:
            mark = (CUT_MARK % room).encode("ascii")
            # Cut at a character's start: the file stays UTF-8.
            data = data[:max(0, room - len(mark))].decode("utf-8", "ignore").encode("utf-8") + mark
            data = data[:room]
        try:
            fd = os.open(os.path.join(self.path, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            self.note("%s was not kept: %s" % (name, exc.strerror or exc))
            return
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        self.used += len(data)
        self.files.append({"name": name, "bytes": len(data), "cut": cut})

    def run(self, argv, what):
        """(stdout bytes or None, problem sentence or ''): argv run as root, bounded by left() and
        file_max; the sentence when it could not run, was cut by time or failed (with what it printed
        before, if anything)."""
        timeout = self.left()
        if timeout <= 0:
            return None, "%s was not run: the evidence deadline of %g s was reached" % (what, self.deadline_s)
        try:
            status, out, err, timed_out = run_as_user(argv, b"", pwd.getpwuid(os.geteuid()), program_env(), timeout,
                                                      self.file_max + 1)  # one more: write() sees the cut
        except OSError as exc:
            return None, "%s could not be run (%s)" % (what, exc.strerror or exc)
        if timed_out:
            return out or None, "%s was stopped after %.1f s (its time limit)" % (what, timeout)
        if status != 0:
            # What it printed before it failed is kept (py-spy prints its header, then fails).
            return out or None, "%s failed (exit status %s): %s" % (what, status, safe_text(err.strip()[:400]) or "no message")
        return out, ""

    def summary(self, extra):
        """The summary file, written last: what was kept, what was not and why."""
        body = dict(extra, files=self.files, notes=self.notes)
        self.write("summary.json", json.dumps(body, indent=1, sort_keys=True) + "\n")
