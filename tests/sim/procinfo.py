"""What /proc says about one process, read the way psutil reads it (stdlib only)."""
from __future__ import annotations

import os
import signal
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


class SimError(Exception):
    """Bad input or a failed build: one clear line for the user."""


def _stat_fields(pid: int) -> list:
    with open("/proc/%d/stat" % pid, encoding="utf-8", errors="replace") as handle:
        data = handle.read()
    # comm may hold spaces and parentheses; the fields after the last ")" are fixed.
    return data[data.rindex(")") + 2:].split()


def boot_time() -> float:
    with open("/proc/stat", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise SimError("/proc/stat has no btime line")


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: clock ticks from boot to the process's start."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError, ValueError):
        return None


def ticks_to_time(ticks: int) -> float:
    return ticks / CLK_TCK + boot_time()


def create_time(pid: int) -> float | None:
    """Start time in seconds since the epoch, as psutil.Process.create_time() computes it;
    None when the process is gone."""
    ticks = start_ticks(pid)
    return None if ticks is None else ticks_to_time(ticks)


def state(pid: int) -> str | None:
    try:
        return _stat_fields(pid)[0]
    except (OSError, IndexError):
        return None


def wait_state(pid: int, wanted: str, timeout: float = 30.0) -> bool:
    """Wait until the process is in state `wanted` (e.g. "Z", not reaped yet); False if it
    never was within timeout (generous: the machine is shared)."""
    deadline = time.monotonic() + timeout
    while state(pid) != wanted:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie holds no files and no GPU memory)."""
    return state(pid) not in (None, "Z")


def ppid(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, IndexError, ValueError):
        return None


def comm(pid: int) -> str:
    with open("/proc/%d/comm" % pid, encoding="utf-8", errors="replace") as handle:
        return handle.read().rstrip("\n")


def cmdline(pid: int) -> list:
    with open("/proc/%d/cmdline" % pid, "rb") as handle:
        raw = handle.read()
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def same_process(pid: int, started: float) -> bool:
    """True while `pid` is still the process that started at `started` and is not a zombie
    (pid reuse safe: a new process under the same pid has another start time)."""
    now = create_time(pid)
    return now is not None and abs(now - started) < 0.01 and state(pid) not in ("Z", "X")


def kill_all(procs: list, timeout: float = 60.0) -> list:
    """SIGKILL each {pid, create_time} that is still that process; wait until all are gone.
    Returns the ones signalled."""
    killed = []
    for proc in procs:
        if same_process(proc["pid"], proc["create_time"]):
            try:
                os.kill(proc["pid"], signal.SIGKILL)
                killed.append(proc)
            except ProcessLookupError:
                pass
    alive = wait_gone(killed, timeout)
    if alive:
        raise SimError("processes %s did not exit after SIGKILL" % [p["pid"] for p in alive])
    return killed


def wait_gone(procs: list, timeout: float) -> list:
    """Wait until none of `procs` is alive (zombies count as gone); return those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if same_process(p["pid"], p["create_time"])]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)
