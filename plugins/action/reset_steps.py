# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The reset's module steps in one task: pycache_purge, gpu_reset, shm_clean, nvml_verify.
Before them, when given: the GPUs read (`nvml_before`), the evidence of what the signals would
destroy (cleanslate.gpu.evidence), and the inference units stopped (`unit`, `units`), so that a
reset that stops a unit is one host contact too (issue 42).

The module of the same name runs the steps on the host, in one process and one host contact:
each step is its module's main() in a child process of its own, as a task of its own would run it
(the same arguments, environment, check and diff mode). One task and one contact instead of four
of each (docs/design.md#why-tasks-are-few, docs/fleet_scale.md).

The steps run in the design's order and stop at the first one that fails (its name is
`failed_step`). A host that does not answer makes the result unreachable, without the results of
any step (they come back together). nvml_verify is the last step: its failure (GPUs still in use)
fails the task too, with every step's result kept.

With `record`, the same task then computes the role's result (node_reset_result's Python) and, for a
host that answered, writes it for node_exporter's textfile collector through textfile_metrics: the
task that already runs on the host writes the metrics, so a host with metrics on costs the
controller no more tasks than one without (docs/fleet_scale.md). A metrics file that cannot be
written is a warning, never the reset's outcome. The role's set_fact of node_reset_result runs the
same Python on the same results (the role's tasks/result.yml).
"""

from __future__ import annotations

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _node_reset_steps as _steps
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._metric_families import metric_families
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._module_answer import lift_messages
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._node_reset_result import node_reset_result

# The steps, in the reset's order: the registry's (plugin_utils/_node_reset_steps.py; why that order:
# module_utils/_reset_order.py).
STEPS = _steps.MODULES
# What the module runs on the host: the steps and what comes before them (the action writes the record).
RUNS = STEPS + ("evidence", "nvml_before", "unit", "units")
# What a failed module said, lifted to the task so that Ansible prints it as for a task of its own.
FAILURE_KEYS = ("msg", "exception", "module_stderr", "module_stdout", "rc")
ARGUMENT_SPEC = dict({name: {"type": "dict"} for name in STEPS}, evidence={"type": "dict"}, nvml_before={"type": "dict"},
                     unit={"type": "str"}, units={"type": "list", "elements": "str"},
                     record={"type": "dict", "options": {"steps": {"type": "dict", "required": True},
                                                         "result": {"type": "dict", "required": True},
                                                         "metrics_dir": {"type": "path", "required": True}}})
# A host in these states was not reached: no metrics file is written there.
UNREACHED = ("unreachable", "swept-unreachable")


def failed_answer(steps, failed_step) -> dict:
    """The answer of the step that failed; `unit` is either stop's, that of `unit` unless it stopped
    fine, then that of `units`."""
    if failed_step == "unit" and not steps.get("unit", {}).get("failed"):
        return steps.get("units", {})
    return steps.get(failed_step, {})


def first_step(args) -> str:
    """The first module step given (the evidence's failure stops nothing)."""
    return next(name for name in STEPS if args[name] is not None)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # each module run makes and removes its own
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC, required_one_of=[list(STEPS)])
        result = self._run_steps(args, task_vars, result)
        if args["record"] is not None:
            self._record(args["record"], result, task_vars)
        return result

    def _run_steps(self, args, task_vars, result):
        """The module runs every step on the host in one process (one host contact); this reads its
        answer as a task of each step's own would be read: changes, warnings, diffs, the failure."""
        steps, diffs = {}, []
        result.update(changed=False, steps=steps)
        try:
            answer = self._execute_module(module_name="cleanslate.gpu.reset_steps", task_vars=task_vars,
                                          module_args={name: args[name] for name in RUNS if args[name] not in (None, [], "")})
        except AnsibleConnectionFailure as exc:
            # No step failed: the host did not answer, before or during the steps (one contact: the
            # results of any that ran are lost with it). `steps` names the first module step given;
            # failed_step says what the fleet report says (a step's name read as its failure).
            steps[first_step(args)] = {"unreachable": True, "msg": str(exc)}
            result.update(unreachable=True, msg=str(exc), failed_step="unreachable")
            return result
        if "steps" not in answer:
            # The module did not run (the host's Python is missing or broken): the first step is the
            # one that failed, with that answer, as when each step was a module run of its own.
            answer = {"steps": {first_step(args): answer}, "failed_step": first_step(args)}
        else:
            # The module's own warnings (a unit to stop that is not installed); each step's below.
            lift_messages(answer, result)
        for name, step in answer["steps"].items():
            if name == "shm_before":
                # The look before the signals (check mode): who held each leftover then. Its changes,
                # diff and warnings are the real step's to say; a look that failed names no holder.
                steps[name] = {key: step[key] for key in ("in_use", "elapsed_s") if key in step and not step.get("failed")}
                continue
            steps[name] = step
            result["changed"] = result["changed"] or bool(step.get("changed"))
            lift_messages(step, result)
            if step.get("diff"):
                # shm_clean with tmp_path answers two diffs, one per directory.
                diffs.extend(step["diff"] if isinstance(step["diff"], list) else [step["diff"]])
        failed_step = answer.get("failed_step")
        if failed_step:
            failed = failed_answer(steps, failed_step)
            result.update({key: failed[key] for key in FAILURE_KEYS if key in failed})
            result.update(failed=True, failed_step=failed_step)
        if diffs:
            result["diff"] = diffs
        return result

    def _record(self, record, result, task_vars):
        """node_reset_result from the earlier steps' results and these (a failed step as the role's
        rescue names it), written on a host that answered (result['metrics'], or a warning)."""
        # As the role's rescue names it: never the final check, whose failure is the result's own (`dirty`).
        failed = ({"failed_step": result["failed_step"], "failed_result": dict(result)}
                  if result.get("failed_step") not in (None, _steps.FINAL_CHECK) else {})
        recorded = node_reset_result(dict(record["steps"], **result["steps"]), **dict(record["result"], **failed))
        if recorded["status"] in UNREACHED:
            return
        metrics = metric_families(recorded, role="node_reset", host=recorded["host"])
        # The run's check mode, not the steps': a verify runs its steps in check mode (they change
        # nothing) and still writes its metrics, as the role's metrics task of its own does.
        steps_check_mode, self._task.check_mode = self._task.check_mode, bool(task_vars.get("ansible_check_mode"))
        try:
            answer = self._execute_module(
                module_name="cleanslate.gpu.textfile_metrics", task_vars=task_vars,
                module_args={"path": record["metrics_dir"], "name": metrics["name"], "families": metrics["families"]})
        except AnsibleConnectionFailure as exc:
            answer = {"unreachable": True, "msg": str(exc)}
        finally:
            self._task.check_mode = steps_check_mode
        result["metrics"] = answer
        lift_messages(answer, result)
        if answer.get("failed") or answer.get("unreachable"):
            result.setdefault("warnings", []).append(
                "the metrics file for node_exporter was not written (%s); the reset's result stands"
                % answer.get("msg", "no reason given"))
        elif answer.get("diff"):
            result.setdefault("diff", []).append(answer["diff"])
