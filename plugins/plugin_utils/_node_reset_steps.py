# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The node_reset steps, written once: their order, their modules, the role variables each takes,
and what each finds that keeps a host from being `clean`.

Read by the reset_steps action (the order it runs the modules in), the node_reset filters (the
modules' arguments from the role's variables, the steps of node_reset_result, what makes a host
dirty), the fleet report (seconds per step) and tools/gen_node_reset_docs.py (the step list of
docs/node_reset.md and of the role's argument spec). A step added or moved is a change here.
"""

from __future__ import annotations

import math

from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES
from ansible_collections.cleanslate.gpu.plugins.module_utils._reset_order import STEP_ORDER


class Step:
    """One module step: `options` are the module options the role passes, each from the role
    variable node_reset_<module>_<option>; `omit_empty` those passed only when not empty (the
    module wants them absent, not empty); `does` the step in words.

    A step that acts on the host (`acts`) names what it acts on: `found`, the result list that
    a reset would act on (a read-only run is `clean` only when every step's is empty); `would`,
    what a reset does to each ("stop"); `found_words`, one of them in words ("process");
    `found_bytes`, the result's size of them, when it has one. node_reset_result's `changed`
    and a read-only run's "a reset would ..." sentences read these, for every step that acts."""

    def __init__(self, module, options, does, omit_empty=(), found=None, would=None, found_words=None,
                 found_bytes=None):
        if found and not (would and found_words):
            raise ValueError("step %s lists %s: it needs `would` and `found_words` for the report's sentence"
                             % (module, found))
        self.module, self.options, self.does = module, tuple(options), does
        self.omit_empty, self.found, self.would = tuple(omit_empty), found, would
        self.found_words, self.found_bytes = found_words, found_bytes

    @property
    def acts(self) -> bool:
        """Whether the step changes the host: it has a list of what it acts on."""
        return bool(self.found)

    def variable(self, option: str) -> str:
        return "node_reset_%s_%s" % (self.module, option)


# In the reset's order (module_utils/_reset_order.py says why), which the module runs them in.
MODULE_STEPS = (
    Step("pycache_purge", ("paths", "modules", "python", "mode"),
         "remove bytecode that no longer matches its source, only when paths or modules are given",
         omit_empty=("paths", "modules", "python"), found="removed", would="remove", found_words="bytecode file"),
    Step("gpu_reset", ("device_paths", "gpus", "cmdline_patterns", "cgroup", "users", "protect_names",
                       "spare_units", "spare_gpus", "include_children", "grace_period", "kill_timeout"),
         "stop every process that holds a GPU or matches cmdline_patterns, with SIGTERM, a grace period, then SIGKILL",
         found="targets", would="stop", found_words="process"),
    Step("shm_clean", ("path", "patterns", "exclude", "min_age", "remove_in_use", "tmp_path", "tmp_patterns",
                       "tmp_owners"),
         "remove leftover shared memory segments, and the engine's IPC sockets and files in tmp_path, that no live "
         "process binds, has open or maps",
         # tmp_path empty: no pass over it (the module wants it absent).
         omit_empty=("tmp_path",),
         found="removed", would="remove", found_words="leftover file",
         found_bytes="bytes_freed"),
    Step("nvml_verify", ("gpus", "expected_count", "max_memory_used_mib", "allow_processes", "timeout",
                         "poll_interval", "checks", "xid_since", "xid_log_path"),
         "poll NVML until every GPU is clean and healthy, else say why",
         # expected_count 0 is the role's "no count check"; xid_log_path empty is the host's own
         # kernel log: the module wants both absent.
         omit_empty=("expected_count", "xid_log_path")),
)
BY_MODULE = {step.module: step for step in MODULE_STEPS}
MODULES = tuple(step.module for step in MODULE_STEPS)
if MODULES != STEP_ORDER:
    # The controller would read the steps' results in another order than the host ran them.
    raise ValueError("the registry lists the steps as %s, the module runs them as %s" % (MODULES, STEP_ORDER))
# The final check: its failure (GPUs still in use or unhealthy, an Xid) is the result's `dirty`
# (or the Xid's status), not a failed step. The role's steps task does not fail on it (steps.yml's
# failed_when), so no rescue names it, and the task's own record of the result must not either.
FINAL_CHECK = MODULES[-1]

# The role's own phases around the module steps, as node_reset_result.steps names them: the NVML
# reading, the evidence and the unit stop before them (prepare.yml), the Proxmox node's sweep after them.
# shm_before is reset_steps' own look, before a real reset signals anything: shm_clean in check
# mode, whose `in_use` names who held each leftover (the report tells a segment removed because the
# reset stopped its holder from one nobody held).
BEFORE = ("nvml_before", "evidence", "unit", "shm_before")
AFTER = ("pve_sweep",)
RESULT_STEPS = BEFORE + MODULES + AFTER
# The steps whose "the host did not answer" counts, in the order they run (node_reset_result).
REACHING = ("pve_reach", "deps", "pycache_check") + BEFORE + MODULES

# The node's sweep of a Proxmox container runs gpu_reset there, scoped to the container's cgroup:
# the container's own selection of GPUs and users means nothing on the node. Its units do: seen
# from the node, a unit's cgroup path still has the unit's name as a component (.../lxc/129/ns/
# system.slice/vllm-b.service), so spare_units keeps a neighbour in the container spared.
SWEEP_OPTIONS = ("device_paths", "cmdline_patterns", "protect_names", "spare_units", "include_children",
                 "grace_period", "kill_timeout")


def role_variables() -> tuple:
    """Every role variable a module step reads, in step order."""
    return tuple(step.variable(option) for step in MODULE_STEPS for option in step.options)


def number_rules() -> dict:
    """{role variable: the module's range of its option} (module_utils/_ranges.py)."""
    return {step.variable(option): RANGES[step.module][option]
            for step in MODULE_STEPS for option in step.options if option in RANGES.get(step.module, {})}


def _arguments(step: Step, variables, options) -> dict:
    args = {}
    for option in options:
        value = variables.get(step.variable(option))
        if value is None or (option in step.omit_empty and _empty(value)):
            continue
        args[option] = value
    return args


def _empty(value) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, str) and value.strip() in ("0", "0.0"):
        return True
    return not value


def _seconds(value):
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def step_arguments(variables, read_only=False, pve=False, sweep_after=None) -> dict:
    """The arguments of cleanslate.gpu.reset_steps, {module: its arguments}, from the role's
    variables ({name: value}). pycache_purge is left out when it has no targets.

    read_only (a check, or check mode): nvml_verify reads once, as waiting for GPUs that nothing
    drained would only be slow. A Proxmox container (pve) whose holders are hidden from it never
    drains on its own: it waits at most `sweep_after` before its node sweeps it."""
    args = {step.module: _arguments(step, variables, step.options) for step in MODULE_STEPS}
    if not ({"paths", "modules"} & set(args["pycache_purge"])):
        del args["pycache_purge"]
    verify = args["nvml_verify"]
    if read_only:
        verify["timeout"] = 0
    elif pve:
        timeout, after = _seconds(verify.get("timeout")), _seconds(sweep_after)
        if timeout is not None and after is not None:
            verify["timeout"] = min(timeout, after)
    return args


def sweep_arguments(variables, cgroup: str) -> dict:
    """The Proxmox node's sweep of a container: gpu_reset scoped to `cgroup`, run on the node, then
    nvml_verify in the container with its full timeout (what is left should drain now)."""
    gpu_reset = dict(_arguments(BY_MODULE["gpu_reset"], variables, SWEEP_OPTIONS), cgroup=cgroup)
    return {"gpu_reset": gpu_reset, "nvml_verify": _arguments(BY_MODULE["nvml_verify"], variables,
                                                              BY_MODULE["nvml_verify"].options)}


def found(steps, step: Step) -> list:
    """What a step's result lists for a reset to act on ([] when nothing, or the step did not run)."""
    result = steps.get(step.module) if hasattr(steps, "get") else None
    value = result.get(step.found) if step.found and hasattr(result, "get") else None
    return list(value) if isinstance(value, (list, tuple)) else []
