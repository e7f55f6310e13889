# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Whether a directory that root writes trusted files into is root's alone. Private to this collection.

A directory that holds secrets (inference_service_config_dir) or state that root acts on later
is safe only when nobody else can change what it holds: whoever may write the directory, or any
directory above it, may swap its files (a rename in a parent replaces the whole subtree), and a
symbolic link on the way lets its owner point root elsewhere. So the rule, for the directory and
each of its parents up to /: owned by root, writable by root alone (no group or other write bit),
never a symbolic link; and not inside a non-root user's home (whose owner, or whoever the site lets
manage it, keeps it as theirs even where root owns a level of it). A directory that does not exist
yet is fine when the nearest one that does passes the rule: root creates the rest.

Read with lstat only: nothing is opened, followed or created. One function, trusted_directory(),
returns the state and, when unsafe, the reason as a sentence part.
"""

from __future__ import annotations

import os
import pwd
import stat

from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

MISSING, SAFE, UNSAFE = "missing", "safe", "unsafe"


def _homes():
    """(home, user) for each non-root user whose home is a directory other than /, the home also as
    its real path (a /home that is a link to /data/home)."""
    found = []
    for entry in pwd.getpwall():
        home = os.path.normpath(entry.pw_dir or "/")
        if entry.pw_uid == 0 or home == "/" or not os.path.isabs(home) or not os.path.isdir(home):
            continue
        for spelled in sorted({home, os.path.realpath(home)}):
            if spelled != "/":
                found.append((spelled, entry.pw_name))
    return found


def _under_home(path):
    for home, user in _homes():
        if path == home or path.startswith(home + "/"):
            return "it lies in the home of the user %s (%s)" % (printable(user), printable(home))
    return None


def _level_problem(path, found):
    """Why one existing level of the path is not root's alone, or None."""
    if stat.S_ISLNK(found.st_mode):
        return "%s is a symbolic link" % printable(path)
    if not stat.S_ISDIR(found.st_mode):
        return "%s is not a directory" % printable(path)
    if found.st_uid != 0:
        return "%s is owned by uid %d, not root" % (printable(path), found.st_uid)
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "%s may be written by others than root (mode %04o)" % (printable(path), stat.S_IMODE(found.st_mode))
    return None


def trusted_directory(path):
    """(MISSING, None), (SAFE, None) or (UNSAFE, why): whether `path` (absolute) is, or would be
    created in, a directory that root alone may change."""
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        return UNSAFE, "%r is not an absolute path" % (path,)
    path = os.path.normpath(path)
    home = _under_home(path)
    if home:
        return UNSAFE, home
    levels, current = [], path
    while True:
        levels.append(current)
        if current == "/":
            break
        current = os.path.dirname(current)
    missing = False
    # From / down: the first level that is not there ends the walk (root creates the rest).
    for level in reversed(levels):
        try:
            found = os.lstat(level)
        except FileNotFoundError:
            missing = True
            break
        except OSError as exc:
            return UNSAFE, "%s cannot be read (%s)" % (printable(level), exc.strerror or exc)
        problem = _level_problem(level, found)
        if problem:
            return UNSAFE, problem
    return (MISSING if missing else SAFE), None
