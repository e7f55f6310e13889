# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""node_reset_result, the node_reset role's result, from its steps' registered results: the
filter cleanslate.gpu.node_reset_result and the action cleanslate.gpu.reset_steps (which
also writes it for node_exporter, in the same task) both run this."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _node_reset_steps as _steps
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_text import count_of, human_bytes

# The checks on the host before anything is stopped (the role's prepare.yml): a refusal there is
# `invalid`, as is a refusal by pycache_purge when it runs first (_refused_first).
HOST_CHECKS = ("pycache_check", "nvml_before")
# pycache_purge's words for a module its interpreter cannot import (module_utils/_pyc_probe.py).
MODULE_NOT_FOUND = re.compile(r"module '[^']*' not found")
# nvml_verify's xid_action, which becomes the host's status (module_utils/_xid.py's classes).
XID_STATUSES = ("needs_reboot", "needs_service")
# systemd_service's words for a unit that is not installed (module_utils/service.py fail_if_missing).
UNIT_MISSING = "Could not find the requested service"


def _step(steps: Mapping, name: str) -> Mapping:
    value = steps.get(name)
    return value if isinstance(value, Mapping) else {}


def _list(step: Mapping, key: str) -> list:
    value = step.get(key)
    return list(value) if isinstance(value, (list, tuple)) else []


def unit_result(stop: Mapping, unit: str) -> dict:
    """What happened to the unit, from systemd_service's result ({} when no unit was given)."""
    if not unit or not stop or stop.get("skipped"):
        return {}
    missing = str(stop.get("msg") or "").startswith(UNIT_MISSING)
    status = stop.get("status") if isinstance(stop.get("status"), Mapping) else {}
    return {"name": unit, "found": not missing and not stop.get("unreachable"),
            "was": status.get("ActiveState", "inactive"), "stopped": bool(stop.get("changed")),
            "note": ("unit %s does not exist: skipped" % unit) if missing else ""}


def units_result(stop: Mapping, units) -> list:
    """What happened to each unit of node_reset_units, from the loop's results (those it reached)."""
    results = stop.get("results") if isinstance(stop.get("results"), list) else []
    by_name = {result.get("item"): result for result in results if isinstance(result, Mapping)}
    done = [unit_result(by_name.get(name) or {}, name) for name in _role_spec.as_list(units or []) if isinstance(name, str)]
    return [unit for unit in done if unit]


def _refused_first(failed_step, steps) -> bool:
    """pycache_purge is the first module step (cleanslate.gpu.reset_steps): when it fails before
    removing anything (its inputs, its probe: a failed removal returns `errors`) and no unit was
    stopped before it, nothing was touched, as when a check on the host refuses it."""
    if failed_step != "pycache_purge":
        return False
    if _step(steps, "units").get("changed"):
        return False  # a unit of node_reset_units was stopped before it
    return "errors" not in _step(steps, "pycache_purge") and not _step(steps, "unit").get("changed")


def _refusal(failed_step, failed_result) -> str:
    """The host's refusal, with the fix when a module of node_reset_pycache_purge_modules is not
    found: the usual cause is a server in a venv of its own, which the modules' interpreter does not see."""
    msg = str(failed_result.get("msg") or "refused by the host")
    if failed_step in ("pycache_check", "pycache_purge") and MODULE_NOT_FOUND.match(msg):
        msg += (" (node_reset_pycache_purge_modules: when the server lives in a venv of its own, set"
                " node_reset_pycache_purge_python to that venv's python, e.g. /opt/vllm/.venv/bin/python)")
    return msg


def _failure(failed_result: Mapping) -> str:
    """The failed step's message; for a loop (node_reset_units), each failed item's, by item,
    instead of Ansible's "One or more items failed"."""
    items = [item for item in failed_result.get("results") or [] if isinstance(item, Mapping) and item.get("failed")]
    if items:
        return "; ".join("%s: %s" % (item.get("item"), item.get("msg", "failed")) for item in items)
    return str(failed_result.get("msg", "failed"))


def _status(kind, failed_step, reach, unreachable, verify, clean) -> str:
    if failed_step == "validate":
        return "invalid"
    if reach.get("unreachable"):
        return "swept-unreachable"
    if unreachable:
        return "unreachable"
    if failed_step:
        return "failed at %s" % failed_step
    # A GPU whose kernel log says a reset of its processes cannot help (nvml_verify's xid check):
    # whatever else the run found, the host is not to be served on until it is rebooted or serviced.
    if verify.get("xid_action") in XID_STATUSES:
        return verify["xid_action"]
    if kind == "verify":
        return "clean" if clean else "dirty"
    return "ok" if verify.get("ok") else "dirty"


def _would(steps: Mapping) -> list:
    """What a read-only run found for a reset to do, one sentence per step that acts, in the
    reset's order: the reasons a verified host is dirty."""
    would = []
    for step in _steps.MODULE_STEPS:
        found = _steps.found(steps, step)
        if found:
            sentence = "a reset would %s %s" % (step.would, count_of(len(found), step.found_words))
            if step.found_bytes:
                sentence += ", " + human_bytes(_step(steps, step.module).get(step.found_bytes))
            would.append(sentence)
    return would


def node_reset_result(steps, host, kind="reset", read_only=False, failed_step=None, failed_result=None,
                      invalid=None, started=None, unit="", now=None, note=None, units=()):
    """node_reset_result from the registered results of the steps (see docs/node_reset.md).

    `steps` maps pve_reach, deps, nvml_before, evidence (cleanslate.gpu.evidence's), unit (systemd_service's result), units (its loop's
    over `units`, node_reset_units), gpu_reset,
    shm_clean, pycache_purge, nvml_verify and pve_sweep to what each registered ({} for a
    step that did not run). `failed_step` names the step that failed (`validate`: a variable
    was refused, `invalid` lists why), `failed_result` is its result; `read_only` is true in
    check mode and for kind `verify`; `started` is the role's start (seconds since the epoch).
    `note` says why the host needed no reset (reset_and_serve.yml: its server answers): nothing ran,
    and the host is ok.
    """
    if not isinstance(steps, Mapping):
        raise TypeError("node_reset_result expects a mapping of the step results, got %s" % type(steps).__name__)
    failed_step = failed_step or None
    failed_result = failed_result if isinstance(failed_result, Mapping) else {}
    # A check on the host that refused an input (its module answered) refuses the host as a bad
    # variable does; a module that could not run at all (no interpreter) is a failure of that step.
    # (ansible-core 2.19 adds `exception` to every failure; only a module that did not run has module_stderr.)
    if (failed_step in HOST_CHECKS or _refused_first(failed_step, steps)) \
            and "module_stderr" not in failed_result and failed_result.get("_ansible_parsed", True):
        invalid, failed_step = list(invalid or []) + [_refusal(failed_step, failed_result)], "validate"
    # The sweep from the Proxmox node runs with its failure ignored (a failure there, in the role's
    # rescue, would end the host without its result): a failed sweep is the failed step.
    if not failed_step and _step(steps, "pve_sweep").get("failed"):
        failed_step, failed_result = "pve_sweep", _step(steps, "pve_sweep")
    if invalid and not failed_step:
        # The role refused its variables and ran no step (no task fails for that).
        failed_step = "validate"
    if failed_step == "validate":
        # Nothing ran: whatever the registers hold is from an earlier run of the role.
        steps = {}
    reach, gpu_reset, sweep = _step(steps, "pve_reach"), _step(steps, "gpu_reset"), _step(steps, "pve_sweep")
    shm, pycache, verify = _step(steps, "shm_clean"), _step(steps, "pycache_purge"), _step(steps, "nvml_verify")
    acting = [_step(steps, step.module) for step in _steps.MODULE_STEPS if step.acts] + [sweep]
    unit_done = unit_result(_step(steps, "unit"), unit)
    units_done = units_result(_step(steps, "units"), units)
    unreachable = ["unreachable: %s" % _step(steps, name).get("msg") for name in _steps.REACHING
                   if _step(steps, name).get("unreachable")][:1]
    if not unreachable and _step(steps, "units").get("unreachable"):
        unreachable = ["unreachable: %s" % _step(steps, "units").get("msg")]
    clean = bool(verify.get("ok")) and not any(_steps.found(steps, step) for step in _steps.MODULE_STEPS)
    status = _status(kind, failed_step, reach, unreachable, verify, clean)
    if note and status != "invalid":
        status, steps = "ok", {}
    if status == "invalid":
        problems = [str(problem) for problem in invalid or []]
    else:
        problems = list(unreachable) + [str(problem) for problem in _list(verify, "problems")]
        problems += [str(problem) for gpu in _list(verify, "gpus") if isinstance(gpu, Mapping)
                     for problem in gpu.get("problems") or []]
        # (A check that did not answer is said once, by `unreachable` above.)
        if "gpus" not in verify and verify.get("msg") and not verify.get("unreachable"):
            problems.append(str(verify["msg"]))
        if status == "dirty" and read_only:
            problems += _would(steps)
    if status == "unreachable" and not failed_step:
        failed_step = "unreachable"
    killed = _list(gpu_reset, "killed") + _list(sweep, "killed")
    error = None
    if failed_step not in (None, "validate", "unreachable"):
        error = _failure(failed_result)
    now = time.time() if now is None else now
    started = float(started) if _role_spec.as_number(started) is not None and math.isfinite(float(started)) else now
    swept_clean = status == "swept-unreachable" and "survivors" in sweep and not sweep["survivors"]
    ok = status in ("ok", "clean") or swept_clean
    result = {
        "host": host,
        "kind": kind,
        "status": status,
        # A swept container is ok when the sweep left no survivor.
        "ok": ok,
        "fails_host": fails_host(ok, status, kind, read_only),
        "changed": any(bool(step.get("changed")) for step in acting)
        or bool(unit_done.get("stopped")) or any(done["stopped"] for done in units_done),
        "failed_step": failed_step,
        # The failed step's own message; a refused variable or a host that did not answer is in `problems`.
        "error": error,
        "killed": killed,
        # Read-only runs (check mode, verify) count what a reset would stop.
        "killed_count": len(_list(gpu_reset, "targets")) if read_only else len(killed),
        "shm_bytes_freed": shm.get("bytes_freed", 0),
        "shm_removed": len(_list(shm, "removed")),
        "bytecode_removed": len(_list(pycache, "removed")),
        "problems": problems,
        "unit": unit_done,
        "units": units_done,
        # Every unit this run stopped (node_reset_unit, then node_reset_units), by name.
        "units_stopped": [done["name"] for done in [unit_done] + units_done if done.get("stopped")],
        "seconds_total": round(now - started, 2),
        "evidence": evidence_result(_step(steps, "evidence")),
        "steps": {name: (unit_done if name == "unit" else _step(steps, name)) for name in _steps.RESULT_STEPS},
    }
    if note:
        result["note"] = str(note)
    return result


def evidence_result(evidence) -> dict:
    """The evidence kept before the reset signalled anything: its directory (null when none was
    kept) and, one sentence each, what was not kept and why."""
    evidence = evidence if isinstance(evidence, Mapping) else {}
    not_kept = [str(note) for note in _list(evidence, "notes")]
    if evidence.get("failed") and evidence.get("msg"):
        not_kept.append(str(evidence["msg"]))
    return {"directory": evidence.get("directory") or None, "not_kept": not_kept}


def fails_host(ok, status, kind, read_only) -> bool:
    """The one rule of what fails a host, read by the role's last task (fail_host.yml), the fleet
    report's last play and the playbooks' rollout check: a result that is not ok, except GPUs in use
    after a reset in check mode, which stopped nothing: they are what a reset would clean."""
    return not ok and not (kind == "reset" and read_only and status == "dirty")
