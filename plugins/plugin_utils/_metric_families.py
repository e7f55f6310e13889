# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The roles' results as Prometheus metric families, for cleanslate.gpu.textfile_metrics: the filter
cleanslate.gpu.metric_families, and the action cleanslate.gpu.reset_steps (node_reset's file, written after its steps).

The figures are the fleet report's (plugin_utils/_report_rows.host_row: MiB freed per GPU, seconds per step),
so a dashboard and the report never disagree. Every family's name, type and HELP come from
FAMILIES: node_exporter merges the families of all its files and refuses one whose HELP differs
between two files, so node_reset's and inference_service's files must say the same words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._report_rows import host_row
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import as_number

PREFIX = "cleanslate_gpu_"
MIB = 1024 * 1024
# name (without the prefix): HELP. All gauges: each holds the last run's figure.
FAMILIES = {
    "last_run_timestamp_seconds": "When the role last ran on the host (seconds since the epoch, the host's clock).",
    "last_success_timestamp_seconds": "When the role last ended ok on the host; kept through failed runs.",
    "failing_since_timestamp_seconds": "When the first of the failed runs since the last success ran; absent after a success.",
    "run_ok": "Whether the role's last run ended ok (1) or not (0).",
    "run_status": "The last run's status (label status; step: the step that failed), always 1.",
    "run_seconds": "Seconds the last run took on the host.",
    "reset_step_seconds": "Seconds each step of the last reset took, as its module measured it.",
    "reset_processes_stopped": "Processes the last reset stopped (a verify: would stop).",
    "reset_gpu_memory_freed_bytes": "GPU memory the last reset freed per GPU (NVML v2 used, before minus after).",
    "reset_shm_freed_bytes": "Bytes of /dev/shm the last reset freed (a verify: would free).",
    "reset_bytecode_files_removed": "Stale bytecode files the last reset removed (a verify: would remove).",
    "reset_gpus": "GPUs the last reset's final check read.",
    "reset_gpus_clean": "GPUs the last reset's final check found clean and healthy.",
    "reset_gpu_xid_action": ("GPUs whose kernel log holds an Xid a reset of their processes cannot clear (label action:"
                             " needs_reboot or needs_service; code: the worst such Xid), always 1."),
    "service_start_to_ready_seconds": "Seconds from the server's start to its health endpoint answering (a start by the run).",
    "service_start_to_first_completion_seconds": "Seconds from the server's start to the end of its first completion.",
    "service_first_completion_seconds": "Seconds the gate's first completion took.",
    "service_speculative_acceptance_rate": "Accepted over drafted speculative tokens, read from the engine at the gate.",
    "service_speculative_mean_acceptance_length": "Tokens per decoding step (1 + accepted / drafts), read at the gate.",
    "service_min_acceptance_rate": "The acceptance floor (inference_service_min_acceptance_rate); 0: none.",
    "service_info": "The engine the unit serves, its version and speculative method, always 1.",
}
# The statuses a result may have, whose failed form carries its step in a label.
FAILED_AT = re.compile(r"failed at (.+)\Z")
# Characters a file name may hold as they are; any other is written _xNN (its UTF-8 bytes).
FILE_SAFE = re.compile(r"[A-Za-z0-9_@:-]")


def _finite(value):
    number = as_number(value)
    return float(number) if number is not None and math.isfinite(float(number)) else None


def _family(name, samples, keep_previous=False) -> dict:
    return {"name": PREFIX + name, "help": FAMILIES[name], "type": "gauge", "keep_previous": keep_previous,
            "samples": [{"labels": labels, "value": value} for labels, value in samples if value is not None]}


def file_part(text: str) -> str:
    """`text` as part of a file name: [A-Za-z0-9_@:-] kept, anything else (dots, slashes, quotes,
    bytes that are not UTF-8) as _xNN, so two unit names never share a file."""
    return "".join(char if FILE_SAFE.match(char) and char != "_" else "".join("_x%02x" % byte for byte in char.encode("utf-8"))
                   for char in printable(text))


def _outcome(labels, ok, status, seconds) -> list:
    """The families every role writes: timestamps, ok, status, seconds."""
    status = str(status or "failed")
    failed_at = FAILED_AT.match(status)
    status_labels = dict(labels, status="failed" if failed_at else status, step=failed_at.group(1) if failed_at else "")
    return [
        _family("last_run_timestamp_seconds", [(labels, "now")]),
        # A failed run keeps the last success's time from the previous file (none yet: no sample).
        _family("last_success_timestamp_seconds", [(labels, "now" if ok else None)], keep_previous=not ok),
        # The first failure's time survives the next failures, and a success drops it.
        _family("failing_since_timestamp_seconds", [(labels, None if ok else "now")], keep_previous=not ok),
        _family("run_ok", [(labels, 1 if ok else 0)]),
        _family("run_status", [(status_labels, 1)]),
        _family("run_seconds", [(labels, _finite(seconds))]),
    ]


def _worst_code(gpu) -> str:
    """The newest Xid code of the GPU's class of xid_action (nvml_verify's gpus[].xid)."""
    codes = [record.get("code") for record in gpu.get("xid") or []
             if isinstance(record, Mapping) and record.get("class") == gpu["xid_action"]]
    return str(codes[-1]) if codes else ""


def _reset_families(result, host) -> dict:
    kind = str(result.get("kind") or "reset")
    role = "node_verify" if kind == "verify" else "node_reset"
    labels = {"host": host, "role": role}
    row = host_row(host, result, read_only=kind == "verify")
    steps = result.get("steps") if isinstance(result.get("steps"), Mapping) else {}
    verify = steps.get("nvml_verify") if isinstance(steps.get("nvml_verify"), Mapping) else {}
    gpus = [gpu for gpu in verify.get("gpus") or [] if isinstance(gpu, Mapping)] if "gpus" in verify else None
    families = _outcome(labels, bool(result.get("ok")), result.get("status"), result.get("seconds_total"))
    families += [
        _family("reset_step_seconds", [(dict(labels, step=step), seconds) for step, seconds in row["seconds_per_step"].items()]),
        _family("reset_processes_stopped", [(labels, row["killed"])]),
        _family("reset_gpu_memory_freed_bytes", [(dict(labels, gpu=index), mib * MIB)
                                                 for index, mib in sorted(row["mib_freed_per_gpu"].items())]),
        _family("reset_shm_freed_bytes", [(labels, row["shm_bytes_freed"])]),
        _family("reset_bytecode_files_removed", [(labels, row["bytecode_removed"])]),
        _family("reset_gpus", [(labels, None if gpus is None else len(gpus))]),
        _family("reset_gpus_clean", [(labels, None if gpus is None else sum(1 for gpu in gpus if not gpu.get("problems")))]),
        _family("reset_gpu_xid_action", [(dict(labels, gpu=str(gpu.get("index")), action=gpu["xid_action"],
                                               code=_worst_code(gpu)), 1)
                                         for gpu in gpus or [] if gpu.get("xid_action")]),
    ]
    return {"name": PREFIX + role, "families": families}


def _service_families(result, host, floor) -> dict:
    unit = str(result.get("unit") or "")
    labels = {"host": host, "role": "inference_service", "unit": unit}
    ready_s, first_ms = _finite(result.get("ready_s")), _finite(result.get("first_completion_ms"))
    first_s = None if first_ms is None else round(first_ms / 1000, 3)
    info = dict(labels, engine=str(result.get("engine") or ""), version=str(result.get("engine_version") or ""),
                speculative_method=str(result.get("speculative_method") or ""))
    # A configuration refused before anything was touched is `invalid`, node_reset's word for it.
    status = "invalid" if result.get("stage") == "validate" else result.get("status")
    families = _outcome(labels, bool(result.get("ok")), status, result.get("gate_s"))
    families += [
        _family("service_start_to_ready_seconds", [(labels, ready_s)]),
        _family("service_start_to_first_completion_seconds",
                [(labels, None if ready_s is None or first_s is None else round(ready_s + first_s, 3))]),
        _family("service_first_completion_seconds", [(labels, first_s)]),
        _family("service_speculative_acceptance_rate", [(labels, _finite(result.get("acceptance_rate")))]),
        _family("service_speculative_mean_acceptance_length", [(labels, _finite(result.get("mean_acceptance_length")))]),
        _family("service_min_acceptance_rate", [(labels, _finite(floor))]),
        _family("service_info", [(info, 1)]),
    ]
    return {"name": PREFIX + "inference_service_" + file_part(unit.removesuffix(".service")), "families": families}


def metric_families(result, role, host, min_acceptance_rate=0):
    """{name: the file's name, families: [...]} of a role's result (node_reset_result or
    inference_service_result) for cleanslate.gpu.textfile_metrics."""
    if not isinstance(result, Mapping):
        raise AnsibleFilterError("metric_families expects the role's result (a dictionary), got %s" % type(result).__name__)
    if not isinstance(host, str) or not host:
        raise AnsibleFilterError("metric_families: host must be the inventory name, got %r" % (host,))
    if role == "node_reset":
        return _reset_families(result, host)
    if role == "inference_service":
        return _service_families(result, host, min_acceptance_rate)
    raise AnsibleFilterError("metric_families: role must be node_reset or inference_service, got %r" % (role,))
