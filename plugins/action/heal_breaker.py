# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The heal playbook's circuit breaker, on the controller (documentation: plugins/modules/heal_breaker.py).

The state is the controller's file, shared by every heal the rulebook starts: the decision, the
state and the metrics file are all changed under one lock (plugin_utils/_heal_breaker.py). The
alert is read raw from the task's variables, never through a template (plugin_utils/_heal_alert.py)."""

from __future__ import annotations

import math
import os
import re
import time

from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display

from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker, secret_values
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import trusted_directory_problem
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _heal_breaker as breaker
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._heal_alert import event_of, raw_field, read_alert
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._playbook_variables import shown
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import load_spec

display = Display()

ARGUMENT_SPEC = {
    "path": {"type": "str", "default": "/var/lib/cleanslate-gpu/heal_breaker.json"},
    "host": {"type": "str", "required": True},
    "state": {"type": "str", "default": "heal", "choices": ["heal", "closed", "open"]},
    # state=open: the reset's status that no heal changes (_heal_breaker.HOLD_OPEN); its problems
    # are read by reset_problems, never templated.
    "cause": {"type": "str", "choices": list(breaker.HOLD_OPEN)},
    # The host's secrets mappings (inference_service_secrets, each instance's `secrets`): masked
    # in whatever of the alert is kept or shown.
    "secrets": {"type": "list", "elements": "raw", "default": [], "no_log": True},
    # One unit per server of the host (inference_service_instances), or the single service's.
    "configured_units": {"type": "list", "elements": "str"},
    "max_heals": {"type": "raw", "default": 3},
    "window_s": {"type": "raw", "default": 3600},
    "quiet_s": {"type": "raw", "default": 3600},
    # None: DEFAULT_METRICS_DIR, written only where it is safe (see metrics_directory).
    "metrics_dir": {"type": "str"},
    # The fleet's cap (docs/self_healing.md): None for both, no cap.
    "fleet_max_heals": {"type": "raw"},
    "fleet_max_percent": {"type": "raw"},
    # The hosts the percentage is of (heal.yml: the hosts of gpu_nodes).
    "fleet_size": {"type": "raw"},
    "fleet_window_s": {"type": "raw", "default": 3600},
    # state=closed: the fleet's breaker instead of the host's; `unit` closes one server's alone.
    "fleet": {"type": "bool", "default": False},
    "unit": {"type": "str"},
}
DEFAULT_METRICS_DIR = "/var/lib/prometheus/node-exporter"
# Characters of the reset's problems kept in the reason (they quote kernel log lines).
DETAIL_MAX = 2000
# A year: anything longer is a typo (and a float that large loses the seconds).
LONGEST_S = 366 * 86400
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# The variable heal.yml and heal_breaker_close.yml give each option from: a sentence names it too.
VARIABLE_OF = {"path": "heal_state_path", "metrics_dir": "heal_metrics_dir", "max_heals": "heal_max_heals",
               "window_s": "heal_window_s", "quiet_s": "heal_quiet_s", "fleet_max_heals": "heal_fleet_max_heals",
               "fleet_max_percent": "heal_fleet_max_percent", "fleet_size": "heal_fleet_size",
               "fleet_window_s": "heal_fleet_window_s"}
# The most hosts a fleet is taken to have (a cap or a size beyond it is a typo).
LARGEST_FLEET = 100000


def _positive(name, value, integer=False, most=LONGEST_S, kind=""):
    """`value` as a number within (0, most]; one sentence naming `name` otherwise."""
    kind = kind or ("a whole number" if integer else "a number of seconds")
    problem = "%s must be %s between 1 and %d, got %s (the playbooks' %s)" % (
        name, kind, most, shown(value), VARIABLE_OF[name])
    if isinstance(value, bool):
        raise AnsibleActionFail(problem)
    try:
        number = float(value) if not integer else int(str(value).strip())
    except (TypeError, ValueError):
        raise AnsibleActionFail(problem) from None
    if not math.isfinite(number) or not 0 < number <= most or (not integer and number < 1):
        raise AnsibleActionFail(problem)
    return number


def check_args(args) -> dict:
    """The options, checked: one sentence per problem."""
    problems = []
    host = args["host"]
    if not host.strip() or CONTROL.search(host):
        problems.append("host %r must be an inventory name (not empty, no control characters)" % host)
    for name in ("path", "metrics_dir"):
        value = args[name]
        if name == "metrics_dir" and not value:
            continue
        if not os.path.isabs(value) or CONTROL.search(value):
            problems.append("%s %s must be an absolute path on the controller (the playbooks' %s)"
                            % (name, shown(value), VARIABLE_OF[name]))
    # Written by root or the rulebook's user: nobody else may choose where (module_utils/_trusted_dirs.py).
    owners = (os.geteuid(),)
    for name, directory in (("path", os.path.dirname(args["path"])), ("metrics_dir", args["metrics_dir"])):
        if problems or not directory:
            continue
        unsafe = trusted_directory_problem(directory, owners, missing_ok=True)
        if unsafe:
            problems.append("%s: %s" % (name, unsafe))
    limits = {}
    for name, integer, most in (("max_heals", True, 1000), ("window_s", False, LONGEST_S), ("quiet_s", False, LONGEST_S)):
        try:
            limits[name] = _positive(name, args[name], integer, most)
        except AnsibleActionFail as exc:
            problems.append(str(exc.message))
    try:
        limits["fleet"] = fleet_cap(args)
    except AnsibleActionFail as exc:
        problems.append(str(exc.message))
    if problems:
        raise AnsibleActionFail("; ".join(problems))
    return limits


def fleet_cap(args) -> dict | None:
    """{max_hosts, window_s} of the fleet breaker, or None without a cap: the smaller of
    fleet_max_heals and fleet_max_percent of fleet_size, the percentage rounded down (a share
    never allows one host more than it says) but at least 1 (a cap that heals nothing is no heal:
    leave the host out of heal_hosts instead)."""
    unset = (None, "")
    most_hosts, most_percent = args.get("fleet_max_heals"), args.get("fleet_max_percent")
    if most_hosts in unset and most_percent in unset:
        return None
    caps = []
    if most_hosts not in unset:
        caps.append(int(_positive("fleet_max_heals", most_hosts, True, LARGEST_FLEET)))
    if most_percent not in unset:
        percent = _positive("fleet_max_percent", most_percent, most=100, kind="a percentage")
        size = int(_positive("fleet_size", args.get("fleet_size"), True, LARGEST_FLEET))
        # Whole hundredths first: 29 % of 100 hosts is 29, where 0.29 * 100 is 28.999999999999996.
        caps.append(max(1, int(round(percent * 100)) * size // 10000))
    return {"max_hosts": min(caps), "window_s": _positive("fleet_window_s", args.get("fleet_window_s", 3600))}


def reset_problems(task_vars) -> str:
    """The host's reset problems (node_reset_result.problems, which quote kernel log lines), read
    as stored: a template in them is text, never run (as the alert in event_of)."""
    result = task_vars.get("node_reset_result")
    problems = result.get("problems") if isinstance(result, dict) else None
    if not isinstance(problems, list):
        return ""
    return "; ".join(str(problem) for problem in problems)


def metrics_directory(args, default=DEFAULT_METRICS_DIR) -> tuple:
    """(directory, warning): where the breaker's metrics go. A directory the operator named was
    checked by check_args (an unsafe one refuses the heal). The default is a record, not the
    breaker: when someone else may write it (Debian's prometheus-blackbox-exporter gives
    /var/lib/prometheus to its own user), no file is written and the heal goes on, with a warning."""
    if args["metrics_dir"] is not None:
        return args["metrics_dir"], ""
    unsafe = trusted_directory_problem(default, (os.geteuid(),), missing_ok=True)
    if unsafe:
        return "", ("heal_breaker: no %s written (heal_metrics_dir is not set and its default is not safe to write in: %s)"
                    % (breaker.METRICS_FILE, unsafe))
    return default, ""


def target_problem(host, event, trigger, configured) -> str:
    """Why the alert cannot heal `host`: it names another host (or none), or a unit the host is not
    served with (the heal would reset a host for something the inventory does not manage). The
    alert's raw values are compared exactly; the sentence shows their texts (trigger)."""
    named, unit = raw_field(event, "host"), raw_field(event, "unit")
    if not (isinstance(named, str) and named == host):
        return ("%s: not healed, the alert names %s (heal.yml heals only the host of the rulebook's event, ansible_eda.event)"
                % (host, "host '%s'" % trigger["host"] if trigger["host"] else "no host"))
    if unit not in (None, "") and not (isinstance(unit, str) and unit in configured):
        return ("%s: the alert %s is about %s, but the host serves %s (inference_service_unit, inference_service_instances):"
                " nothing is healed" % (host, trigger["alertname"] or "(no name)", trigger["unit"] or "a unit that is not text",
                                        ", ".join(configured)))
    return ""


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args, task_vars, result):
        limits = check_args(args)
        metrics_dir, metrics_warning = metrics_directory(args)
        if args["state"] == "open" and not args["cause"]:
            raise AnsibleActionFail("state=open needs cause: the reset's status, one of %s" % ", ".join(breaker.HOLD_OPEN))
        path, host, now = args["path"], args["host"], time.time()
        event = event_of(task_vars)
        mask = Masker([value for secrets in args["secrets"] for dummy, value in secret_values(secrets)])
        fields = read_alert(event, mask)
        trigger = {name: text for name, text in fields.items() if name != "host"}
        # A server without a unit of its own runs under the role's default unit.
        default_unit = load_spec("inference_service")["inference_service_unit"]["default"]
        configured = [unit or default_unit for unit in args["configured_units"] or [""]]
        refused = target_problem(host, event, fields, configured) if args["state"] == "heal" else ""
        detail = mask(reset_problems(task_vars)) if args["state"] == "open" else ""
        detail = detail if len(detail) <= DETAIL_MAX else detail[:DETAIL_MAX] + "..."
        # On a host of several servers an alert about one of them counts against that server's
        # breaker; an alert without a unit, and any alert on a host of one server, the host's.
        unit = fields["unit"] if len(configured) > 1 and args["state"] == "heal" else ""
        close_unit = args.get("unit") or "" if args["state"] == "closed" else ""
        result.update(host=host, path=path, trigger=trigger, metrics_written=False, changed=False)
        if unit:
            result["unit"] = unit
        if refused:
            result.update(allowed=False, open=False, opened=False, reason=refused)
            return result
        try:
            if self._task.check_mode:
                # Decided on what the file holds now, and nothing written: nothing counted.
                self._decide(breaker.load(path), args, limits, now, trigger, unit, close_unit, detail, result)
                return result
            with breaker.locked(path) as state:
                self._decide(state, args, limits, now, trigger, unit, close_unit, detail, result)
                if metrics_warning:
                    display.warning(metrics_warning)
                if metrics_dir and os.path.isdir(metrics_dir):
                    try:
                        breaker.write_metrics(metrics_dir, state, now, limits["window_s"])
                        result["metrics_written"] = True
                    except OSError as exc:
                        # The decision stands: a metrics file is a record, not the breaker.
                        display.warning("heal_breaker: cannot write %s/%s: %s" % (metrics_dir, breaker.METRICS_FILE, exc))
        except breaker.BreakerError as exc:
            # Not chained: ansible-core would append the cause's sentence, which ours already holds.
            raise AnsibleActionFail(str(exc)) from None
        if result.get("opened"):
            # The log line a human alert can fire on (also the metrics cleanslate_gpu_heal_breaker_open
            # and cleanslate_gpu_heal_fleet_breaker_open).
            display.warning("cleanslate.gpu heal %sbreaker opened: %s"
                            % ("fleet " if result.get("fleet_open") else "", result["reason"]))
        return result

    @staticmethod
    def _decide(state, args, limits, now, trigger, unit, close_unit, detail, result):
        """The decision of args' state on `state`, into `result` (check mode: on a copy not saved)."""
        host = args["host"]
        if args["state"] == "closed":
            decision = breaker.close_fleet(state, now) if args.get("fleet") else breaker.close(state, host, now, close_unit)
            result.update(changed=decision["changed"], was_open=decision["was_open"], open=False)
        elif args["state"] == "open":
            result.update(breaker.hold_open(state, host, now, args["cause"], detail))
        else:
            decision = breaker.request_heal(state, host, now, limits["max_heals"], limits["window_s"], limits["quiet_s"],
                                            trigger, unit, limits["fleet"])
            # Every request is recorded (a refused one restarts the quiet period), except an
            # alert that an earlier heal already answered.
            result.update(decision, changed=not decision.get("answered"))
