# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which entries of /dev/shm and of vLLM's temporary directory are a crashed engine's leftovers, who
still uses them, and their removal. Private to this collection.

One rule for the two places that remove them: the shm_clean module (node_reset's step) and the
pre-start cleanup of the inference_service unit (prestart_clean.py, issue 39), which systemd runs
before each start, its own restarts included. Neither needs AnsibleModule here.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import pwd
import re
import stat

from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs
from ansible_collections.cleanslate.gpu.plugins.module_utils._file_users import bound_unix_sockets, directory_device, users

# Each pattern is one program's family of names, read in its sources (SGLang 0.5.21 to 0.5.23, vLLM 0.31 to 0.33);
# none is a name people give their own files.
DEFAULT_PATTERNS = [
    'nccl-*',                  # NCCL's communicator segments
    'psm_*',                   # Python multiprocessing.shared_memory's unnamed segments (vLLM's broadcast rings)
    'sem.mp-*',                # multiprocessing's named semaphores
    'sem.loky-*',              # loky / joblib semaphores
    'torch_*',                 # PyTorch's shared tensors and CUDA IPC ref counters (torch_<pid>_...)
    '*vllm*',                  # vLLM's own files, among them vllm_offload_<engine id>.mmap (KV offload, issue 54002)
                               # and vllm_ec_<engine id>.mmap
    'sgl_shm_*',               # SGLang's segments: sgl_shm_<kind>_<pid>_<random> (mm, mq, nodecheck)
    'multi_tokenizer_args_*',  # SGLang's multi-tokenizer server arguments, multi_tokenizer_args_<pid>
    'sglang_loads_*',          # SGLang's load snapshot slots, sglang_loads_<name>_<digest>.shm
    'sglang_host_pool_*',      # SGLang's host KV pool when memfd_create is missing, sglang_host_pool_<uuid>.mmap
    'cuda.shm.*',              # CUDA IPC segments, which SGLang's own stale-segment sweep lists too
]


# What vLLM leaves directly in its temporary directory (VLLM_RPC_BASE_PATH, by default tempfile.gettempdir())
# and never removes after a crash, read in its sources (0.31 to 0.33): the ZeroMQ IPC sockets of
# get_open_zmq_ipc_path, ipc://<base>/<uuid4()> (str(uuid4()): lower-case, version 4, variant 10), and the
# files of its distributed initialisation, vllm_dist_*. Regular expressions matched against the whole name.
DEFAULT_TMP_PATTERNS = [
    '[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}',
    'vllm_dist_.+',
]


# PyTorch names its segments torch_<creator pid>_<random>_<counter> (at::NewProcessWideShmHandle,
# unchanged up to torch 2.13): tensors shared with the file_system strategy and CUDA IPC ref counters.
TORCH_NAME = re.compile(r'^torch_([0-9]{1,10})_')


def tmp_selected(name, patterns, exclude):
    """True when the whole name matches a tmp_patterns expression and no exclude pattern."""
    # exclude as selected() applies it: shell patterns.
    return any(re.fullmatch(pattern, name) for pattern in patterns) and selected(name, ['*'], exclude)


def selected(name, patterns, exclude):
    """True when name matches a pattern and no exclude pattern (case-sensitive, like the shell)."""
    if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
        return False
    return not any(fnmatch.fnmatchcase(name, p) for p in exclude)


def torch_creator(name):
    """The creator pid a torch_<pid>_* name carries, or None."""
    match = TORCH_NAME.match(name)
    if not match:
        return None
    pid = int(match.group(1))
    return pid if pid > 0 else None


def open_directory(path):
    """A descriptor of path, opened one component at a time from '/', or (None, one clear message).

    A trailing '/' or '/.' makes the kernel follow a final symbolic link, and '..' after a link
    climbs out of the link's target, so checking only the last component with lstat is not enough:
    every component is opened with O_NOFOLLOW relative to the one before, and '..' is resolved from
    the directory actually reached, as the kernel does.
    """
    walk = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open('/', walk)
    reached = ''
    try:
        for part in path.split('/'):
            if part in ('', '.'):
                continue
            reached += '/' + part
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None, 'path %s does not exist (%s is missing)' % (path, reached)
            except OSError as exc:
                return None, 'path %s cannot be examined at %s: %s' % (path, reached, exc)
            if stat.S_ISLNK(st.st_mode):
                return None, ('path %s is a symbolic link or passes through one (%s); give the real directory '
                              '(links are never followed)' % (path, reached))
            if not stat.S_ISDIR(st.st_mode):
                return None, 'path %s is not a directory (%s is not one)' % (path, reached)
            try:
                # O_NOFOLLOW closes the window between the stat above and this open.
                step = os.open(part, walk, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return None, 'path %s is a symbolic link or passes through one (%s)' % (path, reached)
                return None, 'path %s cannot be opened at %s: %s' % (path, reached, exc)
            os.close(fd)
            fd = step
        try:
            return os.open('.', os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd), None
        except OSError as exc:
            return None, 'path %s cannot be opened as a directory: %s' % (path, exc)
    finally:
        os.close(fd)


def real_dir(fd):
    """The path the kernel reports for the open directory (what the user's path resolves to)."""
    return os.readlink('/proc/self/fd/%d' % fd)


def kind_of(mode):
    """A word for a file type that is never removed."""
    for test, word in ((stat.S_ISDIR, 'a directory; directories are never removed'),
                       (stat.S_ISFIFO, 'a FIFO; only regular files and symbolic links are removed'),
                       (stat.S_ISSOCK, 'a socket; only regular files and symbolic links are removed'),
                       (stat.S_ISCHR, 'a character device; only regular files and symbolic links are removed'),
                       (stat.S_ISBLK, 'a block device; only regular files and symbolic links are removed')):
        if test(mode):
            return word
    return 'not a regular file or symbolic link'


def freed_bytes(st):
    """Space that unlinking this name gives back."""
    if stat.S_ISLNK(st.st_mode) or st.st_nlink > 1:
        return 0
    return st.st_blocks * 512


def tmp_kind(st, owners):
    """Why an entry of tmp_path is kept whatever its users, or None: only regular files and unix sockets
    of root or of a user of tmp_owners are leftovers there (tmp_path is everyone's)."""
    if stat.S_ISLNK(st.st_mode):
        return 'a symbolic link; in tmp_path links are neither followed nor removed'
    if stat.S_ISDIR(st.st_mode):
        return 'a directory; directories are never removed'
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return '%s; in tmp_path only regular files and unix sockets are removed' % kind_of(st.st_mode).split(';', maxsplit=1)[0]
    if st.st_uid not in owners:
        return 'owned by uid %d (%s), neither root nor a user of tmp_owners' % (st.st_uid, user_name(st.st_uid))
    return None


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return 'no user of this host'


def survey(fd, base, params, now, owners=None):
    """Classify every top-level entry: (names, candidates, skipped, errors).

    candidates are (name, full path, lstat) of entries that may be removed if no live process uses them.
    owners: None for path's entries (O(patterns)); the uids whose entries may go for tmp_path's (O(tmp_patterns)).
    Names stay as os.scandir gives them (undecodable bytes as surrogates) until they are returned.
    """
    names, candidates, skipped, errors = [], [], [], []
    dir_dev = os.fstat(fd).st_dev
    with os.scandir(fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        if owners is None and not selected(name, params['patterns'], params['exclude']):
            continue
        if owners is not None and not tmp_selected(name, params['tmp_patterns'], params['exclude']):
            continue
        # base is absolute and names never hold '/', so plain joining is exact (and 10,000 entries are common).
        full = base.rstrip('/') + '/' + name
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            skipped.append({'path': full, 'why': 'disappeared during the run'})
            continue
        except OSError as exc:
            errors.append({'path': full, 'error': str(exc)})
            continue
        if owners is not None:
            why = tmp_kind(st, owners)
            if why:
                skipped.append({'path': full, 'why': why})
                continue
        elif not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            skipped.append({'path': full, 'why': kind_of(st.st_mode)})
            continue
        if st.st_dev != dir_dev:
            skipped.append({'path': full, 'why': 'another file system is mounted on it; mount points are never removed'})
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            skipped.append({'path': full, 'why': 'has %d names (hard links): removing this one frees no space, and a '
                                                 'process may use it under another name' % st.st_nlink})
            continue
        age = now - st.st_mtime
        if params['min_age'] > 0 and age < params['min_age']:
            skipped.append({'path': full, 'why': 'modified %.1f s ago, less than min_age %s s' % (max(age, 0.0), params['min_age'])})
            continue
        candidates.append((name, full, st))
    return names, candidates, skipped, errors


def users_of(fd, candidates):
    """({name: sorted pids}, unreadable pids) for candidates a live process opens, maps, binds (a unix
    socket) or (torch_<pid>_*) created. A socket bound to the name is in use even when no holder is seen."""
    # A symlink is removed as a link, so only regular files are asked about.
    inodes = {name: st.st_ino for name, full, st in candidates if stat.S_ISREG(st.st_mode)}
    socket_names = [name for name, full, st in candidates if stat.S_ISSOCK(st.st_mode)]
    sockets, hidden = bound_unix_sockets(socket_names) if socket_names else ({}, [])
    found, unreadable = users(inodes, directory_device(fd), sockets=sockets) if inodes or sockets else ({}, [])
    bound = set(sockets.values())
    result = {}
    for name, full, st in candidates:
        pids = set(found.get(name) or [])
        creator = torch_creator(name)
        # A creator whose /proc entry cannot be read may live: alive() counts it so, and the segment stays.
        if creator is not None and _procs.alive(creator):
            pids.add(creator)
        if pids or name in bound:
            result[name] = sorted(pids)
    return result, sorted(set(unreadable) | set(hidden))


def unlink_if_unchanged(fd, name, st):
    """Unlink name unless it was replaced or rewritten since it was examined. Returns a skip reason or None."""
    now_st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if (now_st.st_dev, now_st.st_ino, now_st.st_mtime_ns) != (st.st_dev, st.st_ino, st.st_mtime_ns):
        return 'changed during the run; left for the next run'
    os.unlink(name, dir_fd=fd)
    return None
