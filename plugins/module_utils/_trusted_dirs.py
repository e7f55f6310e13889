# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A directory that root (or the controller's user) may write in: no one else can steer it.
Pure Python, for the controller and the hosts alike. Private to this collection.

Whoever can write a directory on the way to a path can replace what comes below it with a
symbolic link or a directory of their own, and so choose where a privileged writer's file lands
(or what it reads back). So the directory and each one above it, from `/`, must be a real
directory (never a symbolic link), owned by root or by one of the owners the caller trusts,
and writable by no one else (group and others' write bits clear).

One exception, for the directories above only: a sticky directory writable by others (`/tmp`,
mode 1777). Its sticky bit lets no one rename or remove an entry they do not own, so a trusted
directory inside it stays where it is; whoever could have made that entry first is caught by the
owner check of the entry itself. The directory itself is never accepted writable by others,
sticky or not: they could add a name beside ours (the next heal's lock or state).
"""

from __future__ import annotations

import os
import pwd
import stat

from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

RULE = "the directory and each one above it must be a real directory (no symbolic link) owned by %s and writable by no one else"


def _user(uid: int) -> str:
    try:
        return "uid %d (%s)" % (uid, pwd.getpwuid(uid).pw_name)
    except KeyError:
        return "uid %d" % uid


def _owners(owners) -> str:
    names = ["root"] + [_user(uid) for uid in sorted(set(owners)) if uid != 0]
    return " or ".join(names)


def trusted_directory_problem(path, owners=(0,), missing_ok: bool = False) -> str:
    """'' when `path` is a directory no one but root (or a uid in `owners`) can steer, else one
    sentence naming the first component, from `/` down, that breaks the rule (RULE).

    owners: the uids a directory may belong to besides root (the controller passes its own
    effective uid: the rulebook may run as a user of its own). missing_ok: a component that does
    not exist ends the check without a problem (the caller creates the rest, owned by itself,
    inside a directory that passed); otherwise a missing directory is a problem too."""
    owners = {0} | set(owners)
    if not isinstance(path, str) or not os.path.isabs(path):
        return "%r is not an absolute directory path (%s)" % (path, RULE % _owners(owners))
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        # `..` is resolved by the kernel after the component before it, a link's target included:
        # the names checked would not be the directories walked.
        return "directory %s goes up with `..`: name it without (%s)" % (printable(path), RULE % _owners(owners))
    chain = ["/"] + ["/" + "/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    for index, component in enumerate(chain):
        shown, leaf = printable(component), index == len(chain) - 1
        try:
            info = os.lstat(component)
        except FileNotFoundError:
            if missing_ok:
                return ""
            return "directory %s does not exist: %s is missing" % (printable(path), shown)
        except OSError as exc:
            return "directory %s cannot be checked: %s cannot be examined (%s)" % (printable(path), shown, exc.strerror)
        problem = ""
        if stat.S_ISLNK(info.st_mode):
            problem = "%s is a symbolic link" % shown
        elif not stat.S_ISDIR(info.st_mode):
            problem = "%s is not a directory" % shown
        elif info.st_uid not in owners:
            problem = "%s is owned by %s" % (shown, _user(info.st_uid))
        elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and (leaf or not info.st_mode & stat.S_ISVTX):
            problem = "%s may be written by %s (mode %04o)" % (
                shown, "others" if info.st_mode & stat.S_IWOTH else "its group", stat.S_IMODE(info.st_mode))
        if problem:
            return "directory %s is not safe to write in: %s; %s" % (printable(path), problem, RULE % _owners(owners))
    return ""
