# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The module cleanslate.gpu.gpu_reset, all but its documentation (plugins/modules/gpu_reset.py): its
main() runs as that module, and in cleanslate.gpu.reset_steps's process as one of the reset's steps
(module_utils/_step_process.py)."""

from __future__ import annotations

import glob
import os
import re
import sys
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml
from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs
from ansible_collections.cleanslate.gpu.plugins.module_utils._procs import DEFAULT_PROTECT_NAMES, executable_name
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import InputProblem, fail_on_problems, is_unit_name
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import problem as range_problem
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import masked_command_line
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

try:
    import psutil
except ImportError:
    HAS_PSUTIL = False
    PSUTIL_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_PSUTIL = True
    PSUTIL_IMPORT_ERROR = None

DEFAULT_DEVICE_PATHS = ["/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/nvidia-uvm*", "/dev/nvidia-caps/*"]

# /dev/nvidia3 -> GPU 3; any NVIDIA device file, wherever a container mounts it.
GPU_DEVICE = re.compile(r"(?:^|/)nvidia(\d+)$")
NVIDIA_DEVICE = re.compile(r"(?:^|/)nvidia(?:\d+|ctl|-uvm[-\w]*|-modeset|-caps/.*)$")
NVIDIA_IN_MAPS = re.compile(b"/nvidia")
# GPU selectors: ASCII digits only ("\u00b2".isdigit() is true, and int() refuses it), or a UUID.
GPU_INDEX = re.compile(r"[0-9]{1,4}")
GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]+", re.IGNORECASE)

# Memory NVML shows as used on a GPU beyond what it lists for live processes that explain
# themselves. The real driver lists a process's share a few MiB below what it counts as used;
# a CUDA context takes far more than this.
UNATTRIBUTED_MIB = 256
MAX_ROUNDS = 3  # the first round of signals, then up to two for holders that appeared during it
SETTLE_SCANS = 5  # scans after a round, at most, until no process started during one is a holder (settled_planner)

D_STATE_ACTION = "reboot or GPU reset required"
OTHER_ACTION = "still alive %g s after SIGKILL: inspect it (cat /proc/%d/stack), then reboot if it stays"
REFUSED_ACTION = "not signalled: %s was refused (%s); run the module as root (become: true)"
APPEARED_ACTION = ("appeared during the reset and still holds after %d rounds of signals: find what starts it "
                   "(a supervisor or a restarting service), stop that, then run again")
ROOT_NEEDED = ("gpu_reset needs root (become: true): without it, other users' GPU holders can be neither seen (their "
               "/proc/PID/maps) nor signalled; to stop only your own user's processes instead, give your user name "
               "in the option users (the role's node_reset_gpu_reset_users)")


def compile_pattern(pattern, own):
    """(compiled regex, None) or (None, the sentence saying why the pattern is refused)."""
    try:
        compiled = re.compile(pattern)
    except (re.error, OverflowError, RecursionError, MemoryError, ValueError) as exc:
        return None, "cmdline_patterns: %r is not a valid regular expression: %s" % (pattern, str(exc) or type(exc).__name__)
    if compiled.search("") is not None:
        return None, ("cmdline_patterns: %r matches the empty string, so it matches every process; make it name the "
                      "server, such as 'vllm serve .* --port 8001'" % pattern)
    for line in own:
        found = compiled.search(line)
        if found is not None:
            return None, ("cmdline_patterns: %r matches %r in this module's own command line (%s), so it matches far "
                          "more than a server; make it name the server" % (pattern, found.group(0), printable(line)))
    return compiled, None


def own_command_lines():
    """What no pattern may match: this module's command line and its interpreter's path, as
    given and resolved (a venv's bin/python is a link to the python3.X every Python runs)."""
    lines = [" ".join(_procs.read_cmdline(os.getpid())), sys.executable, os.path.realpath(sys.executable)]
    return [line for line in lines if line]


def input_problems(params):
    """One sentence per bad option value, found before anything is read or signalled."""
    problems = [range_problem("gpu_reset", option, params[option]) for option in ("grace_period", "kill_timeout")]
    own = own_command_lines()
    problems.extend(compile_pattern(pattern, own)[1] for pattern in params["cmdline_patterns"])
    for path in params["device_paths"]:
        if not path.startswith("/") or "\0" in path:
            problems.append("device_paths: %r is not an absolute path" % path)
    for option in ("gpus", "spare_gpus"):
        for selector in params[option]:
            text = selector.strip()
            if not (GPU_INDEX.fullmatch(text) or GPU_UUID.fullmatch(text)):
                problems.append("%s: %r is neither a GPU index (0, 1, ...) nor a GPU UUID (GPU-...)" % (option, selector))
    both = sorted({s.strip().lower() for s in params["gpus"]} & {s.strip().lower() for s in params["spare_gpus"]})
    problems.extend("gpus and spare_gpus both name GPU %r: a GPU cannot be reset and spared at once" % gpu for gpu in both)
    problems.extend(unit_problem(unit) for unit in params["spare_units"])
    if params["cgroup"] is not None and not params["cgroup"].strip():
        problems.append("cgroup: %r is in every process's cgroup, so it limits nothing; leave cgroup out for no limit"
                        % params["cgroup"])
    users = params["users"]
    if users is not None:
        if not users:
            problems.append("users: an empty list matches no process; leave users out for any user")
        problems.extend("users: %r is not a user name or uid" % user for user in users if not user.strip())
    elif os.geteuid() != 0:
        problems.append(ROOT_NEEDED)
    return [problem for problem in problems if problem]


def unit_problem(unit):
    """The sentence saying why a spare_units item is no unit that holds processes, or None."""
    if is_unit_name(unit, holds_processes=True):
        return None
    return ("spare_units: %r is not a systemd unit name with the suffix of a unit that holds processes (.service, "
            ".scope, .slice), such as 'vllm-b.service'" % unit)


def device_files(globs):
    """The device files, each as the kernel shows it in fd links and maps: symbolic links
    (/dev/char/195:0, or a linked directory on the way) resolved."""
    paths = set()
    for pattern in globs:
        paths.update(os.path.realpath(path) for path in glob.glob(pattern))
    return sorted(paths)


def read_nvml():
    """(snapshot or None, 'ok' or 'unavailable: why', when the reading began in clock ticks)."""
    began = _procs.now_ticks()
    if not _nvml.HAS_PYNVML:
        return None, "unavailable: the Python library nvidia-ml-py (import pynvml) is not installed", began
    try:
        return _nvml.snapshot(), "ok", began
    except _nvml.NvmlError as exc:
        return None, "unavailable: %s" % exc, began


def select_gpus(selectors, snapshot, nvml_status, paths, option="gpus"):
    """The GPU indices that `option` names, or None for none given; InputProblem for a GPU that
    NVML or the device files say this host does not have."""
    if not selectors:
        return None
    if snapshot is not None:
        try:
            return set(_nvml.resolve_gpus(snapshot, [s.strip() for s in selectors]))
        except InputProblem as exc:
            raise InputProblem("%s: %s" % (option, exc)) from None
    valid = sorted({int(m.group(1)) for m in map(GPU_DEVICE.search, paths) if m})
    chosen = set()
    for selector in selectors:
        text = selector.strip()
        if not GPU_INDEX.fullmatch(text) or int(text) not in valid:
            raise InputProblem("%s: unknown GPU %r: the device files give GPU indices %s; UUIDs need NVML, which is %s"
                               % (option, selector, ", ".join(map(str, valid)) or "(none)", nvml_status))
        chosen.add(int(text))
    return chosen


def select_scope(params, snapshot, nvml_status, paths):
    """(GPU indices to act on or None for all, GPU indices to spare): InputProblem when one GPU
    is in both, as an index in one list and a UUID in the other."""
    selected = select_gpus(params["gpus"], snapshot, nvml_status, paths)
    spared = select_gpus(params["spare_gpus"], snapshot, nvml_status, paths, option="spare_gpus") or set()
    both = sorted(spared & (selected or set()))
    if both:
        raise InputProblem("gpus and spare_gpus both name GPU %s: a GPU cannot be reset and spared at once"
                           % ", ".join(map(str, both)))
    return selected, spared


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


class Planner:
    """Decides the targets from one pass over /proc (identity, open files, mappings and
    command line of each process read together) and the NVML reading taken before it."""

    def __init__(self, params, patterns, paths, snapshot, reading, scope):
        self.params = params
        self.patterns = patterns
        self.selected, self.spare_gpus = scope
        self.spare_units = set(params["spare_units"])
        self.protect = set(DEFAULT_PROTECT_NAMES).union(params["protect_names"])
        self.users = set(params["users"]) if params["users"] is not None else None
        self.has_nvml = snapshot is not None
        self.listed_on = nvml_processes(snapshot)
        self.used = {gpu["index"]: gpu["memory_used_mib"] for gpu in (snapshot or {}).get("gpus", [])}
        self.lost = {gpu["index"] for gpu in (snapshot or {}).get("lost", [])}
        self.reading = reading
        self.table = _procs.process_table(with_cmdline=bool(patterns), paths=paths)
        self.mapped = {pid: sorted(stat["mapped"]) for pid, stat in self.table.items() if stat["mapped"]}
        self.elsewhere = self._listed_nvidia_maps()
        self.own = set(_procs.ancestors(os.getpid()))
        self.reasons = {}
        self.why = {}  # evidence in words of the targets that map no device file
        self.protected = {}
        self.spared = {}
        self.excluded = {}
        self._gpus = {}
        self._orphaned = None

    # --- which GPUs a process uses ---------------------------------------------------------

    def believed(self, pid):
        """NVML lists this pid and it is the process NVML saw: alive, and started before the
        reading (a process that started after it took over a pid NVML still lists)."""
        stat = self.table.get(pid)
        return (pid in self.listed_on and stat is not None and stat["state"] not in _procs.EXITED
                and stat["starttime"] < self.reading)

    def _listed_nvidia_maps(self):
        """{pid: NVIDIA device files it maps} for processes NVML lists that map nothing in
        device_paths: their devices may be mounted elsewhere (a container's /dev)."""
        found = {}
        for pid in sorted(self.listed_on):
            if pid in self.mapped or not self.believed(pid):
                continue
            paths = sorted({p for p in _procs.mapped_files(pid, NVIDIA_IN_MAPS) if NVIDIA_DEVICE.search(p)})
            stat = _procs.read_stat(pid)
            if paths and stat is not None and stat["starttime"] == self.table[pid]["starttime"]:
                found[pid] = paths
        return found

    def maps(self, pid):
        return self.mapped.get(pid) or self.elsewhere.get(pid, [])

    def mapped_gpus(self, pid):
        return {int(m.group(1)) for m in map(GPU_DEVICE.search, self.maps(pid)) if m}

    def listed(self, pid):
        return set(self.listed_on[pid]) if self.believed(pid) else set()

    def orphaned(self):
        """GPUs whose memory NVML cannot attribute to a live process it lists: a listed pid
        that is gone, a zombie, started after the reading or does not map that GPU (a child
        forked after CUDA initialisation keeps its dead parent's context, and NVML keeps
        listing the parent), or "used" above the listed shares by more than UNATTRIBUTED_MIB
        (pids NVML cannot show, as in a container). A GPU NVML could not read counts too:
        there the mappings alone decide."""
        if self._orphaned is None:
            self._orphaned = set(self.lost)
            explained = {}
            for pid, per_gpu in self.listed_on.items():
                listed, maps = self.listed(pid), self.mapped_gpus(pid)
                for gpu, mib in per_gpu.items():
                    if gpu in listed and self.maps(pid) and (not maps or gpu in maps):
                        explained.setdefault(gpu, []).append(mib)
                    else:
                        self._orphaned.add(gpu)
            for gpu, used in self.used.items():
                shares = explained.get(gpu, [])
                if used is not None and None not in shares and used - sum(shares) > UNATTRIBUTED_MIB:
                    self._orphaned.add(gpu)
        return self._orphaned

    def gpus_of(self, pid):
        """The GPUs this process holds memory on, as far as the evidence tells: an empty set
        for a process that maps device files but holds no memory (CUDA initialised without a
        context, or a forked child whose parent's context lives on)."""
        if pid not in self._gpus:
            maps = self.mapped_gpus(pid)
            listed = self.listed(pid)
            if not self.has_nvml:
                gpus = maps  # mappings alone: every GPU it maps
            elif listed and not maps:
                gpus = listed if self.maps(pid) else set()  # device files without an index in their name
            elif listed & maps:
                gpus = listed & maps
            else:  # NVML does not list it where it maps: it holds only memory nobody else explains
                gpus = maps & self.orphaned()
            self._gpus[pid] = gpus
        return self._gpus[pid]

    def holds_memory(self, pid):
        """Whether the mappings (and NVML, when it answered) say this process holds GPU memory."""
        return not self.has_nvml or bool(self.gpus_of(pid))

    def evidence(self, pid):
        """One line on what makes the process a target (or a client), for the report."""
        maps = self.maps(pid)
        if not maps:
            return self.why.get(pid, "maps no NVIDIA device file")
        gpus = sorted(self.mapped_gpus(pid))
        # nvidia-uvm is mapped by a process with a CUDA context of its own, not by a forked child.
        uvm = "with" if any(path.endswith("/nvidia-uvm") for path in maps) else "without"
        words = ["maps %s, %s nvidia-uvm" % (", ".join("GPU %d" % g for g in gpus) or "NVIDIA device files", uvm)]
        listed = sorted(self.listed(pid) & (set(gpus) or self.listed(pid)))
        held = ", ".join(map(str, sorted(self.gpus_of(pid))))
        if not self.has_nvml:
            words.append("NVML unavailable, so the mappings alone decide")
        elif listed:
            words.append("NVML lists it on GPU %s" % ", ".join(map(str, listed)))
        elif held:
            words.append("NVML shows memory on GPU %s that no live process it lists accounts for" % held)
        else:
            words.append("NVML shows no memory of its own, nor any it cannot attribute, on those GPUs")
        if pid in self.why:
            words.append(self.why[pid])
        return "; ".join(words)

    # --- who may be a target -----------------------------------------------------------------

    def cmdline(self, pid):
        stat = self.table.get(pid, {})
        if "cmdline" not in stat:
            stat["cmdline"] = _procs.read_cmdline(pid)
        return stat.get("cmdline", [])

    def spare_reason(self, pid):
        """Why the process belongs to a healthy neighbour (spare_units, spare_gpus), or None."""
        units = sorted(self.spare_units.intersection(_procs.cgroup_components(_procs.read_cgroup(pid)))) if self.spare_units else []
        if units:
            return "in unit %s" % units[0]
        held = sorted(self.gpus_of(pid) & self.spare_gpus)
        if held:
            return "holds spared GPU %s" % ", ".join(map(str, held))
        return None

    def exclusion(self, pid, needs_gpu):
        """None if pid may be a target, else why not: ('protected', reason), ('spared', why) or
        ('scope', None).

        needs_gpu: the evidence is a device or NVML, so with `gpus` it must be on a selected GPU;
        other evidence only has to not be on another GPU."""
        if pid in self.excluded:
            return self.excluded[pid]
        # Only the planned table: a pid missing from it exited before it was read, and reading it now could
        # describe a newcomer that reused the pid.
        stat = self.table.get(pid)
        verdict = None
        if stat is None or stat["state"] in _procs.EXITED:
            verdict = ("scope", None)
        elif pid == 1:
            verdict = ("protected", "pid 1")
        elif _procs.is_kernel_thread(stat):
            verdict = ("protected", "kernel thread")
        elif pid in self.own:
            verdict = ("protected", "self")
        else:
            argv = self.cmdline(pid)
            names = [stat["comm"], process_name(pid), executable_name(pid)] + ([argv[0].rsplit("/", 1)[-1]] if argv else [])
            spare = self.spare_reason(pid)
            if _procs.name_is_protected(names, stat["comm"], self.protect):
                verdict = ("protected", "protect_names")
            elif spare is not None:
                verdict = ("spared", spare)
            elif self.params["cgroup"] is not None and self.params["cgroup"] not in _procs.read_cgroup(pid):
                verdict = ("scope", None)
            elif self.users is not None and not self.users.intersection(owner(pid)):
                verdict = ("scope", None)
            elif self.selected is not None:
                gpus = self.gpus_of(pid)
                if (gpus or needs_gpu) and not gpus.intersection(self.selected):
                    verdict = ("scope", None)
        if verdict is not None and verdict[0] in ("protected", "spared"):
            # Neither depends on the evidence, so each is decided once per pid.
            self.excluded[pid] = verdict
            getattr(self, verdict[0])[pid] = verdict[1]
        return verdict

    def candidates(self):
        """[(pid, reason, needs_gpu)] from the three kinds of direct evidence."""
        found = [(pid, "device", True) for pid in sorted(self.mapped) if self.holds_memory(pid)]
        found.extend((pid, "nvml", True) for pid in sorted(self.elsewhere))
        if self.patterns:
            for pid in sorted(self.table):
                # A mapper holding no memory (CUDA initialised without a context, as an API server
                # may be) is a client by its device files, and still a target of a pattern.
                if pid in self.elsewhere or (pid in self.mapped and self.holds_memory(pid)):
                    continue
                line = " ".join(self.cmdline(pid))
                matching = [p.pattern for p in self.patterns if line and p.search(line)]
                if matching:
                    found.append((pid, "cmdline", False))
                    self.why[pid] = "command line matches %r" % matching[0]
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
                if self.reasons.setdefault(pid, "child") == "child" and pid not in self.why:
                    self.why[pid] = "descends from pid %d" % self.table[pid]["ppid"]
        return self.reasons

    def clients(self):
        """Processes with device files open, mapping none or holding no memory by the
        evidence, that are not targets: GPU clients such as monitors."""
        return [{"pid": pid, "name": printable(process_name(pid) or stat["comm"]),
                 "devices": [printable(path) for path in sorted(stat["opened"])],
                 "maps": [printable(path) for path in sorted(stat["mapped"])]}
                for pid, stat in sorted(self.table.items())
                if (stat["opened"] or stat["mapped"]) and pid not in self.reasons and pid not in self.own
                and pid not in self.protected and pid not in self.spared and pid not in self.elsewhere
                and not (pid in self.mapped and self.holds_memory(pid))]


# psutil gives what /proc/PID/stat does not: the full name of a process whose comm the kernel
# cut to 15 bytes (from its argv[0]), and the owner's user name. Identity, parent and start
# time come from _procs.read_stat, the reading that pins the process.

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


def describe(planner, pid, reason, round_no):
    """The target as the user sees it, or None if it vanished (or its pid was reused) since
    the pass that found it: only the planned identity is ever signalled."""
    now = _procs.read_stat(pid)
    if now is None or now["starttime"] != planner.table[pid]["starttime"]:
        return None
    try:
        name = psutil.Process(pid).name()
    except psutil.Error:
        return None  # gone since
    names = owner(pid)
    info = {"pid": pid, "ppid": now["ppid"], "name": printable(name), "create_time": round(_procs.start_time(now), 2),
            "user": printable(names[0]) if names else ""}
    # Masked here, at the source: the result is printed whole at -vvv, and the diff and the report read it.
    info["cmdline"] = printable(masked_command_line(planner.cmdline(pid)))
    info["gpus"] = sorted(planner.gpus_of(pid))
    info["devices"] = [printable(path) for path in planner.maps(pid)]
    used = [mib for gpu, mib in planner.listed_on.get(pid, {}).items() if mib is not None and gpu in planner.listed(pid)]
    if used:
        info["gpu_memory_mib"] = sum(used)
    info["reason"] = reason
    info["evidence"] = planner.evidence(pid)
    info["round"] = round_no
    return info


def plan_targets(planner, round_no):
    """(targets as described, {pid: start time}) of one pass."""
    reasons = planner.plan()
    targets = [t for t in (describe(planner, pid, reasons[pid], round_no) for pid in sorted(reasons)) if t]
    return targets, {t["pid"]: planner.table[t["pid"]]["starttime"] for t in targets}


def holders_text(held, targets=(), spared=None):
    """The diff's text: one line per process that maps a device file, is a target or is spared; a
    target's line ends with what makes it one and its command line, so that a target found by
    cmdline_patterns (the API server, which maps no device file) shows too; a spared one's, why."""
    by_pid = {target["pid"]: target for target in targets}
    spared = spared or {}
    lines = []
    for pid in sorted(set(held) | set(by_pid) | set(spared)):
        target = by_pid.get(pid)
        name = target["name"] if target else printable(process_name(pid)) or "?"
        devices = ", ".join(printable(d) for d in held.get(pid, [])) or "no device file"
        line = "%d %s: %s" % (pid, name, devices)
        if target:
            line += " -- stop, %s (%s): %s" % (target["reason"], target.get("evidence") or "", target["cmdline"])
        elif pid in spared:
            line += " -- spared, %s" % spared[pid]
        lines.append(line.replace("\n", " ") + "\n")
    return "".join(lines)


def survivor_report(target, signals, action):
    stat = _procs.read_stat(target["pid"])
    return {"pid": target["pid"], "name": target["name"], "state": stat["state"] if stat else "?",
            "devices": target["devices"], "signalled": signals, "action": action}


def settled_planner(new_planner, paths, patterns):
    """The scan after a round of signals, taken again (up to SETTLE_SCANS in all) while a
    process that its /proc listing did not see maps a device file or matches a pattern.

    A scan lists /proc once, then reads each process. A SIGTERM handler that detaches a
    successor (fork, setsid, fork again, the middle process exits) creates it after the listing
    from a middle process that is gone by the time the scan reads it: that scan sees no holder
    and would end the task while the successor holds the GPU (18 runs of 20 in a private PID
    namespace). Such a newcomer is in a listing taken after the scan, and maps what its parent
    did; its own children would come from a process that listing shows, so one more scan finds
    them. Newcomers that hold nothing (a busy host starts processes all the time) settle it."""
    planner = new_planner(again=True)
    for _scan in range(SETTLE_SCANS - 1):
        newcomers = _procs.process_table(with_cmdline=bool(patterns), paths=paths, pids=_procs.unseen(planner.table))
        if not any(stat["mapped"] or any(p.search(" ".join(stat.get("cmdline", []))) for p in patterns)
                   for stat in newcomers.values()):
            break
        planner = new_planner(again=True)
    return planner


def stop(params, new_planner, targets, identity, result):
    """Signal targets; scan again after each round and signal the holders that appeared, up
    to MAX_ROUNDS rounds. Fills killed, survivors, targets, protected; returns the last planner."""
    handled = set()
    rounds = 0
    signalled = 0
    batch = targets
    while batch:
        rounds += 1
        outcome = _procs.terminate([(t["pid"], identity[t["pid"]]) for t in batch], params["grace_period"],
                                   params["kill_timeout"])
        signalled += outcome["signalled"]
        by_pid = {t["pid"]: t for t in batch}
        result["killed"].extend(dict(e, name=by_pid[e["pid"]]["name"]) for e in outcome["ended"])
        for pid in outcome["survivors"]:
            action = OTHER_ACTION % (params["kill_timeout"], pid)
            report = survivor_report(by_pid[pid], ["SIGTERM", "SIGKILL"], action)
            if report["state"] == "D":
                report["action"] = D_STATE_ACTION
            result["survivors"].append(report)
        for refused in outcome["refused"]:
            signals = ["SIGTERM"] if refused["signal"] == "SIGKILL" else []
            result["survivors"].append(survivor_report(by_pid[refused["pid"]], signals,
                                                       REFUSED_ACTION % (refused["signal"], refused["error"])))
        handled.update((t["pid"], identity[t["pid"]]) for t in batch)
        planner = new_planner(again=True, settled=True)  # done means no holder is left: look again
        fresh, fresh_identity = plan_targets(planner, rounds + 1)
        result["protected"].update(planner.protected)
        result["spared"].update(planner.spared)
        batch = [t for t in fresh if (t["pid"], fresh_identity[t["pid"]]) not in handled]
        identity.update((t["pid"], fresh_identity[t["pid"]]) for t in batch)
        if batch and rounds == MAX_ROUNDS:
            result["survivors"].extend(survivor_report(t, [], APPEARED_ACTION % rounds) for t in batch)
            break
        result["targets"].extend(batch)
    result["changed"] = signalled > 0
    return planner


def run(module, started):
    params = module.params
    patterns = [re.compile(pattern) for pattern in params["cmdline_patterns"]]  # checked by input_problems
    paths = device_files(params["device_paths"])
    snapshot, nvml_status, reading = read_nvml()  # NVML is shut down again: we hold no device now
    scope = select_scope(params, snapshot, nvml_status, paths)

    def new_planner(again=False, settled=False):
        """A pass over /proc; after a round of signals with a fresh NVML reading, since which
        listed pids are gone now (and whose memory someone still holds) is what it tells;
        settled: one that no process started during its pass escaped (settled_planner)."""
        if settled:
            return settled_planner(new_planner, paths, patterns)
        reading_now, began = snapshot, reading
        if again and snapshot is not None:
            fresh, _status, fresh_began = read_nvml()
            if fresh is not None:
                reading_now, began = fresh, fresh_began
        return Planner(params, patterns, paths, reading_now, began, scope)

    planner = new_planner()
    targets, identity = plan_targets(planner, 1)
    result = {
        "changed": bool(targets), "targets": list(targets), "killed": [], "survivors": [], "nvml": nvml_status,
        "memory_before": [{"index": gpu["index"], "uuid": gpu["uuid"], "memory_used_mib": gpu["memory_used_mib"]}
                          for gpu in (snapshot or {}).get("gpus", [])],
        "protected": dict(planner.protected), "spared": dict(planner.spared), "clients": planner.clients(),
    }
    before = dict(planner.mapped)
    before_text = holders_text(before, targets, result["spared"]) if module._diff else ""  # names are read while they live
    if module.check_mode or not targets:
        after = {pid: devs for pid, devs in before.items() if pid not in planner.reasons}
    else:
        after = stop(params, new_planner, targets, identity, result).mapped
    # What is left after the reset: a target that survived keeps its line.
    left = [target for target in targets if target["pid"] in {item["pid"] for item in result["survivors"]}]
    result["protected"] = [{"pid": pid, "name": printable(process_name(pid)), "reason": why}
                           for pid, why in sorted(result["protected"].items())]
    spared_after = {pid: why for pid, why in result["spared"].items() if _procs.alive(pid)}
    if module._diff:
        result["diff"] = {"before": before_text, "after": holders_text(after, left, spared_after)}
    result["spared"] = [{"pid": pid, "name": printable(process_name(pid)), "why": printable(why)}
                        for pid, why in sorted(result["spared"].items())]
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    return result


ARGUMENT_SPEC = dict(
    device_paths=dict(type="list", elements="str", default=DEFAULT_DEVICE_PATHS),
    gpus=dict(type="list", elements="str", default=[]),
    cmdline_patterns=dict(type="list", elements="str", default=[]),
    cgroup=dict(type="str"),
    users=dict(type="list", elements="str"),
    protect_names=dict(type="list", elements="str", default=DEFAULT_PROTECT_NAMES),
    spare_units=dict(type="list", elements="str", default=[]),
    spare_gpus=dict(type="list", elements="str", default=[]),
    include_children=dict(type="bool", default=True),
    grace_period=dict(type="float", default=30),
    kill_timeout=dict(type="float", default=10),
)


def main():
    started = time.monotonic()
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    if not HAS_PSUTIL:
        module.fail_json(msg=missing_required_lib("psutil"), exception=PSUTIL_IMPORT_ERROR)
    fail_on_problems(module, input_problems(module.params))
    try:
        result = run(module, started)
    except InputProblem as exc:
        fail_on_problems(module, [str(exc)])
    if result["survivors"]:
        lines = ["pid %d (%s) state %s mapping %s: %s" % (s["pid"], s["name"], s["state"], ", ".join(s["devices"]) or "no device",
                                                          s["action"]) for s in result["survivors"]]
        module.fail_json(msg="%d target(s) not stopped:\n%s" % (len(lines), "\n".join(lines)), **result)
    module.exit_json(**result)
