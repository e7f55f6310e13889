#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: evidence
short_description: Keep what explains a failed inference server on the host, before a reset signals its processes
version_added: 0.3.0
description:
  - Makes a new directory under O(path), named by the UTC time and the first unit (mode 0700, root's), and keeps in
    it, as text files, the current invocation's journal of each of O(units), the kernel log's NVIDIA Xid records,
    an NVML snapshot of every GPU, the command lines of the processes about to be signalled (those of O(units) and
    those matching O(cmdline_patterns)) and, with O(stacks), the Python stacks of each of them by C(py-spy dump).
  - Bounded in time, so that the reset that follows is never delayed by more than O(deadline) seconds; each program
    run (C(journalctl), C(py-spy)) by O(item_timeout). What did not fit is one line in C(summary.json), never a
    failure. Bounded in size, each file cut at O(file_max) bytes and the whole directory at O(dir_max).
  - Everything kept is untrusted text (the engine's own words), never run or templated, each byte that is not UTF-8
    written as C(\\xNN), and masked, every secret a kept process's command line carries (C(--api-key K),
    C(HF_TOKEN=K), a bearer token, a URL's password) and every value of O(secrets), in each form a program prints
    it, replaced by C(********).
  - C(py-spy) runs as root, so it must be root's, O(py_spy), its real file and the directories of both owned by root
    and writable by no one else. Otherwise, or when it is missing, no stack is kept and C(summary.json) says why in
    one sentence.
  - Nothing is signalled or changed on the host but the new directory. A base directory that is not safe to write
    in (another user could steer it) keeps nothing and says why in a warning; the task does not fail.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    support: full
    details: Nothing is collected or made; RV(would_keep) names the files a run would keep.
  diff_mode:
    support: none
options:
  path:
    description: The base directory; each run makes a directory of its own in it. Missing levels are made, root's, 0700.
    type: path
    default: /var/lib/cleanslate-gpu/evidence
  units:
    description: The systemd units about to be stopped; the journal of each one's current invocation is kept, and
      its processes are those whose stacks are dumped.
    type: list
    elements: str
    default: []
  cmdline_patterns:
    description: Regular expressions (Python C(re.search)) on a process's command line, joined by spaces; the
      matching processes count as about to be signalled, as those of M(cleanslate.gpu.gpu_reset)'s option of that
      name.
    type: list
    elements: str
    default: []
  protect_names:
    description: Process names never taken for the failed server's, in addition to M(cleanslate.gpu.gpu_reset)'s
      default list, as that module's option of that name (a GPU monitor a pattern also matches is not signalled, so
      not kept).
    type: list
    elements: str
    default: []
  spare_units:
    description: The units of healthy neighbours, as M(cleanslate.gpu.gpu_reset)'s option of that name; their processes
      are never kept, even when a pattern matches them.
    type: list
    elements: str
    default: []
  stacks:
    description: Dump the Python stacks of every kept process with C(py-spy dump) (for a hung server).
    type: bool
    default: false
  py_spy:
    description: The C(py-spy) program, root's (see the description).
    type: path
    default: /usr/local/bin/py-spy
  journal_lines:
    description: The newest lines kept of each unit's journal.
    type: int
    default: 2000
  xid_log_path:
    description: A file of kernel log lines read instead of C(journalctl -k) or C(dmesg), as M(cleanslate.gpu.nvml_verify)
      reads it.
    type: path
  item_timeout:
    description: Seconds each program run may take.
    type: float
    default: 3
  deadline:
    description: Seconds the whole collection may take; what is left when it is reached is not kept.
    type: float
    default: 8
  file_max:
    description: Bytes kept of each file.
    type: int
    default: 1048576
  dir_max:
    description: Bytes kept in the run's directory.
    type: int
    default: 8388608
  secrets:
    description: Values masked wherever they appear, in addition to those the processes' command lines carry.
    type: list
    elements: str
    default: []
notes:
  - Runs as root (C(become)); C(journalctl) and C(py-spy) are found on the task's C(PATH) and at O(py_spy).
seealso:
  - module: cleanslate.gpu.gpu_reset
  - module: cleanslate.gpu.nvml_verify
"""

EXAMPLES = r"""
- name: Keep the journal, the Xid records, the GPUs and the stacks of a hung server before it is stopped
  cleanslate.gpu.evidence:
    units: [vllm.service]
    stacks: true
  register: kept

- name: Say where they are
  ansible.builtin.debug:
    msg: "evidence kept in {{ kept.directory }}"
"""

RETURN = r"""
directory:
  description: The run's directory; null in check mode, when nothing could be kept, or when no process is about to be
    signalled (a clean host keeps nothing).
  returned: always
  type: str
  sample: /var/lib/cleanslate-gpu/evidence/20260105T100000Z-vllm.service
files:
  description: Each file kept, its C(name), C(bytes) and whether it was C(cut) at a bound.
  returned: always
  type: list
  elements: dict
  sample: [{name: journal-vllm.service.txt, bytes: 20480, cut: false}]
notes:
  description: What was not kept and why, one sentence each (a missing py-spy, a program stopped at its time limit).
  returned: always
  type: list
  elements: str
  sample: ["py-spy is not installed at /usr/local/bin/py-spy: no stack was kept"]
would_keep:
  description: In check mode, the files a run would keep.
  returned: in check mode
  type: list
  elements: str
  sample: [journal-vllm.service.txt, xid.txt, nvml.json, processes.txt, stack-4242.txt, summary.json]
pids:
  description: The processes whose command lines (and with O(stacks), stacks) were kept.
  returned: always
  type: list
  elements: int
  sample: [4242, 4250]
elapsed_s:
  description: Seconds the collection took.
  returned: always
  type: float
  sample: 1.2
"""

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


if __name__ == "__main__":
    main()
