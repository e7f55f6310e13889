"""What happened to the names of one directory, from the kernel's inotify queue: which names were
created, written, closed after writing, renamed away and renamed in, in order.

The kernel queues an event inside the system call that causes it, so the events a program caused
are all in the queue when it has exited, whatever the machine's load: a test reads them afterwards
and sees every name that ever existed, even for a microsecond (no polling, no race). A queue that
overflowed lost events; reading it raises rather than answer with a partial history.

    with DirectoryEvents(tmp_path) as events:
        run_module(...)
        events.read()  # [Event(kind="create", name=".x.tmp", cookie=0), ..., Event("moved_to", "x.prom", 7)]
"""
from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass

# linux/inotify.h
IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
KINDS = {IN_CREATE: "create", IN_MODIFY: "modify", IN_CLOSE_WRITE: "close_write", IN_MOVED_FROM: "moved_from",
         IN_MOVED_TO: "moved_to", IN_DELETE: "delete"}
HEADER = struct.Struct("=iIII")  # struct inotify_event: wd, mask, cookie, len (then the name, NUL-padded)

LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Event:
    kind: str  # one of KINDS' values
    name: str  # the entry's name at the time (os.fsdecode of the bytes)
    cookie: int  # pairs a moved_from with its moved_to; 0 for the other kinds


class DirectoryEvents:
    """An inotify watch on `directory` (its entries, not below), for the kinds in KINDS."""

    def __init__(self, directory):
        self.directory = os.fsencode(directory)
        self.fd = -1

    def __enter__(self):
        self.fd = LIBC.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1: %s" % os.strerror(ctypes.get_errno()))
        if LIBC.inotify_add_watch(self.fd, self.directory, sum(KINDS)) < 0:
            error = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(error, "inotify_add_watch %s: %s" % (os.fsdecode(self.directory), os.strerror(error)))
        return self

    def __exit__(self, *exc):
        os.close(self.fd)

    def read(self) -> list:
        """The events queued since the last read, oldest first."""
        events = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                dummy, mask, cookie, length = HEADER.unpack_from(data, offset)
                name = data[offset + HEADER.size:offset + HEADER.size + length].rstrip(b"\0")
                offset += HEADER.size + length
                if mask & IN_Q_OVERFLOW:
                    raise OverflowError("the inotify queue of %s overflowed: events were lost" % os.fsdecode(self.directory))
                for bit, kind in KINDS.items():
                    if mask & bit:
                        events.append(Event(kind, os.fsdecode(name), cookie))
