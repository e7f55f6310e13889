# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A host's row of the fleet report from its node_reset_result: MiB freed per GPU, lost GPUs,
seconds per step, what a read-only run would stop.

The figures are arithmetic in Python, once per host, from the step results the role keeps in
the fact. Read by the fleet_report action (the report) and the metric_families filter (the
same figures as metrics), so that a dashboard and the report never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _node_reset_steps as _steps
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_details import (bounded, holders, leftovers, ran as _ran,
                                                                                     stopped, would_stop)
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import as_number

NOT_RUN = "no result: the host failed or did not answer before the role's first step (see the run's output)"
# The steps that measure their own time, in the order they run (node_reset_result.steps): the
# unit stop is systemd's, not measured.
STEPS = tuple(name for name in _steps.RESULT_STEPS if name != "unit")


def figure(value, kind=int):
    """A figure of a module result as a number of `kind`; None when it is missing, not a number
    or not finite."""
    number = as_number(value)
    return kind(number) if number is not None and math.isfinite(number) else None


def _gpus(step, key="gpus") -> list:
    entries = step.get(key) if _ran(step) else None
    return [gpu for gpu in entries or [] if isinstance(gpu, Mapping)]


def memory_before(steps: Mapping) -> list:
    """NVML's reading before the reset: the separate read before a unit stop, else gpu_reset's own."""
    return _gpus(steps.get("nvml_before") or {}) or _gpus(steps.get("gpu_reset") or {}, "memory_before")


def mib_freed(before: list, after: list) -> dict:
    """MiB freed per GPU index: v2 "used" before minus after, never negative.

    A GPU is followed by its UUID, so a GPU that fell off the bus and shifted the indices of
    the others never has another card's reading subtracted from its own. A GPU without a
    reading after the reset (lost) has no figure: nothing proves what was freed there."""
    after_by_uuid = {gpu.get("uuid"): gpu for gpu in after if gpu.get("uuid")}
    after_by_index = {gpu.get("index"): gpu for gpu in after}
    freed = {}
    for gpu in before:
        used = figure(gpu.get("memory_used_mib"))
        now = after_by_uuid.get(gpu.get("uuid")) if gpu.get("uuid") else None
        if now is None:
            candidate = after_by_index.get(gpu.get("index"))
            # Only a reading that names no card can stand for this one by index.
            now = candidate if candidate is not None and not candidate.get("uuid") else None
        used_after = figure(now.get("memory_used_mib")) if now is not None else None
        if used is not None and used_after is not None:
            freed[str(gpu.get("index"))] = max(used - used_after, 0)
    return freed


def _names_lost(problem: str, gpu: dict) -> bool:
    """True when a problem sentence already says that this GPU is lost."""
    named = problem.startswith("GPU %s " % gpu["index"]) or bool(gpu.get("uuid") and gpu["uuid"] in problem)
    return named and " lost" in problem


def lost_gpus(before: list, after: list, listed_after) -> list:
    """The GPUs the last NVML check could not read: {index, uuid}.

    Two ways to be lost: NVML still counts the GPU but cannot read it (no memory figure), or
    the GPU fell off the bus and NVML no longer lists it, which renumbers the GPUs after it.
    The second shows only as a UUID read before the reset and missing after it; that is proof
    only when the check read every GPU NVML lists (a selection of some GPUs misses the others
    by design). `index` is the GPU's number in the reading where it was last seen."""
    seen = {gpu.get("uuid") for gpu in after if gpu.get("uuid")}
    before_by_index = {gpu.get("index"): gpu.get("uuid") for gpu in before}
    lost = []
    for gpu in after:
        if gpu.get("memory_used_mib") is None:
            uuid = gpu.get("uuid")
            if not uuid and before_by_index.get(gpu.get("index")) not in seen:
                # Still counted, so not renumbered: the reading before names it by the same index.
                uuid = before_by_index.get(gpu.get("index"))
            lost.append({"index": gpu.get("index"), "uuid": uuid})
    listed = figure(listed_after)
    if after and listed is not None and len(after) >= listed:
        known = {item["uuid"] for item in lost if item["uuid"]}
        lost += [{"index": gpu.get("index"), "uuid": gpu["uuid"]} for gpu in before
                 if gpu.get("uuid") and gpu["uuid"] not in seen and gpu["uuid"] not in known]
    return lost


def seconds_per_step(steps: Mapping) -> dict:
    """Each step's own duration, as its module measured it."""
    seconds = {}
    for name in STEPS:
        step = steps.get(name) or {}
        value = figure(step.get("elapsed_s", step.get("waited_s")), float) if _ran(step) else None
        if value is not None:
            seconds[name] = round(value, 2)
    return seconds


def not_run_row(host: str, why: str) -> dict:
    return {"host": host, "status": "not run", "ok": False, "reset_ok": False, "fails_host": True, "changed": False,
            "killed": 0, "mib_freed": 0,
            "mib_freed_per_gpu": {}, "gpus_lost": [], "shm_bytes_freed": 0, "bytecode_removed": 0, "seconds": 0.0,
            "seconds_per_step": {}, "problems": [why]}


def killed_gpus(steps: Mapping) -> list:
    """The GPU indices (text) each process gpu_reset ended held, one list per process ([] for one
    that held none, an API server found by its command line): an instance's share of the kills."""
    gpu_reset = steps.get("gpu_reset") or {}
    if not _ran(gpu_reset):
        return []
    held = {target.get("pid"): target.get("gpus") or [] for target in gpu_reset.get("targets") or []
            if isinstance(target, Mapping)}
    return [sorted(str(gpu) for gpu in held.get(item.get("pid")) or []) for item in gpu_reset.get("killed") or []
            if isinstance(item, Mapping)]


def shm_held(steps: Mapping) -> list:
    """The segments shm_clean kept because a live process maps or holds them: {path, bytes, size,
    holders} each (what a reset that freed nothing needs to know: an orphan still holds them)."""
    shm = steps.get("shm_clean") or {}
    items = shm.get("in_use") if _ran(shm) else None
    return [{"path": str(item.get("path")), "bytes": figure(item.get("bytes")), "size": figure(item.get("size")),
             "holders": holders(item)}
            for item in items or [] if isinstance(item, Mapping) and item.get("area", "shm") != "tmp"]


def host_row(host: str, result, why_not_run: str = NOT_RUN, read_only: bool = False) -> dict:
    """One row of the report from a host's node_reset_result (None: the role left none).

    read_only (a verify run, or a reset in check mode): the row also lists `would_stop`, and
    `mib_used` per GPU, since nothing was stopped or freed."""
    if not isinstance(result, Mapping):
        return not_run_row(host, why_not_run)
    steps = result.get("steps") if isinstance(result.get("steps"), Mapping) else {}
    verify = steps.get("nvml_verify") or {}
    before, after = memory_before(steps), _gpus(verify)
    freed = mib_freed(before, after)
    lost = lost_gpus(before, after, verify.get("count") if _ran(verify) else None)
    per_step = seconds_per_step(steps)
    problems = [str(problem) for problem in result.get("problems") or []]
    # nvml_verify names a GPU it selected and found lost ("GPU 0 (...): lost (NVML: ...)"); a GPU
    # gone from the bus altogether only lowers NVML's count, so the report names that one itself.
    problems += ["GPU %s (%s) is lost: NVML read it before the reset and cannot read it now."
                 % (gpu["index"], gpu["uuid"] or "UUID unknown") for gpu in lost
                 if not any(_names_lost(problem, gpu) for problem in problems)]
    # The failed step's message once: not again when a problem already says it (or it repeats them).
    error = str(result.get("error") or "")
    if error and not any(error in problem or problem in error for problem in problems):
        problems.append(error)
    row = {
        "host": host,
        "status": str(result.get("status") or "failed"),
        "ok": bool(result.get("ok")),
        # node_reset's own verdict: `ok` may still be and-ed with what a playbook adds (rows).
        "reset_ok": bool(result.get("ok")),
        # Whether the report's last play fails the host: node_reset_result's own rule (a report
        # written before the rule was in the result: not ok fails).
        "fails_host": bool(result.get("fails_host", not result.get("ok"))),
        "changed": bool(result.get("changed")),
        "killed": figure(result.get("killed_count")) or 0,
        "mib_freed": sum(freed.values()),
        "mib_freed_per_gpu": freed,
        # Which index each GPU had before the reset: an instance names its GPUs by UUID or index.
        "gpu_uuids": {str(gpu.get("index")): gpu.get("uuid") for gpu in before if gpu.get("uuid")},
        "killed_gpus": killed_gpus(steps),
        "gpus_lost": lost,
        "shm_bytes_freed": figure(result.get("shm_bytes_freed")) or 0,
        "bytecode_removed": figure(result.get("bytecode_removed")) or 0,
        # The host's own time: the sum of what its modules measured, not the controller's clock
        # (which also counts the hosts' turns in lockstep and the skipped steps).
        "seconds": round(sum(per_step.values()), 2),
        "seconds_per_step": per_step,
        "problems": problems,
    }
    # A reset that "freed 0 bytes" beside a segment an orphan still maps: which one, its size, and who.
    row["shm_in_use"] = shm_held(steps)
    # Each leftover removed or kept, with why (a postmortem's question: why did the reset remove more
    # than its check said?); bounded, as is every list of a row, with how many were left out.
    row["shm_leftovers"], row["shm_leftovers_left_out"] = bounded(leftovers(steps, "shm", read_only))
    row["tmp_leftovers"], row["tmp_leftovers_left_out"] = bounded(leftovers(steps, "tmp", read_only))
    if result.get("failed_step"):
        row["failed_step"] = str(result["failed_step"])
    # Why nothing was done, or why the reset was: reset_and_serve.yml's "server slow (...): no reset"
    # tells a busy server that was left running apart from a dead one, "server hung (...): reset" why
    # a server that answered /health was reset.
    if result.get("note"):
        row["note"] = str(result["note"])
    # Where the evidence kept before the first signal is on the host (null: none), and what was not kept.
    evidence = result.get("evidence") if isinstance(result.get("evidence"), Mapping) else {}
    row["evidence"] = {"directory": evidence.get("directory") or None,
                       "not_kept": [str(note) for note in evidence.get("not_kept") or []]}
    if read_only:
        row["would_stop"], row["would_stop_left_out"] = bounded(would_stop(steps))
    else:
        row["stopped"], row["stopped_left_out"] = bounded(stopped(steps))
    if read_only or result.get("kind") == "verify":
        row["mib_used"] = {str(gpu.get("index")): gpu.get("memory_used_mib") for gpu in after}
    return row
