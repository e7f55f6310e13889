# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which live processes open or map given files, decided by device and inode. Private to this collection.

Used by shm_clean. A path string cannot tell whether a process uses a file: a process in another
mount namespace sees the same file under another path, and the kernel prints names with a
newline escaped, a carriage return raw and " (deleted)" appended, so that a file named
"x (deleted)" and an unlinked file named "x" print alike. The kernel's own identity of a file is
its device and inode, and /proc gives both for every use:

- /proc/PID/maps: each line carries the mapping's device (major:minor, hex) and inode;
- /proc/PID/fdinfo/N: `mnt_id:` (a mount of that process's mount namespace, which
  /proc/PID/mountinfo turns into major:minor) and, from Linux 5.14, `ino:`.

Both carry the superblock's device (what mountinfo shows). stat() shows the same for tmpfs and
ordinary file systems, but not on btrfs subvolumes or overlayfs; where the directory's mount and
stat() disagree, files are matched by inode alone: that can only find more users, never fewer.

Descriptors are never stat'ed in bulk: stat on the target of a descriptor into a stuck network
mount blocks the whole scan. Only descriptors whose link name ends in a wanted file's name are
examined further (a file's name in its directory is the same in every mount namespace), and only
those few are stat'ed on kernels whose fdinfo has no `ino:`.

A process whose descriptors or mappings cannot be read is reported as unreadable: its uses of the
files are unknown, and the caller must not treat the files as unused.

A unix socket's file is never open in a process: the process holds a socket, whose inode (sockfs's,
`socket:[N]` in /proc/PID/fd) is not the file's. The kernel lists each bound socket with its inode
and the path it was bound to in /proc/PID/net/unix (one table per network namespace), so a socket
file is in use when a socket bound to its name is listed there; who holds it is who has that
socket:[N] open. The path is the binder's (relative to its working directory, or seen from its own
mount namespace), so a listed path whose last component is the file's name counts: a name that two
directories share can only keep more.
"""

from __future__ import annotations

import os
import re

from ansible_collections.cleanslate.gpu.plugins.module_utils._procs import PROC, kernel_path


class Wanted:
    """The files to look for: {name: inode} in one directory, on one device.

    device is (major, minor) as the kernel prints it for the directory's mount, or None to match
    by inode alone (the file system reports devices inconsistently, or the mount is unknown).
    """

    def __init__(self, inodes, device, sockets=None):
        self.by_inode = {ino: name for name, ino in inodes.items()}
        # {socket inode: name} of the bound unix sockets whose holders are wanted (bound_unix_sockets).
        self.sockets = dict(sockets or {})
        self.names = set(inodes)
        self.device = device
        if device is None:
            # Every file mapping: its inode is looked up below.
            tail = rb"[0-9a-f]+:[0-9a-f]+"
        else:
            tail = re.escape(b"%02x:%02x" % device)
        # address perms offset dev inode: single spaces; a name's newline is escaped as \012 in
        # maps, so "^" is always the start of a mapping's line.
        self.maps_line = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ " + tail + rb" ([0-9]+)", re.M)
        self.maps_needle = None if device is None else b" " + b"%02x:%02x" % device + b" "

    def name_of(self, device, ino):
        """The wanted name that is this file, or None."""
        if self.device is not None and device is not None and device != self.device:
            return None
        return self.by_inode.get(ino)

    def name_matches(self, link):
        """The wanted name that a descriptor's link text ends in (with or without " (deleted)"), or None."""
        base = link.rpartition("/")[2]
        if base in self.names:
            return base
        if kernel_path(base) in self.names:
            return kernel_path(base)
        return None


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _pids(proc):
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def mount_devices(text):
    """{mount id: (major, minor)} and {mount id: fstype} from mountinfo text."""
    devices, types = {}, {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 7 or b":" not in fields[2]:
            continue
        major, minor = fields[2].split(b":", 1)
        mnt_id = int(fields[0])
        devices[mnt_id] = (int(major), int(minor))
        if b"-" in fields[6:]:
            after = fields.index(b"-", 6) + 1
            if after < len(fields):
                types[mnt_id] = fields[after]
    return devices, types


def fdinfo_fields(text):
    """(mnt_id, ino) from /proc/PID/fdinfo/N text; either is None when the kernel does not show it."""
    mnt_id = ino = None
    for line in text.splitlines():
        if line.startswith(b"mnt_id:"):
            mnt_id = int(line.split(b":", 1)[1])
        elif line.startswith(b"ino:"):
            ino = int(line.split(b":", 1)[1])
    return mnt_id, ino


def directory_device(dir_fd, proc=PROC):
    """(major, minor) the kernel shows in maps and mountinfo for files of the open directory,
    or None when that is not the device stat() shows for them (btrfs, overlayfs) or is unknown."""
    try:
        mnt_id = fdinfo_fields(_read("%s/self/fdinfo/%d" % (proc, dir_fd)))[0]
        devices, types = mount_devices(_read("%s/self/mountinfo" % proc))
    except (OSError, ValueError):
        return None
    st = os.fstat(dir_fd)
    device = devices.get(mnt_id)
    if device != (os.major(st.st_dev), os.minor(st.st_dev)) or types.get(mnt_id) == b"overlay":
        return None
    return device


class _Mounts:
    """Mount id -> device, per mount namespace (read once per namespace, not once per process)."""

    def __init__(self, proc):
        self.proc = proc
        self.by_ns = {}

    def device(self, pid, mnt_id):
        ns = os.readlink("%s/%d/ns/mnt" % (self.proc, pid))
        devices = self.by_ns.get(ns)
        if devices is None or mnt_id not in devices:
            # New namespace, or a mount made since it was read: read it (again).
            devices = mount_devices(_read("%s/%d/mountinfo" % (self.proc, pid)))[0]
            self.by_ns[ns] = devices
        return devices.get(mnt_id)


def _descriptor_file(pid, fd, mounts, proc):
    """(device, inode) of one open descriptor; device None when only the inode is known."""
    mnt_id, ino = fdinfo_fields(_read("%s/%d/fdinfo/%s" % (proc, pid, fd)))
    if ino is None:
        # Linux < 5.14 has no ino in fdinfo. This descriptor's name ends in a wanted file's name,
        # so stat'ing it is the rare, accepted exception to "never stat a descriptor's target".
        st = os.stat("%s/%d/fd/%s" % (proc, pid, fd))
        return (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino
    device = mounts.device(pid, mnt_id) if mnt_id is not None else None
    return device, ino


def _gone(exc):
    """True when the error means the process (or descriptor) no longer exists."""
    return isinstance(exc, (FileNotFoundError, ProcessLookupError))


def _opened(pid, wanted, mounts, proc):
    """Wanted names the process has open; raises PermissionError/OSError when it cannot tell."""
    found = set()
    directory = "%s/%d/fd" % (proc, pid)
    for fd in os.listdir(directory):
        try:
            link = os.readlink(directory + "/" + fd)
        except OSError as exc:
            if _gone(exc):
                continue  # closed since the listing
            raise
        if link.startswith("socket:[") and wanted.sockets:
            name = wanted.sockets.get(_socket_inode(link))
            if name is not None:
                found.add(name)
            continue
        name = wanted.name_matches(link)
        if name is None:
            continue
        try:
            device, ino = _descriptor_file(pid, fd, mounts, proc)
        except OSError as exc:
            if _gone(exc):
                continue
            found.add(name)  # carries the name and cannot be told apart: counts as a use
            continue
        if wanted.name_of(device, ino) == name:
            found.add(name)
    return found


def _socket_inode(link):
    """N of a descriptor's link text socket:[N], or None."""
    digits = link[len("socket:["):-1]
    return int(digits) if link.endswith("]") and digits.isdigit() else None


def unix_socket_paths(text):
    """[(socket inode, path)] of the bound sockets in /proc/PID/net/unix text (abstract ones left out)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[6].isdigit() and not fields[7].startswith(b"@"):
            found.append((int(fields[6]), fields[7]))
    return found


def bound_unix_sockets(names, proc=PROC):
    """({socket inode: name}, unreadable pids) of the unix sockets bound to a path whose last
    component is one of `names` (text), in every network namespace a process is in (each
    namespace's table read once). A process whose namespace cannot be told is unreadable."""
    wanted = {os.fsencode(name): name for name in names}
    found, unreadable, seen = {}, [], set()
    for pid in ["self"] + _pids(proc):
        try:
            ns = os.readlink("%s/%s/ns/net" % (proc, pid))
            if ns in seen:
                continue
            text = _read("%s/%s/net/unix" % (proc, pid))
        except OSError as exc:
            if pid != "self" and not _gone(exc):
                unreadable.append(pid)
            continue
        seen.add(ns)
        for inode, path in unix_socket_paths(text):
            name = wanted.get(path.rpartition(b"/")[2])
            if name is not None:
                found[inode] = name
    return found, sorted(unreadable)


def _mapped(pid, wanted, proc):
    """Wanted names the process maps; raises PermissionError/OSError when it cannot tell."""
    data = _read("%s/%d/maps" % (proc, pid))
    if wanted.maps_needle is not None and wanted.maps_needle not in data:
        return set()
    found = set()
    for ino in wanted.maps_line.findall(data):
        name = wanted.by_inode.get(int(ino))
        if name is not None:
            found.add(name)
    return found


def users(inodes, device, proc=PROC, sockets=None):
    """Who uses the files {name: inode} of one directory whose files show `device` (or None), and
    who holds the unix sockets {socket inode: name} (bound_unix_sockets).

    Returns (users, unreadable): users is {name: sorted pids} of live processes that have the
    file open or mapped; unreadable is the sorted pids whose descriptors or mappings could not be
    read, whose uses are therefore unknown. Threads share their process's maps and, unless they
    asked otherwise (unshare(CLONE_FILES), which no shared-memory user does), its descriptors.
    """
    wanted = Wanted(inodes, device, sockets)
    mounts = _Mounts(proc)
    found = {}
    unreadable = []
    if not inodes and not sockets:
        return found, unreadable
    for pid in _pids(proc):
        try:
            names = _opened(pid, wanted, mounts, proc) | _mapped(pid, wanted, proc)
        except OSError as exc:
            if not _gone(exc):
                unreadable.append(pid)
            continue
        for name in names:
            found.setdefault(name, []).append(pid)
    for pids in found.values():
        pids.sort()
    return found, sorted(unreadable)
