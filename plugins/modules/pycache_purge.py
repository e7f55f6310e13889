#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: pycache_purge
short_description: Remove bytecode that no longer matches its source, so a patched file really runs
version_added: 0.1.0
description:
  - After a file inside an installed package is patched, Python may keep loading the old bytecode from
    C(__pycache__) and silently ignore the patch. This module removes that bytecode for the interpreter
    that runs the service, so the next start compiles the patched source.
  - The targets are O(paths) (source files or directory trees) and O(modules) (dotted names found by the import
    finders of O(python), as its C(import) would find them, B(without importing) them or their parent packages).
  - For every source, the bytecode is C(__pycache__/<name>.<cache tag>[.opt-1|.opt-2].pyc) for every cache tag
    present and, when the environment of O(python) sets E(PYTHONPYCACHEPREFIX), the same files under that prefix.
  - With O(mode=stale), a C(.pyc) compiled for O(python) is removed when its source no longer exists; when it is
    timestamp-based and its recorded mtime or size differs from the source; when it is hash-based (checked or
    unchecked) and its recorded hash differs from the source's hash as O(python) computes it; when its magic
    number or header is not valid for O(python); or when its code differs from what the current source compiles
    to under O(python), which catches a patch that kept the source's size and mtime (C(cp -p), C(rsync -t), tar,
    an edit within the same second) and that Python itself cannot see. See O(compare_code).
  - A C(.pyc) compiled for another interpreter (another cache tag) is kept and reported in RV(kept) unless its
    source no longer exists; check it by running the module again with O(python) set to that interpreter, or
    remove it with O(mode=all).
  - With O(mode=all), every C(.pyc) of the targets is removed.
  - The comparison runs under O(python) itself (a probe script sent on its standard input), because the bytecode
    format, cache tag and source hash belong to that interpreter, not to the one that runs Ansible.
  - Before O(python) is started, the module decides who can change what it runs - its file, each symbolic link on the
    way to it, its environment's prefix (the parent of its C(bin), with C(pyvenv.cfg) and the C(.pth) files of
    C(lib/python3.*/site-packages) that Python runs at every start) and each directory above them. When root alone
    can, the probe runs as root. When one other user can (the service user who owns the venv), the probe runs as
    that user, with no supplementary groups and a clean environment (see RV(python.ran_as)), in check mode too, and
    the bytecode is removed with that user's rights. When more than one user, a group or everyone can, the task
    fails naming the path and who can change it; nothing is run or removed.
  - The probe's answer is not trusted for what is removed - the roots of O(paths) are the module's own, and when the
    probe ran as another user each root it found for O(modules) must lie inside the environment of O(python). A
    C(.pyc) is removed only from a C(__pycache__) under a root as the kernel resolves it (or its
    E(PYTHONPYCACHEPREFIX) mirror), every directory on the way opened without following a symbolic link.
  - Only files whose names end in C(.pyc) inside C(__pycache__) directories under the targets (or inside the
    targets' mirror under E(PYTHONPYCACHEPREFIX)) are ever removed. C(.pyc) files outside C(__pycache__) and other
    files inside it are never touched.
  - Symbolic links to directories are followed only when they stay inside the targets. Symbolic link loops,
    links out of the targets and unreadable directories are reported in RV(problems) and as warnings, not errors.
  - A FIFO, socket or device is never opened, even when it is named like a source or a C(.pyc) (opening a FIFO
    waits for a writer forever). Such a C(.pyc) name is not bytecode and is left alone; the bytecode of a source
    name that is not a regular file is stale (Python neither loads nor compiles it) and goes in O(mode=stale)
    with the reason C(source is not a regular file) and the file's type.
  - File names are returned as text. A byte that is not valid UTF-8 is written as the four characters C(\xNN)
    (backslash, C(x), two hexadecimal digits), as Python's C(backslashreplace) does, so a name of any bytes is
    reported; valid UTF-8 is returned as it is. This holds for every path in the results and in messages.
requirements:
  - O(python) must be CPython or PyPy 3.8 or later. The module itself runs on Python 3.9 or later.
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
      - The bytecode files that go, one per line with the reason; nothing is listed after.
options:
  paths:
    description:
      - Source files and directory trees whose bytecode is checked. Each must be an absolute path that exists.
      - A C(..) is resolved as the kernel resolves it, from where the path before it leads (C(/x/link/../pkg)
        is the C(pkg) beside the target of C(link), not C(/x/pkg)); RV(targets) shows each root so resolved.
      - A directory is searched recursively for C(__pycache__) directories.
      - At least one of O(paths) and O(modules) must be given.
    type: list
    elements: path
  modules:
    description:
      - Dotted module or package names, for example C(vllm.v1.spec_decode.eagle) or C(vllm), found without
        importing anything. A package means its whole directory tree.
      - Each name is looked up with the finders of C(sys.meta_path) of O(python), in order, as C(import) does, so
        packages that only a finder knows are found too, such as a C(pip install -e) editable install (setuptools
        installs an C(__editable__) finder from a C(.pth) file). A parent package is given to its submodules'
        lookup by its search locations, never by running its C(__init__.py).
      - An unknown name is an error that lists the directories searched and the other finders asked; a finder that
        raises is an error that names it and its exception. Nothing is removed then.
    type: list
    elements: str
  python:
    description:
      - The interpreter whose C(sys.path), cache tag, magic number and compiler count, normally the one that
        runs the inference server (for example C(/opt/vllm/.venv/bin/python)).
      - Defaults to the interpreter that runs this module.
      - It runs as root only when root alone can change what it runs; a venv that belongs to the service user
        runs as that user, and one that more than one user can change is refused (see the description). Only
        E(PYTHONPATH), E(PYTHONHOME), E(PYTHONPYCACHEPREFIX), E(PYTHONNOUSERSITE) and the locale of the task's
        environment reach it then.
    type: path
  mode:
    description:
      - V(stale) removes only bytecode that does not match its source (see the description).
      - V(all) removes every C(.pyc) of the targets, for every interpreter.
    type: str
    choices: [stale, all]
    default: stale
  compare_code:
    description:
      - When O(mode=stale) compiles a source to compare its code with a C(.pyc) whose header matches.
      - V(auto) compiles only when the source's inode changed (its ctime) at or after the time the C(.pyc) was
        written. A patch always changes the ctime, even when C(cp -p) or C(rsync -t) restore the mtime, so this
        finds every patch made after the bytecode, at the cost of a C(stat) for fresh files.
      - V(always) compiles every source whose C(.pyc) header matches (slow on large trees, about 2.5 ms per
        file, spread over the CPUs).
      - V(never) trusts a matching header, as Python does.
    type: str
    choices: [auto, always, never]
    default: auto
  probe_timeout:
    description:
      - Seconds the check under O(python) may take. When they are over, the check and every process it started
        are stopped with C(SIGKILL), nothing is removed, and the task fails saying so.
      - A finite number above 0, at most 86400 (a day). Measured on a 20,000-file tree - about half a second, and
        about 25 CPU seconds with O(compare_code=always).
    type: float
    default: 600
    version_added: 0.1.0
notes:
  - The module never imports the target packages and never writes bytecode; the next import recompiles what was removed.
  - When a C(.pyc) cannot be removed (for example a read-only file system), the others are still removed and the task
    fails at the end, naming each one in RV(errors).
  - When the probe runs as the service user, a C(.pyc) that user may not remove (in a directory of root's named in
    O(paths)) is an error in RV(errors), as any other that cannot be removed.
  - When the check under O(python) fails, the task fails with what happened and removes nothing - a program that is
    not Python, a Python older than 3.8, a check killed by a signal (with the signal's name) or one that exited
    early (with its exit status), each with the last lines it wrote on its standard error, or O(probe_timeout).
  - Source comparisons run in forked worker processes that report back through pipes; they need nothing in
    C(/dev/shm), so a read-only or full C(/dev/shm) on a crashed node does not stop them.
seealso:
  - module: cleanslate.gpu.gpu_reset
  - module: cleanslate.gpu.shm_clean
"""

EXAMPLES = r"""
- name: Make a patched vLLM file run on the next start
  cleanslate.gpu.pycache_purge:
    modules:
      - vllm.v1.spec_decode.eagle
    python: /opt/vllm/.venv/bin/python

- name: Remove stale bytecode from the whole vLLM and SGLang trees
  cleanslate.gpu.pycache_purge:
    modules:
      - vllm
      - sglang
    python: /opt/vllm/.venv/bin/python

- name: Remove all bytecode under a directory, for every interpreter
  cleanslate.gpu.pycache_purge:
    paths:
      - /opt/vllm/.venv/lib/python3.11/site-packages/vllm
    mode: all

- name: Show what would go, without removing anything
  cleanslate.gpu.pycache_purge:
    paths:
      - /opt/vllm/.venv/lib/python3.11/site-packages/vllm/v1/spec_decode/eagle.py
    python: /opt/vllm/.venv/bin/python
  check_mode: true
  diff: true
  register: pycache_plan
"""

RETURN = r"""
removed:
  description:
    - The bytecode files removed; in check mode, the files that would be removed.
  returned: always
  type: list
  elements: dict
  contains:
    pyc:
      description: Absolute path of the C(.pyc) file. Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: /opt/vllm/lib/python3.11/site-packages/vllm/__pycache__/envs.cpython-311.pyc
    source:
      description: The source it was compiled from (which may no longer exist); null when the name carries no tag. Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: /opt/vllm/lib/python3.11/site-packages/vllm/envs.py
    reason:
      description:
        - Why it goes. One of C(source missing), C(mtime differs), C(size differs), C(hash differs),
          C(code differs), C(source does not compile), C(magic number differs), C(corrupt bytecode), C(mode all),
          C(corrupt header) followed by what is wrong with it, or C(source is not a regular file) followed by the
          type of what has the source's name (for example C(FIFO)).
      type: str
      sample: code differs
  sample: [{"pyc": "/site/vllm/__pycache__/envs.cpython-311.pyc", "source": "/site/vllm/envs.py", "reason": "code differs"}]
checked:
  description: How many C(.pyc) files of the targets were examined (for every interpreter).
  returned: always
  type: int
  sample: 2113
kept:
  description:
    - Named C(kept), not C(skipped), because Ansible reads a result's C(skipped) key as the task's own status.
    - C(.pyc) files that were kept without a full check, with the reason, for example bytecode of another
      interpreter whose source still exists.
  returned: always
  type: list
  elements: dict
  contains:
    pyc:
      description: Absolute path of the C(.pyc) file. Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: /site/vllm/__pycache__/envs.cpython-310.pyc
    source:
      description: The source it belongs to, or null when the name carries no interpreter tag. Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: /site/vllm/envs.py
    reason:
      description: Why it was not checked.
      type: str
      sample: compiled for cpython-310; this interpreter is cpython-311
  sample: []
problems:
  description: Directories or files that could not be examined, symbolic link loops and links out of the targets. Not fatal.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The path concerned. Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: /site/vllm/loop
    problem:
      description: What is wrong with it.
      type: str
      sample: "symlink loop: points to its own ancestor /site/vllm"
  sample: []
errors:
  description: C(.pyc) files that could not be removed, with the error. The task fails when this is not empty.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Absolute path of the C(.pyc) file. Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: /site/vllm/__pycache__/envs.cpython-311.pyc
    error:
      description: The operating system's error.
      type: str
      sample: "[Errno 30] Read-only file system"
  sample: []
targets:
  description:
    - The files and directory trees examined, with what named them (C(paths) or C(module <name>)).
    - Each C(root) is the path with every C(..) resolved as the kernel resolves it. Bytes that are not UTF-8 appear as C(\xNN).
  returned: always
  type: list
  elements: dict
  contains:
    root:
      description: The source file or directory tree.
      type: str
      sample: /site/vllm/v1/spec_decode/eagle.py
    from:
      description: C(paths), or C(module) followed by the name given in O(modules).
      type: str
      sample: module vllm.v1.spec_decode.eagle
  sample: [{"root": "/site/vllm/v1/spec_decode/eagle.py", "from": "module vllm.v1.spec_decode.eagle"}]
python:
  description: The interpreter that judged the bytecode.
  returned: always
  type: dict
  contains:
    executable:
      description: Its C(sys.executable). Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: /opt/vllm/.venv/bin/python
    version:
      description: Its version.
      type: str
      sample: 3.11.7
    cache_tag:
      description: Its cache tag; only C(.pyc) files with this tag are checked in full.
      type: str
      sample: cpython-311
    pycache_prefix:
      description: Its C(sys.pycache_prefix) (from E(PYTHONPYCACHEPREFIX)), or null. Bytes that are not UTF-8 appear as C(\xNN).
      type: str
      sample: null
    ran_as:
      description:
        - The user the probe ran as, and the removals were made as - C(root), or the one other user who can change
          what O(python) runs (the owner of its venv).
      type: str
      sample: vllm
      version_added: 0.2.0
  sample: {"executable": "/opt/vllm/.venv/bin/python", "version": "3.11.7", "cache_tag": "cpython-311", "pycache_prefix": null,
           "ran_as": "vllm"}
compared:
  description: How many sources were compiled to compare their code with a C(.pyc) whose header matched.
  returned: always
  type: int
  sample: 3
elapsed_s:
  description: Seconds the module took.
  returned: always
  type: float
  sample: 0.42
"""

from ansible_collections.cleanslate.gpu.plugins.module_utils._pycache_purge_module import main


if __name__ == "__main__":
    main()
