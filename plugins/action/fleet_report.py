# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Write the fleet report (JSON and Markdown) on the controller, in the controller's process.

An action plugin, not file, copy and template tasks: it writes both files itself, with no
module run (fewer tasks: docs/design.md#why-tasks-are-few), and returns the table for the play to print.

Each host's row (its figures from node_reset_result) is plugin_utils/_report_rows.py's; this
file merges the playbooks' rows into it, renders the Markdown and writes both files.
"""

from __future__ import annotations

import glob
import json
import os
import re
import tempfile
import time
from collections.abc import Mapping

from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._playbook_variables import shown
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_details import REMOVED_BY_A_RESET, cut_command_line, held_words
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_rows import NOT_RUN, figure as _number, host_row
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_table import cell as _cell, host_table
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_text import count_of, human_bytes

ARGUMENT_SPEC = {
    "dest": {"type": "path", "required": True},
    "kind": {"type": "str", "required": True},
    "stamp": {"type": "str"},
    "hosts": {"type": "list", "elements": "str", "default": []},
    "rows": {"type": "list", "elements": "dict", "default": []},
    "columns": {"type": "list", "elements": "dict", "default": []},
    "not_run": {"type": "str"},
    "merge": {"type": "list", "elements": "path", "default": []},
    "trigger": {"type": "dict"},
}
RESULT_FACT = "node_reset_result"
# The Markdown's short form of a command line; the JSON row has it up to _report_details.CMDLINE_CHARS.
MARKDOWN_CMDLINE_CHARS = 120
# Both end up in file names: no separators, no dot-dot.
KIND = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
STAMP = re.compile(r"[0-9A-Za-z_-]{1,64}\Z")


def merge_rows(rows: list, extra: list) -> list:
    """Add the keys of `extra` rows to the row of the same host (a new row for a new host).

    Keys are copied through as given, so a playbook can add its own columns without a change
    here; `problems` are appended and `ok` is and-ed, so an added result can only make a host
    worse."""
    by_host = {row["host"]: row for row in rows}
    for item in extra:
        host = item.get("host")
        if host is None:
            raise AnsibleActionFail("every row needs a host: %s" % json.dumps(item, sort_keys=True, default=str))
        row = by_host.get(host)
        if row is None:
            row = by_host[host] = dict(host=host)
            rows.append(row)
        for key, value in item.items():
            if key == "problems":
                row["problems"] = list(row.get("problems") or []) + [str(problem) for problem in value or []]
            elif key == "ok" and "ok" in row:
                row["ok"] = bool(row["ok"]) and bool(value)
            else:
                row[key] = value
    return rows


def instance_rows(rows: list) -> list:
    """One row per server of the hosts with several (inference_service_instances): the host, its unit,
    its GPUs, its service status, whether the reset stopped it and the MiB freed on its GPUs, its
    ready seconds and acceptance. The host's reset is one for all its reset instances: each is
    credited with the MiB freed on its own GPUs (by index; a GPU named by UUID is matched through
    the reading before the reset), and with the processes killed that held one of them (a process
    that held no GPU, such as an API server, counts in the host's `killed` only)."""
    found = []
    for row in rows:
        freed = row.get("mib_freed_per_gpu") if isinstance(row.get("mib_freed_per_gpu"), Mapping) else {}
        by_uuid = {str(uuid).lower(): index for index, uuid in (row.get("gpu_uuids") or {}).items()}
        for instance in row.get("instances") or []:
            if not isinstance(instance, Mapping):
                continue
            indices = [by_uuid.get(str(gpu).lower(), str(gpu)) for gpu in instance.get("gpus") or []]
            mib = [_number(freed[index]) for index in indices if index in freed]
            reset = bool(instance.get("reset"))
            killed = [held for held in row.get("killed_gpus") or [] if set(held) & set(indices)]
            found.append(dict(instance, host=row.get("host"), stopped=reset, killed=len(killed) if reset else 0,
                              mib_freed=sum(value or 0 for value in mib) if reset else 0))
    return found


def with_instance_rows(rows: list) -> list:
    """Each host row's `instances` with what its reset stopped, killed and freed (instance_rows)."""
    for row in rows:
        if isinstance(row.get("instances"), list):
            row["instances"] = instance_rows([row])
    return rows


def render_instances(instances: list, read_only: bool = False) -> list:
    """The Markdown lines of the instances' table (none when no host has several servers)."""
    if not instances:
        return []
    lines = ["", "| host | unit | GPUs | service | %s | MiB freed | ready s | acceptance |"
             % ("would reset" if read_only else "reset"), "| --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for item in instances:
        lines.append("| %s |" % " | ".join(_cell(value) for value in (
            item.get("host"), item.get("unit"), ",".join(str(gpu) for gpu in item.get("gpus") or []) or "all",
            item.get("service_status"), "yes" if item.get("stopped") else "no", "%d" % (_number(item.get("mib_freed")) or 0),
            item.get("service_ready_s", "-"), item.get("service_acceptance", "-"))))
    return lines


def read_reports(patterns: list, kind: str) -> tuple:
    """(rows, files) of the JSON reports that `patterns` (paths or globs) name, for a merge.

    A host in several reports keeps the row of the newest report (by its time stamp; the later
    file on a tie): a slice run again replaces its earlier run. Every report must be of `kind`."""
    problems, files = [], []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not found:
            problems.append("merge: %s matches no file" % pattern)
        files += [path for path in found if path not in files]
    documents = []
    for order, path in enumerate(files):
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError) as exc:
            problems.append("merge: cannot read the report %s: %s" % (path, exc))
            continue
        if not isinstance(document, Mapping) or not isinstance(document.get("hosts"), list) or not all(
                isinstance(row, Mapping) and isinstance(row.get("host"), str) for row in document["hosts"]):
            problems.append("merge: %s is not a fleet report (a JSON object whose hosts are rows with a host)" % path)
        elif document.get("kind") != kind:
            problems.append("merge: %s is a %s report, not %s" % (path, document.get("kind"), kind))
        else:
            documents.append((str(document.get("time") or ""), order, document))
    if problems:
        raise AnsibleActionFail("; ".join(problems))
    rows = {}
    for _time, _order, document in sorted(documents, key=lambda item: item[:2]):
        for row in document["hosts"]:
            rows.pop(row["host"], None)
            rows[row["host"]] = dict(row)
    return list(rows.values()), files


def trigger_line(trigger) -> list:
    """Who started the run, when something other than a person did (the heal rulebook's alert)."""
    if not trigger:
        return []
    what = ", ".join("%s %s" % (key, _cell(trigger[key])) for key in sorted(trigger) if key != "by" and trigger[key] not in (None, ""))
    return ["Triggered by %s%s." % (_cell(trigger.get("by") or "an automation"), ": " + what if what else ""), ""]


def render_kept(rows: list) -> list:
    """The short form of what shm_clean kept in use (segment, size, holders) and did in /dev/shm and tmp_path
    (how many removed, each kept one with why, each one removed because the reset stopped its holder);
    the JSON rows have every entry."""
    lines = []
    held = [row for row in rows if row.get("shm_in_use")]
    if held:
        lines += ["", "Kept in use (the space returns when these processes exit):"]
    for row in held:
        for item in row["shm_in_use"]:
            cells = (_cell(row.get("host")), _cell(item.get("path")), human_bytes(_number(item.get("bytes"))),
                     _cell(held_words(item)))
            lines.append("- %s: %s, %s, held by %s" % cells)
    for key, title in (("shm_leftovers", "Leftovers in the shared memory directory:"),
                       ("tmp_leftovers", "Engine leftovers in tmp_path:")):
        lines += render_leftovers(rows, key, title)
    return lines


def render_leftovers(rows: list, key: str, title: str) -> list:
    """Per host: how many entries were removed and kept, each kept one with why, and each one removed
    that a check kept (its holders were stopped by the reset; in a check, ones the reset would stop)."""
    with_any = [row for row in rows if row.get(key)]
    lines = ["", title] if with_any else []
    for row in with_any:
        gone = [item for item in row[key] if item.get("done") != "kept"]
        kept = [item for item in row[key] if item.get("done") == "kept"]
        would = any(item.get("done") == "would remove" for item in gone)
        left_out = _number(row.get(key + "_left_out")) or 0
        lines.append("- %s: %d %s, %d kept%s" % (_cell(row.get("host")), len(gone), "would be removed" if would else "removed",
                                                 len(kept), " (%d more in no list)" % left_out if left_out else ""))
        # A segment kept in use is in "Kept in use" above, with its size; here only when a reset removes it.
        in_use = {item.get("path") for item in row.get("shm_in_use") or []} if key == "shm_leftovers" else set()
        lines += ["  - kept %s: %s" % (_cell(item.get("path")), _cell(item.get("why"))) for item in kept
                  if item.get("path") not in in_use or str(item.get("why")).endswith(REMOVED_BY_A_RESET)]
        lines += ["  - removed %s: %s" % (_cell(item.get("path")), _cell(item.get("why"))) for item in gone
                  if str(item.get("why") or "").startswith("held only by")]
    return lines


def render_processes(rows: list, read_only: bool) -> list:
    """Each process the reset stopped (a check: would stop), one line each: pid, name, the signal that
    ended it, its GPUs, why it was chosen and its command line (masked by gpu_reset, cut here)."""
    key = "would_stop" if read_only else "stopped"
    with_any = [row for row in rows if row.get(key)]
    lines = ["", "A reset would stop:" if read_only else "Stopped:"] if with_any else []
    for row in with_any:
        lines.append("- %s:" % _cell(row.get("host")))
        for target in row[key]:
            gpus = ",".join(str(gpu) for gpu in target.get("gpus") or []) or "none"
            how = "" if read_only else "%s, " % _cell(target.get("signal"))
            lines.append("  - pid %s %s (%sGPU %s; %s): %s" % (
                _cell(target.get("pid")), _cell(target.get("name")), how, gpus, _cell(target.get("reason")),
                _cell(cut_command_line(target.get("cmdline"), MARKDOWN_CMDLINE_CHARS))))
        left_out = _number(row.get(key + "_left_out")) or 0
        if left_out:
            lines.append("  - and %s, not listed" % count_of(left_out, "more process"))
    return lines


def render_evidence(rows: list) -> list:
    """Where each host keeps the evidence of its failure, and what it could not keep."""
    kept = [row for row in rows if (row.get("evidence") or {}).get("directory")]
    lines = ["", "Evidence kept on the host before the reset:"] if kept else []
    for row in kept:
        lines.append("- %s: %s" % (_cell(row.get("host")), _cell(row["evidence"]["directory"])))
        lines += ["  - not kept: %s" % _cell(note) for note in row["evidence"].get("not_kept") or []]
    return lines


def render_markdown(kind: str, stamp: str, rows: list, columns=(), read_only: bool = False, trigger=None) -> str:
    """The report as a Markdown table, then the hosts that are not ok, one problem per line.

    read_only: nothing was stopped or removed, so the columns say what a reset would do, and
    each process a reset would stop is listed under its host."""
    lines = ["# Fleet %s report %s" % (kind, stamp), ""] + trigger_line(trigger)
    lines += host_table(rows, columns, read_only)
    lines += render_instances([instance for row in rows for instance in row.get("instances") or []], read_only)
    bad = [row for row in rows if not row.get("ok")]
    lines += ["", "%s, %d not ok." % (count_of(len(rows), "host"), len(bad))]
    # One line per problem: a host with eight dirty GPUs reads as eight lines, not one.
    for row in bad:
        problems = [_cell(problem) for problem in row.get("problems") or []] or ["no details"]
        lines.append("- %s (%s):" % (row.get("host"), row.get("status")))
        lines += ["  - %s" % problem for problem in problems]
    lines += render_kept(rows)
    lines += render_processes(rows, read_only)
    lines += render_evidence(rows)
    return "\n".join(lines) + "\n"


# A report holds the engines' journal lines and every host's problems: the controller's other
# users have no business reading them (a secret masked everywhere the product knows of can still
# be one the product was never told), so the files are the writer's alone.
REPORT_MODE = 0o600


def write_atomically(path: str, text: str) -> None:
    """Readers never see half a report: write beside it under a name of its own (never through a link
    planted there, never another run's: heals run at once, and one would empty the other's), then rename."""
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".", suffix=".partial")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), REPORT_MODE)  # whatever the umask took away, nothing more
        handle.write(text)
    os.replace(partial, path)


def reserve_name(base: str) -> str:
    """`base`, or `base-2`, `base-3`, ...: the first whose JSON file did not exist, created empty
    here (O_EXCL) so that a run ending in the same second elsewhere (the heal rulebook runs hosts
    in parallel, --limit slices run side by side) takes the next name instead of replacing it."""
    for number in range(1, 1000):
        candidate = base if number == 1 else "%s-%d" % (base, number)
        try:
            os.close(os.open(candidate + ".json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, REPORT_MODE))
            return candidate
        except FileExistsError:
            continue
    raise AnsibleActionFail("cannot write the fleet report: %s.json and 998 more names of that second exist" % base)


# The playbooks' variables each option comes from (fleet_report.yml, merge_reports.yml), named in its
# sentence: the user set the variable, not the option.
VARIABLE_OF = {"dest": "fleet_report_path", "kind": "fleet_report_kind"}


def check_args(args: dict) -> None:
    """Names that become file names, and columns that name a key; one short line each (a value is
    shown cut, on one line: shown)."""
    problems = []
    if not args["dest"] or not args["dest"].strip() or "\0" in args["dest"]:
        problems.append("dest %s (the playbooks' %s) must name a directory (a relative one is under the directory"
                        " ansible-playbook runs in)" % (shown(args["dest"]), VARIABLE_OF["dest"]))
    if not KIND.match(args["kind"]):
        problems.append("kind %s (the playbooks' %s) must be a lower-case name (letters, digits, - and _), at most 32"
                        " characters" % (shown(args["kind"]), VARIABLE_OF["kind"]))
    if args["stamp"] is not None and not STAMP.match(args["stamp"]):
        problems.append("stamp %s must be letters, digits, - and _ only (it is part of the file names)"
                        % shown(args["stamp"]))
    for column in args["columns"]:
        if not isinstance(column.get("key"), str) or not column["key"]:
            problems.append("each column needs a key (the row key it shows), got %s" % shown(column))
    if problems:
        raise AnsibleActionFail("; ".join(problems))


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args, task_vars, result):
        check_args(args)
        stamp = args["stamp"] or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        hostvars = task_vars.get("hostvars") or {}
        rows, merged = read_reports(args["merge"], args["kind"])
        # Nothing was stopped or removed: a verify run, or a reset in check mode.
        read_only = bool(self._task.check_mode) or args["kind"] == "verify"
        for host in args["hosts"]:
            facts = hostvars[host] if host in hostvars else {}
            rows = [row for row in rows if row["host"] != host]
            rows.append(host_row(host, facts.get(RESULT_FACT), args["not_run"] or NOT_RUN, read_only))
        rows = with_instance_rows(merge_rows(rows, args["rows"]))
        # A relative dest is under the controller's working directory (where ansible-playbook runs),
        # made absolute so that the paths returned say where the files are.
        args["dest"] = os.path.abspath(args["dest"])
        # A check-mode run's report is written too (it is the controller's file, not a change of a
        # target: what a reset would stop, to read before running it), named apart from a real one.
        check = bool(self._task.check_mode)
        base = os.path.join(args["dest"], "%s-%s%s" % (args["kind"], "check-" if check else "", stamp))
        markdown = render_markdown(args["kind"] + (" (check mode: nothing changed)" if check else ""), stamp, rows,
                                   args["columns"], read_only, args.get("trigger"))
        document = {"kind": args["kind"], "time": stamp, "hosts": rows}
        instances = [instance for row in rows for instance in row.get("instances") or []]
        if instances:
            document["instances"] = instances
        if args.get("trigger"):
            document["trigger"] = args.get("trigger")
        if check:
            document["check_mode"] = True
        if merged:
            document["merged_from"] = merged
        try:
            os.makedirs(args["dest"], mode=0o700, exist_ok=True)
            if not args["stamp"]:
                base = reserve_name(base)
            result.update(json_path=base + ".json", markdown_path=base + ".md", markdown=markdown.splitlines(),
                          rows=rows, merged_from=merged, trigger=args.get("trigger") or {}, changed=False)
            write_atomically(base + ".json", json.dumps(document, indent=4, sort_keys=True, default=str) + "\n")
            write_atomically(base + ".md", markdown)
        except OSError as exc:
            raise AnsibleActionFail("cannot write the fleet report under %s: %s" % (args["dest"], exc)) from exc
        return result
