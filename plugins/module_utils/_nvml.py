# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One NVML snapshot: per-GPU memory (v2), processes and health counters.

Private to this collection: the only place that talks to NVML. gpu_reset reads it for
hints (snapshot), nvml_verify pins the selected GPUs and polls them (NvmlSession.select,
read_selected). Every NVML call runs in a worker thread and is given up after
``call_timeout`` seconds, or at the session's deadline if that comes first, because a
GPU in a bad state can block a driver call for minutes. NVML is always shut down before
``snapshot()`` returns: after nvmlInit the calling process itself holds /dev/nvidia*,
which must not happen while gpu_reset signals the holders.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
import traceback

from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import InputProblem

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


class NvmlTimeout(NvmlError):
    """An NVML call that had not returned when its time was up.

    cause is "call_timeout" (this one call outlasted call_timeout: the GPU or driver is hung)
    or "timeout" (the caller's overall deadline came first). call is the NVML function,
    gpu the identity of the GPU it was for ({index, uuid, pci_bus_id}, None for a call on
    the whole system), running_s how long it had been running (None when time ran out
    between two calls), limit_s the limit it met (call_timeout, or the overall timeout)."""

    def __init__(self, call, gpu, running_s, limit_s, cause):
        self.call = call
        self.gpu = gpu
        self.running_s = running_s
        self.limit_s = limit_s
        self.cause = cause
        on = " on %s" % describe_gpu(gpu) if gpu else ""
        if cause == "call_timeout":
            reset = " -i %d" % gpu["index"] if gpu and gpu.get("index") is not None else ""
            message = ("NVML call %s%s did not return within %g s: the GPU or its driver is hung; check `dmesg` "
                       "for Xid errors, then reset the GPU (nvidia-smi -r%s) or reboot" % (call, on, limit_s, reset))
        else:
            running = ("had been running for %.1f s" % running_s if running_s is not None
                       else "was the last call made")
            message = ("the %g s timeout ran out while NVML call %s%s %s: NVML answers slowly or the GPU is hung; "
                       "check `dmesg` for Xid errors, and give a longer timeout if NVML is only slow"
                       % (limit_s, call, on, running))
        super().__init__(message)

    def as_dict(self):
        """The call that had not returned, for a module's result."""
        gpu = self.gpu or {}
        return {"call": self.call, "index": gpu.get("index"), "uuid": gpu.get("uuid"),
                "pci_bus_id": gpu.get("pci_bus_id"),
                "running_s": None if self.running_s is None else round(self.running_s, 3),
                "cause": self.cause}


class _Abandoned(Exception):
    """Raised in the worker at its next call once the waiting thread has given up on its job."""


def _err(name):
    """The pynvml exception class for one NVML_ERROR_* code (a tuple, for except clauses)."""
    code = getattr(pynvml, "NVML_ERROR_" + name, None)
    if code is None:
        return ()
    return (pynvml.nvmlExceptionClass(code),)


def describe_gpu(gpu):
    """'GPU 3 (GPU-5b3a..., 00000000:1B:00.0)': how every message names a GPU.

    Index first (what nvidia-smi shows), then what names the card whatever the enumeration:
    its UUID and PCI bus id, or that they are unknown (a GPU lost before NVML told them)."""
    index = gpu.get("index")
    name = "GPU %d" % index if index is not None else "GPU at an unknown index"
    return "%s (%s, %s)" % (name, gpu.get("uuid") or "UUID unknown", gpu.get("pci_bus_id") or "PCI bus id unknown")


class Sink:
    """Where a read job leaves each result as soon as it has it.

    When time runs out the waiting thread closes the sink and keeps what is there: a read
    cut short still reports the GPUs it finished. Nothing arrives after close()."""

    def __init__(self):
        self._lock = threading.Lock()
        self._items = {}
        self._closed = False

    def put(self, key, value):
        with self._lock:
            if not self._closed:
                self._items[key] = value

    def close(self):
        with self._lock:
            self._closed = True
            return dict(self._items)


class _BoundedCaller:
    """Runs NVML work in one daemon thread and gives up on any single NVML call that takes
    longer than call_timeout, or that is still running at the deadline.

    deadline (a time.monotonic() value, or None) bounds everything run through this caller:
    each call's limit is min(call_timeout, time left); budget_s is the timeout it stands for,
    as messages say it. A whole read (a few calls per GPU) is one job, so a poll costs one
    hand-off between threads, not one per call; the worker notes which call it is in and
    since when, which is what the waiting thread times. When time is up the job is abandoned:
    it makes no further call, and if a call of it never returns (a daemon thread cannot keep
    the module alive), every later job fails at once instead of queueing behind it."""

    def __init__(self, call_timeout, deadline=None, budget_s=None):
        self.call_timeout = call_timeout
        self.deadline = deadline
        self.budget_s = budget_s
        self.stuck = None
        self._job = None      # the job the worker is running: {"abandoned": bool, "current": ...}
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="nvml-calls", daemon=True)
        self._thread.start()

    def _work(self):
        while True:
            item = self._jobs.get()
            if item is None:
                return
            func, job, box, done = item
            self._job = job
            try:
                box["value"] = func()
            except BaseException as exc:  # pylint: disable=broad-exception-caught
                box["error"] = exc
            done.set()

    def step(self, call, gpu, func, *args, **kwargs):
        """One NVML call inside a job, timed from now by the waiting thread; gpu is the
        identity ({index, uuid, pci_bus_id}) of the GPU it is for, or None."""
        job = self._job
        if job["abandoned"]:
            raise _Abandoned()
        job["current"] = (call, gpu, time.monotonic(), True)
        try:
            return func(*args, **kwargs)
        finally:
            job["current"] = (call, gpu, job["current"][2], False)

    def run(self, job_func, deadline=None):
        """Run job_func() in the worker; raise NvmlTimeout when one of its calls outlasts
        call_timeout or the deadline (this run's, else the caller's)."""
        if self.stuck is not None:
            raise NvmlError("NVML is not answering: %s never returned" % self.stuck)
        deadline = self.deadline if deadline is None else deadline
        job = {"abandoned": False, "current": None}
        box = {}
        done = threading.Event()
        queued = time.monotonic()
        self._jobs.put((job_func, job, box, done))
        while not done.is_set():
            current = job["current"]
            call, gpu, began, running = current if current is not None else ("(starting)", None, queued, True)
            now = time.monotonic()
            call_left = began + self.call_timeout - now if running else self.call_timeout
            deadline_left = deadline - now if deadline is not None else call_left
            if min(call_left, deadline_left) <= 0:
                job["abandoned"] = True
                if running:
                    self.stuck = call + (" on %s" % describe_gpu(gpu) if gpu else "")
                if call_left <= 0:
                    raise NvmlTimeout(call, gpu, now - began, self.call_timeout, "call_timeout")
                raise NvmlTimeout(call, gpu, now - began if running else None, self.budget_s, "timeout")
            # Wake when either limit is due; the call in flight changes meanwhile, so look again.
            done.wait(max(0.001, min(call_left, deadline_left)))
        if "error" in box:
            raise box["error"]
        return box["value"]

    def call(self, what, func, *args, **kwargs):
        """One NVML call as its own job."""
        return self.run(lambda: self.step(what, None, func, *args, **kwargs))

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


def _mib(value):
    return None if value is None else int(value) // _MIB


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# What a GPU selector may be. An index is a position in NVML's enumeration, which a GPU that
# is not probed at driver load shifts; a UUID or a PCI bus id names the card itself.
_INDEX = re.compile(r"[0-9]+\Z")
_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z", re.IGNORECASE)
_BUS_ID = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.([0-7]))?\Z", re.IGNORECASE)
SELECTOR_FORMS = ("a GPU index (0), a UUID (GPU-5b3a7c1e-0d2f-4e8a-9c61-3f2b1a0e9d77) or a PCI bus id "
                  "(00000000:18:00.0)")


def parse_selector(selector):
    """("index", int), ("uuid", "GPU-...") or ("pci_bus_id", "0000000D:BB:DD.F"), or None when
    selector is none of them.

    PCI bus ids come in the forms NVML accepts (domain:bus:device.function, domain:bus:device,
    bus:device.function, hexadecimal) and are returned in NVML's own form, so two spellings of
    one bus id compare equal."""
    if isinstance(selector, bool):
        return None
    if isinstance(selector, int):
        return ("index", selector) if selector >= 0 else None
    if not isinstance(selector, str):
        return None
    text = selector.strip()
    if _INDEX.match(text):
        return ("index", int(text))
    if _UUID.match(text):
        return ("uuid", "GPU-" + text[4:].lower())
    match = _BUS_ID.match(text)
    if match and (match.group(1) is not None or match.group(4) is not None):  # "18:00" alone is not a form
        numbers = [int(part or "0", 16) for part in match.groups()]  # domain, bus, device, function
        return ("pci_bus_id", "%08X:%02X:%02X.%X" % tuple(numbers))
    return None


def same_bus_id(first, second):
    """Whether two PCI bus ids, in any form NVML accepts, name the same device."""
    one, other = parse_selector(first or ""), parse_selector(second or "")
    return bool(one and other and one[0] == other[0] == "pci_bus_id" and one[1] == other[1])


class _GpuFailure(Exception):
    """An NVML call on one GPU failed: that GPU cannot be read, the others still can."""

    def __init__(self, call, exc):
        super().__init__(str(exc))
        self.call = call
        self.lost = bool(isinstance(exc, _err("GPU_IS_LOST")))
        self.error = str(exc)

    def as_dict(self):
        return {"call": self.call, "error": self.error, "lost": self.lost}


class NvmlSession:
    """NVML initialised once, read many times, always shut down on close().

    nvml_verify polls through one session so each poll costs only the reads. Two ways to read:
    read() enumerates by index every time (one snapshot, what gpu_reset needs); select() pins
    GPUs once and read_selected() then reads only them, through the handles taken when they
    were pinned, so a GPU that leaves the enumeration is reported lost under its own UUID and
    bus id instead of another card taking its index, and a GPU that is not selected is never
    touched (a hung one cannot block the others)."""

    def __init__(self, call_timeout=5.0, deadline=None, budget_s=None):
        if not HAS_PYNVML:
            raise NvmlError("the Python library nvidia-ml-py (import pynvml) is not installed")
        self._caller = _BoundedCaller(call_timeout, deadline, budget_s)
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
        (the process keeps /dev/nvidia* only until it exits). Past the deadline, the
        shutdown still gets one second: it is quick unless the driver is hung."""
        if self._open and self._caller.stuck is None:
            self._open = False
            deadline = self._caller.deadline
            if deadline is not None:
                deadline = max(deadline, time.monotonic()) + 1.0
            try:
                self._caller.run(lambda: self._caller.step("nvmlShutdown", None, pynvml.nvmlShutdown), deadline)
            except (pynvml.NVMLError, NvmlError):
                pass
        self._caller.stop()

    # Everything below runs inside a worker job (see _BoundedCaller.run).

    def _system(self, call, func, *args):
        """A call on the whole system: its failure fails the read."""
        try:
            return self._caller.step(call, None, func, *args)
        except pynvml.NVMLError as exc:
            raise NvmlError("NVML call %s failed: %s" % (call, exc)) from None

    def _on_gpu(self, call, gpu, func, *args, **kwargs):
        try:
            return self._caller.step(call, gpu, func, *args, **kwargs)
        except pynvml.NVMLError as exc:
            raise _GpuFailure(call, exc) from None

    def _optional(self, call, gpu, func, *args):
        """A health counter that some GPUs do not have: None when 'Not Supported'."""
        try:
            return self._caller.step(call, gpu, func, *args)
        except _err("NOT_SUPPORTED") + _err("FUNCTION_NOT_FOUND"):
            return None
        except pynvml.NVMLError as exc:
            raise _GpuFailure(call, exc) from None

    def _identity(self, gpu, handle):
        """What names this GPU whatever the enumeration does: UUID and PCI bus id (and its
        name, and the N of /dev/nvidiaN). gpu holds its index."""
        gpu = {"index": gpu["index"], "uuid": gpu.get("uuid"), "pci_bus_id": gpu.get("pci_bus_id")}
        gpu["uuid"] = _text(self._on_gpu("nvmlDeviceGetUUID", gpu, pynvml.nvmlDeviceGetUUID, handle))
        gpu["pci_bus_id"] = _text(self._on_gpu("nvmlDeviceGetPciInfo", gpu, pynvml.nvmlDeviceGetPciInfo, handle).busId)
        gpu["name"] = _text(self._on_gpu("nvmlDeviceGetName", gpu, pynvml.nvmlDeviceGetName, handle))
        minor = self._optional("nvmlDeviceGetMinorNumber", gpu, pynvml.nvmlDeviceGetMinorNumber, handle)
        gpu["minor_number"] = None if minor is None else int(minor)
        return gpu

    def _processes(self, gpu, handle, kind):
        name = "Compute" if kind == "compute" else "Graphics"
        newest = getattr(pynvml, "nvmlDeviceGet%sRunningProcesses" % name)
        older = getattr(pynvml, "nvmlDeviceGet%sRunningProcesses_v2" % name)
        call = "nvmlDeviceGet%sRunningProcesses" % name
        try:
            found = self._caller.step(call, gpu, newest, handle)
        except (pynvml.NVMLLibraryMismatchError,) + _err("FUNCTION_NOT_FOUND"):
            # A driver older than the bindings exports only the _v2 entry point.
            found = self._on_gpu(call + "_v2", gpu, older, handle)
        except pynvml.NVMLError as exc:
            raise _GpuFailure(call, exc) from None
        # "exists": a live process in this PID namespace. An exited one (a zombie) holds no GPU
        # memory, so NVML listing it means someone else (typically a forked child) holds it.
        return [{"pid": int(proc.pid), "used_mib": _mib(proc.usedGpuMemory), "type": kind,
                 "exists": _procs.alive(int(proc.pid))} for proc in found]

    def _counters(self, gpu, handle):
        """Memory, processes and health counters of one GPU (None: 'Not Supported' there)."""
        memory = self._on_gpu("nvmlDeviceGetMemoryInfo_v2", gpu, pynvml.nvmlDeviceGetMemoryInfo,
                              handle, version=pynvml.nvmlMemory_v2)
        legacy = self._optional("nvmlDeviceGetMemoryInfo", gpu, pynvml.nvmlDeviceGetMemoryInfo, handle)
        processes = self._processes(gpu, handle, "compute") + self._processes(gpu, handle, "graphics")
        ecc = self._optional("nvmlDeviceGetTotalEccErrors", gpu, pynvml.nvmlDeviceGetTotalEccErrors, handle,
                             pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        remap = self._optional("nvmlDeviceGetRemappedRows", gpu, pynvml.nvmlDeviceGetRemappedRows, handle)
        retired = self._optional("nvmlDeviceGetRetiredPagesPendingStatus", gpu,
                                 pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        return {
            "memory_total_mib": _mib(memory.total),
            "memory_used_mib": _mib(memory.used),
            "memory_reserved_mib": _mib(memory.reserved),
            "memory_used_v1_mib": None if legacy is None else _mib(legacy.used),
            "processes": processes,
            "ecc_uncorrected_volatile": None if ecc is None else int(ecc),
            "remapped_rows": None if remap is None else {
                "correctable": int(remap[0]), "uncorrectable": int(remap[1]),
                "pending": bool(remap[2]), "failed": bool(remap[3])},
            "retired_pages_pending": None if retired is None else bool(retired),
        }

    # ----- one snapshot by index (gpu_reset) -----

    def read(self, gpus=None):
        """One snapshot of the GPUs with these indices (all when None); see snapshot()."""
        return self._caller.run(lambda: self._read(gpus))

    def _read(self, gpus):
        driver = self._system("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        count = int(self._system("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))
        wanted = list(range(count)) if gpus is None else sorted({int(i) for i in gpus})
        result = {"driver_version": _text(driver), "count": count, "gpus": [], "lost": []}
        for index in wanted:
            if index >= count:
                result["lost"].append({"index": index, "uuid": None, "pci_bus_id": None,
                                       "error": "no longer listed by NVML (%d GPUs)" % count})
                continue
            gpu = {"index": index, "uuid": None, "pci_bus_id": None}
            try:
                handle = self._on_gpu("nvmlDeviceGetHandleByIndex", gpu, pynvml.nvmlDeviceGetHandleByIndex, index)
                gpu = self._identity(gpu, handle)
                gpu.update(self._counters(gpu, handle))
            except _GpuFailure as failure:
                result["lost"].append({"index": index, "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"],
                                       "error": failure.error})
            else:
                result["gpus"].append(gpu)
        return result

    # ----- pinned GPUs, read again and again (nvml_verify) -----

    def select(self, selectors):
        """Pin the GPUs the selectors name (every GPU NVML lists when empty).

        Returns {"driver_version", "count", "gpus": [...]}: per GPU its index, uuid, pci_bus_id,
        name, minor_number, and "unreachable" ({call, error, lost}) when NVML could not reach it,
        in index order, each GPU once. An index is resolved here, once: later reads go through
        the handle taken now. A UUID or PCI bus id of a GPU that is lost is pinned (and reported
        lost under that name); one NVML does not know raises InputProblem naming the GPUs there are."""
        return self._caller.run(lambda: self._select(list(selectors or [])))

    def _select(self, selectors):
        driver = _text(self._system("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
        count = int(self._system("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))
        if not selectors:
            selectors = list(range(count))
        pinned = []
        for selector in selectors:
            parsed = parse_selector(selector)
            gpu = None if parsed is None or (parsed[0] == "index" and parsed[1] >= count) else self._pin(*parsed)
            if gpu is None:
                raise InputProblem(self._unknown(selector, count))
            pinned.append(gpu)
        return {"driver_version": driver, "count": count, "gpus": _unique(pinned)}

    def _pin(self, kind, key):
        """The GPU this selector names, with its handle; None when NVML does not know it."""
        gpu = {"index": None, "uuid": None, "pci_bus_id": None, "name": None, "minor_number": None}
        gpu[kind] = key
        lookup = {"index": pynvml.nvmlDeviceGetHandleByIndex, "uuid": pynvml.nvmlDeviceGetHandleByUUID,
                  "pci_bus_id": pynvml.nvmlDeviceGetHandleByPciBusId}[kind]
        call = {"index": "nvmlDeviceGetHandleByIndex", "uuid": "nvmlDeviceGetHandleByUUID",
                "pci_bus_id": "nvmlDeviceGetHandleByPciBusId"}[kind]
        try:
            try:
                handle = self._caller.step(call, gpu, lookup, key)
            except _err("NOT_FOUND"):
                return None
            except pynvml.NVMLError as exc:
                raise _GpuFailure(call, exc) from None
            if gpu["index"] is None:
                gpu["index"] = int(self._on_gpu("nvmlDeviceGetIndex", gpu, pynvml.nvmlDeviceGetIndex, handle))
            gpu.update(self._identity(gpu, handle))
        except _GpuFailure as failure:
            return dict(gpu, handle=None, unreachable=failure.as_dict())
        return dict(gpu, handle=handle, unreachable=None)

    def _unknown(self, selector, count):
        """The sentence for a selector NVML does not know, naming what there is (bounded like
        every call; a GPU that cannot be read is listed as such)."""
        listed = []
        for index in range(count):
            gpu = {"index": index, "uuid": None, "pci_bus_id": None}
            try:
                handle = self._on_gpu("nvmlDeviceGetHandleByIndex", gpu, pynvml.nvmlDeviceGetHandleByIndex, index)
                uuid = _text(self._on_gpu("nvmlDeviceGetUUID", gpu, pynvml.nvmlDeviceGetUUID, handle))
                bus = _text(self._on_gpu("nvmlDeviceGetPciInfo", gpu, pynvml.nvmlDeviceGetPciInfo, handle).busId)
                listed.append("%s (%d, %s)" % (uuid, index, bus))
            except _GpuFailure as failure:
                listed.append("(%d, %s)" % (index, failure.error))
        return ("unknown GPU %r: this host has GPU indices %s and UUIDs %s"
                % (selector, "0-%d" % (count - 1) if count else "(none)", ", ".join(listed) or "(none)"))

    def read_selected(self, gpus, sink):
        """Read the pinned GPUs (from select()) through their handles; skip the unreachable.

        Each result goes into sink as soon as it is complete: sink.put("count", n), and per GPU
        sink.put(position in gpus, counters or {"unreachable": {call, error, lost}}), so a read
        that time cuts short still leaves what it finished."""
        return self._caller.run(lambda: self._read_selected(gpus, sink))

    def _read_selected(self, gpus, sink):
        sink.put("count", int(self._system("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)))
        for position, gpu in enumerate(gpus):
            if gpu.get("unreachable") or gpu.get("handle") is None:
                continue  # lost stays lost: only a GPU reset or a reboot brings it back
            ident = {"index": gpu["index"], "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"]}
            try:
                sink.put(position, self._counters(ident, gpu["handle"]))
            except _GpuFailure as failure:
                sink.put(position, {"unreachable": failure.as_dict()})


def _unique(gpus):
    """Each GPU once (a selector by index and one by UUID may name the same), in index order."""
    seen, unique = set(), []
    for gpu in gpus:
        key = gpu["uuid"] or gpu["pci_bus_id"] or gpu["index"]
        if key not in seen:
            seen.add(key)
            unique.append(gpu)
    return sorted(unique, key=lambda gpu: (gpu["index"] is None, gpu["index"] or 0))


def snapshot(gpus=None, call_timeout=5.0):
    """Initialise NVML, read the GPUs with these indices (all when None), shut NVML down.

    Returns {"driver_version", "count", "gpus": [...], "lost": [{"index", "uuid", "pci_bus_id",
    "error"}]}: one entry in "gpus" per readable GPU (index, uuid, name, pci_bus_id,
    minor_number, then the counters of NvmlSession._counters; None means 'Not Supported' on
    that GPU) and one in "lost" per GPU NVML could not reach (fell off the bus, or no longer
    listed; uuid and pci_bus_id None unless NVML told them before failing). Raises NvmlError
    with a user-facing sentence."""
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
    """Indices for selectors (indices as int or digit strings, UUIDs or PCI bus ids); all when empty.

    Needs a snapshot of every GPU. Raises InputProblem naming the valid indices and UUIDs."""
    count = snap["count"]
    if not selectors:
        return list(range(count))
    chosen = set()
    for selector in selectors:
        parsed = parse_selector(selector)
        index = None
        if parsed is not None and parsed[0] == "index":
            index = parsed[1] if parsed[1] < count else None
        elif parsed is not None:
            for gpu in snap["gpus"] + snap.get("lost", []):
                if (gpu.get("uuid") or "").lower() == parsed[1].lower() or same_bus_id(gpu.get("pci_bus_id"), parsed[1]):
                    index = gpu["index"]
        if index is None:
            valid = ", ".join("%s (%d)" % (gpu["uuid"], gpu["index"]) for gpu in snap["gpus"])
            raise InputProblem(
                "unknown GPU %r: this host has GPU indices %s and UUIDs %s"
                % (selector, "0-%d" % (count - 1) if count else "(none)", valid or "(none)"))
        chosen.add(index)
    return sorted(chosen)
