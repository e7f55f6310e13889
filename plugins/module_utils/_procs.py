# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who holds what: the /proc scan shared by gpu_reset and shm_clean.

Private to this collection; the interface may change without notice.

Everything here reads /proc directly with the standard library. Targets of open
files are read with readlink and never stat'ed: stat on the target of a descriptor
that points into a stuck network mount blocks the whole scan.
"""

from __future__ import annotations

import os
import re

PROC = "/proc"
_DELETED = " (deleted)"


def _kernel_path(path):
    """The path as the kernel prints it for an open or mapped file that was unlinked."""
    if path.endswith(_DELETED):
        return path[:-len(_DELETED)]
    return path


def _pids(proc=PROC):
    """Numeric entries of /proc: one per thread-group leader (threads share fds and maps)."""
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def _fd_targets(pid, proc=PROC):
    """Targets of the process's open descriptors; empty if it vanished or is unreadable."""
    fd_dir = "%s/%d/fd" % (proc, pid)
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(fd_dir + "/" + name))
        except OSError:
            # The descriptor was closed between listdir and readlink.
            continue
    return targets


def _mapped_paths(pid, needle, proc=PROC):
    """Paths in the process's maps that may be wanted, or None if maps was unreadable.

    `needle` is a compiled bytes regex of every wanted path: most processes map none of
    them, and one search over the whole file is far cheaper than splitting every line.
    """
    try:
        with open("%s/%d/maps" % (proc, pid), "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if not needle.search(data):
        return []
    paths = []
    for line in data.splitlines():
        # address perms offset dev inode [path]; the path itself may contain spaces.
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith(b"/"):
            paths.append(_kernel_path(os.fsdecode(fields[5])))
    return paths


def _map_files_targets(pid, proc=PROC):
    """Targets of /proc/PID/map_files, used only when maps could not be read.

    Reading map_files needs privileges that most callers lack; where it works it names the
    same files as maps, so it is the fallback, not a second pass.
    """
    return _fd_targets_in("%s/%d/map_files" % (proc, pid))


def _fd_targets_in(directory):
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(directory + "/" + name))
        except OSError:
            continue
    return targets


def scan(paths, include_maps=True, proc=PROC):
    """One pass over /proc: {pid: set of the given paths it has open (or mapped)}.

    Paths are compared as the kernel prints them, with a trailing " (deleted)" removed.
    Processes that vanish mid-scan and entries we may not read are skipped.
    """
    wanted = {}
    for path in paths:
        wanted[os.path.normpath(path)] = path
    held = {}
    if not wanted:
        return held
    needle = re.compile(b"|".join(re.escape(os.fsencode(p)) for p in sorted(wanted)))
    for pid in _pids(proc):
        found = set()
        for target in _fd_targets(pid, proc):
            original = wanted.get(_kernel_path(target))
            if original is not None:
                found.add(original)
        if include_maps:
            mapped = _mapped_paths(pid, needle, proc)
            if mapped is None:
                mapped = [_kernel_path(t) for t in _map_files_targets(pid, proc)]
            for target in mapped:
                original = wanted.get(target)
                if original is not None:
                    found.add(original)
        if found:
            held[pid] = found
    return held


def holders_of(paths, include_maps=True):
    """For each absolute path given, the sorted pids of live processes that have it open
    (or mapped, with include_maps). One pass over /proc for all paths."""
    result = dict((path, []) for path in paths)
    for pid, found in scan(paths, include_maps=include_maps).items():
        for path in found:
            result[path].append(pid)
    for pids in result.values():
        pids.sort()
    return result
