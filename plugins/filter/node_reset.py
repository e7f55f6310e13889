# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The node_reset role's two computations, in Python: the checks of its variables and its result.

Filters, not Jinja in set_fact tasks: a few milliseconds per host, and the rules read as code
(fewer tasks: docs/design.md#why-tasks-are-few).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping


from ansible_collections.cleanslate.gpu.plugins.module_utils import _ranges
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import is_unit_name
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _node_reset_steps as _steps
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_text import count_of, human_bytes

# (variable, minimum, exclusive minimum, maximum, the rule in words); 0 is also allowed where
# ZERO_ALLOWED says so. A number given with -e is a string: it is converted first. A module
# option's variable takes the module's own range (module_utils/_ranges.py), the role's own
# variables have theirs here.


def _module_rule(name, rule, zero_allowed=False):
    words = _ranges.words(rule)
    if zero_allowed:
        words += ", or 0 (no check)"
    return (name, rule.minimum, rule.above, rule.maximum, words)


NUMBERS = tuple(_module_rule(name, rule, zero_allowed=name == "node_reset_nvml_verify_expected_count")
                for name, rule in _steps.number_rules().items()) + (
    ("node_reset_pve_vmid", 100, None, 999999999, "0 (no container) or a vmid from 100 to 999999999"),
    ("node_reset_pve_connect_timeout", 1, None, 3600, "a number of seconds from 1 to 3600"),
    ("node_reset_pve_sweep_after", 0, None, 86400, "a number of seconds from 0 to 86400"),
)
ZERO_ALLOWED = ("node_reset_pve_vmid", "node_reset_nvml_verify_expected_count")
SELECTORS = ("node_reset_gpu_reset_gpus", "node_reset_nvml_verify_gpus", "node_reset_gpu_reset_spare_gpus")
SELECTOR = re.compile(r"([0-9]+|GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})\Z")
# Lists whose items must be absolute paths (the modules refuse anything else, after gpu_reset ran).
ABSOLUTE = ("node_reset_shm_clean_path", "node_reset_pycache_purge_paths", "node_reset_metrics_dir")
# Python's own rule for a module name: dotted identifiers.
MODULE_NAME = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*\Z")
# The checks on the host before anything is stopped (the role's prepare.yml): a refusal there is
# `invalid`, as is a refusal by pycache_purge when it runs first (_refused_first).
HOST_CHECKS = ("pycache_check", "nvml_before")
# pycache_purge's words for a module its interpreter cannot import (module_utils/_pyc_probe.py).
MODULE_NOT_FOUND = re.compile(r"module '[^']*' not found")
# nvml_verify's xid_action, which becomes the host's status (module_utils/_xid.py's classes).
XID_STATUSES = ("needs_reboot", "needs_service")
# systemd_service's words for a unit that is not installed (module_utils/service.py fail_if_missing).
UNIT_MISSING = "Could not find the requested service"


def spec() -> dict:
    """The role's argument spec (meta/argument_specs.yml, the entry points share their options): the
    types and choices are checked here, one sentence per variable, instead of by ansible-core's
    validation task, whose failure prints the whole spec (some 6 KB) after the one line that matters.
    Read on first use: node_reset_result, which every host runs too, needs none of it."""
    return _role_spec.load_spec("node_reset")


def variables() -> tuple:
    """The variables node_reset_problems reads, for the role to pass (tests compare the two lists): all."""
    return tuple(spec())


def _items(value) -> list:
    """A list variable as Ansible reads `-e name=a,b`: a string is split at commas."""
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        return [value]
    return list(value)


def _text(value) -> str:
    """Jinja's `string` filter."""
    return value if isinstance(value, str) else str(value)


def spec_problems(values: Mapping) -> list:
    """Types, choices and list items of the argument spec (the numbers are left to their rule)."""
    return _role_spec.spec_problems(spec(), values, skip=tuple(rule[0] for rule in NUMBERS) + SELECTORS)


def path_problems(values: Mapping) -> list:
    """What the modules would refuse only after gpu_reset had run: said before any step."""
    problems = []
    for name in ABSOLUTE:
        value = values.get(name)
        # A number is no path (-e gives text; Ansible would make "5" of a 5 silently).
        items = [value] if isinstance(value, (str, int, float)) else value if isinstance(value, list) else []
        bad = [item for item in items if not isinstance(item, str) or not item.startswith("/") or "\0" in item
               or "\n" in item]
        if bad:
            problems.append("%s has %s: a path must be absolute (start with /), on one line." % (
                name, ", ".join(map(_role_spec.shown, bad))))
    modules = values.get("node_reset_pycache_purge_modules")
    modules = _items(modules) if isinstance(modules, (str, list)) else []
    bad = [item for item in modules if not isinstance(item, str) or not MODULE_NAME.match(item)]
    if bad:
        problems.append("node_reset_pycache_purge_modules has %s: a module is a dotted Python name such as"
                        " vllm or vllm.model_executor." % ", ".join(map(_role_spec.shown, bad)))
    patterns = values.get("node_reset_gpu_reset_cmdline_patterns")
    for pattern in patterns if isinstance(patterns, list) else []:
        try:
            re.compile(_text(pattern))
        except re.error as exc:
            problems.append("node_reset_gpu_reset_cmdline_patterns has %s: not a regular expression (%s)."
                            % (_role_spec.shown(pattern), exc))
    tmp_path = values.get("node_reset_shm_clean_tmp_path")
    # Empty: no pass over it. A number is no path, as above.
    if tmp_path not in (None, "") and (not isinstance(tmp_path, str) or not tmp_path.startswith("/")
                                       or "\0" in tmp_path or "\n" in tmp_path):
        problems.append("node_reset_shm_clean_tmp_path is %s: a path must be absolute (start with /), on one line, "
                        "or empty to skip it." % _role_spec.shown(tmp_path))
    patterns = values.get("node_reset_shm_clean_tmp_patterns")
    for pattern in patterns if isinstance(patterns, list) else []:
        try:
            compiled = re.compile(_text(pattern))
        except re.error as exc:
            problems.append("node_reset_shm_clean_tmp_patterns has %s: not a regular expression (%s)."
                            % (_role_spec.shown(pattern), exc))
            continue
        if any(compiled.fullmatch(name) for name in ("", ".", "..")):
            problems.append("node_reset_shm_clean_tmp_patterns has %s: it matches an empty name, . or ..; a pattern "
                            "must name leftovers only." % _role_spec.shown(pattern))
    for name in ("node_reset_shm_clean_patterns", "node_reset_gpu_reset_device_paths"):
        value = values.get(name)
        if isinstance(value, list) and any(not _text(item).strip() for item in value):
            problems.append("%s is %s: an empty item would match nothing or everything." % (name, _role_spec.shown(value)))
    return problems


def number_problems(values: Mapping) -> list:
    return _role_spec.number_problems(NUMBERS, values, ZERO_ALLOWED)


def _unit_name(name: str) -> str:
    """A unit as systemd names it: systemctl adds .service to a name without a suffix."""
    return name if "." in name.rsplit("@", 1)[-1] else name + ".service"


def unit_problems(values: Mapping) -> list:
    """The units stopped (node_reset_units) and spared (node_reset_gpu_reset_spare_units): systemd
    names, and never one unit both (a stop would take down the neighbour the reset spares)."""
    problems = []
    stopped = values.get("node_reset_units")
    stopped = _items(stopped) if stopped is not None else []
    # A unit stopped by name may leave out its .service; a spared one names its cgroup, so it has its suffix.
    bad = [u for u in stopped if not is_unit_name(u)]
    if bad:
        problems.append("node_reset_units has %s: a unit is a systemd unit name such as vllm-a.service, on one line."
                        % ", ".join(map(_role_spec.shown, bad)))
    spared = values.get("node_reset_gpu_reset_spare_units")
    spared = _items(spared) if spared is not None else []
    bad = [u for u in spared if not is_unit_name(u, holds_processes=True)]
    if bad:
        problems.append("node_reset_gpu_reset_spare_units has %s: a unit is a systemd unit name with the suffix of a"
                        " unit that holds processes (.service, .scope, .slice), such as vllm-b.service."
                        % ", ".join(map(_role_spec.shown, bad)))
    unit = values.get("node_reset_unit")
    stopped_names = {_unit_name(u) for u in stopped + [unit] if isinstance(u, str) and u}
    both = [u for u in spared if isinstance(u, str) and u in stopped_names]
    if both and not bad:
        problems.append("node_reset_gpu_reset_spare_units has %s, which node_reset_unit or node_reset_units stops: a"
                        " unit cannot be stopped and spared at once." % ", ".join(map(_role_spec.shown, both)))
    return problems


def gpu_overlap_problems(values: Mapping) -> list:
    """A spared GPU that the reset also selects or checks: gpu_reset would refuse it after the units
    stopped, and nvml_verify would find the healthy neighbour's memory on it."""
    spared = {_text(item).strip().lower() for item in _items(values.get("node_reset_gpu_reset_spare_gpus") or [])}
    both = [_text(item) for name in ("node_reset_gpu_reset_gpus", "node_reset_nvml_verify_gpus")
            for item in _items(values.get(name) or []) if _text(item).strip().lower() in spared]
    if not both:
        return []
    return ["node_reset_gpu_reset_spare_gpus has %s, which node_reset_gpu_reset_gpus or node_reset_nvml_verify_gpus"
            " also names: a GPU cannot be reset and spared at once." % ", ".join(map(_role_spec.shown, sorted(set(both))))]


def input_problems(values: Mapping, pve_host_known=True) -> list:
    problems = unit_problems(values)
    for name in SELECTORS:
        bad = [item for item in map(_text, _items(values.get(name))) if not SELECTOR.match(item)]
        if bad:
            problems.append("%s has %s: a GPU is an index (a non-negative integer such as 0) or a UUID"
                            " (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)." % (name, ", ".join(map(_role_spec.shown, bad))))
    problems += gpu_overlap_problems(values)  # after the selectors' own sentences: one per variable
    # nvml_verify's own checks (its documented choices, which the role's spec takes: tools/gen_node_reset_docs.py).
    known = spec()["node_reset_nvml_verify_checks"]["choices"]
    checks = values.get("node_reset_nvml_verify_checks")
    checks = _items(checks) if checks or isinstance(checks, str) else []
    if not checks:
        problems.append("node_reset_nvml_verify_checks is empty: give at least one of %s (with none, any GPU would"
                        " pass)." % ", ".join(known))
    unknown = [check for check in checks if check not in known]
    if unknown:
        problems.append("node_reset_nvml_verify_checks has %s: the checks are %s."
                        % (", ".join(map(_role_spec.shown, unknown)), ", ".join(known)))
    cgroup = values.get("node_reset_gpu_reset_cgroup")
    if cgroup is not None and not _text(cgroup).strip():
        problems.append("node_reset_gpu_reset_cgroup is %s: an empty cgroup text would match every process; leave"
                        " it unset (null) for no cgroup limit." % _role_spec.shown(cgroup))
    users = values.get("node_reset_gpu_reset_users")
    if users is not None:
        given = _items(users)
        if not given or any(not _text(user).strip() for user in given):
            problems.append("node_reset_gpu_reset_users is %s: an empty list or name would match no process; leave"
                            " it unset (null) for any user." % _role_spec.shown(users))
    host, vmid = values.get("node_reset_pve_host"), values.get("node_reset_pve_vmid")
    host = "" if host is None else _text(host)
    if (len(host) > 0) != ((_role_spec.as_number(vmid) or 0) != 0):
        problems.append("node_reset_pve_host (%s) and node_reset_pve_vmid (%s) must be given together."
                        % (_role_spec.shown(host), _role_spec.shown(vmid)))
    if host and not pve_host_known:
        problems.append("node_reset_pve_host %s is not a host of the inventory." % _role_spec.shown(host))
    return problems


def node_reset_problems(values, pve_host_known=True):
    """Why the role's variables cannot be used: one sentence per bad variable, [] when none.

    `values` maps each name of variables() to its value; `pve_host_known` says whether
    node_reset_pve_host names a host of the inventory."""
    if not isinstance(values, Mapping):
        raise TypeError("node_reset_problems expects a mapping of the role's variables, got %s"
                        % type(values).__name__)
    problems, named = [], set()
    # One sentence per variable: the most specific rule first (a GPU selector's own words rather
    # than "a list of texts"), the argument spec's types and choices last.
    for problem in (number_problems(values) + input_problems(values, bool(pve_host_known)) + path_problems(values)
                    + spec_problems(values)):
        name = problem.split(" ", 1)[0]
        if name not in named or name == "node_reset_pve_host":
            problems.append(problem)
        named.add(name)
    return problems


# --- the result ---------------------------------------------------------------------------------

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
    done = [unit_result(by_name.get(name) or {}, name) for name in _items(units or []) if isinstance(name, str)]
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


def node_reset_step_args(values, read_only=False, pve=False):
    """cleanslate.gpu.reset_steps' arguments from the role's variables (see _node_reset_steps)."""
    if not isinstance(values, Mapping):
        raise TypeError("node_reset_step_args expects a mapping of the role's variables, got %s" % type(values).__name__)
    return _steps.step_arguments(values, read_only=bool(read_only), pve=bool(pve),
                                 sweep_after=values.get("node_reset_pve_sweep_after"))


def node_reset_sweep_args(values):
    """The Proxmox node's sweep of a container: gpu_reset scoped to the container's cgroup
    (node_reset_pve_cgroup, else /lxc/<vmid>/), then nvml_verify in the container."""
    if not isinstance(values, Mapping):
        raise TypeError("node_reset_sweep_args expects a mapping of the role's variables, got %s" % type(values).__name__)
    cgroup = values.get("node_reset_pve_cgroup") or "/lxc/%s/" % values.get("node_reset_pve_vmid")
    return _steps.sweep_arguments(values, str(cgroup))


class FilterModule:
    """The node_reset role's checks and result."""

    def filters(self):
        return {"node_reset_problems": node_reset_problems, "node_reset_result": node_reset_result,
                "node_reset_step_args": node_reset_step_args, "node_reset_sweep_args": node_reset_sweep_args}
