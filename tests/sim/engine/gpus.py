"""The stand-in's GPU workers: one child process per tensor-parallel rank that holds its GPU the
way a CUDA worker does (vLLM's VLLM::Worker_TP<n>, SGLang's sglang::scheduler_TP<n>): it opens
/dev/nvidia<n>, /dev/nvidiactl and /dev/nvidia-uvm and maps each one (one page, MAP_PRIVATE, as a
CUDA context does: gpu_reset takes a process that only has device files open for a client and
leaves it alone), keeps an NCCL-like segment open in the shm directory (STANDIN_SHM_DIR, if set),
and registers its memory in the fake NVML, so that gpu_reset finds it, NVML shows its memory, and
node_reset frees both. A device file that cannot be mapped (a 1:3 node, /dev/null) stops the
worker, as it would stop CUDA: the stand-in never holds GPUs that gpu_reset cannot see.

A worker exits when its API server closes the control pipe (a clean stop, or the server's
death), unless the server was told to leave orphans behind (the orphan_workers fault).
"""
from __future__ import annotations

import ctypes
import os
import secrets
import select
import signal
import sys
import time

from ..program import map_device

PR_SET_NAME = 15
DEVICES = ("nvidia%d", "nvidiactl", "nvidia-uvm")


class EngineError(RuntimeError):
    """The engine would die with this message (printed to stderr, exit status 1)."""


def set_name(name: str) -> None:
    """The kernel keeps 15 characters of a process name, as for the real workers."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def visible_gpus(env, tp: int, dev_dir, nvml=None) -> list:
    """The GPU indices the ranks use: CUDA_VISIBLE_DEVICES (indices or UUIDs), else all."""
    present = sorted(int(name[6:]) for name in os.listdir(dev_dir)
                     if name.startswith("nvidia") and name[6:].isdigit())
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        indices = present
    else:
        uuids = {gpu["uuid"]: gpu["index"] for gpu in nvml.gpus()} if nvml else {}
        indices = []
        for item in (part.strip() for part in listed.split(",") if part.strip()):
            if item.isdigit():
                indices.append(int(item))
            elif item in uuids:
                indices.append(uuids[item])
            else:
                break  # CUDA stops at the first entry it cannot parse
        indices = [i for i in indices if i in present]
    if len(indices) < tp:
        raise EngineError("RuntimeError: tensor parallel size %d needs %d GPUs, %d visible (CUDA_VISIBLE_DEVICES=%s)"
                          % (tp, tp, len(indices), listed))
    return indices[:tp]


def _proc_start(pid: int):
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else int(fields[19])


def check_free(nvml, gpus: list, fraction: float) -> dict:
    """MiB each rank will hold; EngineError (vLLM's message) when other live processes leave too little."""
    if nvml is None:
        return {gpu: 0 for gpu in gpus}
    totals = {gpu["index"]: gpu["memory_total_mib"] for gpu in nvml.gpus()}
    used = {}
    for entry in nvml.registrations():
        if _proc_start(entry["pid"]) == entry["starttime"]:
            used[entry["gpu"]] = used.get(entry["gpu"], 0) + entry["mib"]
    want = {}
    for gpu in gpus:
        if gpu not in totals:
            raise EngineError("RuntimeError: CUDA error: invalid device ordinal (GPU %d)" % gpu)
        total = totals[gpu]
        want[gpu] = int(total * fraction)
        free = total - used.get(gpu, 0)
        if free < want[gpu]:
            raise EngineError(
                "ValueError: Free memory on device cuda:%d (%.2f/%.2f GiB) on startup is less than desired GPU "
                "memory utilization (%.2f, %.2f GiB). Decrease GPU memory utilization or reduce GPU memory used by "
                "other processes." % (gpu, free / 1024, total / 1024, fraction, want[gpu] / 1024))
    return want


def _worker(name: str, gpu: int, mib: int, dev_dir, nvml, shm_dir: str, control: int, ready: int,
            orphan: bool, ignore_term: bool) -> None:
    set_name(name)
    # The server's own handler was inherited with the fork: a worker dies of SIGTERM, as a real one.
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_term else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    held = []
    for dev in DEVICES:
        path = os.path.join(dev_dir, dev % gpu if "%" in dev else dev)
        held.append(os.open(path, os.O_RDWR))
        try:
            map_device(held[-1])
        except OSError as exc:
            raise EngineError("RuntimeError: CUDA error: cannot map %s: %s" % (path, os.strerror(exc.errno or 0))) \
                from exc
    segment = None
    if shm_dir:
        segment = os.path.join(shm_dir, "nccl-standin-%d-%s" % (gpu, secrets.token_hex(4)))
        held.append(os.open(segment, os.O_RDWR | os.O_CREAT, 0o600))
        os.write(held[-1], b"\0" * 65536)
    if nvml is not None and mib:
        nvml.register(os.getpid(), gpu, mib)
    os.write(ready, b"1")
    os.close(ready)
    while True:
        readable, _w, _x = select.select([control], [], [], 3600)
        if readable and not os.read(control, 1):
            break  # the API server closed the pipe, or died
    if orphan:
        while True:  # a crashed server's worker: holds its GPU until someone kills it
            signal.pause()
    if segment:
        os.unlink(segment)
    os._exit(0)


class Workers:
    def __init__(self):
        self.children = []  # (pid, control write end)

    def start(self, prefix: str, gpus: list, mib: dict, dev_dir, nvml, shm_dir: str, orphan: bool,
              ignore_term: bool, timeout: float = 60) -> None:
        for rank, gpu in enumerate(gpus):
            control_r, control_w = os.pipe()
            ready_r, ready_w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(control_w)
                    os.close(ready_r)
                    for _pid, other in self.children:
                        os.close(other)
                    _worker("%s%d" % (prefix, rank), gpu, mib.get(gpu, 0), dev_dir, nvml, shm_dir, control_r,
                            ready_w, orphan, ignore_term)
                except BaseException as exc:  # noqa: BLE001  # a child must never return into the server
                    sys.stderr.write("worker %d: %s\n" % (rank, exc))
                    os._exit(1)
            os.close(control_r)
            os.close(ready_w)
            self.children.append((pid, control_w))
            readable, _w, _x = select.select([ready_r], [], [], timeout)
            started = bool(readable) and os.read(ready_r, 1) == b"1"
            os.close(ready_r)
            if not started:
                raise EngineError("RuntimeError: worker for GPU %d did not start" % gpu)

    @property
    def pids(self) -> list:
        return [pid for pid, _fd in self.children]

    def stop(self, timeout: float = 10) -> None:
        for _pid, control in self.children:
            try:
                os.close(control)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for pid, _fd in self.children:
            while time.monotonic() < deadline:
                done, _status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.02)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        self.children = []
