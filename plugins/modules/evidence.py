#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: evidence
short_description: Keep what explains a failed inference server on the host, before a reset signals its processes
version_added: 0.3.0
description:
  - Makes a new directory under O(path), named by the UTC time and the first unit (mode 0700, root's), and keeps in
    it, as text files, the current invocation's journal of each of O(units), the kernel log's NVIDIA Xid records,
    an NVML snapshot of every GPU, the command lines of the processes about to be signalled (those of O(units) and
    those matching O(cmdline_patterns)) and, with O(stacks), the Python stacks of each of them by C(py-spy dump).
  - Bounded in time, so that the reset that follows is never delayed by more than O(deadline) seconds; each program
    run (C(journalctl), C(py-spy)) by O(item_timeout). What did not fit is one line in C(summary.json), never a
    failure. Bounded in size, each file cut at O(file_max) bytes and the whole directory at O(dir_max).
  - Everything kept is untrusted text (the engine's own words), never run or templated, each byte that is not UTF-8
    written as C(\\xNN), and masked, every secret a kept process's command line carries (C(--api-key K),
    C(HF_TOKEN=K), a bearer token, a URL's password) and every value of O(secrets), in each form a program prints
    it, replaced by C(********).
  - C(py-spy) runs as root, so it must be root's, O(py_spy), its real file and the directories of both owned by root
    and writable by no one else. Otherwise, or when it is missing, no stack is kept and C(summary.json) says why in
    one sentence.
  - Nothing is signalled or changed on the host but the new directory. A base directory that is not safe to write
    in (another user could steer it) keeps nothing and says why in a warning; the task does not fail.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    support: full
    details: Nothing is collected or made; RV(would_keep) names the files a run would keep.
  diff_mode:
    support: none
options:
  path:
    description: The base directory; each run makes a directory of its own in it. Missing levels are made, root's, 0700.
    type: path
    default: /var/lib/cleanslate-gpu/evidence
  units:
    description: The systemd units about to be stopped; the journal of each one's current invocation is kept, and
      its processes are those whose stacks are dumped.
    type: list
    elements: str
    default: []
  cmdline_patterns:
    description: Regular expressions (Python C(re.search)) on a process's command line, joined by spaces; the
      matching processes count as about to be signalled, as those of M(cleanslate.gpu.gpu_reset)'s option of that
      name.
    type: list
    elements: str
    default: []
  protect_names:
    description: Process names never taken for the failed server's, in addition to M(cleanslate.gpu.gpu_reset)'s
      default list, as that module's option of that name (a GPU monitor a pattern also matches is not signalled, so
      not kept).
    type: list
    elements: str
    default: []
  spare_units:
    description: The units of healthy neighbours, as M(cleanslate.gpu.gpu_reset)'s option of that name; their processes
      are never kept, even when a pattern matches them.
    type: list
    elements: str
    default: []
  stacks:
    description: Dump the Python stacks of every kept process with C(py-spy dump) (for a hung server).
    type: bool
    default: false
  py_spy:
    description: The C(py-spy) program, root's (see the description).
    type: path
    default: /usr/local/bin/py-spy
  journal_lines:
    description: The newest lines kept of each unit's journal.
    type: int
    default: 2000
  xid_log_path:
    description: A file of kernel log lines read instead of C(journalctl -k) or C(dmesg), as M(cleanslate.gpu.nvml_verify)
      reads it.
    type: path
  item_timeout:
    description: Seconds each program run may take.
    type: float
    default: 3
  deadline:
    description: Seconds the whole collection may take; what is left when it is reached is not kept.
    type: float
    default: 8
  file_max:
    description: Bytes kept of each file.
    type: int
    default: 1048576
  dir_max:
    description: Bytes kept in the run's directory.
    type: int
    default: 8388608
  secrets:
    description: Values masked wherever they appear, in addition to those the processes' command lines carry.
    type: list
    elements: str
    default: []
notes:
  - Runs as root (C(become)); C(journalctl) and C(py-spy) are found on the task's C(PATH) and at O(py_spy).
seealso:
  - module: cleanslate.gpu.gpu_reset
  - module: cleanslate.gpu.nvml_verify
"""

EXAMPLES = r"""
- name: Keep the journal, the Xid records, the GPUs and the stacks of a hung server before it is stopped
  cleanslate.gpu.evidence:
    units: [vllm.service]
    stacks: true
  register: kept

- name: Say where they are
  ansible.builtin.debug:
    msg: "evidence kept in {{ kept.directory }}"
"""

RETURN = r"""
directory:
  description: The run's directory; null in check mode, when nothing could be kept, or when no process is about to be
    signalled (a clean host keeps nothing).
  returned: always
  type: str
  sample: /var/lib/cleanslate-gpu/evidence/20260105T100000Z-vllm.service
files:
  description: Each file kept, its C(name), C(bytes) and whether it was C(cut) at a bound.
  returned: always
  type: list
  elements: dict
  sample: [{name: journal-vllm.service.txt, bytes: 20480, cut: false}]
notes:
  description: What was not kept and why, one sentence each (a missing py-spy, a program stopped at its time limit).
  returned: always
  type: list
  elements: str
  sample: ["py-spy is not installed at /usr/local/bin/py-spy: no stack was kept"]
would_keep:
  description: In check mode, the files a run would keep.
  returned: in check mode
  type: list
  elements: str
  sample: [journal-vllm.service.txt, xid.txt, nvml.json, processes.txt, stack-4242.txt, summary.json]
pids:
  description: The processes whose command lines (and with O(stacks), stacks) were kept.
  returned: always
  type: list
  elements: int
  sample: [4242, 4250]
elapsed_s:
  description: Seconds the collection took.
  returned: always
  type: float
  sample: 1.2
"""

from ansible_collections.cleanslate.gpu.plugins.module_utils._evidence_module import main


if __name__ == "__main__":
    main()
