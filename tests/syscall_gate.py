"""Run a program under a seccomp filter that holds or refuses chosen system calls: the
environment a test needs to make a race happen on purpose, with no change to the program.

`hold` calls stop the calling thread until the test has looked at them (a seccomp user
notification, Linux 5.5+): the test's handler runs while the program is stopped inside the
call, for example to replace a file between the moment the program examined it and the moment
it acts on it, and the call then continues as the program made it. `deny` calls fail at once
with the given errno, as on a kernel that lacks them (pidfd_open failing with ENOSYS).

The filter is installed by this file run as a script in front of the program (a wrapper that
run_module can use as the module's `python`); it sends the notification descriptor to the test
over a Unix socket, then execs the program, so the filter covers the program and its children.
Only the standard library is used here, since the script runs before anything else is set up.

    with SyscallGate(tmp_path, hold=["unlinkat"], handler=on_unlink) as gate:
        result = run_module("shm_clean", params, python=gate.python)
    gate.calls  # [Call(syscall="unlinkat", pid=..., path=b"nccl-a"), ...]
"""
from __future__ import annotations

import argparse
import ctypes
import errno as errno_names
import os
import platform
import select
import socket
import struct
import sys
import threading
from dataclasses import dataclass

# System call numbers per machine; the filter only knows these.
SYSCALLS = {
    "x86_64": {"unlinkat": 263, "openat": 257, "kill": 62, "pidfd_open": 434, "pidfd_send_signal": 424,
               "seccomp": 317, "rename": 82, "renameat2": 316},
    "aarch64": {"unlinkat": 35, "openat": 56, "kill": 129, "pidfd_open": 434, "pidfd_send_signal": 424,
                "seccomp": 277, "renameat2": 276},
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Which argument of a held call is a path in the caller's memory (for Call.path).
PATH_ARGUMENT = {"unlinkat": 1, "openat": 1}

# linux/seccomp.h and linux/filter.h
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
PR_SET_NO_NEW_PRIVS = 38
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06
NOTIF = struct.Struct("=QII iIQ6Q")  # struct seccomp_notif: id, pid, flags, seccomp_data
NOTIF_RESP = struct.Struct("=QqiI")  # struct seccomp_notif_resp: id, val, error, flags


def _iowr(number, size):
    return (3 << 30) | (size << 16) | (ord("!") << 8) | number


NOTIF_RECV = _iowr(0, NOTIF.size)
NOTIF_SEND = _iowr(1, NOTIF_RESP.size)
NOTIF_ID_VALID = (1 << 30) | (8 << 16) | (ord("!") << 8) | 2

LIBC = ctypes.CDLL(None, use_errno=True)


def machine():
    name = platform.machine()
    if name not in SYSCALLS:
        raise OSError(errno_names.ENOSYS, "syscall_gate knows the system call numbers of %s only, not %s"
                      % (", ".join(SYSCALLS), name))
    return name


def program(hold, deny):
    """The BPF program: held calls notify, denied calls fail with their errno, the rest run."""
    arch = machine()
    numbers = SYSCALLS[arch]
    rules = [(numbers[name], SECCOMP_RET_USER_NOTIF) for name in hold]
    rules += [(numbers[name], SECCOMP_RET_ERRNO | (code & 0xFFFF)) for name, code in deny.items()]
    insns = [(BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
             (BPF_JEQ_K, 1, 0, AUDIT_ARCH[arch]),
             (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),  # another ABI (x32, compat): not ours to judge
             (BPF_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    for number, action in rules:
        insns += [(BPF_JEQ_K, 0, 1, number), (BPF_RET_K, 0, 0, action)]
    insns.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *insn) for insn in insns), len(insns)


def install(hold, deny):
    """Install the filter on this process; the listener descriptor when calls are held, else None."""
    code, count = program(hold, deny)
    buffer = ctypes.create_string_buffer(code)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(count, ctypes.addressof(buffer))
    if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    LIBC.syscall.restype = ctypes.c_long
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER if hold else 0
    fd = LIBC.syscall(ctypes.c_long(SYSCALLS[machine()]["seccomp"]), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                      ctypes.c_uint(flags), ctypes.byref(fprog))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed: %s"
                      % os.strerror(ctypes.get_errno()))
    return fd if hold else None


def main(argv=None):
    """Wrapper: install the filter, hand the listener to the test, exec the program."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", help="Unix socket of the test that receives the listener")
    parser.add_argument("--hold", action="append", default=[])
    parser.add_argument("--deny", action="append", default=[], help="NAME:ERRNO, e.g. pidfd_open:ENOSYS")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    deny = dict((name, getattr(errno_names, code)) for name, code in (item.split(":") for item in args.deny))
    listener = install(args.hold, deny)
    if listener is not None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(args.socket)
            socket.send_fds(conn, [b"L"], [listener])
        os.close(listener)
    os.execv(command[0], command)


@dataclass
class Call:
    syscall: str
    pid: int
    args: tuple
    path: bytes | None


class SyscallGate:
    """The test's side: writes the wrapper, receives the listener, runs handler(call) for each held
    call while the caller waits inside it, then lets the call continue. Records every held call."""

    def __init__(self, directory, hold=(), deny=None, handler=None):
        self.directory = str(directory)
        self.hold = list(hold)
        self.deny = dict(deny or {})
        self.handler = handler
        self.calls = []
        self.errors = []
        self._names = dict((number, name) for name, number in SYSCALLS[machine()].items())
        self._stop = threading.Event()
        self._thread = None
        self._server = None
        self.socket_path = os.path.join(self.directory, "gate.sock")
        self.python = os.path.join(self.directory, "python-gated")

    def __enter__(self):
        deny = " ".join("--deny %s:%s" % (name, errno_names.errorcode[code]) for name, code in self.deny.items())
        hold = " ".join("--hold %s" % name for name in self.hold)
        with open(self.python, "w") as handle:
            handle.write('#!/bin/sh\nexec "%s" "%s" --socket "%s" %s %s -- "%s" "$@"\n' % (
                sys.executable, os.path.abspath(__file__), self.socket_path, hold, deny, sys.executable))
        os.chmod(self.python, 0o755)
        if self.hold:
            self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server.bind(self.socket_path)
            self._server.listen(1)
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._server is not None:
            self._server.close()
            os.unlink(self.socket_path)
        if self.errors and exc_info[0] is None:
            raise self.errors[0]

    def _serve(self):
        try:
            self._server.settimeout(0.2)
            while not self._stop.is_set():
                try:
                    conn, _addr = self._server.accept()
                except socket.timeout:
                    continue
                with conn:
                    _msg, fds, _flags, _addr = socket.recv_fds(conn, 16, 1)
                self._listen(fds[0])
        except BaseException as exc:  # noqa: B902 - handed to the test by __exit__
            self.errors.append(exc)

    def _listen(self, listener):
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        try:
            while True:
                events = poller.poll(200)
                if not events:
                    if self._stop.is_set():
                        return
                    continue
                if events[0][1] & select.POLLIN:
                    self._answer(listener)
                elif events[0][1] & (select.POLLHUP | select.POLLERR):
                    return  # every filtered process has exited
        finally:
            os.close(listener)

    def _ioctl(self, fd, request, buffer):
        while LIBC.ioctl(fd, ctypes.c_ulong(request), buffer) != 0:
            code = ctypes.get_errno()
            if code != errno_names.EINTR:
                return code
        return 0

    def _answer(self, listener):
        buffer = ctypes.create_string_buffer(NOTIF.size)
        code = self._ioctl(listener, NOTIF_RECV, buffer)
        if code == errno_names.ENOENT:
            return  # the caller was interrupted by a signal before we took the call
        if code:
            raise OSError(code, "SECCOMP_IOCTL_NOTIF_RECV failed")
        fields = NOTIF.unpack(buffer.raw)
        notif_id, pid, args = fields[0], fields[1], fields[6:12]
        name = self._names.get(fields[3], str(fields[3]))
        path = None
        try:
            if name in PATH_ARGUMENT:
                path = self._read_string(pid, args[PATH_ARGUMENT[name]])
                valid = ctypes.c_uint64(notif_id)
                if self._ioctl(listener, NOTIF_ID_VALID, ctypes.byref(valid)):
                    return  # the caller is gone: what was read may belong to another process
            call = Call(name, pid, args, path)
            self.calls.append(call)
            if self.handler is not None:
                self.handler(call)
        except BaseException as exc:  # noqa: B902 - the call must still be let go
            self.errors.append(exc)
        finally:
            response = ctypes.create_string_buffer(NOTIF_RESP.pack(notif_id, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE))
            code = self._ioctl(listener, NOTIF_SEND, response)
            if code not in (0, errno_names.ENOENT):
                self.errors.append(OSError(code, "SECCOMP_IOCTL_NOTIF_SEND failed"))

    @staticmethod
    def _read_string(pid, address):
        with open("/proc/%d/mem" % pid, "rb", buffering=0) as mem:
            mem.seek(address)
            data = mem.read(4096)
        return data.split(b"\0", 1)[0]


if __name__ == "__main__":
    main()
