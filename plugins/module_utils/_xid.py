# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA Xid records: which ones a reset cannot clear, read from the kernel log. Private to this collection.

The NVIDIA driver logs each GPU fault to the kernel log as
`NVRM: Xid (PCI:0000:2a:00): 79, pid=..., name=..., <text>`. XID_TABLE classifies each code the
collection acts on; a code not in it is reported as `unknown` and keeps no GPU from serving.
The classes follow the "Resolution Bucket (Immediate Action)" of NVIDIA's Xid catalog
(CATALOG): RESTART_APP and IGNORE are `restart_app` (stopping the processes clears it: what
node_reset does), RESET_GPU and RESTART_BM are `needs_reboot` (a GPU reset, `nvidia-smi -r`, or a
reboot, neither of which this collection ever does), and so are the WORKFLOW_ rows whose text says
a GPU reset or a reboot clears them (48, 74). `needs_service` is Xid 64 alone: its immediate action
is RESET_GPU, but a row that could not be remapped stays bad after the reset (investigatory action
CONTACT_SUPPORT; an RMA condition in NVIDIA's GPU Memory Error Management, MEMORY_ERRORS).

The log's text is untrusted: a line is kept only up to LINE_MAX characters, each byte that is not
UTF-8 as \\xNN and each control character as \\x.., so a line stays one line of valid JSON.
"""

from __future__ import annotations

import os
import pwd
import re

from ansible_collections.cleanslate.gpu.plugins.module_utils._bounded_run import program_env, run_as_user
from ansible_collections.cleanslate.gpu.plugins.module_utils._nvml import parse_selector

CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
MEMORY_ERRORS = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html"
RESTART_APP, NEEDS_REBOOT, NEEDS_SERVICE, UNKNOWN = "restart_app", "needs_reboot", "needs_service", "unknown"
# Worst last: a GPU's action is that of its worst record.
SEVERITY = (UNKNOWN, RESTART_APP, NEEDS_REBOOT, NEEDS_SERVICE)

# code: (class, the catalog's mnemonic, what it means in our words). Source of each: CATALOG, the
# row of that code (its "Resolution Bucket (Immediate Action)" in the comment where the class is
# not read from it directly).
XID_TABLE = {
    8: (RESTART_APP, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "the GPU stopped processing a channel"),
    13: (RESTART_APP, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception, usually a kernel's bad access"),
    31: (RESTART_APP, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault of an application"),
    32: (RESTART_APP, "ROBUST_CHANNEL_PBDMA_ERROR", "corrupted push buffer stream"),
    43: (RESTART_APP, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "an application's channel stopped after a fault"),  # IGNORE
    45: (RESTART_APP, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "channels cleaned up after their process ended"),  # WORKFLOW_XID_45
    68: (RESTART_APP, "ROBUST_CHANNEL_NVDEC0_ERROR", "video decoder exception"),
    69: (RESTART_APP, "ROBUST_CHANNEL_GR_CLASS_ERROR", "graphics engine class error"),
    63: (RESTART_APP, "INFOROM_DRAM_RETIREMENT_EVENT", "a memory row remapped or page retired: no action"),  # IGNORE
    94: (RESTART_APP, "ROBUST_CHANNEL_CONTAINED_ERROR",
         "contained memory error: only the application that hit it must restart (NVIDIA: reset the GPU when convenient)"),
    48: (NEEDS_REBOOT, "ROBUST_CHANNEL_GPU_ECC_DBE", "double bit ECC error in GPU memory"),  # WORKFLOW_XID_48
    62: (NEEDS_REBOOT, "PMU_HALT_ERROR", "internal micro-controller halted"),
    74: (NEEDS_REBOOT, "NVLINK_ERROR", "NVLink error"),  # WORKFLOW_NVLINK_ERR
    79: (NEEDS_REBOOT, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "the GPU fell off the bus"),
    95: (NEEDS_REBOOT, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained memory error: the GPU must be reset"),
    109: (NEEDS_REBOOT, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout"),
    119: (NEEDS_REBOOT, "GSP_RPC_TIMEOUT", "the GPU System Processor did not answer in time"),
    120: (NEEDS_REBOOT, "GSP_ERROR", "error in the GPU System Processor"),
    140: (NEEDS_REBOOT, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecovered ECC error"),
    # XID_154: the line names the action for another Xid (recovery_action() reads it); this row is for a
    # line whose action cannot be read: the worst it can name.
    154: (NEEDS_REBOOT, "GPU_RECOVERY_ACTION_CHANGED", "the driver asks for a GPU reset or a node reboot"),
    64: (NEEDS_SERVICE, "INFOROM_DRAM_RETIREMENT_FAILURE", "a memory row could not be remapped: the GPU needs service"),
}

LINE_MAX = 400  # characters of a log line kept
RECORDS_MAX = 8  # newest records kept per GPU (the worst is always among them: see records_by_gpu)
OUTPUT_MAX = 8 * 1024 * 1024  # bytes of the kernel log read
# `(PCI:0000:2a:00)`; older drivers leave out `PCI:`, some add the function.
_XID = re.compile(rb"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?\):"
                  rb" ?([0-9]{1,6})\b")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Xid 154's text, after CATALOG's row: `GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset
# Required)`; the action is the last `to` (greedy `.*`), with or without its number and parentheses.
_RECOVERY = re.compile(rb"recovery action changed from .* to (?:0x[0-9a-fA-F]{1,8} ?)?\(?([A-Za-z0-9 ]{1,40}?)\)?\s*$",
                       re.IGNORECASE)
# The actions CATALOG names (NVML_GPU_RECOVERY_ACTION_*, MEMORY_ERRORS' "Recovery action flag"): None and
# Drain P2P (end the GPU's processes, then the driver names one of the others) are cleared by stopping
# the processes; Drain and Reset and GPU Reset Required need `nvidia-smi -r`, Node Reboot Required a reboot.
_RECOVERY_ACTIONS = {
    b"none": (RESTART_APP, "the driver asks for no recovery action"),
    b"drain p2p": (RESTART_APP, "the driver asks to end the GPU's peer-to-peer processes"),
    b"drain and reset": (NEEDS_REBOOT, "the driver asks to drain the GPU and reset it"),
    b"gpu reset required": (NEEDS_REBOOT, "the driver asks for a GPU reset"),
    b"node reboot required": (NEEDS_REBOOT, "the driver asks for a node reboot"),
}


def classify(code):
    """(class, mnemonic, meaning) of an Xid code; unknown codes are UNKNOWN."""
    return XID_TABLE.get(code, (UNKNOWN, None, "not in the collection's table (%s)" % CATALOG))


def recovery_action(raw):
    """(class, meaning) of an Xid 154 line (bytes) from the action it names; None when it names none
    of CATALOG's (the table's row, the worst, applies)."""
    match = _RECOVERY.search(raw)
    return _RECOVERY_ACTIONS.get(match.group(1).strip().lower()) if match else None


def shown(raw):
    """A log line (bytes) as one line of text: not UTF-8 as \\xNN, control characters as \\xNN, bounded."""
    text = raw.decode("utf-8", "backslashreplace")
    text = _CONTROL.sub(lambda match: "\\x%02x" % ord(match.group()), text)
    return text if len(text) <= LINE_MAX else text[:LINE_MAX] + "..."


def bus_key(bus_id):
    """A PCI bus id in NVML's own form (00000000:2A:00.0), from any form NVML accepts (an Xid line
    writes 0000:2a:00); None for anything else."""
    selector = parse_selector(bus_id or "")
    return selector[1] if selector and selector[0] == "pci_bus_id" else None


def parse(log):
    """Each Xid record of the log (bytes, one record per line), oldest first: dicts with `bus`
    (the bus_key), `code`, `class`, `mnemonic`, `meaning` and `line` (shown())."""
    records = []
    for raw in log.splitlines():
        match = _XID.search(raw)
        if not match:
            continue
        code = int(match.group(4))
        cls, mnemonic, meaning = classify(code)
        if code == 154:
            cls, meaning = recovery_action(raw) or (cls, meaning)
        bus = b"%s:%s:%s" % match.groups()[:3]
        records.append({"bus": bus_key(bus.decode("ascii")), "code": code, "class": cls,
                        "mnemonic": mnemonic, "meaning": meaning, "line": shown(raw.strip())})
    return records


def worst(records):
    """The class of the worst record, or None when there is none."""
    classes = [record["class"] for record in records]
    return max(classes, key=SEVERITY.index) if classes else None


def records_by_gpu(records, gpus):
    """{position in gpus: its records} for the GPUs (dicts with `pci_bus_id`) the records name, and
    the records of buses no GPU of gpus has. A GPU keeps its worst record and its newest ones, up
    to RECORDS_MAX, oldest first, without the internal `bus` key."""
    positions = {bus_key(gpu.get("pci_bus_id")): position for position, gpu in enumerate(gpus)}
    positions.pop(None, None)
    found, elsewhere = {}, []
    for record in records:
        position = positions.get(record["bus"])
        kept = {key: value for key, value in record.items() if key != "bus"}
        if position is None:
            elsewhere.append(kept)
        else:
            found.setdefault(position, []).append(kept)
    for position, kept in found.items():
        newest = kept[-RECORDS_MAX:]
        bad = worst(kept)
        if kept and worst(newest) != bad:
            newest = [next(record for record in reversed(kept) if record["class"] == bad)] + newest[1:]
        found[position] = newest
    return found, elsewhere[-RECORDS_MAX:]


def read_kernel_log(since, timeout, path=None):
    """(log bytes, source, problem): the kernel log since `since` (journalctl's --since forms, such
    as `-2h` or `2026-01-05 10:00:00`; empty: the current boot), read with journalctl -k, or with
    dmesg (the whole ring buffer: `since` cannot be applied) on a host without journald; from
    `path` when given (a file of such lines, as tests feed it). problem is one sentence when the
    log could not be read, else None. Bounded by timeout seconds and OUTPUT_MAX bytes."""
    if path:
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(max(0, size - OUTPUT_MAX))  # the newest bytes
                return handle.read(OUTPUT_MAX), path, None
        except OSError as exc:
            return b"", path, "the kernel log file %s cannot be read (%s)" % (path, exc.strerror or exc)
    entry = pwd.getpwuid(os.geteuid())
    # journalctl without a running journald reads nothing and says so only without -q.
    readers = ((["dmesg"], False),) if not os.path.isdir("/run/systemd/journal") else ()
    # Newest first, so the bound on output keeps the newest records; parse() needs oldest first.
    journal = ["journalctl", "-k", "-r", "-q", "--no-pager", "-o", "short-iso"] + (["--since", since] if since else ["-b"])
    problems = []
    for argv, reverse in readers or ((journal, True), (["dmesg"], False)):
        try:
            status, out, err, timed_out = run_as_user(argv, b"", entry, program_env(), timeout, OUTPUT_MAX)
        except OSError as exc:
            problems.append("%s: %s" % (argv[0], exc.strerror or exc))
            continue
        if timed_out:
            problems.append("%s did not end within %.0f s" % (argv[0], timeout))
            continue
        # journalctl exits 0 with "No journal files were found." on a host without journald.
        if status == 0 and (out or not err):
            return (b"\n".join(reversed(out.splitlines())) if reverse else out), argv[0], None
        problems.append("%s: %s" % (argv[0], shown(err.strip()) or "exit status %s" % status))
    return b"", None, "the kernel log cannot be read for Xid records (%s)" % "; ".join(problems)
