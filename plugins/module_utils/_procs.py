# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who holds what, and who is alive: the /proc reading of gpu_reset, shm_clean and _nvml.

Private to this collection; the interface may change without notice.

Everything here reads /proc directly with the standard library. Targets of open
files are read with readlink and never stat'ed: stat on the target of a descriptor
that points into a stuck network mount blocks the whole scan. /proc/PID/stat is read
in one place, read_stat; whether a process lives is decided in one place, alive.
"""

from __future__ import annotations

import os
import re
import select
import signal
import time

PROC = "/proc"
_DELETED = " (deleted)"


def kernel_path(path):
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


def fd_targets(pid, proc=PROC):
    """Targets of the process's open descriptors; empty if it vanished or is unreadable."""
    return _links_in("%s/%d/fd" % (proc, pid))


def _links_in(directory):
    """readlink of every entry, skipping entries that vanish between listdir and readlink."""
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


def _mapped_paths(pid, needle, proc=PROC):
    """Paths in the process's maps that may be wanted, or None if maps was unreadable.

    `needle` is a compiled bytes regex that every wanted path matches (their directories):
    most processes map nothing there, and one search over the whole file is far cheaper than splitting every line.
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
            paths.append(kernel_path(os.fsdecode(fields[5])))
    return paths


def _map_files_targets(pid, proc=PROC):
    """Targets of /proc/PID/map_files, used only when maps could not be read.

    Reading map_files needs privileges that most callers lack; where it works it names the
    same files as maps, so it is the fallback, not a second pass.
    """
    return _links_in("%s/%d/map_files" % (proc, pid))


def _wanted(paths):
    """({path as the kernel prints it: path as given}, bytes regex of their directories).

    The regex prefilters maps: every wanted path contains its directory plus "/", and most
    processes map nothing there. Compiling one alternative per path would take seconds for
    10,000 paths; their directories are few."""
    wanted = {}
    for path in paths:
        wanted[os.path.normpath(path)] = path
    prefixes = sorted({os.path.join(os.path.dirname(p), "") for p in wanted})
    needle = re.compile(b"|".join(re.escape(os.fsencode(p)) for p in prefixes)) if prefixes else None
    return wanted, needle


def _files_of(pid, wanted, needle, proc):
    """(wanted paths the process has open, wanted paths it has mapped), as given.

    Paths are compared as the kernel prints them, with a trailing " (deleted)" removed; a
    process that vanished meanwhile, or whose entries may not be read, has none."""
    opened = set()
    for target in fd_targets(pid, proc):
        original = wanted.get(kernel_path(target))
        if original is not None:
            opened.add(original)
    mapped = set()
    found = _mapped_paths(pid, needle, proc)
    if found is None:
        found = [kernel_path(t) for t in _map_files_targets(pid, proc)]
    for target in found:
        original = wanted.get(target)
        if original is not None:
            mapped.add(original)
    return opened, mapped


def mapped_files(pid, needle, proc=PROC):
    """Every path the process maps, if any of them matches the bytes regex `needle` (else
    []): e.g. the NVIDIA device files of a process NVML lists, wherever they are mounted."""
    return _mapped_paths(pid, needle, proc) or []


# --- the process table: one read of /proc/PID/stat per process ---------------------------

_PF_KTHREAD = 0x00200000  # include/linux/sched.h: this task is a kernel thread

# States of a process that has exited and is still in /proc: a zombie (Z) waiting for its
# parent to reap it, a dead task (X; x on kernels before 4.14) being torn down. It runs no
# code and holds no file, mapping or GPU memory any more.
EXITED = ("Z", "X", "x")


def _parse_stat(pid, proc):
    """{pid, comm, state, ppid, flags, starttime} from /proc/PID/stat.

    Raises what open and read raise (FileNotFoundError, or ProcessLookupError when the process
    went between the two: there is no such process; PermissionError and other OSErrors: it
    exists but may not be read), and ValueError for text the kernel does not write."""
    with open("%s/%d/stat" % (proc, pid), "rb") as handle:
        data = handle.read()
    # comm sits in parentheses and may itself contain ") ", so split at the last one.
    close = data.rfind(b")")
    rest = data[close + 2:].split() if close >= 0 else []
    if len(rest) < 20:
        raise ValueError("/proc/%d/stat is cut short" % pid)
    return {
        "pid": pid,
        "comm": os.fsdecode(data[data.find(b"(") + 1:close]),
        "state": os.fsdecode(rest[0]),
        "ppid": int(rest[1]),
        "flags": int(rest[6]),
        "starttime": int(rest[19]),
    }


def read_stat(pid, proc=PROC):
    """{pid, comm, state, ppid, flags, starttime} from /proc/PID/stat, or None if the process
    is gone or its entry cannot be read: what is not read is never acted on.

    starttime (clock ticks since boot) is the process's identity: a reused pid has another.
    """
    try:
        return _parse_stat(pid, proc)
    except (OSError, ValueError):
        return None


def alive(pid, starttime=None, proc=PROC, unreadable=True):
    """Whether pid is a process that has not exited (its state is not in EXITED) and, with
    starttime, the very process that started then (a reused pid has another start time).

    An entry that exists but cannot be read (/proc mounted with hidepid=1, a security module)
    returns `unreadable`: whether it lives is unknown, so the caller says which guess is safe.
    The default, alive, is the safe side of every keep-or-remove decision (a segment whose
    creator may live is kept; a target is not reported gone on a guess) and what NVML's
    "exists" means (the pid is there). Sending a signal needs proof of identity: False."""
    try:
        stat = _parse_stat(pid, proc)
    except (FileNotFoundError, ProcessLookupError):
        return False
    except (OSError, ValueError):
        return unreadable
    return stat["state"] not in EXITED and (starttime is None or stat["starttime"] == starttime)


def read_cmdline(pid, proc=PROC):
    """The argument vector, or [] for kernel threads, zombies and vanished processes."""
    try:
        with open("%s/%d/cmdline" % (proc, pid), "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    return [os.fsdecode(arg) for arg in data.rstrip(b"\0").split(b"\0")] if data else []


def read_cgroup(pid, proc=PROC):
    """/proc/PID/cgroup as text ('' if unreadable): matched by substring, e.g. '/lxc/129/'."""
    try:
        with open("%s/%d/cgroup" % (proc, pid), "rb") as handle:
            return os.fsdecode(handle.read())
    except OSError:
        return ""


def cgroup_components(text):
    """Every component of every path in /proc/PID/cgroup text (cgroup v2 and each v1 hierarchy):
    a systemd unit's processes have the unit's name as one, e.g. system.slice/vllm-b.service."""
    found = set()
    for line in text.splitlines():
        path = kernel_path(line.split(":", 2)[-1])
        found.update(part for part in path.split("/") if part)
    return found


def is_kernel_thread(stat):
    """What the kernel flags as one, and nothing else: inside a container's PID namespace
    pid 2 and its children are ordinary processes (often the inference server itself)."""
    return bool(stat["flags"] & _PF_KTHREAD)


def boot_time(proc=PROC):
    """When the system booted, in seconds since the epoch (btime in /proc/stat)."""
    with open("%s/stat" % proc, "rb") as handle:
        for line in handle:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise ValueError("%s/stat has no btime line" % proc)


def start_time(stat, proc=PROC):
    """When the process of this stat started, in seconds since the epoch (as ps and psutil
    give it): its starttime in clock ticks since boot, plus the boot time."""
    return stat["starttime"] / os.sysconf("SC_CLK_TCK") + boot_time(proc)


def now_ticks():
    """The current time in the unit and clock of starttime in /proc/PID/stat (clock ticks
    since boot, CLOCK_BOOTTIME, which a time namespace offsets the same way): a process whose
    starttime is at or after this value started after this call."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def process_table(with_cmdline=False, proc=PROC, paths=None, pids=None):
    """{pid: stat dict (+ 'cmdline')} for every process alive during the pass (or for those of
    `pids` that are).

    With `paths` (absolute, as the kernel prints them), each entry also has 'opened' and
    'mapped': the sets of those paths the process has open and has mapped. A process's
    files and command line are read between two reads of its stat and kept only if its
    start time did not change in between, so evidence and identity always belong to the
    same process: a pid reused mid-pass is left out, never given another process's files.
    """
    wanted, needle = _wanted(paths) if paths is not None else (None, None)
    table = {}
    for pid in sorted(pids) if pids is not None else _pids(proc):
        stat = read_stat(pid, proc)
        if stat is None:
            continue
        if wanted is not None:
            stat["opened"], stat["mapped"] = _files_of(pid, wanted, needle, proc) if wanted else (set(), set())
        if with_cmdline:
            stat["cmdline"] = read_cmdline(pid, proc)
        if with_cmdline or (wanted and (stat["opened"] or stat["mapped"])):
            again = read_stat(pid, proc)
            if again is None or again["starttime"] != stat["starttime"]:
                continue
            stat["state"] = again["state"]  # a process that exited meanwhile is a zombie now
        table[pid] = stat
    return table


def unseen(table, proc=PROC):
    """Pids in /proc now that `table` does not have: processes started since its pass listed
    /proc (or gone from the listing to the read)."""
    return set(_pids(proc)) - set(table)


def ancestors(pid, proc=PROC):
    """pid itself and every ancestor up to (and including) pid 1, read live."""
    chain = []
    seen = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        chain.append(pid)
        stat = read_stat(pid, proc)
        if stat is None:
            break
        pid = stat["ppid"]
    return chain


def children_index(table):
    """{ppid: [pids]} from a process table."""
    index = {}
    for pid, stat in table.items():
        index.setdefault(stat["ppid"], []).append(pid)
    return index


def descendants(roots, index, stop):
    """Every descendant of roots, breadth first, never walking into or through a pid for
    which stop(pid) is true: an excluded process shields its own children too."""
    found = []
    seen = set(roots)
    queue = list(roots)
    while queue:
        parent = queue.pop(0)
        for child in sorted(index.get(parent, ())):
            if child in seen or stop(child):
                continue
            seen.add(child)
            found.append(child)
            queue.append(child)
    return found


# Never stopped, whatever holds a GPU (gpu_reset), and never taken for a failed server's (evidence):
# the driver's daemons, monitoring, MPS, the display server.
DEFAULT_PROTECT_NAMES = ["nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nv-fabricmanager", "nvlsm",
                         "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "Xorg", "Xwayland"]


def executable_name(pid, proc=PROC):
    """The base name of the process's executable ('' if unknown), read with readlink: the kernel's
    own, kept when a daemon renames its comm and rewrites its argv[0]."""
    try:
        return os.path.basename(kernel_path(os.readlink("%s/%d/exe" % (proc, pid))))
    except OSError:
        return ""


def name_is_protected(names, comm, protect):
    """True if any of a process's names is in protect.

    The kernel truncates comm to 15 bytes, so a comm of exactly 15 characters also counts
    when a protected name starts with it: erring towards sparing a process is the safe side.
    """
    if any(name in protect for name in names if name):
        return True
    return len(comm) == 15 and any(p.startswith(comm) for p in protect)


# --- signalling: TERM everything at once, wait, KILL what remains, wait ------------------

class _Handle:
    """One target pinned to its identity.

    With pidfds (Linux >= 5.3, Python >= 3.9) the descriptor is opened first and the start
    time checked after, so every later signal reaches exactly this process or nobody, and
    poll() on the descriptors wakes us the moment a process exits (zombie included).
    Without them we recheck the start time before each kill() and poll /proc. A target whose
    entry cannot be read is never signalled on a guess, nor counted gone on one.
    """

    def __init__(self, pid, starttime, proc=PROC):
        self.pid = pid
        self.starttime = starttime
        self.proc = proc
        self.pidfd = None
        self.gone = False
        self.gone_at = None
        self.signal = None
        self.error = None  # (signal name, why) when a signal could not be sent
        if hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                self.gone = True
                return
            except OSError:
                self.pidfd = None  # kernel without pidfd support: fall back to kill()
        if not alive(pid, starttime, proc, unreadable=False):
            self.gone = True
            self.close()

    def pending(self):
        """Still to be waited for: not gone, and not refused a signal."""
        return not self.gone and self.error is None

    def running(self):
        """Alive and runnable (state R): after SIGKILL, a process on its way out."""
        stat = read_stat(self.pid, self.proc)
        return (stat is not None and stat["starttime"] == self.starttime and stat["state"] == "R")

    def send(self, signum, name):
        """Deliver signum; False if the process turned out to be gone already or the
        signal was refused (then `error` says why, e.g. another user's process)."""
        if self.gone:
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            elif alive(self.pid, self.starttime, self.proc, unreadable=False):
                os.kill(self.pid, signum)
            else:
                return False
        except ProcessLookupError:
            return False
        except OSError as exc:  # EPERM above all: not ours to signal
            self.error = (name, exc.strerror or str(exc))
            return False
        return True

    def close(self):
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _reap(pid):
    """Collect the exit status if the target happens to be our own child, so it does not
    linger as our zombie; for anyone else's process this is a no-op."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:
        pass


def _wait(handles, deadline, started, clock):
    """Mark handles gone as they exit, until all are gone or the deadline passes. Always
    checks each one at least once, however close the deadline."""
    delay = 0.002
    while True:
        waiting = [h for h in handles if h.pending()]
        now = clock()
        for handle in waiting:
            if not alive(handle.pid, handle.starttime, handle.proc):
                handle.gone = True
                handle.gone_at = now - started
                _reap(handle.pid)
        waiting = [h for h in waiting if not h.gone]
        if not waiting or now >= deadline:
            return
        timeout = max(0.0, deadline - now)
        with_fd = [h for h in waiting if h.pidfd is not None]
        if len(with_fd) == len(waiting):
            # Every survivor has a pidfd: sleep until one exits instead of polling.
            poller = select.poll()
            for handle in with_fd:
                poller.register(handle.pidfd, select.POLLIN)
            poller.poll(timeout * 1000.0)
        else:
            time.sleep(min(delay, timeout))
            delay = min(delay * 2, 0.05)


# After SIGKILL a process is runnable until the kernel has torn it down, which takes a
# moment after kill() returns (longer on a busy machine). One still runnable when
# kill_timeout ends is on its way out, not a survivor: it gets up to this much longer.
# A process that cannot die is not runnable: it sleeps uninterruptibly (state D).
SETTLE_S = 2.0


def _settle(handles, started, clock):
    limit = clock() + SETTLE_S
    while clock() < limit:
        running = [h for h in handles if h.pending() and h.running()]
        if not running:
            break
        _wait(running, min(limit, clock() + 0.05), started, clock)
    _wait(handles, clock(), started, clock)  # the last look, after the deadline


def terminate(targets, grace_period, kill_timeout, proc=PROC, clock=time.monotonic):
    """Stop targets, a list of (pid, starttime): SIGTERM to all at once, SIGKILL to those
    still there after grace_period, then wait up to kill_timeout (and for a process still
    on its way out, see SETTLE_S).

    Returns {ended, survivors, signalled, refused}: ended is [{pid, signal, seconds}] for
    every process that we signalled and that is gone (exited or zombie), signal being the
    one after which it went; survivors are the pids still alive after SIGKILL; signalled
    is how many processes received at least one signal; refused is [{pid, signal, error}]
    for every process a signal could not be sent to (it is left as it was, and alive).
    """
    started = clock()
    handles = [_Handle(pid, starttime, proc) for pid, starttime in targets]
    signalled = 0
    try:
        for handle in handles:
            if handle.send(signal.SIGTERM, "SIGTERM"):
                handle.signal = "SIGTERM"
                signalled += 1
            elif handle.error is None:
                handle.gone = True
        _wait(handles, started + grace_period, started, clock)
        for handle in handles:
            if handle.pending():
                if handle.send(signal.SIGKILL, "SIGKILL"):
                    handle.signal = "SIGKILL"
                elif handle.error is None:
                    handle.gone = True
                    handle.gone_at = clock() - started
        _wait(handles, clock() + kill_timeout, started, clock)
        _settle(handles, started, clock)
    finally:
        for handle in handles:
            handle.close()
    ended = [{"pid": h.pid, "signal": h.signal, "seconds": round(h.gone_at, 3)}
             for h in handles if h.gone and h.signal is not None and h.gone_at is not None]
    return {
        "ended": ended,
        "survivors": [h.pid for h in handles if h.pending()],
        "signalled": signalled,
        "refused": [{"pid": h.pid, "signal": h.error[0], "error": h.error[1]} for h in handles if h.error is not None],
    }
