# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a role prints at the end of a user's own play (`roles: [cleanslate.gpu.node_reset]`): its
row of the fleet report as a small table, its problems, and where the whole result is. The
playbooks run the roles by their tasks files and print the fleet report instead, never this.

Lines, not one text: a play without the project's ansible.cfg prints a debug message as JSON,
where one text would read as a single line of \\n."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_result import inference_service_report_row
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_rows import host_row
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_table import cell, host_table

# The service's columns, as reset_and_serve.yml adds them to the fleet report (fleet_report_columns).
SERVICE_COLUMNS = (("service_status", "service"), ("service_engine", "engine"), ("service_ready_s", "ready s"),
                   ("service_first_completion_ms", "first completion ms"), ("service_acceptance", "acceptance"))
WHERE = ("The whole result is in %s; docs/%s.md, \"In your own play\", shows how to write the fleet report "
         "(JSON and Markdown) from your play.")


def node_reset_summary(result, read_only=False):
    """The host's row of the fleet report (status, killed, MiB freed, shm freed, bytecode removed,
    seconds), its problems, what a check would stop, and where node_reset_result is."""
    if not isinstance(result, Mapping):
        raise TypeError("node_reset_summary expects node_reset_result, got %s" % type(result).__name__)
    # What fleet_report calls read-only: a check mode run, or a verify.
    read_only = bool(read_only) or result.get("kind") == "verify"
    row = host_row(str(result.get("host")), result, read_only=read_only)
    lines = host_table([row], read_only=read_only)
    lines += ["- %s" % cell(problem) for problem in row["problems"]]
    lines += ["- would stop pid %s %s (%s)" % tuple(cell(target.get(key)) for key in ("pid", "name", "reason"))
              for target in row.get("would_stop") or []]
    return lines + [WHERE % ("node_reset_result", "node_reset")]


def inference_service_summary(result):
    """The host's service columns of the fleet report (inference_service_report_row), one line per
    instance when it runs several, its problems, and where inference_service_result is."""
    row = inference_service_report_row(result)
    lines = ["| host | %s |" % " | ".join(title for dummy, title in SERVICE_COLUMNS),
             "| --- |" + " --- |" * len(SERVICE_COLUMNS),
             "| %s |" % " | ".join(cell(row.get(key)) for key in ("host",) + tuple(key for key, dummy in SERVICE_COLUMNS))]
    lines += ["- %s: %s, ready s %s, acceptance %s" % tuple(cell(instance.get(key)) for key in (
        "unit", "service_status", "service_ready_s", "service_acceptance")) for instance in row.get("instances") or []]
    # A refusal before anything was touched is node_reset's problem in the fleet report, not the row's: said here.
    problems = row.get("problems") or ([] if row.get("ok") else str(result.get("reason") or "").splitlines())
    lines += ["- %s" % cell(problem) for problem in problems if problem]
    return lines + [WHERE % ("inference_service_result", "inference_service")]


class FilterModule:
    """The summaries the roles print at the end of a user's own play."""

    def filters(self):
        return {"node_reset_summary": node_reset_summary, "inference_service_summary": inference_service_summary}
