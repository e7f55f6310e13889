"""Host contacts, counted: every ssh client Ansible starts is one (pipelining: one per module run,
whatever task or action runs it). `ANSIBLE_SSH_EXECUTABLE` names a wrapper that notes when (the
kernel's boot clock, /proc/uptime, read by the shell alone, so that counting costs no interpreter
start), then runs ssh. Where BENCH_SSH_CGROUP names a cgroup v2 directory the wrapper moves itself
there first, so that ssh's CPU (the clients and the ControlPersist masters they leave) is read
apart. Read by bench_inference_service.py (contacts before serving again) and bench_fleet.py
(contacts per host, and ssh's share of the controller's CPU)."""
from __future__ import annotations

import time
from pathlib import Path

SSH_COUNTER = """#!/bin/sh
read -r up _ < /proc/uptime
printf '%s\\n' "$up" >> "$BENCH_SSH_LOG"
[ -z "$BENCH_SSH_CGROUP" ] || echo $$ > "$BENCH_SSH_CGROUP/cgroup.procs"
exec ssh "$@"
"""


def ssh_counter(directory: Path) -> tuple:
    """(the wrapper's path, its log, emptied): ANSIBLE_SSH_EXECUTABLE points at the wrapper,
    BENCH_SSH_LOG at the log."""
    wrapper, log = directory / "ssh-counted", directory / "ssh-contacts.log"
    wrapper.write_text(SSH_COUNTER)
    wrapper.chmod(0o755)
    log.unlink(missing_ok=True)
    return wrapper, log


def contact_times(log: Path) -> list:
    """When each contact started, on time.monotonic()'s clock (none when no ssh client ran)."""
    if not log.exists():
        return []
    offset = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    return [float(line) - offset for line in log.read_text().split()]
