"""The processes a crashed inference server leaves on a real GPU, one per scenario.

    python3 -m tests.gpu.holders ROLE --ready FILE [--mib N] [--tag TAG] [--device N]

Each role writes its pid(s) to FILE as JSON once it holds what it should, then sleeps until it
is killed. Roles:
  hold          a CUDA process holding --mib MiB on visible GPU --device (scenarios 1, 7-11; the
                scenario pins it with CUDA_VISIBLE_DEVICES or leaves every GPU visible)
  fork-child    initialise CUDA, allocate on --device, fork; the parent exits, the child keeps the
                memory alive through the inherited mappings while NVML lists the dead parent
                (scenarios 2 and 9)
  ignore-term   a worker that ignores SIGTERM while holding memory (scenario 3)
  spawn-tree    a parent that holds nothing and multiprocessing "spawn" workers that do; the
                command line carries --tag so the role's cmdline_patterns can name it (scenario 4)
  nvml-monitor  calls nvmlInit and only reads, named nvidia-persistenced: must survive (scenario 5)
  gpu-monitor   an NVML monitor that is not protected by name (pynvml reading memory in a loop): it
                opens every device file and maps none, so it must survive as a GPU client (scenario 10)
  cuda-init     initialises CUDA without creating a context (maps the GPU files, holds no memory):
                a GPU client beside a real holder (scenario 11)
  shm-leftovers torch shared-memory tensors (file_system strategy) and multiprocessing shared
                memory, then the process is SIGKILLed by the scenario, leaving torch_* and psm_*
                segments in /dev/shm (scenario 6)
  server        an inference server as a unit runs it (scenarios 12 and 13): an API-server-like
                parent without CUDA that first moves itself into the cgroup --cgroup (a directory
                named like a systemd unit) and then starts --workers workers of role --worker-role
                (hold: a TP-like worker with a context; open-devices: no context), every command
                line carrying --tag
  open-devices  a worker without CUDA that has every NVIDIA device file open and maps none (what a
                monitor or a tokenizer process beside the GPU workers looks like to the reset)
Nothing here changes a GPU setting.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import glob
import os
import signal
import subprocess
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


def allocate(mib: int, device: int = 0):
    """mib MiB on the visible GPU `device` (with every GPU visible, the context is made there only)."""
    import torch  # pylint: disable=import-outside-toplevel
    torch.cuda.set_device(device)
    block = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda:%d" % device)
    block.fill_(1)
    torch.cuda.synchronize()
    return block


def sleep_forever():
    while True:
        time.sleep(3600)


def hold(args):
    set_name("VLLM::Worker_TP0")
    block = allocate(args.mib, args.device)  # noqa: F841  (kept alive until killed)
    report(args.ready, {"pids": [os.getpid()]})
    sleep_forever()


def fork_child(args):
    set_name("VLLM::EngineCor")
    block = allocate(args.mib, args.device)  # noqa: F841
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


def gpu_monitor(args):
    import pynvml  # pylint: disable=import-outside-toplevel
    set_name("gpu-monitor")
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    report(args.ready, {"pids": [os.getpid()]})
    while True:
        for handle in handles:
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        time.sleep(0.5)


def cuda_init(args):
    import torch  # pylint: disable=import-outside-toplevel
    set_name("cuda-probe")
    torch.cuda.init()  # the driver is initialised; no context, no memory
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


def open_devices(args):
    set_name("VLLM::Tokenizer")
    # O_RDWR as NVML opens them; the descriptors stay open (never mapped) until the process is killed.
    fds = [os.open(path, os.O_RDWR) for path in sorted(glob.glob("/dev/nvidia*")) if not os.path.isdir(path)]
    report(args.ready, {"pids": [os.getpid()], "fds": len(fds)})
    sleep_forever()


def server(args):
    if args.cgroup:
        # Before any child starts, so the workers are born in the unit's cgroup as systemd's would be.
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
    set_name("vllm")
    workers = []
    for number in range(args.workers):
        ready = "%s.worker%d" % (args.ready, number)
        if os.path.exists(ready):  # an earlier scenario's server of the same name: its pids are not these
            os.unlink(ready)
        argv = [sys.executable, "-m", "tests.gpu.holders", args.worker_role, "--ready", ready, "--mib", str(args.mib),
                "--tag", args.tag, "--device", str(args.device)]
        workers.append((subprocess.Popen(argv, stdin=subprocess.DEVNULL), ready))
    pids = []
    for proc, ready in workers:
        while not os.path.exists(ready):
            if proc.poll() is not None:
                sys.exit("worker %d ended with rc=%s before it was ready" % (proc.pid, proc.returncode))
            time.sleep(0.05)
        with open(ready) as handle:
            pids += json.load(handle)["pids"]
    report(args.ready, {"pids": [os.getpid()] + pids, "parent": os.getpid(), "workers": pids})
    sleep_forever()


ROLES = {"hold": hold, "fork-child": fork_child, "ignore-term": ignore_term, "spawn-tree": spawn_tree,
         "nvml-monitor": nvml_monitor, "shm-leftovers": shm_leftovers, "gpu-monitor": gpu_monitor,
         "cuda-init": cuda_init,
         "open-devices": open_devices, "server": server}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m tests.gpu.holders")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--ready", required=True)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--tag", default="", help="a marker for cmdline_patterns")
    parser.add_argument("--device", type=int, default=0, help="the visible GPU that holds the context (hold, fork-child)")
    parser.add_argument("--workers", type=int, default=2, help="server: how many workers it starts")
    parser.add_argument("--worker-role", default="hold", choices=["hold", "open-devices"], help="server: its workers' role")
    parser.add_argument("--cgroup", default="", help="server: the cgroup directory it moves into first")
    args = parser.parse_args(argv)
    ROLES[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
