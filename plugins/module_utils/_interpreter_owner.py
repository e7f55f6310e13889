# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Who can change what an interpreter runs, decided from the file system before it is started.
Private to this collection; read with lstat, readlink, listdir of the site directories, and short reads of
each program's first bytes (its `#!` line) and of pyvenv.cfg (its `home`); nothing is executed.

Whoever can change the interpreter's file, a symbolic link on the way to it, its environment's
prefix (where pyvenv.cfg and lib/python3.*/site-packages live: Python runs the site-packages'
.pth files at every start) or a directory above one of those, chooses the code it runs. Started
by root, that is their code running as root (issue 35: root never runs code from a place another
user can write). So every such place is looked at, and the answer is the one user who controls
them: root (run as today), one other user (run the interpreter as that user: nothing is gained
that they do not have), or a refusal when more than one user, a group or everyone could.

The directories are checked with trusted_directory (one walk from `/`, the one rule of
_trusted_dirs), given the owners found as trusted; the files and links are checked here.
What the interpreter then imports deeper in its site-packages, or what a script's body runs,
is not examined: it belongs to whoever owns those levels, which is the user chosen here.
"""

from __future__ import annotations

import errno
import glob
import os
import pwd
import stat

from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import SAFE, trusted_directory

# The kernel's own limits: 40 symbolic links on one path, 4 levels of `#!` interpreters, and
# the first 256 bytes of a program read for its `#!` line (BINPRM_BUF_SIZE).
MAX_LINKS = 40
MAX_SHEBANGS = 4
SHEBANG_BYTES = 256
# pyvenv.cfg is a few lines; a larger one is not read (its `home` is then not looked at).
PYVENV_CFG_BYTES = 65536
# Where an environment's prefix holds code that runs at start: the standard library and the
# site directories (site-packages, and Debian's dist-packages).
CODE_DIRS = ("lib/python3*", "lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages")


class Refused(Exception):
    """The interpreter must not be run: one sentence, naming the path and who could change it."""


def user_text(uid: int) -> str:
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


class Places:
    """What was found on the way: directories (real paths, for trusted_directory), and files and
    links with their lstat, each with the path first seen owned by each uid (for the sentence)."""

    def __init__(self, python):
        self.python = python
        self.directories = set()
        self.files = []
        self.first_of = {}
        self.prefixes = []

    def owner(self, uid, path):
        self.first_of.setdefault(uid, path)

    def add_directory(self, path):
        path = os.path.realpath(path)
        if path in self.directories:
            return
        self.directories.add(path)
        parts = [part for part in path.split("/") if part]
        for end in range(len(parts) + 1):
            level = "/" + "/".join(parts[:end])
            self.owner(os.lstat(level).st_uid, level)

    def add_file(self, path, info):
        self.files.append((path, info))
        self.owner(info.st_uid, path)


def follow(places, path):
    """The real path of `path`, each symbolic link on the way recorded (owner, the directory it lies
    in, and for a link to the program its environment), as the kernel walks it: a link's target
    replaces it, `..` goes up from where the walk is."""
    pending = [part for part in path.split("/") if part]
    current, hops = "/", 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        info = os.lstat(candidate)
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            places.add_directory(current)
            places.add_file(candidate, info)
            if not pending:
                # A link that names the program: a venv beside it counts as the program's own
                # (bin/python -> python3 -> /usr/bin/python3.11, or a link into a venv's bin).
                add_prefix(places, current)
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending[:0] = [piece for piece in target.split("/") if piece]
        else:
            current = candidate
    return current


def add_prefix(places, bin_dir):
    """The environment of a program in bin_dir: its prefix (bin's parent), pyvenv.cfg and the
    directories of code that runs at start, with the entries of the site directories (a .pth file,
    sitecustomize); and the `home` a pyvenv.cfg names (the base interpreter of a copied venv)."""
    prefix = os.path.dirname(os.path.realpath(bin_dir))
    if prefix in places.prefixes:
        return
    places.prefixes.append(prefix)
    places.add_directory(prefix)
    for pattern in CODE_DIRS:
        for directory in sorted(glob.glob(os.path.join(glob.escape(prefix), pattern))):
            if not os.path.isdir(directory):
                continue
            places.add_directory(directory)
            if directory.endswith("-packages"):
                for entry in sorted(os.listdir(directory)):
                    places.add_file(os.path.join(directory, entry), os.lstat(os.path.join(directory, entry)))
    home = None
    for config in (os.path.join(bin_dir, "pyvenv.cfg"), os.path.join(prefix, "pyvenv.cfg")):
        if os.path.lexists(config):
            places.add_file(config, os.lstat(config))
            home = home or venv_home(config)
    if home and os.path.isabs(home) and os.path.isdir(home):
        places.add_directory(home)
        add_prefix(places, home)


def venv_home(config):
    """The `home` of a pyvenv.cfg, or None."""
    if not stat.S_ISREG(os.lstat(config).st_mode):
        return None
    with open(config, "rb") as handle:
        text = handle.read(PYVENV_CFG_BYTES).decode("utf-8", "replace")
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "home":
            return value.strip()
    return None


def shebang(path):
    """The interpreter named by a `#!` line at the start of path, or None."""
    with open(path, "rb") as handle:
        head = handle.read(SHEBANG_BYTES)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else None


def examine(places, program, depth=0):
    """Record everything that decides what `program` runs; returns nothing, raises OSError."""
    # Python finds its venv from the path as given (pyvenv.cfg beside it or one level up),
    # and its standard library from the real binary: both prefixes count.
    add_prefix(places, os.path.dirname(program))
    real = follow(places, program)
    places.add_directory(os.path.dirname(real))
    places.add_file(real, os.lstat(real))
    add_prefix(places, os.path.dirname(real))
    interpreter = shebang(real) if depth < MAX_SHEBANGS else None
    if interpreter and os.path.isabs(interpreter):
        examine(places, interpreter, depth + 1)


def interpreter_owner(python):
    """(uid, prefix): the one user who controls what `python` runs (0 when root alone does) and the
    prefix of its environment as the path given names it. Raises Refused with one sentence."""
    places = Places(python)
    try:
        examine(places, python)
    except OSError as exc:
        raise Refused("python %s cannot be examined before it is run (%s: %s); nothing was run or removed" % (
            printable(python), printable(exc.filename or python), exc.strerror or exc))
    others = sorted(uid for uid in places.first_of if uid != 0)
    if len(others) > 1:
        raise Refused("refusing to run python %s: more than one user can change what it runs (%s); nothing was "
                      "run or removed" % (printable(python), ", ".join(
                          "%s owns %s" % (user_text(uid), printable(places.first_of[uid])) for uid in others)))
    for directory in sorted(places.directories):
        state, why = trusted_directory(directory, owners=others)
        if state != SAFE:
            raise Refused("refusing to run python %s: %s, so others can change what it runs; nothing was run or "
                          "removed" % (printable(python), why))
    for path, info in places.files:
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Refused("refusing to run python %s: %s may be written by %s (mode %04o), so others can change "
                          "what it runs; nothing was run or removed" % (
                              printable(python), printable(path), "others" if info.st_mode & stat.S_IWOTH else "its group",
                              stat.S_IMODE(info.st_mode)))
    return (others[0] if others else 0), places.prefixes[0]
