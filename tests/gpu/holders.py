"""The processes a crashed inference server leaves on a real GPU, one per scenario.

    python3 -m tests.gpu.holders ROLE --ready FILE [--mib N] [--tag TAG]

Each role writes its pid(s) to FILE as JSON once it holds what it should, then sleeps until it
is killed. Roles:
  hold          a CUDA process holding --mib MiB (scenario 1)
  fork-child    initialise CUDA, allocate, fork; the parent exits, the child keeps the memory
                alive through the inherited device fds while NVML lists the dead parent (scenario 2)
  ignore-term   a worker that ignores SIGTERM while holding memory (scenario 3)
  spawn-tree    a parent that holds nothing and multiprocessing "spawn" workers that do; the
                command line carries --tag so the role's cmdline_patterns can name it (scenario 4)
  nvml-monitor  calls nvmlInit and only reads, named nvidia-persistenced: must survive (scenario 5)
  shm-leftovers torch shared-memory tensors (file_system strategy) and multiprocessing shared
                memory, then the process is SIGKILLed by the scenario, leaving torch_* and psm_*
                segments in /dev/shm (scenario 6)
Nothing here changes a GPU setting.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time


def set_name(name: str) -> None:
    """Set the 15-character kernel process name (what ps and psutil show)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def report(path: str, payload: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)


def allocate(mib: int):
    import torch  # pylint: disable=import-outside-toplevel
    block = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    return block


def sleep_forever():
    while True:
        time.sleep(3600)


def hold(args):
    set_name("VLLM::Worker_TP0")
    block = allocate(args.mib)  # noqa: F841  (kept alive until killed)
    report(args.ready, {"pids": [os.getpid()]})
    sleep_forever()


def fork_child(args):
    set_name("VLLM::EngineCor")
    block = allocate(args.mib)  # noqa: F841
    child = os.fork()
    if child == 0:
        # The child touches no CUDA state (undefined after fork); it only keeps the inherited fds.
        set_name("VLLM::Worker")
        sleep_forever()
    report(args.ready, {"pids": [child], "dead_parent": os.getpid()})
    os._exit(0)  # the parent dies; NVML keeps listing its pid while the child holds the context


def ignore_term(args):
    set_name("VLLM::Worker_TP1")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    block = allocate(args.mib)  # noqa: F841
    report(args.ready, {"pids": [os.getpid()]})
    sleep_forever()


def _spawn_worker(mib, queue):
    block = allocate(mib)  # noqa: F841
    queue.put(os.getpid())
    sleep_forever()


def spawn_tree(args):
    import multiprocessing  # pylint: disable=import-outside-toplevel
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_spawn_worker, args=(args.mib, queue)) for _worker in range(2)]
    for worker in workers:
        worker.start()
    pids = [queue.get(timeout=300) for _worker in workers]
    report(args.ready, {"pids": [os.getpid()] + pids, "parent": os.getpid()})
    sleep_forever()


def nvml_monitor(args):
    import pynvml  # pylint: disable=import-outside-toplevel
    set_name("nvidia-persistenced")
    pynvml.nvmlInit()
    pynvml.nvmlDeviceGetHandleByIndex(0)
    report(args.ready, {"pids": [os.getpid()]})
    sleep_forever()


def shm_leftovers(args):
    import torch  # pylint: disable=import-outside-toplevel
    import torch.multiprocessing as tmp  # pylint: disable=import-outside-toplevel
    from multiprocessing import shared_memory  # pylint: disable=import-outside-toplevel
    tmp.set_sharing_strategy("file_system")
    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    tensors = [torch.full((1 << 20,), i, dtype=torch.float32) for i in range(4)]
    for tensor in tensors:
        queue.put(tensor)  # pickling shares the storage through a torch_<pid>_* segment
    segments = [shared_memory.SharedMemory(create=True, size=1 << 20) for _segment in range(3)]
    report(args.ready, {"pids": [os.getpid()], "psm": [seg.name for seg in segments]})
    sleep_forever()


ROLES = {"hold": hold, "fork-child": fork_child, "ignore-term": ignore_term, "spawn-tree": spawn_tree,
         "nvml-monitor": nvml_monitor, "shm-leftovers": shm_leftovers}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m tests.gpu.holders")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--ready", required=True)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--tag", default="", help="a marker for cmdline_patterns")
    args = parser.parse_args(argv)
    ROLES[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
