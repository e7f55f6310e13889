"""First look at a real NVIDIA driver: what NVML reports on the idle card (v1 and v2 memory),
how a CUDA process's device files appear in /proc/PID/fd and maps, and what NVML lists for it.
Read-only: it never changes a GPU setting. Run on a GPU machine: python3 tests/gpu/probe_driver.py
"""
import glob
import json
import os
import subprocess
import sys
import time

import pynvml


def memory(handle):
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    mib = 1024 * 1024
    return {"v1_used_mib": v1.used // mib, "v1_total_mib": v1.total // mib,
            "v2_used_mib": v2.used // mib, "v2_reserved_mib": v2.reserved // mib, "v2_total_mib": v2.total // mib}


def nvml_state():
    pynvml.nvmlInit()
    try:
        out = {"driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            procs = [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) // 2**20}
                     for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
            out["gpus"].append({"index": i, "name": pynvml.nvmlDeviceGetName(h), **memory(h), "procs": procs})
        return out
    finally:
        pynvml.nvmlShutdown()


def nvidia_links(pid):
    fds, maps = [], set()
    for fd in glob.glob("/proc/%d/fd/*" % pid):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "nvidia" in target:
            fds.append(target)
    try:
        with open("/proc/%d/maps" % pid) as handle:
            for line in handle:
                if "nvidia" in line:
                    maps.add(line.split(None, 5)[-1].strip())
    except OSError:
        pass
    return sorted(set(fds)), sorted(maps)


HOLDER = "import torch,time,sys; x=torch.empty(int(sys.argv[1])*2**20, dtype=torch.uint8, device='cuda'); print('ready', flush=True); time.sleep(600)"

print(json.dumps({"uname": os.uname().release, "dev": sorted(glob.glob("/dev/nvidia*")),
                  "caps": sorted(glob.glob("/dev/nvidia-caps/*"))}))
print("idle", json.dumps(nvml_state()))
child = subprocess.Popen([sys.executable, "-c", HOLDER, "2048"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
fds, maps = nvidia_links(child.pid)
print("holder", child.pid, json.dumps({"fds": fds, "maps": maps}))
print("holding", json.dumps(nvml_state()))
start = time.monotonic()
child.kill()
child.wait()
while True:
    state = nvml_state()
    if state["gpus"][0]["v2_used_mib"] < 16:
        break
    time.sleep(0.01)
print("released_after_s", round(time.monotonic() - start, 3), json.dumps(state))
print(subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False).stdout)
