#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: reset_steps
short_description: Run pycache_purge, gpu_reset, shm_clean and nvml_verify on a host in one task
version_added: 0.2.0
description:
  - Runs, in this order, each of M(cleanslate.gpu.pycache_purge), M(cleanslate.gpu.gpu_reset),
    M(cleanslate.gpu.shm_clean) and M(cleanslate.gpu.nvml_verify) whose option is given, with that option's
    dictionary as the module's arguments. Each module runs on the host as a task of its own would run it, with the
    task's environment, check mode and diff mode, checks its own arguments and answers as its own.
  - Before them, what a reset needs before its first signal, each when given. O(nvml_before), a reading of the GPUs
    by M(cleanslate.gpu.nvml_verify) (the memory before, the GPU selection checked). O(evidence). Then the units
    O(unit) and O(units) stopped, as M(ansible.builtin.systemd_service) with C(state=stopped) stops them; with a unit to
    stop, O(pycache_purge) first runs in check mode (RV(steps) C(pycache_check)), so that a target only the host can
    refuse is refused before the stop, and for real after it.
  - The steps reach the host in one module run, one host contact and one Python for all of them; each step's module
    runs in a child process of its own, forked from that one, so that nothing one step sets reaches the next.
  - The order is the reset's. The bytecode first, because it is the one step whose inputs only the host can refuse
    (a module that does not resolve, a path that is not there) and it needs no process stopped, so that a refusal
    comes before any signal. Then no segment is removed while its holders live, and the GPUs are read last.
  - Stops at the first step that fails, which fails the task with that module's message and names the step in
    RV(failed_step); the steps after it do not run. A host that does not answer makes the task unreachable, without
    the results of any step (they come back together). Two failures stop nothing. O(nvml_before)'s, unless it refuses
    the GPU selection (a GPU this host does not have, a bad C(gpus) entry), since a node whose driver is gone still
    gets its reset and the final check says why. A unit that is not installed, which is a note in its answer and a
    warning. Every unit of O(units) is tried, even after one failed.
  - This module logs only the names of the steps to the host's journal; each step logs its own arguments as its
    module does, masking its C(no_log) options (the secrets of M(cleanslate.gpu.evidence)), which are masked in the
    whole answer too.
  - Outside check mode, when both O(gpu_reset) and O(shm_clean) are given, M(cleanslate.gpu.shm_clean) also runs once
    in check mode before M(cleanslate.gpu.gpu_reset) signals anything, a look that removes nothing; its RV(steps)
    entry C(shm_before) keeps its C(in_use) (who held each leftover then), so that a report can say that a segment
    the reset removed was held only by a process the reset stopped.
  - One task and one host contact instead of one for each step and unit, so that the controller pays for one task and
    one module run per host (the collection's C(docs/design.md), "Why tasks are few"). The C(cleanslate.gpu.node_reset)
    role runs its steps with it; the modules stay usable one by one.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - cleanslate.gpu.attributes
  - cleanslate.gpu.attributes.action
attributes:
  check_mode:
    details: Every step runs in check mode, and reports what it would do.
  diff_mode:
    support: full
    details: The diffs of the steps that return one, in the order they ran; the units stopped, a line each, their state before and after.
options:
  pycache_purge:
    description: The arguments of M(cleanslate.gpu.pycache_purge). Omitted, the step is not run.
    type: dict
  gpu_reset:
    description: The arguments of M(cleanslate.gpu.gpu_reset). Omitted, the step is not run.
    type: dict
  shm_clean:
    description: The arguments of M(cleanslate.gpu.shm_clean). Omitted, the step is not run.
    type: dict
  nvml_verify:
    description: The arguments of M(cleanslate.gpu.nvml_verify). Omitted, the step is not run.
    type: dict
  evidence:
    description:
      - The arguments of M(cleanslate.gpu.evidence), run after O(pycache_purge) and before every other step, so that
        the evidence is kept before the first signal. Its failure never stops the steps (its result in RV(steps) says it).
      - With O(unit) or O(units), it runs before the units are stopped (after the checks before them).
      - Omitted, it is not run.
    type: dict
  nvml_before:
    description:
      - The arguments of M(cleanslate.gpu.nvml_verify) for a reading of the GPUs before anything is stopped or signalled
        (C(timeout=0) and C(checks=[count]) read once). Its failure stops the steps only when it refuses the GPU
        selection (see the description). Omitted, it is not run.
    type: dict
  unit:
    description:
      - A systemd unit stopped before any process is signalled, after O(nvml_before) and O(evidence), as
        M(ansible.builtin.systemd_service) with C(state=stopped) stops it; systemd gives its processes the unit's
        C(TimeoutStopSec), then kills its control group. A unit that is not installed is a note, not a failure.
      - Its failure stops the steps, before O(units).
    type: str
  units:
    description:
      - More units stopped the same way, after O(unit), each tried even after one failed; any failure then stops the
        steps, with each failed unit's own message, by unit.
    type: list
    elements: str
  record:
    description:
      - After the steps, the role C(cleanslate.gpu.node_reset)'s result, computed as the filter
        C(cleanslate.gpu.node_reset_result) computes it, written on the host for node_exporter's textfile collector as
        M(cleanslate.gpu.textfile_metrics) would write it in a task of its own (check and diff mode too), unless the host
        did not answer. The task that already runs on the host writes the metrics, so a host with metrics on costs the
        controller no more tasks than one without (the collection's C(docs/fleet_scale.md)).
      - A metrics file that cannot be written never changes the steps' outcome; a warning says why.
    type: dict
    suboptions:
      steps:
        description: The results the role registered before these steps, by name (the filter's first argument, but the steps' own).
        type: dict
        required: true
      result:
        description: The filter's other arguments (C(host), C(kind), C(read_only), C(invalid), C(started), C(unit), C(units)).
        type: dict
        required: true
      metrics_dir:
        description: The collector's directory on the host.
        type: path
        required: true
notes:
  - At least one of the steps must be given.
seealso:
  - module: cleanslate.gpu.pycache_purge
  - module: cleanslate.gpu.gpu_reset
  - module: cleanslate.gpu.shm_clean
  - module: cleanslate.gpu.nvml_verify
"""

EXAMPLES = r"""
- name: Purge a patched module's bytecode, stop the GPU holders, remove the dead server's leftovers, check
  cleanslate.gpu.reset_steps:
    pycache_purge:
      modules: [vllm.model_executor.layers.sampler]
      python: /opt/vllm/bin/python
    gpu_reset:
      cmdline_patterns: ['vllm\.entrypoints']
      grace_period: 30
    shm_clean:
      path: /dev/shm
    nvml_verify:
      timeout: 60
  register: reset

- name: Say what the reset stopped and freed
  ansible.builtin.debug:
    msg: "{{ reset.steps.gpu_reset.killed | length }} stopped, {{ reset.steps.shm_clean.bytes_freed }} bytes of shared memory freed"
"""

RETURN = r"""
steps:
  description:
    - The result of every step that ran, by its module's name, as the module returned it (see each module's return
      values). When the host did not answer, the first step given holds C(unreachable) (true) and C(msg), and no
      other step is there.
    - C(shm_before), outside check mode, is the look before the signals (see the description), C({in_use, elapsed_s})
      of M(cleanslate.gpu.shm_clean) in check mode; empty when that look failed (the real step then says why).
    - C(pycache_check) is M(cleanslate.gpu.pycache_purge) in check mode before a unit stop (it changes nothing);
      C(nvml_before) the reading of O(nvml_before).
    - C(unit) is the stop of O(unit) as M(ansible.builtin.systemd_service) answers it (C(status) with the unit's
      C(LoadState) and C(ActiveState) before the stop, C(changed) when it was running; C(msg) for a unit that is not
      installed). C(units) is C({changed, results}), an answer of that kind per unit of O(units) with C(item), its
      name, and C(failed) and C(msg) when a unit failed.
  returned: always
  type: dict
  sample:
    gpu_reset: {changed: true, killed: [{pid: 4242, name: python3}], elapsed_s: 3.1}
    shm_clean: {changed: true, removed: [{path: /dev/shm/psm_1a2b}], bytes_freed: 1048576, elapsed_s: 0.01}
metrics:
  description: The answer of M(cleanslate.gpu.textfile_metrics) (with O(record)); absent when it did not run (no O(record), or a host that did not answer).
  returned: with O(record), when the host answered
  type: dict
  sample: {changed: true, path: /var/lib/prometheus/node-exporter/cleanslate_gpu_node_reset.prom}
failed_step:
  description:
    - The step that failed (the steps after it did not run), or C(unreachable) when the host did not answer.
    - C(pycache_check) or C(nvml_before) for a refusal before anything was touched; C(unit) for the stop of O(unit), or
      of any unit of O(units).
  returned: when a step failed
  type: str
  sample: pycache_purge
"""


import re

from ansible.module_utils.basic import AnsibleModule, _load_params

from ansible_collections.cleanslate.gpu.plugins.module_utils import _evidence_module, _gpu_reset_module, _nvml_verify_module
from ansible_collections.cleanslate.gpu.plugins.module_utils import _pycache_purge_module, _shm_clean_module
from ansible_collections.cleanslate.gpu.plugins.module_utils._reset_order import STEP_ORDER
from ansible_collections.cleanslate.gpu.plugins.module_utils._step_process import internal_settings, run_module_main
from ansible_collections.cleanslate.gpu.plugins.module_utils._unit_stop import stop_units, units_diff

MODULES = {"pycache_purge": _pycache_purge_module, "gpu_reset": _gpu_reset_module, "shm_clean": _shm_clean_module,
           "nvml_verify": _nvml_verify_module, "evidence": _evidence_module}
# The action (plugins/action/reset_steps.py) writes the record after the steps: it is computed on
# the controller. Any other option is a step's arguments, which the step's own module checks.
ARGUMENT_SPEC = dict({name: {"type": "dict"} for name in MODULES},
                     nvml_before={"type": "dict"}, unit={"type": "str"}, units={"type": "list", "elements": "str"},
                     record={"type": "dict", "options": {"steps": {"type": "dict", "required": True},
                                                         "result": {"type": "dict", "required": True},
                                                         "metrics_dir": {"type": "path", "required": True}}})
# nvml_verify's refusal of the GPU selection (module_utils/_nvml.py, _nvml_verify_module.py): the
# one failure of the reading before the stop that stops the reset. A driver that does not answer
# still gets its reset; the final check says why.
SELECTION_REFUSED = re.compile(r"unknown GPU|gpus entry")
# The runs before the stop that are no step of their own, by name: (the module run, the option its
# arguments come from). pycache_check is pycache_purge's in check mode; nvml_before, nvml_verify's.
CHECK_RUNS = {"pycache_check": ("pycache_purge", "pycache_purge"), "nvml_before": ("nvml_verify", "nvml_before")}


def order(params):
    """What runs, in the reset's order. With units to stop: the checks that touch nothing
    (pycache_purge in check mode, the GPUs read), the evidence, the stop, then the module steps.
    Without: the GPUs read, pycache_purge (whose refusal of a target signals nothing and leaves the
    host untouched), the evidence, then the steps that signal and remove."""
    names = [name for name in STEP_ORDER if params[name] is not None]
    before = ["nvml_before"] if params["nvml_before"] is not None else []
    evidence = ["evidence"] if params["evidence"] is not None else []
    if params["unit"] or params["units"]:
        checks = ["pycache_check"] if params["pycache_purge"] is not None else []
        return checks + before + evidence + ["stops"] + names
    if names[:1] == ["pycache_purge"]:
        return before + names[:1] + evidence + names[1:]
    return before + evidence + names


def step_secrets(params):
    """The values of the options a step's own module keeps out of its log and its answer (no_log):
    this module's answer masks them too (it carries every step's arguments)."""
    found = set()
    for name, module in MODULES.items():
        given = params[name] if isinstance(params[name], dict) else {}
        for option, spec in module.ARGUMENT_SPEC.items():
            value = given.get(option)
            if spec.get("no_log") and value not in (None, "", []):
                found.update(str(item) for item in (value if isinstance(value, list) else [value]) if str(item))
    return found


def run_steps(module, params, settings):
    """The steps' answers by name, in the order they ran, and the step that failed (None): each
    module step in its own child process, the units stopped in this one, until one fails. A failure
    to keep the evidence holds nothing back (its answer says it), nor one to read the GPUs before,
    unless it refused the GPU selection."""
    answers, failed_step = {}, None
    for name in order(params):
        if name == "stops":
            stopped, failed = stop_units(module, params["unit"], params["units"])
            answers.update(stopped)
            if failed:
                failed_step = "unit"
                break
            continue
        module_name, option = CHECK_RUNS.get(name, (name, name))
        step_settings = dict(settings, _ansible_check_mode=True) if name == "pycache_check" else settings
        if name == "gpu_reset" and params["shm_clean"] is not None and not module.check_mode:
            # The look before anything is signalled: who holds each leftover now (the action keeps
            # its in_use as steps.shm_before). Check mode: it removes nothing.
            answers["shm_before"] = run_module_main(_shm_clean_module.main, "cleanslate.gpu.shm_clean",
                                                    params["shm_clean"], dict(settings, _ansible_check_mode=True))
        answers[name] = run_module_main(MODULES[module_name].main, "cleanslate.gpu." + module_name,
                                        params[option], step_settings)
        if name == "pycache_check":
            answers[name]["changed"] = False  # a check: what it would remove is removed after the stop
        failed = answers[name].get("failed")
        if failed and (name not in ("evidence", "nvml_before")
                       or name == "nvml_before" and SELECTION_REFUSED.match(str(answers[name].get("msg") or ""))):
            failed_step = name
            break
    return answers, failed_step


class StepsModule(AnsibleModule):
    """The steps' arguments (the evidence's secrets among them) are each step's to log, as its own
    module logs them, in its child; this process writes only the steps' names to the host's journal.
    (AnsibleModule's no_log=True would not do: the task's `_ansible_no_log` overrides it.)"""

    def _log_invocation(self):
        self.log("Invoked with the steps %s" % ", ".join(name for name in ARGUMENT_SPEC if name != "record" and self.params.get(name)))


def main():
    module = StepsModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if module.params["record"] is not None:
        module.fail_json(msg="record is written by the action cleanslate.gpu.reset_steps on the controller, "
                             "not by this module")
    if not any(module.params[name] is not None for name in STEP_ORDER):
        module.fail_json(msg="one of the following is required: %s" % ", ".join(STEP_ORDER))
    module.no_log_values.update(step_secrets(module.params))
    answers, failed_step = run_steps(module, module.params, internal_settings(_load_params()))
    stops = [name for name in ("unit", "units") if name in answers]
    if module._diff and stops:
        answers[stops[-1]]["diff"] = units_diff(answers)
    # The action reads the steps' answers as their modules' own (changes, warnings, diffs, the failure).
    module.exit_json(changed=any(answer.get("changed") for name, answer in answers.items() if name != "shm_before"),
                     steps=answers, failed_step=failed_step)


if __name__ == "__main__":
    main()
