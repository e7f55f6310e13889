#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: nvml_verify
short_description: Prove through NVML that every GPU is clean and healthy, polling until it is
version_added: 0.1.0
description:
  - Reads NVML (through C(pynvml)) every O(poll_interval) seconds until every selected check passes on
    every selected GPU, or O(timeout) expires. There is no fixed sleep; the task returns as soon as the
    last holder's memory is released.
  - Memory is read through the v2 structure, whose C(used) excludes driver-reserved memory (an idle H200
    reads 615 MiB used through v1 and 0 MiB through v2).
  - Each process NVML lists is marked whether its pid exists here. Inside a container NVML hides other
    namespaces' pids while C(used) still counts their memory, and on a host NVML can list a dead parent
    while its forked child holds the memory; both show as memory used with no visible process.
  - Every NVML call is bounded by O(call_timeout), since a GPU in a bad state can hang a driver call.
  - Read-only. C(changed) is always false; check mode runs the same checks.
author:
  - cleanslate.gpu maintainers (@cleanslate)
requirements:
  - nvidia-ml-py (import C(pynvml)) on the managed host
  - the NVIDIA driver and its C(libnvidia-ml.so.1)
attributes:
  check_mode:
    description: Check mode runs the same read-only checks.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
  platform:
    description: Linux hosts with the NVIDIA driver.
    support: full
    platforms: posix
options:
  gpus:
    description:
      - GPUs to verify, as indices or UUIDs (C(GPU-...)). All GPUs when empty.
      - An unknown GPU fails the task with the list of valid indices and UUIDs.
    type: list
    elements: str
    default: []
  expected_count:
    description:
      - Number of GPUs this host must have. Fewer means a GPU fell off the bus (check C(dmesg) for Xid 79).
      - When not set, the V(count) check fails only on a GPU that NVML reports lost.
    type: int
  max_memory_used_mib:
    description:
      - Highest v2 C(used) memory, in MiB, that still counts as clean. v2 C(used) excludes driver-reserved memory.
    type: int
    default: 16
  allow_processes:
    description:
      - When true, the V(processes) check passes even if NVML lists processes on the GPU.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to keep polling before failing. V(0) checks once.
    type: float
    default: 30
  poll_interval:
    description:
      - Seconds between two NVML reads while polling.
    type: float
    default: 0.1
  call_timeout:
    description:
      - Seconds one NVML call may take before the GPU or driver is declared hung and the task fails.
    type: float
    default: 5
  checks:
    description:
      - Which checks must pass.
      - V(memory) compares v2 C(used) with O(max_memory_used_mib).
      - V(processes) fails while NVML lists any process, unless O(allow_processes).
      - V(count) compares the number of reachable GPUs with O(expected_count) and fails on a lost GPU.
      - V(ecc) fails on uncorrected volatile ECC errors.
      - V(remapped_rows) fails on a pending or failed row remapping.
      - V(retired_pages) fails on retired pages pending; C(Not Supported) passes.
    type: list
    elements: str
    choices: [memory, processes, count, ecc, remapped_rows, retired_pages]
    default: [memory, processes, count, ecc, remapped_rows, retired_pages]
"""

EXAMPLES = r"""
- name: Wait until every GPU is free and healthy
  cleanslate.gpu.nvml_verify:
    expected_count: 8

- name: Verify two GPUs, allowing a monitoring process, with a longer wait
  cleanslate.gpu.nvml_verify:
    gpus: [0, "GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77"]
    allow_processes: true
    max_memory_used_mib: 512
    timeout: 120

- name: Only check health counters, once
  cleanslate.gpu.nvml_verify:
    checks: [ecc, remapped_rows, retired_pages]
    timeout: 0
"""

RETURN = r"""
ok:
  description: Whether every selected check passed on every selected GPU.
  returned: always
  type: bool
  sample: true
waited_s:
  description: Seconds from the first NVML read until the checks passed or O(timeout) expired.
  returned: always
  type: float
  sample: 0.31
polls:
  description: Number of NVML reads made.
  returned: always
  type: int
  sample: 4
driver_version:
  description: NVIDIA driver version reported by NVML.
  returned: when NVML could be read
  type: str
  sample: "570.133.20"
count:
  description: Number of GPUs NVML lists, lost ones included.
  returned: when NVML could be read
  type: int
  sample: 8
problems:
  description: Problems of the host as a whole (a GPU count below O(expected_count)), as plain sentences.
  returned: always
  type: list
  elements: str
  sample: ["NVML lists 7 GPUs, 8 expected: a GPU fell off the bus or the driver did not bind it; check dmesg for Xid 79, then reboot."]
gpus:
  description: The selected GPUs, as last read.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: NVML index.
      type: int
      returned: always
      sample: 0
    uuid:
      description: GPU UUID; null for a lost GPU.
      type: str
      returned: always
      sample: GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77
    name:
      description: Product name; null for a lost GPU.
      type: str
      returned: always
      sample: NVIDIA H200
    pci_bus_id:
      description: PCI bus id; null for a lost GPU.
      type: str
      returned: always
      sample: "00000000:18:00.0"
    memory_used_mib:
      description: v2 C(used) memory in MiB, driver-reserved memory excluded.
      type: int
      returned: always
      sample: 0
    memory_reserved_mib:
      description: Driver-reserved memory in MiB.
      type: int
      returned: always
      sample: 615
    memory_total_mib:
      description: Total memory in MiB.
      type: int
      returned: always
      sample: 143771
    memory_used_v1_mib:
      description: v1 C(used) memory in MiB, which counts reserved memory (what older tools show).
      type: int
      returned: always
      sample: 615
    unattributed_mib:
      description: MiB used that no process visible here accounts for; null when NVML does not know a process's share.
      type: int
      returned: always
      sample: 0
    processes:
      description: Processes NVML lists on this GPU.
      type: list
      elements: dict
      returned: always
      sample: [{"pid": 4242, "used_mib": 70000, "type": "compute", "exists": true}]
    ecc_uncorrected_volatile:
      description: Uncorrected volatile ECC error count; null when not supported.
      type: int
      returned: always
      sample: 0
    remapped_rows:
      description: Row remapper counters C(correctable), C(uncorrectable), C(pending), C(failed); null when not supported.
      type: dict
      returned: always
      sample: {"correctable": 0, "uncorrectable": 0, "pending": false, "failed": false}
    retired_pages_pending:
      description: Whether retired pages wait for a reset; null when not supported.
      type: bool
      returned: always
      sample: null
    problems:
      description: What is wrong with this GPU and what to do, as plain sentences; empty when clean.
      type: list
      elements: str
      returned: always
      sample: []
"""

import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.cleanslate.gpu.plugins.module_utils._nvml import (
    HAS_PYNVML,
    PYNVML_IMPORT_ERROR,
    NvmlError,
    NvmlSession,
    resolve_gpus,
    unattributed_mib,
)

CHECKS = ["memory", "processes", "count", "ecc", "remapped_rows", "retired_pages"]

ARGUMENT_SPEC = dict(
    gpus=dict(type="list", elements="str", default=[]),
    expected_count=dict(type="int"),
    max_memory_used_mib=dict(type="int", default=16),
    allow_processes=dict(type="bool", default=False),
    timeout=dict(type="float", default=30),
    poll_interval=dict(type="float", default=0.1),
    call_timeout=dict(type="float", default=5),
    checks=dict(type="list", elements="str", choices=CHECKS, default=list(CHECKS)),
)

RESET_HINT = "reset the GPU (nvidia-smi -r -i {index}) or reboot"


def bad_params(params):
    """One sentence for the first out-of-range option, or None."""
    for name in ("timeout", "max_memory_used_mib"):
        if params[name] < 0:
            return "%s must be 0 or more, got %s" % (name, params[name])
    for name in ("poll_interval", "call_timeout"):
        if params[name] <= 0:
            return "%s must be more than 0, got %s" % (name, params[name])
    if params["expected_count"] is not None and params["expected_count"] < 1:
        return "expected_count must be 1 or more, got %s" % params["expected_count"]
    return None


def _describe_process(proc):
    share = "%d MiB" % proc["used_mib"] if proc["used_mib"] is not None else "an unknown amount of memory"
    if proc["exists"]:
        return "%s process %d (exists here, %s)" % (proc["type"], proc["pid"], share)
    return "%s process %d (does not exist here, %s)" % (proc["type"], proc["pid"], share)


def gpu_problems(gpu, params):
    """Plain sentences for everything the selected checks find wrong on one readable GPU."""
    checks = params["checks"]
    index = gpu["index"]
    reset = RESET_HINT.format(index=index)
    problems = []
    procs = gpu["processes"]
    ghosts = [proc for proc in procs if not proc["exists"]]
    if "processes" in checks and procs and not params["allow_processes"]:
        sentence = "NVML lists %s." % ", ".join(_describe_process(proc) for proc in procs)
        if ghosts:
            sentence += (" A listed pid that does not exist here died leaving a forked child that still holds"
                         " its memory, or lives in another PID namespace (a container).")
        problems.append(sentence + " Run cleanslate.gpu.gpu_reset to stop the holders.")
    used = gpu["memory_used_mib"]
    if "memory" in checks and used > params["max_memory_used_mib"]:
        sentence = "%d MiB of memory used (v2, %s MiB driver-reserved not counted), above the %d MiB limit." % (
            used, gpu["memory_reserved_mib"], params["max_memory_used_mib"])
        loose = unattributed_mib(gpu)
        # On a real driver a CUDA context's few MiB never show in its process's share (an
        # H200 holder: 4622 MiB used, 4614 MiB listed), so only name what is over the limit.
        if loose and loose > params["max_memory_used_mib"]:
            sentence += (" %d MiB is memory used with no visible process: a dead pid's forked child or a process"
                         " in another PID namespace holds it; run cleanslate.gpu.gpu_reset with cmdline_patterns"
                         " (or stop it from the container's host), and if it stays, %s." % (loose, reset))
        elif not problems:
            # The processes sentence, when there is one, already says what to do.
            sentence += " Run cleanslate.gpu.gpu_reset to stop the holders."
        problems.append(sentence)
    ecc = gpu["ecc_uncorrected_volatile"]
    if "ecc" in checks and ecc:
        problems.append("%d uncorrected volatile ECC errors: drain the GPU, check dmesg for Xid 48/63/94/95, then %s."
                        % (ecc, reset))
    rows = gpu["remapped_rows"]
    if "remapped_rows" in checks and rows and (rows["pending"] or rows["failed"]):
        counters = "correctable %d, uncorrectable %d" % (rows["correctable"], rows["uncorrectable"])
        if rows["failed"]:
            problems.append("Row remapping failed (%s): the GPU has run out of spare rows and needs service (RMA);"
                            " take it out of use." % counters)
        if rows["pending"]:
            problems.append("Row remapping pending (%s): %s to apply it." % (counters, reset))
    if "retired_pages" in checks and gpu["retired_pages_pending"]:
        problems.append("Retired pages pending: %s so the retirement takes effect." % reset)
    return problems


def lost_problem(lost):
    return ("GPU %d is lost (NVML: %s): it fell off the bus or stopped answering; check dmesg for Xid 79,"
            " then reboot or power-cycle the host." % (lost["index"], lost["error"]))


def evaluate(snap, indices, params):
    """(gpus, host problems, ok) for one snapshot, the selected indices and the checks."""
    readable = dict((gpu["index"], gpu) for gpu in snap["gpus"])
    lost = dict((item["index"], item) for item in snap["lost"])
    gpus = []
    for index in indices:
        if index in readable:
            gpu = dict(readable[index])
            gpu["unattributed_mib"] = unattributed_mib(gpu)
            gpu["problems"] = gpu_problems(gpu, params)
        else:
            # A GPU that cannot be read cannot be proved clean, whatever the checks.
            reason = lost.get(index, {"index": index, "error": "not readable"})
            gpu = dict(index=index, uuid=None, name=None, pci_bus_id=None, memory_used_mib=None,
                       memory_reserved_mib=None, memory_total_mib=None, memory_used_v1_mib=None,
                       unattributed_mib=None, processes=[], ecc_uncorrected_volatile=None,
                       remapped_rows=None, retired_pages_pending=None, problems=[lost_problem(reason)])
        gpus.append(gpu)
    host = []
    if "count" in params["checks"]:
        reachable = snap["count"] - len([item for item in snap["lost"] if item["index"] < snap["count"]])
        expected = params["expected_count"]
        if expected is not None and reachable != expected:
            host.append("NVML reaches %d GPUs (%d listed), %d expected: a GPU fell off the bus or the driver did not"
                        " bind it; check dmesg for Xid 79, then reboot." % (reachable, snap["count"], expected))
        for item in snap["lost"]:
            if item["index"] not in indices:
                host.append(lost_problem(item))
        if snap["count"] == 0 and expected is None:
            host.append("NVML lists no GPU: check that the driver sees the GPUs (dmesg, lspci).")
    ok = not host and not any(gpu["problems"] for gpu in gpus)
    return gpus, host, ok


def failure_message(gpus, host, waited, polls):
    """One message naming each failing GPU, what is wrong with it and what to do."""
    parts = list(host)
    for gpu in gpus:
        if gpu["problems"]:
            label = "GPU %d" % gpu["index"] + (" (%s)" % gpu["uuid"] if gpu["uuid"] else "")
            parts.append("%s: %s" % (label, " ".join(gpu["problems"])))
    return "GPUs not clean after %.1f s (%d NVML reads): %s" % (waited, polls, " | ".join(parts))


def verify(params):
    """Poll NVML until every selected check passes or the timeout expires; return the result dict."""
    result = dict(changed=False, ok=False, waited_s=0.0, polls=0, problems=[], gpus=[])
    with NvmlSession(params["call_timeout"]) as session:
        start = time.monotonic()
        snap = session.read()
        result["polls"] = 1
        # An unknown GPU raises ValueError here, before any polling.
        indices = resolve_gpus(snap, params["gpus"])
        while True:
            gpus, host, ok = evaluate(snap, indices, params)
            elapsed = time.monotonic() - start
            if ok or elapsed >= params["timeout"]:
                break
            # Read again one poll_interval after the last read began, never past the deadline.
            next_read = start + min(result["polls"] * params["poll_interval"], params["timeout"])
            time.sleep(max(0.0, next_read - time.monotonic()))
            snap = session.read(indices)
            result["polls"] += 1
    result.update(ok=ok, waited_s=round(elapsed, 3), gpus=gpus, problems=host,
                  driver_version=snap["driver_version"], count=snap["count"])
    if not ok:
        result["msg"] = failure_message(gpus, host, elapsed, result["polls"])
    else:
        result["msg"] = "%d GPUs clean after %.2f s" % (len(gpus), elapsed)
    return result


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if not HAS_PYNVML:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    problem = bad_params(module.params)
    if problem:
        module.fail_json(msg=problem, changed=False)
    try:
        result = verify(module.params)
    except (NvmlError, ValueError) as exc:
        module.fail_json(msg=str(exc), changed=False, ok=False)
    if result["ok"]:
        module.exit_json(**result)
    module.fail_json(**result)


if __name__ == "__main__":
    main()
