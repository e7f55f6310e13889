# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The hosts' table of the fleet report (one row per host: status, killed, MiB freed...), for the
report (fleet_report) and for the summary a role prints at the end of a user's own play."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_rows import figure
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_text import human_bytes


def cell(value) -> str:
    """A value as one Markdown table cell."""
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def host_table(rows: list, columns=(), read_only: bool = False) -> list:
    """The Markdown lines of the hosts' table; `columns` ({key, title}) are a playbook's own.

    read_only: nothing was stopped or removed, so the columns say what a reset would do."""
    titles = ["host", "status", "killed", "MiB freed", "shm freed", "bytecode removed", "seconds"]
    if read_only:
        titles[2:6] = ["would stop", "MiB used", "shm would remove", "bytecode would remove"]
    titles += [str(column.get("title") or column["key"]) for column in columns]
    lines = ["| %s |" % " | ".join(titles), "| --- | --- | ---: | ---: | ---: | ---: | ---: |" + " --- |" * len(columns)]
    for row in rows:
        used = row.get("mib_used") if isinstance(row.get("mib_used"), Mapping) else {}
        mib = sum(figure(value) or 0 for value in used.values()) if read_only else figure(row.get("mib_freed")) or 0
        cells = [cell(row.get("host")), cell(row.get("status")), "%d" % (figure(row.get("killed")) or 0),
                 "%d" % mib, human_bytes(figure(row.get("shm_bytes_freed"))),
                 "%d" % (figure(row.get("bytecode_removed")) or 0),
                 "%.1f" % (figure(row.get("seconds"), float) or 0.0)]
        cells += [cell(row.get(column["key"])) for column in columns]
        lines.append("| %s |" % " | ".join(cells))
    return lines
