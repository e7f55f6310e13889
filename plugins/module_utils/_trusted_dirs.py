# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A directory that root (or the controller's user) writes trusted files in: no one else can steer it.
Pure Python, read with lstat only (nothing opened, followed or created), for the controller and the
hosts alike. Private to this collection.

Whoever can write a directory on the way to a path can replace what comes below it with a
symbolic link or a directory of their own, and so choose where a privileged writer's file lands
(or what it reads back: the secrets of inference_service_config_dir, the heal breaker's state).
So the directory and each one above it, from `/`, must be a real directory (never a symbolic
link), owned by root or by one of the owners the caller trusts, and writable by no one else
(group and others' write bits clear).

One exception, for the directories above only: a sticky directory writable by others (`/tmp`,
mode 1777). Its sticky bit lets no one rename or remove an entry they do not own, so a trusted
directory inside it stays where it is. The directory written in is never accepted writable by
others, sticky or not: they could add a name beside ours; and when the directory is missing, the
one it would be made in counts as that directory (in a sticky /tmp, whoever makes the name first
owns it, between the check and the creation).

A host's secrets must also not lie in a non-root user's home (outside_homes): its owner, or whoever
the site lets manage it, keeps it as theirs even where root owns a level of it.
"""

from __future__ import annotations

import os
import pwd
import stat

from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

MISSING, SAFE, UNSAFE = "missing", "safe", "unsafe"
RULE = "the directory and each one above it must be a real directory (no symbolic link) owned by %s and writable by no one else"


def _user(uid: int) -> str:
    try:
        return "uid %d (%s)" % (uid, pwd.getpwuid(uid).pw_name)
    except KeyError:
        return "uid %d" % uid


def owners_text(owners) -> str:
    """Who may own the directories, in words (for RULE)."""
    return " or ".join(["root"] + [_user(uid) for uid in sorted(set(owners)) if uid != 0])


def _home_of(path: str) -> str:
    """The phrase when `path` lies in a non-root user's home (as written or as its real path), else ''."""
    for entry in pwd.getpwall():
        home = os.path.normpath(entry.pw_dir or "/")
        if entry.pw_uid == 0 or home == "/" or not os.path.isabs(home) or not os.path.isdir(home):
            continue
        for spelled in sorted({home, os.path.realpath(home)}):
            if spelled != "/" and (path == spelled or path.startswith(spelled + "/")):
                return "it lies in the home of the user %s (%s)" % (printable(entry.pw_name), printable(home))
    return ""


def _level_problem(shown: str, info, owners, written_in: bool) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "%s is a symbolic link" % shown
    if not stat.S_ISDIR(info.st_mode):
        return "%s is not a directory" % shown
    if info.st_uid not in owners:
        return "%s is owned by %s" % (shown, _user(info.st_uid))
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and (written_in or not info.st_mode & stat.S_ISVTX):
        return "%s may be written by %s (mode %04o)" % (
            shown, "others" if info.st_mode & stat.S_IWOTH else "its group", stat.S_IMODE(info.st_mode))
    return ""


def trusted_directory(path, owners=(), outside_homes: bool = False) -> tuple:
    """(SAFE, ''), (MISSING, 'X is missing') or (UNSAFE, why): whether `path` is, or would be made
    in, a directory no one but root (or a uid of `owners`) can steer. `why` names the first
    component, from `/` down, that breaks the rule (RULE)."""
    owners = {0} | set(owners)
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        return UNSAFE, "%s is not an absolute directory path" % printable(repr(path))
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        # `..` is resolved by the kernel after the component before it, a link's target included:
        # the names checked would not be the directories walked.
        return UNSAFE, "%s goes up with `..`: name it without" % printable(path)
    if outside_homes:
        home = _home_of("/" + "/".join(parts))
        if home:
            return UNSAFE, home
    chain = ["/"] + ["/" + "/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    infos = []
    for component in chain:
        try:
            infos.append(os.lstat(component))
        except (FileNotFoundError, NotADirectoryError):
            break  # a file on the way is named by the level check below
        except OSError as exc:
            return UNSAFE, "%s cannot be examined (%s)" % (printable(component), exc.strerror or exc)
    for index, info in enumerate(infos):
        problem = _level_problem(printable(chain[index]), info, owners, written_in=index == len(infos) - 1)
        if problem:
            return UNSAFE, problem
    if len(infos) < len(chain):
        return MISSING, "%s is missing" % printable(chain[len(infos)])
    return SAFE, ""


def trusted_directory_problem(path, owners=(0,), missing_ok: bool = False) -> str:
    """'' when `path` is a directory trusted_directory accepts (a missing one too with missing_ok:
    the caller makes the rest, as itself), else one sentence naming the component and the rule."""
    state, why = trusted_directory(path, owners)
    if state == SAFE or (state == MISSING and missing_ok):
        return ""
    if state == MISSING:
        return "directory %s does not exist: %s" % (printable(path), why)
    return "directory %s is not safe to write in: %s; %s" % (printable(str(path)), why, RULE % owners_text({0} | set(owners)))


def trusted_program_problem(path):
    """'' when root may run the program at `path`: it, its real file and the directories of both are
    root's and writable by no one else; else one sentence saying why not."""
    if not os.path.isabs(path):
        return "%s is not an absolute path" % printable(path)
    try:
        real = os.path.realpath(path)
        info = os.stat(real)
    except OSError as exc:
        return "%s cannot be examined (%s)" % (printable(path), exc.strerror or exc)
    for directory in sorted({os.path.dirname(path), os.path.dirname(real)}):
        problem = trusted_directory_problem(directory)
        if problem:
            return problem
    if not stat.S_ISREG(info.st_mode):
        return "%s is not a regular file" % printable(real)
    if info.st_uid != 0:
        return "%s is owned by uid %d, not root" % (printable(real), info.st_uid)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "%s may be written by %s (mode %04o)" % (
            printable(real), "others" if info.st_mode & stat.S_IWOTH else "its group", stat.S_IMODE(info.st_mode))
    return ""
