# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Write the fleet report (JSON and Markdown) on the controller, in the controller's process.

The report play used file, copy and template: five module runs on localhost, which cost more
than three seconds of a reset that should take a few. An action plugin writes both files
directly and returns the table for the play to print.
"""

from __future__ import annotations

import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = {
    "dest": {"type": "path", "required": True},
    "kind": {"type": "str", "required": True, "choices": ["reset", "verify", "reset_and_serve"]},
    "stamp": {"type": "str", "required": True},
    "rows": {"type": "list", "elements": "dict", "required": True},
}
UNITS = ("Bytes", "KiB", "MiB", "GiB", "TiB")


def human_bytes(count) -> str:
    """1024-based size as people read it: 0 Bytes, 512 Bytes, 1.0 MiB."""
    value = float(count or 0)
    unit = 0
    while value >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    return "%d Bytes" % value if unit == 0 else "%.1f %s" % (value, UNITS[unit])


def render_markdown(kind: str, stamp: str, rows: list) -> str:
    """The report as a Markdown table, then one line per host that is not ok, with why. Rows
    with a `service` (reset_and_serve) add the service columns."""
    serving = any(row.get("service") for row in rows)
    lines = ["# Fleet %s report %s" % (kind, stamp), "",
             "| host | status | killed | MiB freed | shm freed | bytecode removed | seconds |"
             + (SERVICE_HEADER if serving else ""),
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |" + (SERVICE_ALIGN if serving else "")]
    for row in rows:
        lines.append("| %s | %s | %d | %d | %s | %d | %.1f |" % (
            row.get("host"), row.get("status"), int(row.get("killed") or 0), int(row.get("mib_freed") or 0),
            human_bytes(row.get("shm_bytes_freed")), int(row.get("bytecode_removed") or 0),
            float(row.get("seconds") or 0)) + (service_cells(row.get("service") or {}) if serving else ""))
    bad = [row for row in rows if not row.get("ok") or service_trouble(row)]
    lines += ["", "%d hosts, %d not ok." % (len(rows), len(bad))]
    for row in bad:
        problems = list(row.get("problems") or []) if not row.get("ok") else []
        if service_trouble(row):
            problems.append("service %s: %s" % (row["service"].get("status"), row["service"].get("reason") or "no details"))
        lines.append("- %s (%s): %s" % (row.get("host"), row.get("status"), "; ".join(problems) or "no details"))
    return "\n".join(lines) + "\n"


SERVICE_HEADER = " engine | ready s | first completion ms | acceptance | service |"
SERVICE_ALIGN = " --- | ---: | ---: | ---: | --- |"


def service_trouble(row) -> bool:
    """A served host that is not ready (degraded or failed) is listed with its reason."""
    return bool(row.get("service")) and row["service"].get("status") not in ("ready", "check")


def service_cells(service: dict) -> str:
    """engine, ready s, first completion ms, acceptance rate, status: the inference_service_result's."""
    def number(value, spec):
        return "-" if value is None or value == "" else spec % float(value)
    if not service:
        return " - | - | - | - | - |"
    engine = " ".join(str(part) for part in (service.get("engine"), service.get("engine_version")) if part)
    rate = service.get("acceptance_rate")
    return " %s | %s | %s | %s | %s |" % (
        engine or "-", number(service.get("ready_s"), "%.1f"), number(service.get("first_completion_ms"), "%.0f"),
        "-" if rate is None or rate == "" else "%.0f%%" % (float(rate) * 100), service.get("status") or "-")


def write_atomically(path: str, text: str) -> None:
    """Readers never see half a report: write beside it, then rename."""
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(partial, 0o644)
    os.replace(partial, path)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # not used: nothing runs on a target
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        base = os.path.join(args["dest"], "%s-%s" % (args["kind"], args["stamp"]))
        markdown = render_markdown(args["kind"], args["stamp"], args["rows"])
        document = {"kind": args["kind"], "time": args["stamp"], "hosts": args["rows"]}
        result.update(json_path=base + ".json", markdown_path=base + ".md", markdown=markdown.splitlines(),
                      changed=False)
        if self._task.check_mode:
            return result
        try:
            os.makedirs(args["dest"], mode=0o755, exist_ok=True)
            write_atomically(base + ".json", json.dumps(document, indent=4, sort_keys=True) + "\n")
            write_atomically(base + ".md", markdown)
        except OSError as exc:
            raise AnsibleActionFail("cannot write the fleet report under %s: %s" % (args["dest"], exc)) from exc
        return result
