# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The module cleanslate.gpu.evidence, all but its documentation (plugins/modules/evidence.py): its
main() runs as that module, and in cleanslate.gpu.reset_steps's process as one of the reset's steps
(module_utils/_step_process.py)."""

from __future__ import annotations

import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs, _xid
from ansible_collections.cleanslate.gpu.plugins.module_utils._evidence import Kept, run_label
from ansible_collections.cleanslate.gpu.plugins.module_utils._nvml import HAS_PYNVML, NvmlError, snapshot
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker, argument_secrets, masked_command_line
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import trusted_directory_problem, trusted_program_problem

INVOCATION_ID = re.compile(r"^[0-9a-f]{32}$")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")

ARGUMENT_SPEC = dict(
    path=dict(type="path", default="/var/lib/cleanslate-gpu/evidence"),
    units=dict(type="list", elements="str", default=[]),
    cmdline_patterns=dict(type="list", elements="str", default=[]),
    protect_names=dict(type="list", elements="str", default=[]),
    spare_units=dict(type="list", elements="str", default=[]),
    stacks=dict(type="bool", default=False),
    py_spy=dict(type="path", default="/usr/local/bin/py-spy"),
    journal_lines=dict(type="int", default=2000),
    xid_log_path=dict(type="path"),
    item_timeout=dict(type="float", default=3.0),
    deadline=dict(type="float", default=8.0),
    file_max=dict(type="int", default=1048576),
    dir_max=dict(type="int", default=8388608),
    secrets=dict(type="list", elements="str", default=[], no_log=True),
)


def input_problems(params):
    """One sentence per bad option."""
    problems = []
    for unit in params["units"]:
        if not UNIT_NAME.match(unit):
            problems.append("units: %r is not a systemd unit name (letters, digits and :_.@\\-)" % unit)
    for pattern in params["cmdline_patterns"]:
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append("cmdline_patterns: %r is not a regular expression (%s)" % (pattern, exc))
    for name, low, high in (("journal_lines", 1, 1000000), ("file_max", 1024, 1 << 30), ("dir_max", 1024, 1 << 32)):
        if not low <= params[name] <= high:
            problems.append("%s must be from %d to %d, got %d" % (name, low, high, params[name]))
    for name, high in (("item_timeout", 600), ("deadline", 3600)):
        if not 0 < params[name] <= high:
            problems.append("%s must be more than 0 and at most %d seconds, got %g" % (name, high, params[name]))
    if not os.path.isabs(params["path"]):
        problems.append("path must be an absolute directory path, got %r" % params["path"])
    return problems


def unit_control(kept, unit):
    """(invocation id, control group) of a unit, from systemctl show; ('', '') when it has none."""
    out, problem = kept.run(["systemctl", "show", "--property=InvocationID,ControlGroup", "--", unit],
                            "systemctl show %s" % unit)
    if problem:
        kept.note(problem)
    state = dict(line.split("=", 1) for line in (out or b"").decode("utf-8", "replace").splitlines() if "=" in line)
    invocation = state.get("InvocationID", "")
    return (invocation if INVOCATION_ID.match(invocation) else ""), state.get("ControlGroup", "")


def targets(params, groups):
    """{pid: argv} of the processes about to be signalled: in a unit's control group, or matching a
    pattern, and neither protected nor in a unit of spare_units (a neighbour that keeps serving):
    gpu_reset's rules, which never signal those."""
    patterns = [re.compile(pattern) for pattern in params["cmdline_patterns"]]
    spared = set(params["spare_units"])
    protect = set(_procs.DEFAULT_PROTECT_NAMES).union(params["protect_names"])
    found, mine = {}, set(_procs.ancestors(os.getpid()))
    for pid, info in _procs.process_table(with_cmdline=True).items():
        if pid in mine or _procs.is_kernel_thread(info) or not info["cmdline"]:
            continue
        names = [info["comm"], _procs.executable_name(pid), info["cmdline"][0].rsplit("/", 1)[-1]]
        if _procs.name_is_protected(names, info["comm"], protect):
            continue
        text = _procs.read_cgroup(pid)
        if spared & _procs.cgroup_components(text):
            continue
        cgroups = {_procs.kernel_path(line.split(":", 2)[-1]) for line in text.splitlines()}
        in_unit = any(group and (path == group or path.startswith(group + "/")) for group in groups for path in cgroups)
        if in_unit or any(pattern.search(" ".join(info["cmdline"])) for pattern in patterns):
            found[pid] = info["cmdline"]
    return found


def keep_journals(kept, params, invocations):
    for unit, invocation in invocations.items():
        argv = ["journalctl", "--no-pager", "-o", "short-iso", "--lines", str(params["journal_lines"])]
        # Lines of earlier runs would mislead: the whole unit only when it has no invocation.
        argv += ["_SYSTEMD_INVOCATION_ID=" + invocation, "+", "INVOCATION_ID=" + invocation] if invocation \
            else ["--unit", unit]
        out, problem = kept.run(argv, "journalctl for %s" % unit)
        if problem:
            kept.note(problem)
        if out is not None:
            kept.write("journal-%s.txt" % unit, out)


def keep_xid(kept, params):
    log, source, problem = _xid.read_kernel_log("", kept.left(), params["xid_log_path"])
    if problem:
        kept.note(problem)
    records = _xid.parse(log)
    lines = ["%s %s (%s): %s\n" % (record["code"], record["class"], record["meaning"], record["line"]) for record in records]
    kept.write("xid.txt", "".join(lines) or "no Xid record in the kernel log (%s)\n" % (source or "not read"))


def keep_nvml(kept):
    if not HAS_PYNVML:
        kept.note("nvidia-ml-py is not installed: no NVML snapshot was kept")
        return
    try:
        snap = snapshot(call_timeout=max(0.5, kept.left()))
    except NvmlError as exc:
        kept.note("NVML could not be read: %s" % exc)
        return
    kept.write("nvml.json", json.dumps(snap, indent=1, sort_keys=True, default=str) + "\n")


def keep_stacks(kept, params, found):
    refused = trusted_program_problem(params["py_spy"])
    if refused and not os.path.lexists(params["py_spy"]):
        kept.note("py-spy is not installed at %s: no stack was kept (the host's deps install it when asked)"
                  % params["py_spy"])
        return
    if refused:
        kept.note("py-spy at %s is refused, root runs only a program no one else can change: %s; no stack was kept"
                  % (params["py_spy"], refused))
        return
    for pid in sorted(found):
        # Without pausing it: py-spy cannot pause a stopped process (SIGSTOP, a frozen cgroup, a
        # debugger) to read its threads, and a hung server's state is read, never changed.
        out, problem = kept.run([params["py_spy"], "dump", "--nonblocking", "--pid", str(pid)], "py-spy dump of pid %d" % pid)
        if problem:
            kept.note(problem)
        if out is not None:
            kept.write("stack-%d.txt" % pid, out)


def collect(module, params):
    started = time.monotonic()
    result = {"changed": False, "directory": None, "files": [], "notes": [], "pids": []}
    if module.check_mode:
        found = targets(params, [])
        result.update(pids=sorted(found), would_keep=["journal-%s.txt" % unit for unit in params["units"]]
                      + ["xid.txt", "nvml.json", "processes.txt"]
                      + (["stack-%d.txt" % pid for pid in sorted(found)] if params["stacks"] else []) + ["summary.json"])
        return result
    problem = trusted_directory_problem(params["path"], missing_ok=True)
    if problem:
        result["notes"] = ["nothing was kept: %s" % problem]
        module.warn(result["notes"][0])
        return result
    # The secrets are those of every process kept: known before anything is written.
    provisional = Kept(params["path"], run_label(params["units"], time.time()), lambda text: text,
                       params["file_max"], params["dir_max"], params["item_timeout"], params["deadline"])
    invocations, groups = {}, []
    for unit in params["units"]:
        invocations[unit], group = unit_control(provisional, unit)
        groups.append(group)
    found = targets(params, groups)
    if not found:
        # Nothing is about to be signalled (a clean host): there is nothing to explain, so no directory.
        os.rmdir(provisional.path)
        result["notes"] = ["no process is about to be signalled: nothing was kept"]
        return result
    kept = provisional
    kept.mask = Masker(list(params["secrets"]) + [secret for argv in found.values() for secret in argument_secrets(argv)])
    kept.notes = [kept.mask(note) for note in kept.notes]
    kept.write("processes.txt", "".join("%d %s\n" % (pid, masked_command_line(argv)) for pid, argv in sorted(found.items())))
    keep_journals(kept, params, invocations)
    keep_xid(kept, params)
    keep_nvml(kept)
    if params["stacks"]:
        keep_stacks(kept, params, found)
    elapsed = round(time.monotonic() - started, 3)
    kept.summary({"units": params["units"], "pids": sorted(found), "elapsed_s": elapsed})
    result.update(changed=True, directory=kept.path, files=kept.files, notes=kept.notes, pids=sorted(found),
                  elapsed_s=elapsed)
    return result


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    problems = input_problems(module.params)
    if problems:
        module.fail_json(msg="; ".join(problems), changed=False)
    started = time.monotonic()
    try:
        result = collect(module, module.params)
    except OSError as exc:
        module.fail_json(msg="the evidence could not be kept in %s: %s" % (module.params["path"], exc.strerror or exc),
                         changed=False)
    result.setdefault("elapsed_s", round(time.monotonic() - started, 3))
    module.exit_json(**result)
