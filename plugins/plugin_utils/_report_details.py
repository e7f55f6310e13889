# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a reset stopped and removed, one entry each with why, for a host's row of the fleet report.

A postmortem needs each process a reset stopped (pid, name, command line, GPUs, the signal that
ended it, why it was chosen) and each leftover removed or kept, with why. Read from the steps of
node_reset_result; gpu_reset already masked the secrets of every command line. Each list is bounded
(a host may run thousands of processes): the first MAX_LISTED, and how many were left out.
"""

from __future__ import annotations

from collections.abc import Mapping

# At most this many entries per list and host; the rest are counted in the row's `*_left_out`.
MAX_LISTED = 50
# A command line longer than this is cut, saying how much was left out (after masking: no half secret).
CMDLINE_CHARS = 300
# What a read-only run says of an entry kept in use only by processes a reset would stop.
REMOVED_BY_A_RESET = ", which a reset stops: the reset removes it"


def ran(step) -> bool:
    """Whether a registered step result is the step's own answer (not skipped, reached)."""
    return isinstance(step, Mapping) and bool(step) and not step.get("skipped") and not step.get("unreachable")


def _entries(step, key) -> list:
    return [item for item in (step.get(key) if ran(step) else None) or [] if isinstance(item, Mapping)]


def bounded(items: list) -> tuple:
    """(the first MAX_LISTED items, how many more there were)."""
    return items[:MAX_LISTED], max(len(items) - MAX_LISTED, 0)


def cut_command_line(text, limit: int = CMDLINE_CHARS) -> str:
    text = str(text or "")
    if len(text) <= limit:
        return text
    return "%s... (%d more characters)" % (text[:limit], len(text) - limit)


def _process(target: Mapping) -> dict:
    return {"pid": target.get("pid"), "name": str(target.get("name") or ""),
            "cmdline": cut_command_line(target.get("cmdline")),
            "gpus": [gpu for gpu in target.get("gpus") or [] if isinstance(gpu, int)],
            "reason": str(target.get("evidence") or target.get("reason") or "")}


def _stopping_steps(steps: Mapping) -> list:
    """gpu_reset's result, and the Proxmox node's sweep's (the same module, run on the node)."""
    return [steps.get(name) or {} for name in ("gpu_reset", "pve_sweep")]


def would_stop(steps: Mapping) -> list:
    """What a read-only run found for a reset to stop: {pid, name, cmdline, gpus, reason} per target."""
    return [_process(target) for step in _stopping_steps(steps) for target in _entries(step, "targets")]


def stopped(steps: Mapping) -> list:
    """Each process the reset stopped: its target's {pid, name, cmdline, gpus, reason}, with the
    signal after which it went (SIGTERM, or SIGKILL after the grace period) and how many seconds after
    its round's SIGTERM."""
    found = []
    for step in _stopping_steps(steps):
        targets = {target.get("pid"): target for target in _entries(step, "targets")}
        for item in _entries(step, "killed"):
            entry = _process(targets.get(item.get("pid")) or item)
            entry.update(signal=str(item.get("signal") or ""), seconds=item.get("seconds"))
            found.append(entry)
    return found


def holders(item: Mapping) -> list:
    """{pid, name} of who holds an in_use entry (a result before names were returned: the pids alone)."""
    named = [holder for holder in item.get("holders") or [] if isinstance(holder, Mapping)]
    if not named:
        named = [{"pid": pid, "name": "?"} for pid in item.get("pids") or []]
    return [{"pid": holder.get("pid"), "name": str(holder.get("name") or "?")} for holder in named]


def held_words(item: Mapping) -> str:
    """Who holds an in_use entry, in words: `pid 4242 (VLLM::EngineCor)`, or why none is named."""
    named = item.get("holders") or []
    if not named:
        return "a socket bound to it, no holder seen"
    return ", ".join("pid %s (%s)" % (holder["pid"], holder["name"]) for holder in named)


def _held_only_by(item: Mapping, pids: set) -> bool:
    named = holders(item)
    return bool(named) and all(holder["pid"] in pids for holder in named)


def leftovers(steps: Mapping, area: str, read_only: bool = False) -> list:
    """Each entry of shm_clean's pass over `area` (`shm`: its path, /dev/shm; `tmp`: its tmp_path):
    {path, done, why}, done `removed` (a read-only run: `would remove`) or `kept`.

    Why a removed entry went: nobody held it, or (a real reset) shm_before, the look before the
    signals, saw it held only by processes the reset then stopped: a check keeps such an entry, the
    reset removes it. A read-only run says of an entry kept in use only by processes a reset would
    stop that the reset removes it."""
    shm = steps.get("shm_clean") or {}
    if not ran(shm):
        return []

    def ours(step, key):
        return [item for item in _entries(step, key) if item.get("area", "shm") == area]
    ended = {entry["pid"] for entry in (would_stop(steps) if read_only else stopped(steps))}
    before = {str(item.get("path")): item for item in ours(steps.get("shm_before") or {}, "in_use")}
    in_use = {str(item.get("path")): item for item in ours(shm, "in_use")}
    found = []
    for item in ours(shm, "removed"):
        held = before.get(str(item.get("path")))
        if str(item.get("path")) in in_use:
            why = "in use: %s; removed as remove_in_use asks" % held_words(dict(item, holders=holders(
                in_use.pop(str(item.get("path"))))))
        elif held is not None and _held_only_by(held, ended):
            why = "held only by %s, which the reset stopped" % held_words(dict(held, holders=holders(held)))
        else:
            why = "no live process held it" + (" (nor bound it)" if area == "tmp" else "")
        found.append({"path": str(item.get("path")), "done": "would remove" if read_only else "removed", "why": why})
    for item in in_use.values():
        why = "in use: " + held_words(dict(item, holders=holders(item)))
        if read_only and _held_only_by(item, ended):
            why += REMOVED_BY_A_RESET
        found.append({"path": str(item.get("path")), "done": "kept", "why": why})
    found += [{"path": str(item.get("path")), "done": "kept", "why": str(item.get("why") or "")}
              for item in ours(shm, "kept")]
    return found
