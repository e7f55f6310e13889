"""Run a test's processes, and the module it points at them, inside a private PID namespace.

    result = run_in_pidns("tests.functional.test_x:scenario", lib_dir=str(...), ...)

starts `unshare --pid --fork --mount-proc --kill-child`, whose first process (PID 1 of the new
namespace, with a /proc of its own) imports `scenario` and calls it with a `Namespace` and the
keyword arguments; what it returns comes back as JSON. The scenario starts holders, runs the
module with `ns.module(...)` and reports the holders' fates with `ns.alive(...)`. A module
that goes wrong can only signal what the scenario started: nothing else is in its namespace.
When PID 1 ends (or the test's timeout kills unshare), the kernel kills everything left in
the namespace, so no test leaves a process behind.

The first process a scenario starts gets PID 2: a scenario that needs that starts it first.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK = "@@pidns-result@@ "

# A holder: takes a name, ignores SIGTERM or forks on it, opens files, maps files (one page,
# MAP_PRIVATE, as a CUDA context maps /dev/nvidiaN; with close_mapped, then closes their
# descriptors, so that only the mappings show), forks children (which inherit the
# mappings, as a child forked after CUDA initialisation does, unless `fresh`: then the child
# execs itself anew and inherits nothing), says it is ready on stdout
# (one write per line: parent and children share the pipe) and waits for signals.
HOLDER = r"""
import ctypes, json, mmap, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
kept = []

def say(spec):
    os.write(1, (json.dumps({"key": spec.get("key"), "pid": os.getpid(), "ppid": os.getppid()}) + "\n").encode())

def take(spec):
    if spec.get("name"):
        name = bytes.fromhex(spec["name"][4:]) if spec["name"].startswith("hex:") else spec["name"].encode()
        libc.prctl(15, name[:15], 0, 0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if spec.get("ignore_term") else signal.SIG_DFL)
    kept.extend(os.open(path, os.O_RDONLY) for path in spec.get("open", []))
    for path in spec.get("map", []):
        fd = os.open(path, os.O_RDONLY)
        kept.append(fd)
        if libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0) in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of %s failed" % path)
        if spec.get("close_mapped"):
            os.close(kept.pop())  # the mapping alone keeps the file in use
    if spec.get("term_forks"):
        def on_term(signum, frame):
            # A SIGTERM handler that forks a successor (which keeps the mappings) and exits once
            # the successor is set up, so that the successor is what a scan finds next.
            ready, done = os.pipe()
            if os.fork() == 0:
                os.close(ready)
                become(spec["term_forks"], done)
            os.close(done)
            os.read(ready, 1)
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
    if spec.get("term_detaches"):
        def on_detach(signum, frame):
            # A SIGTERM handler that detaches a successor as a daemon does (fork, setsid, fork
            # again, the middle one exits) and exits at once, without waiting: the successor keeps
            # the mappings and is created after its parent is gone, by a process that lives a moment.
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.setsid()
                if spec.get("detach_hold"):
                    # The middle process waits for the test (a FIFO) before it forks, its pid beside it.
                    with open(spec["detach_hold"] + ".pid", "w") as handle:
                        handle.write(str(os.getpid()))
                    open(spec["detach_hold"], "rb").read(1)
                if os.fork() == 0:
                    become(spec["term_detaches"])
                os._exit(0)
            os._exit(0)
        signal.signal(signal.SIGTERM, on_detach)

def become(spec, done=None):
    take(spec)
    for child in spec.get("children", []):
        if os.fork() == 0:
            if child.get("fresh"):
                # A worker started anew (fork and exec): none of the parent's mappings or files.
                source = open("/proc/self/cmdline", "rb").read().split(b"\0")[2]
                os.execv(sys.executable, [sys.executable, "-c", source, json.dumps(child)])
            become(child)
    say(spec)
    if done is not None:
        os.write(done, b"+")
        os.close(done)
    if spec.get("exits"):
        os._exit(0)
    while spec.get("fork_every"):
        # A parent forking in a loop: each child keeps the mappings and waits to be signalled.
        time.sleep(spec["fork_every"])
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            while True:
                signal.pause()
    while True:
        signal.pause()

become(json.loads(sys.argv[1]))
"""


def count(spec: dict) -> int:
    """How many processes of a spec say they are ready (not the SIGTERM-forked successors)."""
    return 1 + sum(count(child) for child in spec.get("children", []))


class Namespace(object):
    """What a scenario running as PID 1 of its namespace uses."""

    def __init__(self):
        self.procs = []
        self.scratch = Path(tempfile.mkdtemp(prefix="pidns-"))
        self.scratch.chmod(0o755)
        self.readable = None  # the modules copied for runs as another user (tests/readable_copy.py)

    def start(self, argv_extra=(), uid=None, python=None, **spec) -> dict:
        """Start a holder (see HOLDER; spec keys: key, name ("hex:..." for raw bytes), open, map,
        ignore_term, term_forks, term_detaches (detach_hold),
        children (each may be `fresh`), exits, fork_every, close_mapped) and return {key: {pid, ppid, starttime}} of it
        and its children, once each is ready. argv_extra: more arguments (bytes allowed) that
        only show in its cmdline; uid: run it as this user; python: the interpreter to run it
        with (e.g. a link named like a protected daemon). A holder that exits is waited for."""
        argv = [python or sys.executable, "-c", HOLDER, json.dumps(spec)] + list(argv_extra)
        proc = subprocess.Popen(as_user(uid) + argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        found = {}
        for _ready in range(count(spec)):
            line = json.loads(proc.stdout.readline())
            line["starttime"] = starttime(line["pid"])
            found[line.pop("key") or str(line["pid"])] = line
        if spec.get("exits"):
            proc.wait()
        return found

    def alive(self, entry: dict) -> bool:
        """Whether the process of {pid, starttime} is still alive (a zombie is not)."""
        stat = read_stat(entry["pid"])
        return stat is not None and stat[1] == entry["starttime"] and stat[0] not in ("Z", "X")

    def reap(self) -> None:
        """Collect the exit status of every process that ended (orphans come to PID 1)."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def mappers(self, paths) -> list:
        """Pids of live processes that map any of these paths."""
        wanted = set(str(p) for p in paths)
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/maps" % name, "rb") as handle:
                    lines = handle.read().decode(errors="replace").splitlines()
            except OSError:
                continue
            if any(len(line.split(None, 5)) == 6 and line.split(None, 5)[5] in wanted for line in lines):
                found.append(int(name))
        return sorted(found)

    def module(self, name: str, params: dict, check: bool = False, diff: bool = False, env: dict | None = None,
               uid: int | None = None, python: str | None = None) -> dict:
        """Run a module as Ansible does (tests/run_module.py), as root or as user `uid`, with
        this machine's interpreter or `python`."""
        from tests import readable_copy  # pylint: disable=import-outside-toplevel
        from tests.run_module import run_module  # pylint: disable=import-outside-toplevel
        collections = None
        if uid is not None:
            # The arguments file is root's; this shell opens it before setpriv drops to the user,
            # and the module reads its arguments from stdin, as AnsibleModule does without argv[1].
            python = self.scratch / ("python-as-%d" % uid)
            python.write_text('#!/bin/sh\nexec %s %s "$1" < "$2"\n' % (" ".join(as_user(uid)), sys.executable))
            python.chmod(0o755)
            # The checkout may be closed to the user (a clone in root's home): a copy it can read.
            if self.readable is None:
                self.readable = readable_copy.modules()
            collections = self.readable
        result = run_module(name, params, check=check, diff=diff, env=env, python=str(python) if python else None,
                            collections=collections)
        self.reap()
        return result

    def close(self):
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.readable is not None:
            shutil.rmtree(self.readable, ignore_errors=True)


def as_user(uid) -> list:
    """The command prefix that runs a program as user `uid` (and its group), or [] for ourselves.

    setpriv, not Popen(user=...): this machine's interpreter lives under a directory only root
    may search, and setpriv still starts it, as a user's login would not."""
    return [] if uid is None else ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups", "--"]


def read_stat(pid: int):
    """(state, starttime) of a pid, or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[19])


def starttime(pid: int):
    stat = read_stat(pid)
    return stat[1] if stat else None


def available() -> str | None:
    """None if PID namespaces can be made here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1) here"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True,
                           check=False)
    return None if probe.returncode == 0 else "cannot make a PID namespace: %s" % probe.stderr.strip()


def run_in_pidns(ref: str, timeout: float = 300, **kwargs) -> dict:
    """Call the scenario `module:function` as PID 1 of a new PID namespace; its return value."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m",
                           "tests.functional.pidns", ref, json.dumps(kwargs)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        raise AssertionError("the scenario %s gave no result (rc=%s)\nstdout:\n%s\nstderr:\n%s"
                             % (ref, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    result = json.loads(lines[-1][len(MARK):])
    if "scenario_error" in result:
        raise AssertionError("the scenario %s failed inside its namespace:\n%s" % (ref, result["scenario_error"]))
    return result


def main(argv) -> int:
    ref, kwargs = argv[0], json.loads(argv[1])
    if os.getpid() != 1:
        raise SystemExit("tests.functional.pidns runs scenarios as PID 1 of a new PID namespace only")
    module_name, function = ref.split(":")
    ns = Namespace()
    try:
        result = getattr(importlib.import_module(module_name), function)(ns, **kwargs)
    except Exception:  # pylint: disable=broad-except
        result = {"scenario_error": traceback.format_exc()}
    finally:
        ns.close()
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
