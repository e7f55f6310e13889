# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The module cleanslate.gpu.nvml_verify, all but its documentation (plugins/modules/nvml_verify.py): its
main() runs as that module, and in cleanslate.gpu.reset_steps's process as one of the reset's steps
(module_utils/_step_process.py)."""

from __future__ import annotations

import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.cleanslate.gpu.plugins.module_utils import _xid
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import InputProblem, fail_on_problems
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import problem as range_problem
from ansible_collections.cleanslate.gpu.plugins.module_utils._nvml import (
    HAS_PYNVML,
    PYNVML_IMPORT_ERROR,
    SELECTOR_FORMS,
    NvmlError,
    NvmlSession,
    NvmlTimeout,
    Sink,
    describe_gpu,
    parse_selector,
    unattributed_mib,
)

CHECKS = ["memory", "processes", "count", "ecc", "remapped_rows", "retired_pages", "xid"]

ARGUMENT_SPEC = dict(
    gpus=dict(type="list", elements="str", default=[]),
    expected_count=dict(type="int"),
    max_memory_used_mib=dict(type="int", default=16),
    allow_processes=dict(type="bool", default=False),
    timeout=dict(type="float", default=30),
    poll_interval=dict(type="float", default=0.1),
    call_timeout=dict(type="float", default=5),
    checks=dict(type="list", elements="str", choices=CHECKS, default=list(CHECKS)),
    xid_since=dict(type="str", default=""),
    xid_log_path=dict(type="path"),
)

READ_MARGIN_S = 0.05  # time a read may take beyond twice the last one before the deadline cuts it

RESET_HINT = "reset the GPU (nvidia-smi -r -i {index}) or reboot"
GPU_KEYS = ("index", "uuid", "name", "pci_bus_id", "minor_number")
READING_KEYS = ("memory_used_mib", "memory_reserved_mib", "memory_total_mib", "memory_used_v1_mib", "processes",
                "ecc_uncorrected_volatile", "remapped_rows", "retired_pages_pending", "xid", "xid_action")
# The Xid classes no reset of a GPU's processes clears (module_utils/_xid.py).
XID_ACTIONS = (_xid.NEEDS_REBOOT, _xid.NEEDS_SERVICE)


def input_problems(params):
    """One sentence per option value that cannot be honoured, found before NVML is touched."""
    problems = [range_problem("nvml_verify", option, params[option])
                for option in ("timeout", "poll_interval", "call_timeout", "max_memory_used_mib")]
    if params["expected_count"] is not None:
        problems.append(range_problem("nvml_verify", "expected_count", params["expected_count"]))
    if not params["checks"]:
        # With nothing to check every GPU passes, whatever it holds.
        problems.append("checks is empty, so any GPU would pass; name at least one of %s" % ", ".join(CHECKS))
    for selector in params["gpus"]:
        if parse_selector(selector) is None:
            problems.append("gpus entry %r is not %s" % (selector, SELECTOR_FORMS))
    return [problem for problem in problems if problem]


def _describe_process(proc):
    share = "%d MiB" % proc["used_mib"] if proc["used_mib"] is not None else "an unknown amount of memory"
    if proc["exists"]:
        return "%s process %d (exists here, %s)" % (proc["type"], proc["pid"], share)
    return "%s process %d (does not exist here, %s)" % (proc["type"], proc["pid"], share)


def gpu_problems(gpu, params):
    """(problems a wait may clear, problems only a GPU reset or service clears) for one GPU that
    was read, as plain sentences without the GPU's name."""
    checks = params["checks"]
    reset = RESET_HINT.format(index=gpu["index"])
    waiting, lasting = [], []
    procs = gpu["processes"]
    ghosts = [proc for proc in procs if not proc["exists"]]
    if "processes" in checks and procs and not params["allow_processes"]:
        sentence = "NVML lists %s." % ", ".join(_describe_process(proc) for proc in procs)
        if ghosts:
            sentence += (" A listed pid that does not exist here died leaving a forked child that still holds"
                         " its memory, or lives in another PID namespace (a container).")
        waiting.append(sentence + " Run cleanslate.gpu.gpu_reset to stop the holders.")
    used = gpu["memory_used_mib"]
    limit = params["max_memory_used_mib"]
    if "memory" in checks and gpu["memory_total_mib"] is not None and limit >= gpu["memory_total_mib"]:
        # Like checks: [], a limit no GPU can exceed would pass a GPU whatever it holds.
        lasting.append("max_memory_used_mib %d is not below this GPU's %d MiB of memory, so the memory check could"
                       " never fail; give a lower limit, or leave memory out of checks." % (limit, gpu["memory_total_mib"]))
    elif "memory" in checks and used > limit:
        sentence = "%d MiB of memory used (v2, %s MiB driver-reserved not counted), above the %d MiB limit." % (
            used, gpu["memory_reserved_mib"], limit)
        loose = gpu["unattributed_mib"]
        # On a real driver a CUDA context's few MiB never show in its process's share (an
        # H200 holder: 4622 MiB used, 4614 MiB listed), so only name what is over the limit.
        if loose and loose > limit:
            sentence += (" %d MiB is memory used with no visible process: a dead pid's forked child or a process"
                         " in another PID namespace holds it; run cleanslate.gpu.gpu_reset with cmdline_patterns"
                         " (or stop it from the container's host), and if it stays, %s." % (loose, reset))
        elif not waiting:
            # The processes sentence, when there is one, already says what to do.
            sentence += " Run cleanslate.gpu.gpu_reset to stop the holders."
        waiting.append(sentence)
    ecc = gpu["ecc_uncorrected_volatile"]
    if "ecc" in checks and ecc:
        lasting.append("%d uncorrected volatile ECC errors: drain the GPU, check dmesg for Xid 48/63/94/95, then %s."
                       % (ecc, reset))
    rows = gpu["remapped_rows"]
    if "remapped_rows" in checks and rows and (rows["pending"] or rows["failed"]):
        counters = "correctable %d, uncorrectable %d" % (rows["correctable"], rows["uncorrectable"])
        if rows["failed"]:
            lasting.append("Row remapping failed (%s): the GPU has run out of spare rows and needs service (RMA);"
                           " take it out of use." % counters)
        if rows["pending"]:
            lasting.append("Row remapping pending (%s): %s to apply it." % (counters, reset))
    if "retired_pages" in checks and gpu["retired_pages_pending"]:
        lasting.append("Retired pages pending: %s so the retirement takes effect." % reset)
    lasting.extend(xid_problems(gpu))
    return waiting, lasting


def xid_problems(gpu):
    """One sentence per Xid record of the GPU that no reset of its processes clears."""
    sentences = []
    for record in gpu.get("xid") or []:
        if record["class"] not in XID_ACTIONS:
            continue
        todo = (RESET_HINT.format(index=gpu["index"])
                if record["class"] == _xid.NEEDS_REBOOT else "take it out of use and have it serviced")
        sentences.append("%s: Xid %d (%s, %s) in the kernel log: %r; stopping its processes cannot clear it: %s"
                         " (this collection does neither)." % (record["class"], record["code"], record["mnemonic"],
                                                               record["meaning"], record["line"], todo))
    return sentences


def attach_xid(gpus, params, deadline):
    """Read the kernel log once and give each pinned GPU its Xid records (`xid`) and the worst
    class among them that a reset does not clear (`xid_action`); return the host's Xid result:
    the records of buses no selected GPU has, where the log came from, and why it could not be read."""
    if "xid" not in params["checks"]:
        return {}
    limit = min(params["call_timeout"], max(0.5, deadline - time.monotonic()))
    log, source, problem = _xid.read_kernel_log(params["xid_since"], limit, params["xid_log_path"])
    found, elsewhere = _xid.records_by_gpu(_xid.parse(log), gpus)
    for position, gpu in enumerate(gpus):
        gpu["xid"] = found.get(position, [])
        bad = _xid.worst(gpu["xid"])
        gpu["xid_action"] = bad if bad in XID_ACTIONS else None
    return {"xid_source": source, "xid_log_problem": problem, "xid_other_buses": elsewhere}


def unreachable_problem(gpu):
    """The sentence for a selected GPU NVML cannot reach (it stays so until a reset or reboot)."""
    failure = gpu["unreachable"]
    if failure["lost"]:
        where = (" (NVML does not tell a lost GPU's PCI bus id: nvidia-smi prints it)"
                 if not gpu.get("pci_bus_id") else "")
        return ("lost (NVML: %s): it fell off the bus or stopped answering%s; check dmesg for Xid 79, then reboot or"
                " power-cycle the host." % (failure["error"], where))
    return ("NVML cannot read it (%s: %s): check dmesg for Xid errors, then %s."
            % (failure["call"], failure["error"], RESET_HINT.format(index=gpu["index"])))


def unfinished_problem(exc, params):
    """The sentence for the NVML call that had not returned when its time was up."""
    if exc.cause == "call_timeout":
        reset = RESET_HINT.format(index=exc.gpu["index"]) if exc.gpu and exc.gpu.get("index") is not None else (
            "reset the GPU (nvidia-smi -r) or reboot")
        return ("NVML call %s did not return within %g s (call_timeout): the GPU or its driver is hung; check dmesg"
                " for Xid errors, then %s." % (exc.call, params["call_timeout"], reset))
    running = ("had been running for %.1f s" % exc.running_s if exc.running_s is not None
               else "was the last one made")
    if params["timeout"] > 0:
        budget = "the %g s timeout" % params["timeout"]
    else:
        budget = "the %g s that timeout 0 gives its one read (call_timeout)" % params["call_timeout"]
    return ("NVML call %s %s when %s ran out: NVML answers slowly or the GPU is hung; check dmesg for Xid errors,"
            " and give a longer timeout if NVML is only slow." % (exc.call, running, budget))


def _same_gpu(gpu, other):
    if gpu.get("uuid") and other.get("uuid"):
        return gpu["uuid"] == other["uuid"]
    return gpu.get("index") is not None and gpu.get("index") == other.get("index")


def evaluate(gpus, count, params, unfinished=None):
    """(gpus as reported, host problems, ok, lasting) for the pinned GPUs as last read.

    Each entry of gpus holds the GPU's identity (GPU_KEYS), "unreachable" when NVML cannot
    reach it, and its newest counters (READING_KEYS) once read. Every problem starts with the
    GPU's name (describe_gpu). lasting is true when a problem is one no wait can clear (a lost
    GPU, a health counter, a GPU count): polling on cannot make the task pass."""
    checks = params["checks"]
    lasting = unfinished is not None
    reported = []
    for gpu in gpus:
        view = {key: gpu.get(key) for key in GPU_KEYS}
        view.update((key, gpu.get(key)) for key in READING_KEYS)
        view["processes"] = view["processes"] or []
        read = view["memory_used_mib"] is not None
        view["unattributed_mib"] = unattributed_mib(view) if read else None
        problems = []
        if gpu.get("unreachable"):
            # A GPU that cannot be read cannot be proved clean, whatever the checks.
            problems.append(unreachable_problem(gpu))
            lasting = True
        elif read:
            waiting, stays = gpu_problems(view, params)
            problems.extend(waiting + stays)
            lasting = lasting or bool(stays)
        if unfinished is not None and unfinished.gpu and _same_gpu(unfinished.gpu, view):
            problems.append(unfinished_problem(unfinished, params))
        elif not read and not gpu.get("unreachable"):
            problems.append("not read: time ran out before NVML got to this GPU.")
        label = describe_gpu(view)
        view["problems"] = ["%s: %s" % (label, problem) for problem in problems]
        reported.append(view)
    host = []
    if unfinished is not None and not any(
            unfinished.gpu and _same_gpu(unfinished.gpu, gpu) for gpu in reported):
        # A call on the whole system, or on a GPU before it was pinned.
        prefix = describe_gpu(unfinished.gpu) + ": " if unfinished.gpu else ""
        host.append(prefix + unfinished_problem(unfinished, params))
    expected = params["expected_count"]
    by_index = any((parse_selector(selector) or ("",))[0] == "index" for selector in params["gpus"])
    if count is not None and expected is not None and count != expected:
        # Fewer GPUs also shifts every index after the missing one: an index may name another card.
        shifted = by_index and count < expected
        if "count" in checks or shifted:
            if count < expected:
                sentence = ("NVML lists %d GPUs, %d expected: a GPU fell off the bus or was not probed when the"
                            " driver loaded; check dmesg for Xid 79 or 'fallen off the bus', then reboot." % (count, expected))
            else:
                sentence = "NVML lists %d GPUs, %d expected: set expected_count to what this host has." % (count, expected)
            if shifted:
                sentence += (" The GPUs after the missing one have moved down one index, so gpus given by index may"
                             " name other cards than meant: select them by UUID or PCI bus id.")
            host.append(sentence)
            lasting = True
    if "count" in checks and count == 0 and expected is None:
        host.append("NVML lists no GPU: check that the driver sees the GPUs (dmesg, lspci).")
        lasting = True
    ok = not host and not any(view["problems"] for view in reported)
    return reported, host, ok, lasting


def failure_message(gpus, host, waited, polls, unfinished=None, early=False):
    """One message naming each failing GPU, what is wrong with it and what to do."""
    parts = list(host)
    for gpu in gpus:
        parts.extend(gpu["problems"])
    if unfinished is not None:
        head = "GPUs not proved clean: time ran out after %.1f s (%d complete NVML reads)" % (waited, polls)
    else:
        head = "GPUs not clean after %.1f s (%d NVML reads)" % (waited, polls)
        if early:
            head += ", no longer polling: waiting cannot clear these"
    return "%s: %s" % (head, " | ".join(parts))


def verify(params):
    """Pin the selected GPUs, then read them every poll_interval until every selected check
    passes, a problem no wait can clear shows, or time runs out; return the result dict.

    Everything, nvmlInit included, ends by the deadline: O(timeout) after the start, or for
    timeout 0 (one read) call_timeout after it. Raises NvmlError (NVML unusable) and
    InputProblem (a GPU this host does not have)."""
    start = time.monotonic()
    timeout = params["timeout"]
    budget = timeout if timeout > 0 else params["call_timeout"]
    session = NvmlSession(params["call_timeout"], deadline=start + budget, budget_s=budget)
    pinned, gpus, count, polls, unfinished = None, [], None, 0, None
    ok, lasting, host, reported = False, False, [], []
    try:
        session.open()
        pinned = session.select(params["gpus"])
        gpus = pinned["gpus"]
        count = pinned["count"]
        while True:
            began = time.monotonic()
            sink = Sink()
            try:
                session.read_selected(gpus, sink)
                polls += 1
            finally:
                read = sink.close()
                count = read.pop("count", count)
                for position, values in read.items():
                    gpus[position].update(values)
            took = time.monotonic() - began
            reported, host, ok, lasting = evaluate(gpus, count, params)
            next_read = began + params["poll_interval"]
            # Start a read only when it can end before the deadline (twice the last one's time,
            # and a margin): one cut short by the deadline would blame NVML for being slow.
            if ok or lasting or timeout == 0 or next_read + 2 * took + READ_MARGIN_S >= start + timeout:
                break
            time.sleep(max(0.0, next_read - time.monotonic()))
    except NvmlTimeout as exc:
        unfinished = exc
    finally:
        session.close()
    # Once, after the last read: the log says what NVML's counters do not (a GPU that fell off the bus).
    xid = attach_xid(gpus, params, start + budget) if pinned is not None else {}
    if unfinished is not None or xid:
        reported, host, ok, lasting = evaluate(gpus, count, params, unfinished)
    elapsed = time.monotonic() - start
    result = dict(changed=False, ok=ok, waited_s=round(elapsed, 3), polls=polls, problems=host, gpus=reported,
                  unfinished_call=unfinished.as_dict() if unfinished is not None else None, **xid)
    actions = [gpu["xid_action"] for gpu in reported if gpu.get("xid_action")]
    result["xid_action"] = max(actions, key=_xid.SEVERITY.index) if actions else None
    if pinned is not None:
        result.update(driver_version=pinned["driver_version"], count=count)
    if ok:
        result["msg"] = "%d GPUs clean after %.2f s" % (len(reported), elapsed)
    else:
        early = lasting and unfinished is None and elapsed < timeout
        result["msg"] = failure_message(reported, host, elapsed, polls, unfinished, early)
    return result


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    fail_on_problems(module, input_problems(module.params), changed=False, ok=False)
    if not HAS_PYNVML:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    try:
        result = verify(module.params)
    except InputProblem as exc:
        fail_on_problems(module, [str(exc)], changed=False, ok=False)
    except NvmlError as exc:
        module.fail_json(msg=str(exc), changed=False, ok=False)
    if result.get("xid_log_problem"):
        module.warn(result["xid_log_problem"])
    if result["ok"]:
        module.exit_json(**result)
    module.fail_json(**result)
