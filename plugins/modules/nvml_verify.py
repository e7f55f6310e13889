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
  - O(timeout) bounds the whole task, C(nvmlInit) and every read included, however slowly NVML answers (the
    kernel log read of the V(xid) check excepted, which O(call_timeout) bounds);
    the result then names the NVML call, and the GPU, that had not answered (RV(unfinished_call)).
  - Polling stops at once when a problem shows that no wait can clear (a lost GPU, ECC errors, pending
    row remaps or retired pages, a GPU count other than O(expected_count)); the message says so.
  - The selected GPUs are pinned on the first read, by their UUID and PCI bus id, and read through the
    handles NVML gave for them then; GPUs that are not selected are never touched, so one that hangs or
    is lost cannot block or fail a selection that leaves it out.
  - Memory is read through the v2 structure, whose C(used) excludes driver-reserved memory (an idle H200
    reads 615 MiB used through v1 and 0 MiB through v2).
  - Each process NVML lists is marked whether its pid exists here. Inside a container NVML hides other
    namespaces' pids while C(used) still counts their memory, and on a host NVML can list a dead parent
    while its forked child holds the memory; both show as memory used with no visible process.
  - Every NVML call is also bounded by O(call_timeout), since a GPU in a bad state can hang a driver call.
  - "Every problem, in RV(gpus[].problems) and in the message, starts with the GPU's index, UUID and PCI
    bus id, for example C(GPU 3 (GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77, 00000000:5D:00.0): ...)."
  - Read-only. C(changed) is always false; check mode runs the same checks.
requirements:
  - nvidia-ml-py (import C(pynvml)) on the managed host
  - the NVIDIA driver and its C(libnvidia-ml.so.1)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details:
      - Check mode runs the same read-only checks.
  diff_mode:
    support: none
    details:
      - Nothing changes, so there is no diff.
  platform:
    details:
      - Linux hosts with the NVIDIA driver.
options:
  gpus:
    description:
      - GPUs to verify, as NVML indices (V(0)), UUIDs (V(GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77)) or PCI
        bus ids in any form NVML accepts (V(00000000:18:00.0), V(0000:18:00.0), V(18:00.0)). All GPUs when empty.
      - An index names a position in NVML's enumeration, which a GPU missing at driver load shifts. It is
        resolved once, on the first read; from then on the GPU is followed by its handle, UUID and PCI bus
        id, so a GPU that falls off the bus during the task is reported lost under its own name and never
        replaced by the card that takes its index. When NVML lists fewer GPUs than O(expected_count) and a
        GPU is given by index, the task fails whatever the checks, since the index may name another card;
        select by UUID or PCI bus id to be safe from that.
      - A UUID or PCI bus id of a lost GPU selects it (and reports it lost). An entry that is none of the three
        forms fails the task before NVML is touched; a GPU this host does not have fails it with the list of
        the GPUs there are.
    type: list
    elements: str
    default: []
  expected_count:
    description:
      - Number of GPUs NVML must list on this host, 1 or more. Fewer means a GPU was not probed when the driver
        loaded, often after it fell off the bus (check C(dmesg) for Xid 79).
      - A GPU that falls off the bus while the driver is loaded stays listed; it is reported lost when selected.
    type: int
  max_memory_used_mib:
    description:
      - Highest v2 C(used) memory, in MiB, that still counts as clean. v2 C(used) excludes driver-reserved memory.
      - 0 or more, and below each selected GPU's total memory (a limit no GPU can exceed would pass any GPU;
        leave V(memory) out of O(checks) instead).
    type: int
    default: 16
  allow_processes:
    description:
      - When true, the V(processes) check passes even if NVML lists processes on the GPU.
    type: bool
    default: false
  timeout:
    description:
      - Seconds the whole task may take, from before C(nvmlInit) to the last read, 0 to 86400. A read is started
        only when it can end in time (judged by the last one); a read it cuts short fails the task, naming the
        NVML call still running (RV(unfinished_call)).
      - V(0) reads once, and gives that one read O(call_timeout) seconds in all.
    type: float
    default: 30
  poll_interval:
    description:
      - Seconds from the start of one NVML read to the start of the next, more than 0 and at most 3600.
    type: float
    default: 0.1
  call_timeout:
    description:
      - Seconds one NVML call may take before the GPU or driver is declared hung and the task fails, more than
        0 and at most 3600. Each call's limit is the smaller of this and the time O(timeout) leaves.
    type: float
    default: 5
  checks:
    description:
      - Which checks must pass; at least one (with none, any GPU would pass).
      - A selected GPU that NVML cannot reach (lost) fails whatever the checks.
      - V(memory) compares v2 C(used) with O(max_memory_used_mib).
      - V(processes) fails while NVML lists any process, unless O(allow_processes).
      - V(count) compares the number of GPUs NVML lists with O(expected_count), and fails when NVML lists none.
      - V(ecc) fails on uncorrected volatile ECC errors.
      - V(remapped_rows) fails on a pending or failed row remapping.
      - V(retired_pages) fails on retired pages pending; C(Not Supported) passes.
      - V(xid) reads the kernel log once, after the last NVML read, for the driver's Xid records (C(NVRM) lines) of the
        selected GPUs (matched by PCI bus id), and fails on a record whose code a reset of the GPU's processes cannot
        clear, by NVIDIA's Xid catalog - V(needs_reboot) (a GPU reset or a reboot, such as Xid 79, 48, 95, 109,
        119) or V(needs_service) (such as Xid 64). Application errors (such as Xid 13, 31, 43, and 94, a contained
        memory error) and codes not in the collection's table are listed in RV(gpus[].xid) and pass. This module never resets a GPU or reboots a host.
      - The log is read with C(journalctl -k) (root, or the C(systemd-journal) or C(adm) group), else with C(dmesg) on a
        host without journald; a log that cannot be read is a warning (RV(xid_log_problem)), not a failure. The read
        takes at most O(call_timeout) seconds, also when O(timeout) has run out, and at most 8 MiB of the newest log.
    type: list
    elements: str
    choices: [memory, processes, count, ecc, remapped_rows, retired_pages, xid]
    default: [memory, processes, count, ecc, remapped_rows, retired_pages, xid]
  xid_since:
    description:
      - For the V(xid) check, the oldest kernel log entries read, in any form C(journalctl --since) takes (V(-2h),
        V(2026-01-05 10:00:00)), the time the GPUs were last known good. Empty reads the current boot.
      - C(dmesg) cannot apply it, so on a host without journald the whole kernel ring buffer is read.
    type: str
    default: ""
  xid_log_path:
    description:
      - For tests and for a kernel log kept elsewhere, a file of kernel log lines read instead of C(journalctl) or
        C(dmesg) (its newest 8 MiB; O(xid_since) does not apply). Unset reads the host's kernel log.
    type: path
"""

EXAMPLES = r"""
- name: Wait until every GPU is free and healthy
  cleanslate.gpu.nvml_verify:
    expected_count: 8

- name: Verify two GPUs, allowing a monitoring process, with a longer wait
  cleanslate.gpu.nvml_verify:
    gpus: ["GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77", "0000:2a:00.0"]
    allow_processes: true
    max_memory_used_mib: 512
    timeout: 120

- name: Only check health counters, once
  cleanslate.gpu.nvml_verify:
    checks: [ecc, remapped_rows, retired_pages, xid]
    timeout: 0

- name: Read the Xid records logged since the GPUs were last good
  cleanslate.gpu.nvml_verify:
    checks: [xid]
    xid_since: "-30min"
"""

RETURN = r"""
ok:
  description: Whether every selected check passed on every selected GPU.
  returned: always
  type: bool
  sample: true
waited_s:
  description: Seconds from the start (before C(nvmlInit)) until the checks passed, a problem no wait can clear
    showed, or time ran out.
  returned: unless the task failed before reading (a bad option, NVML missing or failing C(nvmlInit), an unknown GPU)
  type: float
  sample: 0.31
polls:
  description: Number of complete reads of the selected GPUs (a read that O(timeout) cut short is not counted).
  returned: unless the task failed before reading (a bad option, NVML missing or failing C(nvmlInit), an unknown GPU)
  type: int
  sample: 4
unfinished_call:
  description:
    - The NVML call that had not returned when O(timeout) ran out (C(cause) V(timeout)) or that outlasted
      O(call_timeout) (V(call_timeout)); null when every call returned.
    - C(index), C(uuid) and C(pci_bus_id) name its GPU (null for a call on the whole system, such as
      C(nvmlInit)); C(running_s) is how long it had run (null when time ran out between two calls).
  returned: unless the task failed before reading (a bad option, NVML missing or failing C(nvmlInit), an unknown GPU)
  type: dict
  sample: {"call": "nvmlDeviceGetMemoryInfo_v2", "index": 0, "uuid": "GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77",
           "pci_bus_id": "00000000:18:00.0", "running_s": 0.98, "cause": "timeout"}
driver_version:
  description: NVIDIA driver version reported by NVML.
  returned: when NVML could be read
  type: str
  sample: "570.133.20"
count:
  description: Number of GPUs NVML lists at the last read; a GPU lost while the driver is loaded still counts.
  returned: when NVML could be read
  type: int
  sample: 8
problems:
  description: Problems of the host as a whole (a GPU count other than O(expected_count), an NVML call on the whole
    system that did not return in time), as plain sentences.
  returned: unless the task failed before reading (a bad option, NVML missing or failing C(nvmlInit), an unknown GPU)
  type: list
  elements: str
  sample: ["NVML lists 7 GPUs, 8 expected: a GPU fell off the bus or was not probed when the driver loaded; check
            dmesg for Xid 79 or 'fallen off the bus', then reboot."]
xid_action:
  description:
    - The worst Xid class of the selected GPUs that a reset of their processes cannot clear, V(needs_service) over
      V(needs_reboot); null when none (or without the V(xid) check).
  returned: unless the task failed before reading (a bad option, NVML missing or failing C(nvmlInit), an unknown GPU)
  type: str
  sample: needs_reboot
xid_source:
  description: Where the kernel log was read from - C(journalctl), C(dmesg) or O(xid_log_path); null when it could
    not be read.
  returned: with the V(xid) check, when NVML could be read
  type: str
  sample: journalctl
xid_log_problem:
  description: Why the kernel log could not be read, one sentence (also a warning); null when it was read.
  returned: with the V(xid) check, when NVML could be read
  type: str
  sample: null
xid_other_buses:
  description: The newest 8 Xid records of PCI buses no selected GPU has (a GPU not selected, or not listed by NVML),
    each as in RV(gpus[].xid).
  returned: with the V(xid) check, when NVML could be read
  type: list
  elements: dict
  sample: []
gpus:
  description: The selected GPUs, each once, in index order, as last read (a GPU not read yet has null readings).
  returned: unless the task failed before reading (a bad option, NVML missing or failing C(nvmlInit), an unknown GPU)
  type: list
  elements: dict
  contains:
    index:
      description: NVML index when the GPU was pinned (on the first read); null for a GPU selected by UUID or PCI
        bus id that was already lost then.
      type: int
      returned: always
      sample: 0
    uuid:
      description: GPU UUID; null for a GPU lost before NVML told it (selected by index or PCI bus id).
      type: str
      returned: always
      sample: GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77
    name:
      description: Product name; null for a GPU lost before NVML told it.
      type: str
      returned: always
      sample: NVIDIA H200
    pci_bus_id:
      description: PCI bus id, as NVML writes it; null for a GPU lost before NVML told it (selected by index or UUID).
      type: str
      returned: always
      sample: "00000000:18:00.0"
    minor_number:
      description: The N of its device file C(/dev/nvidiaN), which unlike the index does not shift; null when
        unknown.
      type: int
      returned: always
      sample: 0
    memory_used_mib:
      description: v2 C(used) memory in MiB, driver-reserved memory excluded; null when not read.
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
    xid:
      description:
        - With the V(xid) check, this GPU's Xid records in the kernel log, oldest first - the newest 8, and the worst
          always among them.
        - C(code), C(class) (V(restart_app), V(needs_reboot), V(needs_service), V(unknown)), C(mnemonic) (NVIDIA's
          name, null for an unknown code), C(meaning), and C(line), the log line as it is, up to 400 characters,
          each byte that is not UTF-8 and each control character written as C(\xNN).
      type: list
      elements: dict
      returned: always
      sample: [{"code": 79, "class": "needs_reboot", "mnemonic": "GPU_HAS_FALLEN_OFF_THE_BUS",
                "meaning": "the GPU fell off the bus", "line": "NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus."}]
    xid_action:
      description: The worst class of RV(gpus[].xid) that a reset of the GPU's processes cannot clear, V(needs_reboot)
        or V(needs_service); null when none.
      type: str
      returned: always
      sample: null
    problems:
      description: What is wrong with this GPU and what to do, as plain sentences that start with the GPU's index,
        UUID and PCI bus id; empty when clean.
      type: list
      elements: str
      returned: always
      sample: ["GPU 3 (GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77, 00000000:5D:00.0): 3 uncorrected volatile ECC errors:
                drain the GPU, check dmesg for Xid 48/63/94/95, then reset the GPU (nvidia-smi -r -i 3) or reboot."]
"""

from ansible_collections.cleanslate.gpu.plugins.module_utils._nvml_verify_module import main


if __name__ == "__main__":
    main()
