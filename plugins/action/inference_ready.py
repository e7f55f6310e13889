# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readiness gate: the inference_ready module in bounded rounds, with progress between them.

A large model loads for 10 to 60 minutes, and Ansible prints nothing while a module runs. So
the module waits at most progress_interval seconds per call; between calls this plugin prints
one line (elapsed, unit state, what the server last answered) and calls it again with the
unit's baseline (InvocationID, NRestarts), until the server is ready, the unit dies, or the
deadline passes. Then it decides the status: ready, or degraded when speculative decoding
accepts less than the floor; a server the run did not start that the module finds slow or
unproven ends the gate at once with that status (it is left running, never reset for it).
"""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._module_answer import lift_messages

display = Display()
MODULE = "cleanslate.gpu.inference_ready"
# Options for this plugin only; the module receives the others.
OWN = ("timeout", "progress_interval", "min_acceptance_rate", "fail_on_degraded")
# The module's states that end the gate: ready, or a server this run did not start that it left
# running, slow or unproven (the module's LEFT_RUNNING), reported at once with its reason.
LEFT_RUNNING = ("slow", "unproven")


def percentages(rate, floor):
    """Rate and floor as percentages for a message, the rate with as many decimals as it takes
    to show it below the floor (29.96% below 30%, not 30% below 30%), and never fewer than the
    floor shows."""
    floor_text = ("%.6f" % (floor * 100)).rstrip("0").rstrip(".")
    decimals = len(floor_text.partition(".")[2])
    rate_text = "%.*f" % (decimals, rate * 100)
    while float(rate_text) >= float(floor_text) and decimals < 12:
        decimals += 1
        rate_text = "%.*f" % (decimals, rate * 100)
    return rate_text, floor_text


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        try:
            # The role gives its settings as one mapping (cleanslate.gpu.inference_service_plugin_args).
            args = _settings.expanded(self._task.args)
        except ValueError as exc:
            return dict(result, failed=True, msg=str(exc))
        # The probe's other servers give theirs alike; what is no mapping is the module's to refuse.
        if isinstance(args.get("servers"), list):
            servers = []
            for index, server in enumerate(args["servers"]):
                try:
                    servers.append(_settings.expanded(server) if isinstance(server, dict) else server)
                except ValueError as exc:
                    return dict(result, failed=True, msg="servers[%d]: %s" % (index, exc))
            args["servers"] = servers
        if args.get("mode", "gate") == "probe":
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            # The second look's warnings (a kernel log it could not read) are the task's, as its own task's were.
            if isinstance(result.get("xid_look"), dict):
                lift_messages(result["xid_look"], result)
            return result
        # The options read here, not by the module: their ranges are the role's settings'.
        spec = _settings.argument_spec(_settings.GATE)
        ranges = _settings.option_ranges(_settings.GATE)
        values = {name: args.get(name, spec[name]["default"]) for name in ("timeout", "progress_interval",
                                                                           "min_acceptance_rate")}
        problems = [sentence for sentence in (ranges[name].sentence(name, value, convert=True)
                                              for name, value in values.items()) if sentence]
        if problems:
            return dict(result, failed=True, msg=" ".join(problems))
        timeout, progress = int(float(values["timeout"])), int(float(values["progress_interval"]))
        floor = float(values["min_acceptance_rate"])
        host = (task_vars or {}).get("inventory_hostname", "?")
        # The module hides secrets in what it returns; this plugin prints too, so it hides them as well.
        mask = Masker(list(args.get("secrets") or []) + [args.get("api_key") or ""])
        module_args = {key: value for key, value in args.items() if key not in OWN}
        started = time.monotonic()
        deadline = started + timeout
        baseline = dict(args.get("baseline") or {})
        polls = 0
        while True:
            left = deadline - time.monotonic()
            wait = max(0.0, min(progress, left))
            call = dict(module_args, wait=wait, baseline=baseline, with_journal=left <= progress)
            answer = self._execute_module(module_name=MODULE, module_args=call, task_vars=task_vars)
            polls += answer.get("polls", 0)
            baseline = answer.get("baseline") or baseline
            elapsed = time.monotonic() - started
            if answer.get("failed") or answer.get("state") in ("ready",) + LEFT_RUNNING:
                result.update(answer)
                result.update(polls=polls, gate_s=round(elapsed, 2))
                break
            line = mask(self._progress(host, args, answer, elapsed, timeout))
            if time.monotonic() >= deadline:
                result.update(answer)
                result.update(failed=True, polls=polls, gate_s=round(elapsed, 2),
                              msg=mask("%s not ready after %d s (the deadline, inference_service_ready_timeout): %s%s"
                                       % (args.get("url"), timeout, line, self._journal(answer))))
                return result
            display.display(line)
        if result.get("state") in LEFT_RUNNING:
            result.update(status=result["state"], reason=mask(result.get("reason") or result.get("last_seen") or ""))
            result.setdefault("warnings", []).append("%s: %s" % (result["status"], result["reason"]))
        elif not result.get("failed"):
            self._status(result, floor, bool(args.get("fail_on_degraded")))
        return result

    @staticmethod
    def _journal(answer):
        """The module's journal lines for the deadline's message: the error lines (the cause) first, then the tail."""
        parts = []
        if answer.get("journal_errors"):
            parts.append("the cause, from the journal:\n" + "\n".join(answer["journal_errors"]))
        if answer.get("journal"):
            parts.append("its last journal lines:\n" + "\n".join(answer["journal"]))
        return "; " + "\n".join(parts) if parts else ""

    @staticmethod
    def _progress(host, args, answer, elapsed, timeout):
        unit = answer.get("unit") or {}
        where = " (unit %s %s/%s, pid %s, restarts %s)" % (
            args.get("unit"), unit.get("ActiveState"), unit.get("SubState"), unit.get("MainPID"),
            unit.get("NRestarts")) if unit else ""
        return "%s: waiting for %s%s: %d s of %d s, last seen: %s" % (
            host, args.get("url"), where, elapsed, timeout, answer.get("last_seen"))

    @staticmethod
    def _status(result, floor, fail_on_degraded):
        spec = result.get("speculation")
        result["status"], result["reason"] = "ready", ""
        if spec is None:
            return
        rate = spec.get("acceptance_rate")
        if not spec.get("available") or rate is None:
            result["reason"] = "acceptance rate unknown: %s" % spec.get("note", "no data")
            result.setdefault("warnings", []).append(result["reason"])
        elif floor and rate < floor:
            result["status"] = "degraded"
            result["reason"] = ("speculative decoding accepts %s%% of drafted tokens, below "
                                "inference_service_min_acceptance_rate %s%%: speculation that rarely hits is "
                                "slower than none" % percentages(rate, floor))
            if fail_on_degraded:
                result.update(failed=True, msg=result["reason"])
            else:
                result.setdefault("warnings", []).append(result["reason"])
