# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which processes listen on a TCP port, from /proc alone. Private to this collection.

/proc/net/tcp and /proc/net/tcp6 (of the reader's network namespace) list every socket with its
local address, its state (0A is LISTEN) and its inode; a process holds the socket when one of
its descriptors links to `socket:[inode]`. A listening socket may be held by several processes
(workers forked after bind, SO_REUSEPORT), and by none that can be seen (a process whose
descriptors may not be read, or one in another PID namespace): the caller is told both.
"""

from __future__ import annotations

import os

from ansible_collections.cleanslate.gpu.plugins.module_utils._procs import PROC, _pids, read_cgroup, read_cmdline, \
    read_stat

TCP_LISTEN = "0A"


def listening_sockets(port, proc=PROC):
    """Inodes of the TCP sockets (IPv4 and IPv6) listening on port, on any address."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open("%s/net/%s" % (proc, table), "rb") as handle:
                lines = handle.read().decode("ascii", "replace").splitlines()[1:]
        except OSError:  # no tcp6 where IPv6 is off
            continue
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            fields = line.split()
            if len(fields) > 9 and fields[3] == TCP_LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def socket_holders(inodes, proc=PROC):
    """({inode: sorted pids holding it}, sorted pids whose descriptors could not be read)."""
    links = {"socket:[%d]" % inode: inode for inode in inodes}
    holders = {inode: [] for inode in inodes}
    unreadable = []
    for pid in _pids(proc):
        directory = "%s/%d/fd" % (proc, pid)
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone
        except OSError:
            unreadable.append(pid)
            continue
        for name in names:
            try:
                inode = links.get(os.readlink(directory + "/" + name))
            except PermissionError:
                # A root without CAP_SYS_PTRACE lists another user's fd directory but may not
                # follow its links (EACCES): that process may hold the port, it is not gone.
                unreadable.append(pid)
                break
            except OSError:
                continue  # closed since the listing
            if inode is not None and pid not in holders[inode]:
                holders[inode].append(pid)
    return {inode: sorted(pids) for inode, pids in holders.items()}, sorted(unreadable)


def cgroup_path(text):
    """The process's control group path from /proc/PID/cgroup text: the cgroup v2 line (0::),
    else systemd's hierarchy of cgroup v1 (name=systemd); '' when neither is there."""
    found = ""
    for line in text.splitlines():
        hierarchy, dummy, rest = line.partition(":")
        controllers, dummy, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            return path
        if controllers == "name=systemd":
            found = path
    return found


def describe(pid, proc=PROC):
    """{pid, name (its command line, or its comm), cgroup (path)} of a process."""
    stat = read_stat(pid, proc)
    name = " ".join(read_cmdline(pid, proc)) or (stat["comm"] if stat else "?")
    return {"pid": pid, "name": name[:200], "cgroup": cgroup_path(read_cgroup(pid, proc))}


def listeners(port, proc=PROC):
    """Who listens on port: {"sockets": {inode: [{pid, name, cgroup}, ...]}, "unreadable": [pids]}."""
    holders, unreadable = socket_holders(listening_sockets(port, proc), proc)
    return {"sockets": {inode: [describe(pid, proc) for pid in pids] for inode, pids in holders.items()},
            "unreadable": unreadable}
