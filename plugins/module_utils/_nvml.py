# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One NVML snapshot: per-GPU memory (v2), processes and health counters.

Private to this collection: the only place that talks to NVML. gpu_reset reads it for
hints, nvml_verify polls it. Every NVML call runs in a worker thread and is given up
after ``call_timeout`` seconds, because a GPU in a bad state can block a driver call
for minutes. NVML is always shut down before ``snapshot()`` returns: after nvmlInit
the calling process itself holds /dev/nvidia*, which must not happen while gpu_reset
signals the holders.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback

try:
    import pynvml
except ImportError:
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None

_MIB = 1024 * 1024


class NvmlError(Exception):
    """An NVML failure, worded as one sentence a user can act on."""


def _err(name):
    """The pynvml exception class for one NVML_ERROR_* code (a tuple, for except clauses)."""
    code = getattr(pynvml, "NVML_ERROR_" + name, None)
    if code is None:
        return ()
    return (pynvml.nvmlExceptionClass(code),)


class _BoundedCaller(object):
    """Runs NVML work in one daemon thread and gives up on any single NVML call that takes
    longer than call_timeout.

    A whole read (about a dozen calls per GPU) is one job, so a poll costs one hand-off
    between threads, not one per call; the worker notes which call it is in and since
    when, which is what the waiting thread times. When a call does not return, the worker
    is abandoned (a daemon cannot keep the module alive) and every later job fails at once
    instead of queueing behind it."""

    def __init__(self, call_timeout):
        self.call_timeout = call_timeout
        self.stuck = None
        self._current = None  # (call, time.monotonic() when it began) while the worker is in one
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="nvml-calls", daemon=True)
        self._thread.start()

    def _work(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            func, box, done = job
            try:
                box["value"] = func()
            except BaseException as exc:  # pylint: disable=broad-exception-caught
                box["error"] = exc
            self._current = None
            done.set()

    def step(self, what, func, *args, **kwargs):
        """One NVML call inside a job, timed from now by the waiting thread."""
        self._current = (what, time.monotonic())
        return func(*args, **kwargs)

    def run(self, job):
        """Run job() in the worker; raise NvmlError when one of its calls outlasts call_timeout."""
        if self.stuck is not None:
            raise NvmlError("NVML is not answering: %s never returned" % self.stuck)
        box = {}
        done = threading.Event()
        queued = time.monotonic()
        self._jobs.put((job, box, done))
        while not done.is_set():
            current = self._current
            what, began = current if current is not None else ("(starting)", queued)
            left = began + self.call_timeout - time.monotonic()
            if left <= 0:
                self.stuck = what
                raise NvmlError(
                    "NVML call %s did not return within %g s: the GPU or its driver is hung; "
                    "check `dmesg` for Xid errors, then reset the GPU (nvidia-smi -r) or reboot"
                    % (what, self.call_timeout))
            done.wait(left)
        if "error" in box:
            raise box["error"]
        return box["value"]

    def call(self, what, func, *args, **kwargs):
        """One NVML call as its own job."""
        return self.run(lambda: self.step(what, func, *args, **kwargs))

    def stop(self):
        if self.stuck is None:
            self._jobs.put(None)


def _library_hint():
    path = os.environ.get("LD_LIBRARY_PATH")
    return "LD_LIBRARY_PATH=%s" % path if path else "LD_LIBRARY_PATH is not set"


def _init_error(exc):
    """Turn an nvmlInit failure into the sentence the user sees."""
    if isinstance(exc, _err("LIBRARY_NOT_FOUND")):
        return NvmlError(
            "libnvidia-ml not found: pynvml could not load libnvidia-ml.so.1 (%s); install the "
            "NVIDIA driver (its NVML library) on this host, or check that it is a GPU host" % _library_hint())
    if isinstance(exc, _err("DRIVER_NOT_LOADED")):
        return NvmlError(
            "NVIDIA driver not loaded: nvmlInit answered '%s'; load the kernel module "
            "(modprobe nvidia) and check `dmesg` for why it is missing" % exc)
    if isinstance(exc, _err("LIB_RM_VERSION_MISMATCH")):
        return NvmlError(
            "NVIDIA driver and libnvidia-ml versions differ (%s): reboot after the driver "
            "upgrade, or reload the nvidia kernel modules" % exc)
    if isinstance(exc, _err("NO_PERMISSION")):
        return NvmlError("no permission to use NVML (%s): run as root or give access to /dev/nvidiactl" % exc)
    return NvmlError("nvmlInit failed: %s" % exc)


def pid_exists(pid):
    """True when pid is a live process in this PID namespace.

    A zombie counts as gone: it holds no GPU memory, so NVML listing one means someone
    else (typically a forked child) holds the memory."""
    if not pid or pid < 0:
        return False
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    # The state letter follows the command name, which is in parentheses and may hold spaces.
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def _mib(value):
    return None if value is None else int(value) // _MIB


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlSession(object):
    """NVML initialised once, read many times, always shut down on close().

    nvml_verify polls through one session so each poll costs only the reads."""

    def __init__(self, call_timeout=5.0):
        if not HAS_PYNVML:
            raise NvmlError("the Python library nvidia-ml-py (import pynvml) is not installed")
        self._caller = _BoundedCaller(call_timeout)
        self._open = False

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc_info):
        self.close()

    def open(self):
        try:
            self._caller.call("nvmlInit", pynvml.nvmlInit)
        except pynvml.NVMLError as exc:
            self._caller.stop()
            raise _init_error(exc) from None
        except NvmlError:
            self._caller.stop()
            raise
        self._open = True

    def close(self):
        """Shut NVML down, bounded in time like every other call; a hang here is ignored
        (the process keeps /dev/nvidia* only until it exits)."""
        if self._open and self._caller.stuck is None:
            self._open = False
            try:
                self._caller.call("nvmlShutdown", pynvml.nvmlShutdown)
            except (pynvml.NVMLError, NvmlError):
                pass
        self._caller.stop()

    # _call, _optional and _processes run inside a worker job (see read()).
    def _call(self, what, func, *args, **kwargs):
        try:
            return self._caller.step(what, func, *args, **kwargs)
        except pynvml.NVMLError as exc:
            if isinstance(exc, _err("GPU_IS_LOST")):
                raise
            raise NvmlError("NVML call %s failed: %s" % (what, exc)) from None

    def _optional(self, what, func, *args):
        """A health counter that some GPUs do not have: None when 'Not Supported'."""
        try:
            return self._caller.step(what, func, *args)
        except _err("NOT_SUPPORTED") + _err("FUNCTION_NOT_FOUND"):
            return None
        except pynvml.NVMLError as exc:
            if isinstance(exc, _err("GPU_IS_LOST")):
                raise
            raise NvmlError("NVML call %s failed: %s" % (what, exc)) from None

    def read(self, gpus=None):
        """One snapshot of the GPUs with these indices (all when None); see snapshot()."""
        return self._caller.run(lambda: self._read(gpus))

    def _read(self, gpus):
        driver = self._call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        count = self._call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        wanted = list(range(count)) if gpus is None else sorted(set(int(i) for i in gpus))
        result = {"driver_version": _text(driver), "count": count, "gpus": [], "lost": []}
        # Every handle is taken, selected or not: a GPU that fell off the bus shows up here.
        handles = {}
        for index in range(count):
            try:
                handles[index] = self._caller.step("nvmlDeviceGetHandleByIndex(%d)" % index,
                                                   pynvml.nvmlDeviceGetHandleByIndex, index)
            except pynvml.NVMLError as exc:
                result["lost"].append({"index": index, "error": str(exc)})
        for index in wanted:
            if index >= count:
                result["lost"].append({"index": index, "error": "no longer listed by NVML (%d GPUs)" % count})
                continue
            if index not in handles:
                continue
            try:
                result["gpus"].append(self._read_gpu(index, handles[index]))
            except pynvml.NVMLError as exc:
                result["lost"].append({"index": index, "error": str(exc)})
        result["lost"].sort(key=lambda item: item["index"])
        return result

    def _processes(self, index, handle, kind):
        name = "Compute" if kind == "compute" else "Graphics"
        newest = getattr(pynvml, "nvmlDeviceGet%sRunningProcesses" % name)
        older = getattr(pynvml, "nvmlDeviceGet%sRunningProcesses_v2" % name)
        what = "nvmlDeviceGet%sRunningProcesses on GPU %d" % (name, index)
        try:
            found = self._caller.step(what, newest, handle)
        except (pynvml.NVMLLibraryMismatchError,) + _err("FUNCTION_NOT_FOUND"):
            # A driver older than the bindings exports only the _v2 entry point.
            found = self._call(what, older, handle)
        except pynvml.NVMLError as exc:
            if isinstance(exc, _err("GPU_IS_LOST")):
                raise
            raise NvmlError("NVML call %s failed: %s" % (what, exc)) from None
        return [{"pid": int(proc.pid), "used_mib": _mib(proc.usedGpuMemory), "type": kind,
                 "exists": pid_exists(int(proc.pid))} for proc in found]

    def _read_gpu(self, index, handle):
        on = " on GPU %d" % index
        memory = self._call("nvmlDeviceGetMemoryInfo_v2" + on, pynvml.nvmlDeviceGetMemoryInfo,
                            handle, version=pynvml.nvmlMemory_v2)
        legacy = self._optional("nvmlDeviceGetMemoryInfo" + on, pynvml.nvmlDeviceGetMemoryInfo, handle)
        remap = self._optional("nvmlDeviceGetRemappedRows" + on, pynvml.nvmlDeviceGetRemappedRows, handle)
        retired = self._optional("nvmlDeviceGetRetiredPagesPendingStatus" + on,
                                 pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        return {
            "index": index,
            "uuid": _text(self._call("nvmlDeviceGetUUID" + on, pynvml.nvmlDeviceGetUUID, handle)),
            "name": _text(self._call("nvmlDeviceGetName" + on, pynvml.nvmlDeviceGetName, handle)),
            "pci_bus_id": _text(self._call("nvmlDeviceGetPciInfo" + on, pynvml.nvmlDeviceGetPciInfo, handle).busId),
            "memory_total_mib": _mib(memory.total),
            "memory_used_mib": _mib(memory.used),
            "memory_reserved_mib": _mib(memory.reserved),
            "memory_used_v1_mib": None if legacy is None else _mib(legacy.used),
            "processes": self._processes(index, handle, "compute") + self._processes(index, handle, "graphics"),
            "ecc_uncorrected_volatile": self._optional(
                "nvmlDeviceGetTotalEccErrors" + on, pynvml.nvmlDeviceGetTotalEccErrors, handle,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
            "remapped_rows": None if remap is None else {
                "correctable": int(remap[0]), "uncorrectable": int(remap[1]),
                "pending": bool(remap[2]), "failed": bool(remap[3])},
            "retired_pages_pending": None if retired is None else bool(retired),
        }


def snapshot(gpus=None, call_timeout=5.0):
    """Initialise NVML, read the GPUs with these indices (all when None), shut NVML down.

    Returns {"driver_version", "count", "gpus": [...], "lost": [{"index", "error"}]}: one
    entry in "gpus" per readable GPU (see NvmlSession._read_gpu for its keys; None means
    'Not Supported' on that GPU) and one in "lost" per GPU NVML could not reach (fell off
    the bus, or no longer listed). Raises NvmlError with a user-facing sentence."""
    with NvmlSession(call_timeout) as session:
        return session.read(gpus)


def unattributed_mib(gpu):
    """MiB in use on this GPU that no process visible here accounts for.

    Inside a container NVML hides other namespaces' pids while "used" still counts their
    memory; on a host it points at a dead pid whose forked child holds the memory. None
    when a visible process's share is unknown to NVML."""
    visible = {}
    for proc in gpu["processes"]:
        if proc["exists"]:
            if proc["used_mib"] is None:
                return None
            # A process can be listed as compute and graphics: count it once.
            visible[proc["pid"]] = max(visible.get(proc["pid"], 0), proc["used_mib"])
    return max(0, gpu["memory_used_mib"] - sum(visible.values()))


def resolve_gpus(snap, selectors):
    """Indices for selectors (indices as int or digit strings, or UUIDs); all when empty.

    Needs a snapshot of every GPU. Raises ValueError naming the valid indices and UUIDs."""
    count = snap["count"]
    if not selectors:
        return list(range(count))
    by_uuid = dict((gpu["uuid"].lower(), gpu["index"]) for gpu in snap["gpus"])
    chosen = set()
    for selector in selectors:
        text = str(selector).strip()
        if isinstance(selector, bool):
            index = None
        elif isinstance(selector, int) or text.isdigit():
            index = int(text)
            if index >= count:
                index = None
        else:
            index = by_uuid.get(text.lower())
        if index is None:
            valid = ", ".join("%s (%d)" % (gpu["uuid"], gpu["index"]) for gpu in snap["gpus"])
            raise ValueError(
                "unknown GPU %r: this host has GPU indices %s and UUIDs %s"
                % (selector, "0-%d" % (count - 1) if count else "(none)", valid or "(none)"))
        chosen.add(index)
    return sorted(chosen)
