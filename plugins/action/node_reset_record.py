# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""node_reset_result, and its textfile metrics on the host, in one task (issue 42).

The result is cleanslate.gpu.node_reset_result's (the filter's Python); the metrics are
cleanslate.gpu.textfile_metrics run from here as a task of its own would run it (check and diff
mode), so that a host with metrics on costs the controller no more tasks than one without
(docs/fleet_scale.md). A metrics file that cannot be written never changes the reset's outcome:
a warning says so, and the task neither fails nor changes.
"""

from __future__ import annotations

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._metric_families import metric_families
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._node_reset_result import node_reset_result
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._module_answer import lift_messages

# A host that did not answer gets no file: nothing would be written, and the error would hide the result's.
UNREACHED = ("unreachable", "swept-unreachable")
ARGUMENT_SPEC = {
    "steps": {"type": "dict", "required": True},
    "result": {"type": "dict", "required": True},
    "metrics_dir": {"type": "path"},
    "metrics_later": {"type": "bool", "default": False},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # the metrics module's run makes and removes its own
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        recorded = node_reset_result(args["steps"], **args["result"])
        result.update(changed=False, ansible_facts={"node_reset_result": recorded,
                                                    "__node_reset_metrics_pending": args["metrics_later"]})
        if args["metrics_dir"] is None or recorded["status"] in UNREACHED:
            result["metrics"] = {"skipped": True}
            return result
        result["metrics"] = self._write_metrics(args["metrics_dir"], recorded, task_vars)
        lift_messages(result["metrics"], result)
        if result["metrics"].get("failed") or result["metrics"].get("unreachable"):
            result.setdefault("warnings", []).append(
                "the metrics file for node_exporter was not written (%s); the reset's result stands"
                % result["metrics"].get("msg", "no reason given"))
        elif result["metrics"].get("diff"):
            result["diff"] = result["metrics"]["diff"]
        return result

    def _write_metrics(self, directory, recorded, task_vars):
        metrics = metric_families(recorded, role="node_reset", host=recorded["host"])
        try:
            return self._execute_module(
                module_name="cleanslate.gpu.textfile_metrics", task_vars=task_vars,
                module_args={"path": directory, "name": metrics["name"], "families": metrics["families"]})
        except AnsibleConnectionFailure as exc:
            return {"unreachable": True, "msg": str(exc)}
