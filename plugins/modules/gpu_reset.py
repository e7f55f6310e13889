#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_reset
short_description: Stop exactly the processes that hold the NVIDIA GPUs
version_added: 0.1.0
description:
  - Finds every process that holds an NVIDIA device file (read with C(readlink) on C(/proc/PID/fd) and C(/proc/PID/maps),
    never C(stat), so a stuck network mount cannot hang the scan), every process NVML lists on the selected GPUs once it
    is confirmed to hold a device, every process whose command line matches O(cmdline_patterns) and, with
    O(include_children), every descendant of those.
  - Sends C(SIGTERM) to all of them at once, waits up to O(grace_period) seconds, sends C(SIGKILL) to what remains and
    waits up to O(kill_timeout) seconds. A zombie holds no GPU memory and counts as gone.
  - Never a target are PID 1, kernel threads, the module itself and its ancestors, and processes named in
    O(protect_names). These exclusions apply before children are followed, so a process never becomes a target only
    because an excluded parent holds a device.
  - Fails, with one line per process, when a target is still alive after C(SIGKILL); a process in uninterruptible
    sleep (state C(D)) needs a reboot or a GPU reset. The module never resets a GPU, changes persistence mode or
    unloads a driver.
  - Without an NVIDIA driver or without the C(pynvml) library it works from the device files alone and says so in
    RV(nvml).
author:
  - cleanslate.gpu maintainers (@cleanslate)
requirements:
  - psutil
  - nvidia-ml-py (optional; without it NVML hints are skipped)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: RV(targets) lists what would be signalled; nothing is signalled.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: The holders of the device files before and after.
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
notes:
  - Linux only (it reads C(/proc)).
  - C(/dev/nvidiaN) is mapped to GPU index N, which is also the NVML index on hosts where the device minor numbers follow
    PCI order, as the NVIDIA driver assigns them by default.
  - A process matched by O(cmdline_patterns) that holds no GPU device is a target even when O(gpus) is given, since no
    GPU is known for it; make the pattern specific to the server that runs on those GPUs.
options:
  device_paths:
    description:
      - Glob patterns of the device files whose holders are targets.
      - A pattern that matches nothing is not an error.
    type: list
    elements: str
    default: ['/dev/nvidia[0-9]*', '/dev/nvidiactl', '/dev/nvidia-uvm*', '/dev/nvidia-caps/*']
  gpus:
    description:
      - Only stop holders of these GPUs, given as indices or UUIDs (UUIDs need NVML).
      - A holder of C(/dev/nvidiaN) for a GPU not listed here, and not listed by NVML on a selected GPU, is spared.
        A process that holds only shared files such as C(/dev/nvidiactl) has no known GPU and is spared too.
      - Empty means every GPU.
    type: list
    elements: str
    default: []
  cmdline_patterns:
    description:
      - Regular expressions searched in the full command line (arguments joined by spaces).
      - Matching processes are targets even if they hold no device, for example an API server whose workers died.
    type: list
    elements: str
    default: []
  cgroup:
    description:
      - Only stop processes whose C(/proc/PID/cgroup) contains this text, for example C(/lxc/129/) for the processes of
        Proxmox container 129 seen from the Proxmox node.
    type: str
  users:
    description:
      - Only stop processes owned by these users (names or numeric uids).
    type: list
    elements: str
  protect_names:
    description:
      - Process names that are never stopped. Holders with these names are reported in RV(protected).
      - A name is compared with the kernel's C(comm), the executable's base name and C(argv[0])'s base name.
    type: list
    elements: str
    default:
      - nvidia-persistenced
      - nv-hostengine
      - dcgm-exporter
      - nv-fabricmanager
      - nvlsm
      - nvidia-cuda-mps-control
      - nvidia-cuda-mps-server
      - Xorg
      - Xwayland
  include_children:
    description:
      - Also stop every descendant of a target (forked workers that may not have opened a device yet).
    type: bool
    default: true
  grace_period:
    description:
      - Seconds between C(SIGTERM) and C(SIGKILL). C(0) sends C(SIGKILL) right after C(SIGTERM).
    type: float
    default: 30
  kill_timeout:
    description:
      - Seconds to wait for the processes to go after C(SIGKILL) before failing.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: Stop every process that holds a GPU
  cleanslate.gpu.gpu_reset:
  register: gpu_reset_result

- name: Stop the holders of GPUs 2 and 3 and the API server whose workers died, giving them 10 seconds
  cleanslate.gpu.gpu_reset:
    gpus: [2, 3]
    cmdline_patterns:
      - 'vllm serve .* --port 8001'
    grace_period: 10

- name: Show what would be stopped, without stopping anything
  cleanslate.gpu.gpu_reset:
  check_mode: true
  diff: true

# A play over Proxmox LXC containers: processes of a container are visible, and can be
# signalled, from the Proxmox node; the container itself may not see the device holders of
# its own GPUs (or may lack psutil). Run the module on the node, scoped to the container.
- name: Stop the GPU holders of this container from its Proxmox node
  cleanslate.gpu.gpu_reset:
    cgroup: "/lxc/{{ proxmox_vmid }}/"
    grace_period: 15
  delegate_to: "{{ proxmox_node }}"
"""

RETURN = r"""
targets:
  description:
    - The processes found to be stopped (in check mode, those that would be signalled), sorted by pid.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 4242
    ppid:
      description: Parent process id.
      type: int
      sample: 4100
    user:
      description: Owner's user name, or the numeric uid when it has no name.
      type: str
      sample: vllm
    name:
      description: Process name.
      type: str
      sample: VLLM::EngineCor
    cmdline:
      description: Command line, arguments joined by spaces.
      type: str
      sample: python3 -m vllm.entrypoints.openai.api_server --model m
    create_time:
      description: Start time, seconds since the epoch.
      type: float
      sample: 1732870000.12
    gpus:
      description: GPU indices it was found to use.
      type: list
      elements: int
      sample: [0]
    devices:
      description: Device files it holds.
      type: list
      elements: str
      sample: [/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm]
    gpu_memory_mib:
      description: GPU memory NVML attributes to it, in MiB, when NVML lists it.
      type: int
      returned: when known
      sample: 70112
    reason:
      description:
        - Why it is a target. V(device) holds a device file, V(nvml) is listed by NVML and holds an NVIDIA device file
          outside O(device_paths), V(cmdline) matches O(cmdline_patterns), V(child) descends from a target.
      type: str
      sample: device
killed:
  description: Processes that were signalled and are gone (exited or zombie).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 4242
    name:
      description: Process name.
      type: str
      sample: python3
    signal:
      description: The signal after which it went, V(SIGTERM) or V(SIGKILL).
      type: str
      sample: SIGTERM
    seconds:
      description: Seconds from the first C(SIGTERM) until it was gone.
      type: float
      sample: 0.012
survivors:
  description: Targets still alive after O(kill_timeout); any makes the task fail.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 4242
    name:
      description: Process name.
      type: str
      sample: python3
    state:
      description: Kernel state letter from C(/proc/PID/stat), such as C(D) for uninterruptible sleep.
      type: str
      sample: D
    devices:
      description: Device files it holds.
      type: list
      elements: str
      sample: [/dev/nvidia0]
    action:
      description: What to do about it.
      type: str
      sample: reboot or GPU reset required
protected:
  description: Processes that hold a device, match a pattern or descend from a target, but are never stopped.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 1500
    name:
      description: Process name.
      type: str
      sample: nvidia-persistenced
    reason:
      description: V(protect_names), V(self) (this module or one of its ancestors), V(pid 1) or V(kernel thread).
      type: str
      sample: protect_names
memory_before:
  description:
    - NVML's memory use of every GPU before anything was signalled (v2 "used", without driver-reserved memory), from
      the same NVML reading that gave the hints; empty when NVML is unavailable.
    - With RV(cleanslate.gpu.nvml_verify#module:gpus) after the reset it gives the MiB freed per GPU, without opening
      NVML once more.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: GPU index.
      type: int
      sample: 0
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-5f0c8a1e-0000-4000-8000-000000000000
    memory_used_mib:
      description: MiB used.
      type: int
      sample: 70000
  sample: [{"index": 0, "uuid": "GPU-5f0c8a1e-0000-4000-8000-000000000000", "memory_used_mib": 70000}]
nvml:
  description: V(ok) when NVML hints were used, else V(unavailable) with the reason.
  returned: always
  type: str
  sample: "unavailable: libnvidia-ml not found"
elapsed_s:
  description: Seconds the module took.
  returned: always
  type: float
  sample: 0.21
"""

import glob
import os
import re
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml
from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs

try:
    import psutil
except ImportError:
    HAS_PSUTIL = False
    PSUTIL_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_PSUTIL = True
    PSUTIL_IMPORT_ERROR = None

DEFAULT_DEVICE_PATHS = ["/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/nvidia-uvm*", "/dev/nvidia-caps/*"]
DEFAULT_PROTECT_NAMES = ["nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nv-fabricmanager", "nvlsm",
                         "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "Xorg", "Xwayland"]

# /dev/nvidia3 -> GPU 3; any NVIDIA device file, wherever a container mounts it.
GPU_DEVICE = re.compile(r"(?:^|/)nvidia(\d+)$")
NVIDIA_DEVICE = re.compile(r"(?:^|/)nvidia(?:\d+|ctl|-uvm[-\w]*|-modeset|-caps/.*)$")

D_STATE_ACTION = "reboot or GPU reset required"
OTHER_ACTION = "still alive %g s after SIGKILL: inspect it (cat /proc/%d/stack), then reboot if it stays"


class BadInput(Exception):
    """An option value we refuse, worded for the user."""


def check_params(params):
    """Every bad value, found before anything is read or signalled."""
    for option in ("grace_period", "kill_timeout"):
        if params[option] < 0:
            raise BadInput("%s must be zero or more seconds, got %s" % (option, params[option]))
    patterns = []
    for pattern in params["cmdline_patterns"]:
        try:
            patterns.append(re.compile(pattern))
        except re.error as exc:
            raise BadInput("cmdline_patterns: %r is not a valid regular expression: %s" % (pattern, exc))
    for path in params["device_paths"]:
        if not path.startswith("/"):
            raise BadInput("device_paths: %r is not an absolute path" % path)
    return patterns


def expand(globs):
    paths = set()
    for pattern in globs:
        paths.update(glob.glob(pattern))
    return sorted(paths)


def read_nvml():
    """(snapshot or None, 'ok' or 'unavailable: why')."""
    if not _nvml.HAS_PYNVML:
        return None, "unavailable: the Python library nvidia-ml-py (import pynvml) is not installed"
    try:
        return _nvml.snapshot(), "ok"
    except _nvml.NvmlError as exc:
        return None, "unavailable: %s" % exc


def select_gpus(selectors, snapshot, nvml_status, paths):
    """The GPU indices to act on, or None for all."""
    if not selectors:
        return None
    if snapshot is not None:
        try:
            return set(_nvml.resolve_gpus(snapshot, selectors))
        except ValueError as exc:
            raise BadInput("gpus: %s" % exc)
    valid = sorted(set(int(m.group(1)) for m in map(GPU_DEVICE.search, paths) if m))
    chosen = set()
    for selector in selectors:
        text = str(selector).strip()
        if not text.isdigit() or int(text) not in valid:
            raise BadInput("gpus: unknown GPU %r: the device files give GPU indices %s; UUIDs need NVML, which is %s"
                           % (selector, ", ".join(map(str, valid)) or "(none)", nvml_status))
        chosen.add(int(text))
    return chosen


def nvml_processes(snapshot):
    """{pid: {gpu index: MiB or None}} as NVML reports them."""
    found = {}
    for gpu in (snapshot or {}).get("gpus", []):
        for proc in gpu["processes"]:
            per_gpu = found.setdefault(proc["pid"], {})
            used = proc["used_mib"]
            if per_gpu.get(gpu["index"]) is None or (used or 0) > per_gpu[gpu["index"]]:
                per_gpu[gpu["index"]] = used
    return found


class Planner(object):
    """Decides the targets from one scan of the device holders and one process table."""

    def __init__(self, params, patterns, paths, snapshot, selected):
        self.params = params
        self.patterns = patterns
        self.selected = selected
        self.protect = set(params["protect_names"])
        self.users = set(params["users"]) if params["users"] is not None else None
        self.held = dict((pid, sorted(devs)) for pid, devs in _procs.scan(paths).items())
        self.nvml = nvml_processes(snapshot)
        self.table = _procs.process_table(with_cmdline=bool(patterns))
        self.own = set(_procs.ancestors(os.getpid()))
        self.reasons = {}
        self.protected = {}
        self.excluded = {}

    def gpus_of(self, pid):
        gpus = set(int(m.group(1)) for m in map(GPU_DEVICE.search, self.held.get(pid, ())) if m)
        gpus.update(self.nvml.get(pid, {}))
        return gpus

    def cmdline(self, pid):
        stat = self.table.get(pid, {})
        if "cmdline" not in stat:
            stat["cmdline"] = _procs.read_cmdline(pid)
        return stat.get("cmdline", [])

    def exclusion(self, pid, needs_gpu):
        """None if pid may be a target, else why not: ('protected', reason) or ('scope', None).

        needs_gpu: the evidence is a device or NVML, so with `gpus` it must be on a selected GPU;
        other evidence only has to not be on another GPU."""
        if pid in self.excluded:
            return self.excluded[pid]
        # Only the planned table: a pid missing from it exited before it was read, and reading it now could
        # describe a newcomer that reused the pid.
        stat = self.table.get(pid)
        verdict = None
        if stat is None or stat["state"] in ("Z", "X"):
            verdict = ("scope", None)
        elif pid == 1:
            verdict = ("protected", "pid 1")
        elif _procs.is_kernel_thread(stat):
            verdict = ("protected", "kernel thread")
        elif pid in self.own:
            verdict = ("protected", "self")
        else:
            argv = self.cmdline(pid)
            names = [stat["comm"], process_name(pid)] + ([argv[0].rsplit("/", 1)[-1]] if argv else [])
            if _procs.name_is_protected(names, stat["comm"], self.protect):
                verdict = ("protected", "protect_names")
            elif self.params["cgroup"] is not None and self.params["cgroup"] not in _procs.read_cgroup(pid):
                verdict = ("scope", None)
            elif self.users is not None and not self.users.intersection(owner(pid)):
                verdict = ("scope", None)
            elif self.selected is not None:
                gpus = self.gpus_of(pid)
                if (gpus or needs_gpu) and not gpus.intersection(self.selected):
                    verdict = ("scope", None)
        if verdict is not None and verdict[0] == "protected":
            # Protection does not depend on the evidence, so it is decided once per pid.
            self.excluded[pid] = verdict
            self.protected[pid] = verdict[1]
        return verdict

    def holds_nvidia_device(self, pid):
        return [t for t in _procs.fd_targets(pid) if NVIDIA_DEVICE.search(_procs.kernel_path(t))]

    def candidates(self):
        """[(pid, reason, needs_gpu)] from the three kinds of direct evidence."""
        found = [(pid, "device", True) for pid in sorted(self.held)]
        for pid in sorted(self.nvml):
            if pid in self.held or pid not in self.table:
                continue
            # A hint only: NVML may list a dead parent (its pid now someone else's) while a
            # forked child holds the memory. Accept it only if it holds an NVIDIA device.
            devices = self.holds_nvidia_device(pid)
            if devices:
                self.held[pid] = sorted(set(_procs.kernel_path(d) for d in devices))
                found.append((pid, "nvml", True))
        if self.patterns:
            for pid in sorted(self.table):
                if pid in self.held:
                    continue
                line = " ".join(self.cmdline(pid))
                if line and any(p.search(line) for p in self.patterns):
                    found.append((pid, "cmdline", False))
        return found

    def plan(self):
        """{pid: reason} of every target."""
        for pid, reason, needs_gpu in self.candidates():
            if self.exclusion(pid, needs_gpu) is None:
                self.reasons[pid] = reason
        if self.params["include_children"]:
            index = _procs.children_index(self.table)
            roots = sorted(self.reasons)
            for pid in _procs.descendants(roots, index, lambda p: self.exclusion(p, False) is not None):
                self.reasons.setdefault(pid, "child")
        return self.reasons


def process_name(pid):
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


def owner(pid):
    """[user name, uid] of the process's real uid ([] if it vanished)."""
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
    except psutil.Error:
        return []
    try:
        return [proc.username(), str(uid)]
    except (psutil.Error, KeyError):
        return [str(uid)]


def describe(planner, pid, reason):
    """The target as the user sees it, or None if it vanished meanwhile."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            info = {"pid": pid, "ppid": proc.ppid(), "name": proc.name(), "create_time": round(proc.create_time(), 2)}
            names = owner(pid)
            info["user"] = names[0] if names else ""
    except psutil.Error:
        return None
    info["cmdline"] = " ".join(planner.cmdline(pid))
    info["gpus"] = sorted(planner.gpus_of(pid))
    info["devices"] = planner.held.get(pid, [])
    used = [mib for mib in planner.nvml.get(pid, {}).values() if mib is not None]
    if used:
        info["gpu_memory_mib"] = sum(used)
    info["reason"] = reason
    return info


def holders_text(held):
    return "".join("%d %s: %s\n" % (pid, process_name(pid) or "?", ", ".join(devs)) for pid, devs in sorted(held.items()))


def survivor_report(pid, name, devices, kill_timeout):
    stat = _procs.read_stat(pid)
    state = stat["state"] if stat else "?"
    action = D_STATE_ACTION if state == "D" else OTHER_ACTION % (kill_timeout, pid)
    return {"pid": pid, "name": name, "state": state, "devices": devices, "action": action}


def run(module, started):
    params = module.params
    patterns = check_params(params)
    paths = expand(params["device_paths"])
    snapshot, nvml_status = read_nvml()  # NVML is shut down again: we hold no device now
    selected = select_gpus(params["gpus"], snapshot, nvml_status, paths)
    planner = Planner(params, patterns, paths, snapshot, selected)
    reasons = planner.plan()
    # Each target keeps the identity (start time) it had when planned: a pid that was reused since then
    # belongs to another process, which is dropped here and never signalled.
    stat_of = {}
    for pid in reasons:
        now = _procs.read_stat(pid)
        if now is not None and now["starttime"] == planner.table[pid]["starttime"]:
            stat_of[pid] = now
    targets = [t for t in (describe(planner, pid, reasons[pid]) for pid in sorted(reasons) if pid in stat_of) if t]
    result = {
        "changed": bool(targets), "targets": targets, "killed": [], "survivors": [], "nvml": nvml_status,
        "memory_before": [{"index": gpu["index"], "uuid": gpu["uuid"], "memory_used_mib": gpu["memory_used_mib"]}
                          for gpu in (snapshot or {}).get("gpus", [])],
        "protected": [{"pid": pid, "name": process_name(pid), "reason": why} for pid, why in sorted(planner.protected.items())],
    }
    before = dict(planner.held)
    before_text = holders_text(before) if module._diff else ""  # names are read while they live
    if module.check_mode or not targets:
        after = dict((pid, devs) for pid, devs in before.items() if pid not in reasons)
    else:
        ended, left, signalled = _procs.terminate(
            [(t["pid"], stat_of[t["pid"]]["starttime"]) for t in targets], params["grace_period"], params["kill_timeout"])
        names = dict((t["pid"], t["name"]) for t in targets)
        result["changed"] = signalled > 0
        result["killed"] = [dict(e, name=names[e["pid"]]) for e in ended]
        result["survivors"] = [survivor_report(pid, names[pid], planner.held.get(pid, []), params["kill_timeout"]) for pid in left]
        after = dict((pid, sorted(devs)) for pid, devs in _procs.scan(paths).items()) if module._diff else {}
    if module._diff:
        result["diff"] = {"before": before_text, "after": holders_text(after)}
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    return result


def main():
    started = time.monotonic()
    module = AnsibleModule(
        argument_spec=dict(
            device_paths=dict(type="list", elements="str", default=DEFAULT_DEVICE_PATHS),
            gpus=dict(type="list", elements="str", default=[]),
            cmdline_patterns=dict(type="list", elements="str", default=[]),
            cgroup=dict(type="str"),
            users=dict(type="list", elements="str"),
            protect_names=dict(type="list", elements="str", default=DEFAULT_PROTECT_NAMES),
            include_children=dict(type="bool", default=True),
            grace_period=dict(type="float", default=30),
            kill_timeout=dict(type="float", default=10),
        ),
        supports_check_mode=True,
    )
    if not HAS_PSUTIL:
        module.fail_json(msg=missing_required_lib("psutil"), exception=PSUTIL_IMPORT_ERROR)
    try:
        result = run(module, started)
    except BadInput as exc:
        module.fail_json(msg=str(exc))
    if result["survivors"]:
        lines = ["pid %d (%s) state %s holding %s: %s" % (s["pid"], s["name"], s["state"], ", ".join(s["devices"]) or "no device",
                                                          s["action"]) for s in result["survivors"]]
        module.fail_json(msg="%d process(es) survived SIGKILL:\n%s" % (len(lines), "\n".join(lines)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
