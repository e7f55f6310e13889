# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The module cleanslate.gpu.shm_clean, all but its documentation (plugins/modules/shm_clean.py): its
main() runs as that module, and in cleanslate.gpu.reset_steps's process as one of the reset's steps
(module_utils/_step_process.py)."""

from __future__ import annotations

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


ARGUMENT_SPEC = dict(
    path=dict(type='path', default='/dev/shm'),
    patterns=dict(type='list', elements='str', default=list(DEFAULT_PATTERNS)),
    exclude=dict(type='list', elements='str', default=[]),
    min_age=dict(type='float', default=0),
    remove_in_use=dict(type='bool', default=False),
    tmp_path=dict(type='path'),
    tmp_patterns=dict(type='list', elements='str', default=list(DEFAULT_TMP_PATTERNS)),
    tmp_owners=dict(type='list', elements='str', default=[]),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
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
