# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference units a reset stops before it signals anything, stopped in cleanslate.gpu.reset_steps's
own process: the reset's one host contact (issue 42) instead of a systemd_service task per unit.

Each unit is stopped as ansible.builtin.systemd_service with state=stopped stops it, and answers in
its shape, which node_reset_result reads (plugin_utils/_node_reset_result.py): `status` (the unit's
LoadState and ActiveState before the stop), `changed` (it was running), and for a unit systemd does
not know, systemd_service's own sentence, which is a note and a warning, not a failure. `systemctl stop` waits
for the unit's processes: systemd gives them the unit's TimeoutStopSec, then kills its cgroup.
"""

from __future__ import annotations

import subprocess

from ansible_collections.cleanslate.gpu.plugins.module_utils._bounded_run import program_env

# systemd_service's words for a unit that is not installed, which node_reset_result reads.
UNIT_MISSING = "Could not find the requested service"
# Anything else is running, starting, reloading or stopping: a stop is due (systemd_service leaves a
# reloading unit running; a reset must not).
STOPPED = ("inactive", "failed")


def _systemctl(systemctl, *args):
    """(rc, stdout, stderr) of systemctl, run in program_env()."""
    proc = subprocess.run([systemctl, *args], capture_output=True, env=program_env(), check=False)
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def stop_unit(module, systemctl, name) -> dict:
    """One unit stopped (or, in check mode, said to be stopped), systemd_service's answer."""
    answer = {"name": name, "changed": False, "state": "stopped"}
    if systemctl is None:
        return dict(answer, failed=True, msg="systemctl is not on this host's PATH: the unit cannot be stopped here")
    rc, out, err = _systemctl(systemctl, "show", "--property=LoadState,ActiveState", "--", name)
    if rc != 0:
        return dict(answer, failed=True, msg=(err or out).strip() or "systemctl show exited with status %d" % rc)
    status = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    answer["status"] = status
    if status.get("LoadState") == "not-found":
        module.warn("unit %s does not exist: skipped" % name)
        return dict(answer, msg="%s %s: host" % (UNIT_MISSING, name))
    if status.get("ActiveState", "inactive") in STOPPED:
        return answer
    if not module.check_mode:
        rc, out, err = _systemctl(systemctl, "stop", "--", name)
        if rc != 0:
            return dict(answer, failed=True, msg="Unable to stop service %s: %s" % (name, (err or out).strip()))
    return dict(answer, changed=True)


def stop_units(module, unit, units) -> tuple:
    """(answers, failed): `unit` (node_reset_unit) first, alone: a failure there stops the reset
    before the others, as its own task did. Then each of `units`, every one tried even after one
    failed (as a loop over them does); their answers are `units`: {changed, results, failed, msg},
    the failure's message each failed unit's own, by unit."""
    systemctl = module.get_bin_path("systemctl")
    answers = {}
    if unit:
        answers["unit"] = stop_unit(module, systemctl, unit)
        if answers["unit"].get("failed"):
            return answers, True
    if units:
        results = [dict(stop_unit(module, systemctl, name), item=name) for name in units]
        failed = [result for result in results if result.get("failed")]
        answers["units"] = {"changed": any(result["changed"] for result in results), "results": results}
        if failed:
            answers["units"].update(failed=True, msg="; ".join("%s: %s" % (result["item"], result["msg"]) for result in failed))
            return answers, True
    return answers, False


def units_diff(answers) -> dict:
    """What the stops changed, a line per unit: its state before, and after (inactive when stopped)."""
    stops = ([answers["unit"]] if "unit" in answers else []) + answers.get("units", {}).get("results", [])
    before = after = ""
    for stop in stops:
        was = stop.get("status", {}).get("ActiveState", "unknown")
        before += "%s: %s\n" % (stop["name"], was)
        after += "%s: %s\n" % (stop["name"], "inactive" if stop.get("changed") else was)
    return {"before": before, "after": after, "before_header": "units", "after_header": "units"}
