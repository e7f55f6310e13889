"""Scenarios of test_gpu_reset_guards.py, each run as PID 1 of a private PID namespace
(tests/functional/pidns.py): the moments a decision of gpu_reset or _procs.terminate is made
on, brought about on purpose.
"""
from __future__ import annotations

import sys
import threading
import time

from tests.functional.gpu_reset_ns import FAST, NO_NVML
from tests.functional.pidns import REPO, read_stat

# The collection as the modules import it (pytest.ini's pythonpath; a scenario has only the repository).
COLLECTIONS = str(REPO / ".ansible" / "collections")


def reused_pid_after_the_round(ns, holder, newcomer, device_paths) -> dict:
    """Start `holder` (a target that exits on SIGTERM) and run gpu_reset under a seccomp gate
    (tests/syscall_gate.py) that holds it at its first read of another process's stat once the
    holder is gone (the scan after the round has begun): this process then reaps the holder and
    starts `newcomer`, a new holder, with the holder's pid (ns_last_pid: nothing else in this
    namespace takes a pid meanwhile). Returns the result, both identities and who lived on."""
    from tests.syscall_gate import SyscallGate  # pylint: disable=import-outside-toplevel
    target = ns.start(**holder)[holder["key"]]
    proc = ns.procs[-1]
    reused = {}

    def on_call(call):
        path = call.path or b""
        if reused or not (path.startswith(b"/proc/") and path.endswith(b"/stat")):
            return
        if path == b"/proc/%d/stat" % target["pid"] or proc.poll() is None:
            return  # the round is not over: the target lives (poll reaps it once it exited)
        with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
            handle.write(str(target["pid"] - 1))
        reused.update(ns.start(**newcomer)[newcomer["key"]])

    with SyscallGate(ns.scratch, hold=["openat"], handler=on_call) as gate:
        result = ns.module("gpu_reset", dict(FAST, device_paths=device_paths), env=NO_NVML, python=gate.python)
    return {"result": result, "target": target, "newcomer": reused or None,
            "newcomer_alive": bool(reused) and ns.alive(reused)}


def lingering_after_sigkill(ns, grace_period, kill_timeout, linger, state="D") -> dict:
    """_procs.terminate on a target that ignores SIGTERM and, after SIGKILL, stays in the kernel
    in `state` for `linger` seconds before it is gone: D while the driver tears down its GPU
    context, R while the kernel frees a large address space. The real process dies at once; the
    /proc that terminate reads (a copy of the real entry, proc=) shows it in `state` until
    `linger` seconds after its death, then a zombie. Returns terminate's outcome and when (seconds after its start) the target went."""
    sys.path.insert(0, COLLECTIONS)
    from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs  # pylint: disable=import-outside-toplevel
    target = ns.start(key="target", ignore_term=True)["target"]
    proc = ns.procs[-1]
    fake = ns.scratch / "proc" / str(target["pid"])
    fake.mkdir(parents=True)
    with open("/proc/%d/stat" % target["pid"], "rb") as handle:
        real = handle.read()
    head, _close, tail = real.rpartition(b") ")
    fields = tail.split(b" ")

    def show(state):
        fields[0] = state
        (fake / "stat.new").write_bytes(head + b") " + b" ".join(fields))
        (fake / "stat.new").rename(fake / "stat")  # never a half-written stat

    show(b"R" if state == "R" else b"S")  # a busy target is runnable before its signals too
    went = {}

    def tear_down():
        while proc.poll() is None:  # the real death, after SIGKILL (SIGTERM is ignored)
            time.sleep(0.005)
        show(state.encode())
        time.sleep(linger)
        show(b"Z")
        went["at"] = time.monotonic() - began

    watcher = threading.Thread(target=tear_down, daemon=True)
    began = time.monotonic()
    watcher.start()
    outcome = _procs.terminate([(target["pid"], target["starttime"])], grace_period, kill_timeout,
                               proc=str(ns.scratch / "proc"))
    returned = time.monotonic() - began
    watcher.join(timeout=30)
    return {"outcome": outcome, "target": target, "went_at": went.get("at"), "returned_at": returned,
            "state_at_return": (read_stat(target["pid"]) or ("gone",))[0]}
