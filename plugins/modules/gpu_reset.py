#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_reset
short_description: Stop exactly the processes that hold the NVIDIA GPUs
version_added: 0.1.0
description:
  - Finds the processes that hold GPU memory, from evidence tied to each process, namely its mappings of the device files
    of O(device_paths) (read from C(/proc/PID/maps) and with C(readlink), never C(stat), so a stuck network mount
    cannot hang the scan) and NVML's per-GPU process list, checked against them.
  - A process with a CUDA context maps C(/dev/nvidiaN) of every GPU visible to it, C(nvidiactl) and C(nvidia-uvm),
    and NVML lists it on the GPU of its context; that narrows it there, once the process is confirmed to map that
    GPU and to have started before the reading (a pid NVML lists may be a dead process's, reused since).
  - A process that maps GPU files but that NVML does not list there (a child forked after CUDA initialisation keeps
    its parent's mappings and context, and NVML goes on listing the dead parent) holds the memory of those GPUs
    that NVML cannot attribute to a live process it lists (a listed pid that is gone, or memory used above the
    listed shares by more than 256 MiB, as when NVML cannot see the pids of a container). Where all the memory is
    accounted for, such a process holds none (CUDA initialised without a context maps the GPU files too) and is a
    GPU client. It cannot be told apart from a forked child where memory is unaccounted for, since neither maps
    C(nvidia-uvm) (which RV(targets[].evidence) reports).
  - Without NVML the mappings alone decide. Every process that maps a device file is a holder, of every GPU whose
    file it maps (a process with every GPU visible counts for each of them).
  - A process that only has device files open, mapping none, holds no GPU memory (NVML monitors, C(nvidia-smi),
    exporters, the Kubernetes device plugin open every device file). It is never a target because of the device
    files, only through O(cmdline_patterns) or as a child of a target; it is reported in RV(clients), as are the
    mapping processes found to hold no memory.
  - Also a target is every process NVML lists that maps an NVIDIA device file outside O(device_paths) (for example
    a container's), every process whose command line matches O(cmdline_patterns) and, with O(include_children),
    every descendant of those.
  - Sends C(SIGTERM) to all of them at once, waits up to O(grace_period) seconds, sends C(SIGKILL) to what remains and
    waits up to O(kill_timeout) seconds. A zombie holds no GPU memory and counts as gone.
  - Then scans again, with a fresh NVML reading. A holder that appeared during the reset (a C(SIGTERM) handler that
    forks, a parent forking in a loop, a forked child that keeps a stopped parent's context, which NVML then lists
    under the dead parent's pid) is signalled the same way in a further round, up to 3 rounds in all; a holder still
    there after the last round fails the task by name.
  - Never a target are PID 1, kernel threads (what the kernel flags as one), the module itself and its ancestors,
    and processes named in O(protect_names). These exclusions apply before children are followed, so a process never
    becomes a target only because an excluded parent holds a device.
  - On a node that runs several servers, O(spare_units) and O(spare_gpus) name the healthy neighbours. Their
    processes are never targets, whatever the evidence (a command line that matches, a selected GPU held too, a
    target as parent); they are excluded as the processes above, before children are followed, and reported in
    RV(spared).
  - Fails, with one line per process, when a target is still alive after C(SIGKILL) (a process in uninterruptible
    sleep, state C(D), needs a reboot or a GPU reset) or could not be signalled. The module never resets a GPU,
    changes persistence mode or unloads a driver.
  - Every option is checked before anything is read or signalled; a bad value fails the task with one sentence per
    problem.
  - Without an NVIDIA driver or without the C(pynvml) library it works from the device files alone and says so in
    RV(nvml).
requirements:
  - psutil
  - nvidia-ml-py (optional; without it NVML hints are skipped)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details:
      - RV(targets) lists what would be signalled; nothing is signalled.
  diff_mode:
    support: full
    details:
      - The processes that map the device files, before and after, one line each; each target's line also says why it
        is one (its reason and evidence) and its command line, so a target found by O(cmdline_patterns) that maps no
        device file is listed too. A process spared by O(spare_units) or O(spare_gpus) is listed with why.
notes:
  - Linux only (it reads C(/proc)).
  - Runs as root. Without root it cannot read other users' mappings nor signal their processes, so it fails at once
    unless O(users) limits it to processes it may signal; a signal that is refused anyway is reported per process in
    RV(survivors) and fails the task.
  - C(/dev/nvidiaN) is mapped to GPU index N, which is also the NVML index on hosts where the device minor numbers follow
    PCI order, as the NVIDIA driver assigns them by default.
  - A process matched by O(cmdline_patterns) that maps no GPU device is a target even when O(gpus) is given, since no
    GPU is known for it; make the pattern specific to the server that runs on those GPUs.
  - Names and command lines are returned as text; a byte that is not UTF-8 (a process may set any bytes in its argv)
    is written as the four characters C(\xNN), so the result stays valid.
options:
  device_paths:
    description:
      - Glob patterns of the device files whose holders are targets.
      - A match that is a symbolic link, or lies under one (such as C(/dev/char/195:0)), is resolved first, since the
        kernel shows open and mapped files by their real path.
      - A pattern that matches nothing is not an error. Each pattern must be an absolute path.
    type: list
    elements: str
    default: ['/dev/nvidia[0-9]*', '/dev/nvidiactl', '/dev/nvidia-uvm*', '/dev/nvidia-caps/*']
  gpus:
    description:
      - Only stop holders of these GPUs, given as indices (C(0), C(1), ...) or UUIDs (C(GPU-...), which need NVML).
      - A holder is spared when every GPU it is found to use (see the description) is outside this list. A process
        that maps only shared files such as C(/dev/nvidiactl) has no known GPU and is spared too.
      - Empty means every GPU.
    type: list
    elements: str
    default: []
  cmdline_patterns:
    description:
      - Regular expressions searched in the full command line (arguments joined by spaces).
      - Matching processes are targets even if they hold no device, for example an API server whose workers died.
      - A pattern that matches the empty string (C(""), C(|), C(x?)) or this module's own command line or interpreter
        path (C(python3), C(ansible)) would match far more than a server, and is refused.
    type: list
    elements: str
    default: []
  cgroup:
    description:
      - Only stop processes whose C(/proc/PID/cgroup) contains this text, for example C(/lxc/129/) for the processes of
        Proxmox container 129 seen from the Proxmox node.
      - Must not be empty (an empty text is in every process's cgroup); leave the option out for no such limit.
    type: str
  users:
    description:
      - Only stop processes owned by these users (names or numeric uids).
      - Must not be an empty list (it would match no process); leave the option out for any user.
      - Needed when the module does not run as root, which may signal only its own user's processes.
    type: list
    elements: str
  protect_names:
    description:
      - Process names that are never stopped. Holders with these names are reported in RV(protected).
      - The names given are protected in addition to the default list, which is always protected, so a list with one
        more name does not drop the defaults. Stop such daemons through their own service when that is meant.
      - A name is compared with the kernel's C(comm), the executable's base name and C(argv[0])'s base name.
    type: list
    elements: str
    default:
      - nvidia-persistenced
      - nv-hostengine
      - dcgm-exporter
      - nv-fabricmanager
      - nvlsm
      - nvidia-cuda-mps-control
      - nvidia-cuda-mps-server
      - Xorg
      - Xwayland
  spare_units:
    description:
      - Systemd units (C(vllm-b.service)) whose processes are never stopped, such as the healthy servers beside the one
        being reset. A process is in a unit when a component of a path in its C(/proc/PID/cgroup) is exactly the
        unit's name (so C(vllm-b.service) spares neither C(vllm-b.service2) nor C(x-vllm-b.service)).
      - Such a process is never a target and is never followed as a child of a target (its own children are reached
        only through their own evidence). It is reported in RV(spared).
      - Each name is a unit name with the suffix of a unit that holds processes (C(.service), C(.scope), C(.slice)).
    type: list
    elements: str
    default: []
    version_added: 0.2.0
  spare_gpus:
    description:
      - GPUs of the healthy neighbours, as indices or UUIDs like O(gpus). A process found to hold any of them (see
        the description) is never a target, even when it matches O(cmdline_patterns), also holds a selected GPU or
        descends from a target. It is reported in RV(spared).
      - A GPU that is both in O(gpus) and here (by index or UUID) is refused.
    type: list
    elements: str
    default: []
    version_added: 0.2.0
  include_children:
    description:
      - Also stop every descendant of a target (forked workers that may not have opened a device yet).
    type: bool
    default: true
  grace_period:
    description:
      - Seconds between C(SIGTERM) and C(SIGKILL), from 0 to 3600. C(0) sends C(SIGKILL) right after C(SIGTERM).
    type: float
    default: 30
  kill_timeout:
    description:
      - Seconds to wait for the processes to go after C(SIGKILL) before failing, from 0 to 3600.
      - A process still running when it ends is on its way out (the kernel is tearing it down) and is given up to
        2 seconds more; a process that cannot die sleeps uninterruptibly (state C(D)) and is not waited for longer.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: Stop every process that holds a GPU
  cleanslate.gpu.gpu_reset:
  register: gpu_reset_result

- name: Stop the holders of GPUs 2 and 3 and the API server whose workers died, giving them 10 seconds
  cleanslate.gpu.gpu_reset:
    gpus: [2, 3]
    cmdline_patterns:
      - 'vllm serve .* --port 8001'
    grace_period: 10

- name: Reset the server on GPUs 0 and 1, never touching its neighbour vllm-b on GPUs 2 and 3
  cleanslate.gpu.gpu_reset:
    gpus: [0, 1]
    cmdline_patterns:
      - 'vllm serve .* --port 8001'
    spare_units: [vllm-b.service]
    spare_gpus: [2, 3]

- name: Show what would be stopped, without stopping anything
  cleanslate.gpu.gpu_reset:
  check_mode: true
  diff: true

# A play over Proxmox LXC containers: processes of a container are visible, and can be
# signalled, from the Proxmox node; the container itself may not see the device holders of
# its own GPUs (or may lack psutil). Run the module on the node, scoped to the container.
- name: Stop the GPU holders of this container from its Proxmox node
  cleanslate.gpu.gpu_reset:
    cgroup: "/lxc/{{ proxmox_vmid }}/"
    grace_period: 15
  delegate_to: "{{ proxmox_node }}"
"""

RETURN = r"""
targets:
  description:
    - The processes found to be stopped (in check mode, those that would be signalled), sorted by round and pid.
    - Text fields carry bytes that are not UTF-8 as C(\xNN).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 4242
    ppid:
      description: Parent process id.
      type: int
      sample: 4100
    user:
      description: Owner's user name, or the numeric uid when it has no name.
      type: str
      sample: vllm
    name:
      description: Process name.
      type: str
      sample: VLLM::EngineCor
    cmdline:
      description:
        - Command line, arguments joined by spaces.
        - The value of a flag or environment assignment that names a secret (C(--api-key), C(--hf-token),
          C(HF_TOKEN=), C(--password)), a bearer token and a URL's password are replaced by C(********), wherever
          they appear in the line.
      type: str
      sample: python3 -m vllm.entrypoints.openai.api_server --model m --api-key ********
    create_time:
      description: Start time, seconds since the epoch.
      type: float
      sample: 1732870000.12
    gpus:
      description: GPU indices it was found to use (see the module's description for how).
      type: list
      elements: int
      sample: [0]
    devices:
      description: Device files it maps.
      type: list
      elements: str
      sample: [/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm]
    gpu_memory_mib:
      description: GPU memory NVML attributes to it, in MiB, when NVML lists it.
      type: int
      returned: when known
      sample: 70112
    reason:
      description:
        - Why it is a target. V(device) maps a device file, V(nvml) is listed by NVML and maps an NVIDIA device file
          outside O(device_paths), V(cmdline) matches O(cmdline_patterns), V(child) descends from a target.
      type: str
      sample: device
    evidence:
      description:
        - What makes it a target, in words. For a process that maps device files, which GPUs, whether it maps
          C(nvidia-uvm) (a CUDA context of its own, unlike a forked child) and what NVML says of it.
      type: str
      sample: maps GPU 0, with nvidia-uvm; NVML lists it on GPU 0
    round:
      description: The round of signals it was found in; V(1) unless it appeared during the reset.
      type: int
      sample: 1
killed:
  description: Processes that were signalled and are gone (exited or zombie).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 4242
    name:
      description: Process name.
      type: str
      sample: python3
    signal:
      description: The signal after which it went, V(SIGTERM) or V(SIGKILL).
      type: str
      sample: SIGTERM
    seconds:
      description: Seconds from the first C(SIGTERM) of its round until it was gone.
      type: float
      sample: 0.012
survivors:
  description:
    - Targets not stopped; any makes the task fail. Each is still alive after C(SIGKILL), or could not be signalled
      (another user's process, without root), or appeared during the reset and was still there after the last round.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 4242
    name:
      description: Process name.
      type: str
      sample: python3
    state:
      description: Kernel state letter from C(/proc/PID/stat), such as C(D) for uninterruptible sleep.
      type: str
      sample: D
    devices:
      description: Device files it maps.
      type: list
      elements: str
      sample: [/dev/nvidia0]
    signalled:
      description: The signals it received, in order (empty when none could be sent).
      type: list
      elements: str
      sample: [SIGTERM, SIGKILL]
    action:
      description: What happened and what to do about it.
      type: str
      sample: reboot or GPU reset required
clients:
  description:
    - Processes that have device files of O(device_paths) open or mapped but hold no GPU memory by the evidence (NVML
      monitors, exporters, device plugins, CUDA initialised without a context), left alone. A client matched by
      O(cmdline_patterns) or descending from a target is a target instead.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 2100
    name:
      description: Process name.
      type: str
      sample: dcgm-exporter
    devices:
      description: Device files it has open.
      type: list
      elements: str
      sample: [/dev/nvidia0, /dev/nvidia1, /dev/nvidiactl]
    maps:
      description: Device files it maps (empty for a monitor).
      type: list
      elements: str
      sample: []
protected:
  description: Processes that hold a device, match a pattern or descend from a target, but are never stopped.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 1500
    name:
      description: Process name.
      type: str
      sample: nvidia-persistenced
    reason:
      description: V(protect_names), V(self) (this module or one of its ancestors), V(pid 1) or V(kernel thread).
      type: str
      sample: protect_names
spared:
  description:
    - Processes that would have been targets (or were reached as a child of one) but belong to O(spare_units) or hold a
      GPU of O(spare_gpus), so were left alone.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 5100
    name:
      description: Process name.
      type: str
      sample: VLLM::Worker_TP
    why:
      description: The unit it belongs to (V(in unit vllm-b.service)) or the spared GPUs it holds (V(holds spared GPU 2)).
      type: str
      sample: in unit vllm-b.service
  version_added: 0.2.0
memory_before:
  description:
    - NVML's memory use of every GPU before anything was signalled (v2 "used", without driver-reserved memory), from
      the same NVML reading that gave the hints; empty when NVML is unavailable.
    - With RV(cleanslate.gpu.nvml_verify#module:gpus) after the reset it gives the MiB freed per GPU, without opening
      NVML once more.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: GPU index.
      type: int
      sample: 0
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-5f0c8a1e-0000-4000-8000-000000000000
    memory_used_mib:
      description: MiB used.
      type: int
      sample: 70000
  sample: [{"index": 0, "uuid": "GPU-5f0c8a1e-0000-4000-8000-000000000000", "memory_used_mib": 70000}]
nvml:
  description: V(ok) when NVML hints were used, else V(unavailable) with the reason.
  returned: always
  type: str
  sample: "unavailable: libnvidia-ml not found"
elapsed_s:
  description: Seconds the module took.
  returned: always
  type: float
  sample: 0.21
"""

from ansible_collections.cleanslate.gpu.plugins.module_utils._gpu_reset_module import main


if __name__ == "__main__":
    main()
