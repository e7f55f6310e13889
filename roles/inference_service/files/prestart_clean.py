# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference_service unit's cleanup before each start, systemd's own restarts included (issue 39):
the leftovers of the unit's user in /dev/shm and in vLLM's temporary directory that no live process
holds, by shm_clean's rule (module_utils/_leftovers.py), so that a restart does not meet the segment
a crash leaked (sgl-project/sglang#40723, vllm-project/vllm#54002).

    python3 -I prestart_clean.py --user vllm [--shm /dev/shm] [--tmp /tmp]

systemd runs it as root (ExecStartPre=+): only root reads the maps and descriptors of every process,
without which no entry is proven unused. It removes only entries the unit's user owns, never
follows a link, and keeps every entry when some process cannot be read. It never stops the start:
every problem is one line in the unit's journal and the exit status is 0.
"""

from __future__ import annotations

import argparse
import os
import pwd
import stat
import sys

# -I keeps the script's own directory off sys.path; the module_utils it needs lie beside it, root's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ansible_collections.cleanslate.gpu.plugins.module_utils import _leftovers  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable  # noqa: E402  pylint: disable=wrong-import-position


def owner_uid(user):
    return int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid


def clean(path, owner, tmp):
    """Remove the unused leftovers of owner in path; lines saying what was removed or kept."""
    fd, problem = _leftovers.open_directory(path)
    if problem:
        return ['nothing removed: %s' % problem]
    try:
        params = {'patterns': _leftovers.DEFAULT_PATTERNS, 'exclude': [], 'min_age': 0,
                  'tmp_patterns': _leftovers.DEFAULT_TMP_PATTERNS}
        _names, candidates, _kept, errors = _leftovers.survey(fd, path, params, 0, {owner} if tmp else None)
        # tmp's survey keeps other owners' entries itself; in /dev/shm only the owner's are this unit's.
        candidates = [item for item in candidates if item[2].st_uid == owner]
        used, unreadable = _leftovers.users_of(fd, candidates)
        unread = 'the maps and descriptors of %d process(es) could not be read (pids %s)' % (
            len(unreadable), ', '.join(str(pid) for pid in unreadable[:10]))
        # shm_clean's rule: without root nothing is proven unused; root is refused only by a security
        # policy or a process with capabilities it lacks (a container's root reading its host's init).
        if unreadable and os.geteuid() != 0:
            return ['nothing removed in %s: %s' % (path, unread)]
        lines = ['even as root, ' + unread] if unreadable else []
        lines += ['cannot examine %s: %s' % (printable(item['path']), item['error']) for item in errors]
        for name, full, st in candidates:
            if name in used:
                lines.append('kept %s: held by pid %s' % (printable(full), ', '.join(str(pid) for pid in used[name])))
                continue
            try:
                why = _leftovers.unlink_if_unchanged(fd, name, st)
            except FileNotFoundError:
                continue
            except OSError as exc:
                lines.append('cannot remove %s: %s' % (printable(full), exc))
                continue
            lines.append('kept %s: %s' % (printable(full), why) if why else 'removed %s (%d bytes, %s): no live process holds it'
                         % (printable(full), _leftovers.freed_bytes(st), 'socket' if stat.S_ISSOCK(st.st_mode) else 'file'))
        return lines
    finally:
        os.close(fd)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', 1)[0])
    parser.add_argument('--user', required=True, help="the unit's user (name or uid)")
    parser.add_argument('--shm', default='/dev/shm')
    parser.add_argument('--tmp', default='/tmp')
    args = parser.parse_args(argv)
    try:
        owner = owner_uid(args.user)
    except KeyError:
        print('pre-start cleanup: user %r is no user of this host; nothing removed' % args.user)
        return 0
    for path, tmp in ((args.shm, False), (args.tmp, True)):
        try:
            lines = clean(path, owner, tmp)
        except OSError as exc:
            lines = ['nothing removed in %s: %s' % (path, exc)]
        for line in lines:
            print('pre-start cleanup: ' + line)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
