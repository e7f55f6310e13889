# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The module cleanslate.gpu.pycache_purge, all but its documentation (plugins/modules/pycache_purge.py): its
main() runs as that module, and in cleanslate.gpu.reset_steps's process as one of the reset's steps
(module_utils/_step_process.py)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import sys
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cleanslate.gpu.plugins.module_utils import _pyc_probe
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import fail_on_problems
from ansible_collections.cleanslate.gpu.plugins.module_utils._interpreter_owner import Refused, interpreter_owner
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import problem as range_problem
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

# Problems become warnings too, but a broken tree should not flood the play output.
MAX_WARNINGS = 20

# probe_timeout: a day is far beyond any tree (20,000 files take about 0.5 s, and about 25 CPU
# seconds compiled in full); above it, a number is a mistake rather than a wish to wait.

# After the probe's process group is killed, how long its pipes may take to close. Only a
# process that left the group (setsid) can hold them longer, and then the result is lost anyway.
DRAIN_AFTER_KILL_S = 5

# How many of the probe's last stderr lines a failure quotes.
STDERR_LINES = 3

# What the probe keeps of this module's environment when it runs as the user who controls the
# interpreter (see _interpreter_owner): the operator's settings for how Python finds and caches
# modules, and the locale (how file names are decoded). HOME, USER and LOGNAME are that user's,
# PATH a fixed system one; nothing else of root's environment reaches their code.
FORWARDED = ('PYTHONPATH', 'PYTHONHOME', 'PYTHONPYCACHEPREFIX', 'PYTHONNOUSERSITE', 'LANG', 'LC_ALL', 'LC_CTYPE')
SYSTEM_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# How each directory on the way to a pyc is opened for its removal: never through a symbolic link.
WALK_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, 'O_CLOEXEC', 0)


def input_problems(params):
    """Every problem with the arguments as one sentence each; empty when they are usable."""
    problems = []
    if not params['paths'] and not params['modules']:
        # required_one_of counts an option given as null or [] as given.
        problems.append('nothing to purge: give paths, modules or both')
    missing = []
    for path in params['paths'] or []:
        if not os.path.isabs(path):
            problems.append('paths entry %r must be an absolute path' % path)
        elif not os.path.exists(path):
            missing.append(path)
    if missing:
        problems.append('paths that do not exist: %s' % ', '.join(missing))
    for name in params['modules'] or []:
        if not name or not all(part.isidentifier() for part in name.split('.')):
            problems.append('modules entry %r is not a dotted module name' % name)
    python = params['python']
    if not os.path.isabs(python):
        problems.append('python %r must be an absolute path' % python)
    elif not os.path.exists(python):
        problems.append('python %s does not exist' % python)
    elif not os.path.isfile(python) or not os.access(python, os.X_OK):
        problems.append('python %s is not an executable file' % python)
    problems.append(range_problem('pycache_purge', 'probe_timeout', params['probe_timeout']))
    return [problem for problem in problems if problem]


def shown(text):
    """Wire text from the probe (names as UTF-8 with surrogateescape) as Ansible can carry it."""
    return printable(text.encode('utf-8', 'surrogateescape')) if text is not None else None


# What python runs from its stdin. Valid Python 2 too, so that the STARTED line is printed by any
# Python (on a line of its own, whatever a .pth file printed before) and an old one gets a
# sentence; the probe's source is compiled only after both.
BOOTSTRAP = """import sys
sys.stdout.write("\\n" + %(started)r + "\\n")
sys.stdout.flush()
if sys.version_info < (3, 8):
    import json
    sys.stdout.write(json.dumps({"probe": %(probe)r, "version": sys.version.split()[0], "error":
        "%%s is Python %%s: the probe needs Python 3.8 or later" %% (sys.executable, sys.version.split()[0])}) + "\\n")
else:
    probe = {"__name__": "cleanslate_gpu_pyc_probe"}
    exec(compile(%(source)r, %(filename)r, "exec", dont_inherit=True), probe)
    probe["run_main"](%(request)r)
"""


def probe_script(request):
    """The bootstrap carrying the probe's source and this request."""
    loader = _pyc_probe.__spec__.loader
    source = loader.get_source(_pyc_probe.__name__)
    if not source:
        # Only a loader without sources (a bytecode-only install) gets here.
        with open(_pyc_probe.__file__, 'r') as handle:
            source = handle.read()
    return BOOTSTRAP % {'started': _pyc_probe.STARTED, 'probe': _pyc_probe.PROBE_ID, 'source': source,
                        'filename': '<%s>' % _pyc_probe.PROBE_ID, 'request': json.dumps(request)}


def describe_exit(rc):
    if rc < 0:
        try:
            return 'was killed by signal %s (%d)' % (signal.Signals(-rc).name, -rc)
        except ValueError:
            return 'was killed by signal %d' % -rc
    return 'exited with rc %d' % rc


def service_user(module, python, uid):
    """The pwd entry of the user who controls python, or None when that is who runs this module."""
    if uid in (0, os.geteuid()):
        return None
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        module.fail_json(msg='refusing to run python %s as uid %d, which has no user entry (no group to run it '
                         'with); nothing was run or removed' % (printable(python), uid))


def user_name(user):
    if user is not None:
        return printable(user.pw_name)
    try:
        return printable(pwd.getpwuid(os.geteuid()).pw_name)
    except KeyError:
        return 'uid %d' % os.geteuid()


def probe_environment(user):
    """None (this module's environment) as root; the clean environment of FORWARDED as user."""
    if user is None:
        return None
    env = {key: os.environ[key] for key in FORWARDED if key in os.environ}
    env.update(PATH=SYSTEM_PATH, HOME=user.pw_dir or '/', USER=user.pw_name, LOGNAME=user.pw_name)
    return env


def run_probe(module, python, request, timeout, user=None):
    """Run the probe under python (as user when given); returns its result or fails the task saying what happened."""
    try:
        rc, out, err, timed_out = _pyc_probe.run_bounded([python, '-B', '-'], probe_script(request).encode('utf-8'),
                                                         timeout, DRAIN_AFTER_KILL_S, user=user,
                                                         env=probe_environment(user))
    except OSError as exc:
        module.fail_json(msg='python %s cannot be run: %s' % (python, exc))
    lines = out.decode('utf-8', 'replace').strip().splitlines()
    # Not necessarily the first line: a .pth file may print before the bootstrap runs.
    started = _pyc_probe.STARTED in lines
    result = None
    if started and lines[-1] != _pyc_probe.STARTED:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
    said = [printable(line) for line in err.strip().splitlines()[-STDERR_LINES:]]
    detail = (' and said: ' + ' | '.join(said)) if said else ' and printed nothing on stderr'
    if timed_out:
        module.fail_json(msg='the probe under python %s did not finish within %s seconds (probe_timeout); it was '
                         'stopped with its processes, nothing was removed%s' % (
                             python, module.params['probe_timeout'], detail if said else ''))
    if not isinstance(result, dict) or result.get('probe') != _pyc_probe.PROBE_ID:
        if started:
            module.fail_json(msg='the probe under python %s %s before it gave a result, nothing was removed%s' % (
                python, describe_exit(rc), detail))
        if rc < 0:
            module.fail_json(msg='python %s %s before it ran the probe%s' % (python, describe_exit(rc), detail))
        said = [printable(line) for line in (err or out).strip().splitlines()[-STDERR_LINES:]]
        module.fail_json(msg='python %s is not a Python 3.8+ interpreter: it exited with rc %d%s' % (
            python, rc, (' and said: ' + ' | '.join(said)) if said else ' and printed nothing'))
    if rc != 0 or result.get('error'):
        module.fail_json(msg=shown(result.get('error')) or 'the probe under python %s %s%s' % (
            python, describe_exit(rc), detail), python=python_info(result, user))
    return result


def python_info(result, user=None):
    """The interpreter's facts from the probe's result (wire text), as returned, and whom it ran as."""
    info = {key: result.get(key) for key in ('executable', 'version', 'cache_tag', 'pycache_prefix')}
    for key in ('executable', 'pycache_prefix'):
        info[key] = shown(info[key]) if isinstance(info[key], str) else None
    info['ran_as'] = user_name(user)
    return info


def local_names(result):
    """The probe's result with every name turned from wire text into this interpreter's str."""
    def local(text):
        return None if text is None else _pyc_probe.from_wire(text)
    for target in result['targets']:
        target['root'] = local(target['root'])
    for key in ('stale', 'skipped'):
        for item in result[key]:
            item['pyc'], item['source'] = local(item['pyc']), local(item['source'])
    for item in result['problems']:
        item['path'] = local(item['path'])
    result['pycache_prefix'] = local(result.get('pycache_prefix'))
    return result


# The probe's answer, key by key: what each holds (the probe may be the service user's code).
LISTS = {'targets': ('root', 'from'), 'stale': ('pyc', 'reason'), 'skipped': ('pyc', 'reason'),
         'problems': ('path', 'problem')}


def malformed(result):
    """What is wrong with the shape of the probe's answer, or ''."""
    for key in ('checked', 'compared'):
        if not isinstance(result.get(key), int) or isinstance(result.get(key), bool):
            return '%s is not a number' % key
    for key in ('executable', 'version', 'cache_tag', 'pycache_prefix'):
        if result.get(key) is not None and not isinstance(result.get(key), str):
            return '%s is not text' % key
    for key, texts in LISTS.items():
        items = result.get(key)
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            return '%s is not a list of objects' % key
        for item in items:
            if not all(isinstance(item.get(text), str) for text in texts):
                return 'an entry of %s lacks %s' % (key, ' or '.join(texts))
            if key in ('stale', 'skipped') and not isinstance(item.get('source'), (str, type(None))):
                return 'an entry of %s has a source that is not text' % key
    return ''


def trusted_targets(module, params, result, user, environment, info):
    """The targets, from the operator where possible: the roots of paths are this module's own
    resolution of params['paths'], whatever the probe said. The roots of modules are the probe's
    (only the interpreter's finders know them); when it ran as the service user, each must lie,
    as the kernel resolves it, inside the environment of python (that user's own), else the task
    stops: the operator names such a directory in paths instead."""
    targets = [{'root': _pyc_probe.resolve_path(path), 'from': 'paths'} for path in params['paths'] or []]
    asked = set('module ' + name for name in params['modules'] or [])
    for target in result['targets']:
        if target['from'] not in asked:
            continue
        real = os.path.realpath(target['root'])
        if user is not None and not (real == environment or under(real, environment)):
            module.fail_json(msg='refusing to purge %s found at %s by python %s run as %s: it lies outside that '
                             "interpreter's environment %s; name the directory in paths to purge it, nothing was "
                             'removed' % (target['from'], printable(real), printable(params['python']),
                                          printable(user.pw_name), printable(environment)),
                             python=info)
        targets.append(target)
    return targets


def forwarded_prefix():
    """The PYTHONPYCACHEPREFIX this module gave the probe (FORWARDED), as an honest probe reports it
    (sys.pycache_prefix); None when unset or empty, as Python ignores an empty one."""
    return os.environ.get('PYTHONPYCACHEPREFIX') or None


def printable_items(items, keys):
    """Copies of items with the names under keys escaped for Ansible (see _text.printable)."""
    return [dict(item, **{key: printable(item[key]) if item[key] is not None else None for key in keys})
            for item in items]


def under(path, root):
    root = root.rstrip(os.sep) or os.sep
    return path.startswith(root if root == os.sep else root + os.sep)


def stem_of(path):
    """'eagle' for .../eagle.py and for .../__pycache__/eagle.cpython-311.opt-1.pyc."""
    return os.path.basename(path).split('.', 1)[0]


def removable(pyc, targets, prefix):
    """Safety rule 5, checked here rather than trusted to the probe: only a *.pyc directly inside a
    __pycache__ directory under a target, or inside a target's PYTHONPYCACHEPREFIX mirror."""
    if not pyc.endswith('.pyc') or not os.path.isabs(pyc) or os.path.normpath(pyc) != pyc:
        return False
    directory = os.path.dirname(pyc)
    in_pycache = os.path.basename(directory) == '__pycache__'
    for target in targets:
        root = target['root']
        if os.path.isdir(root):
            mirrors = mirrors_of(prefix, root)
            if in_pycache and (directory == root or under(directory, root)):
                return True
            if any(directory == mirror or under(directory, mirror) for mirror in mirrors):
                return True
        elif stem_of(pyc) == stem_of(root):
            if in_pycache and os.path.dirname(directory) == os.path.dirname(root):
                return True
            if directory in mirrors_of(prefix, os.path.dirname(root)):
                return True
    return False


def removal_dir(pyc, targets, prefix):
    """The real directory pyc is removed from, or None when it is not removable.

    removable() judges the names the probe gave; a name can pass through a symbolic link (a
    __pycache__ that is a link to a directory of root's), so the directory is judged again as the
    kernel resolves it: a __pycache__ under a target's real path, or inside its real mirror."""
    if not removable(pyc, targets, prefix):
        return None
    real_dir = os.path.realpath(os.path.dirname(pyc))
    for target in targets:
        root = target['root']
        if os.path.isdir(root):
            real_root = os.path.realpath(root)
            if os.path.basename(real_dir) == '__pycache__' and (real_dir == real_root or under(real_dir, real_root)):
                return real_dir
            if any(real_dir == mirror or under(real_dir, mirror) for mirror in real_mirrors(prefix, root)):
                return real_dir
        elif stem_of(pyc) == stem_of(root):
            beside = os.path.realpath(os.path.dirname(root))
            if real_dir == os.path.join(beside, '__pycache__') or real_dir in real_mirrors(prefix, os.path.dirname(root)):
                return real_dir
    return None


def real_mirrors(prefix, directory):
    return {os.path.realpath(mirror) for mirror in mirrors_of(prefix, directory)}


def mirrors_of(prefix, directory):
    """Where importlib keeps the bytecode of directory's sources under PYTHONPYCACHEPREFIX (as given, as resolved)."""
    if not prefix:
        return set()
    return {_pyc_probe.prefix_mirror(prefix, form) for form in (directory, os.path.realpath(directory))}


def unlink_in(real_dir, name):
    """Unlink name in real_dir, each directory from `/` opened without following a symbolic link: a
    directory swapped for a link since removal_dir resolved it fails here (ELOOP), not followed."""
    fd = os.open('/', WALK_FLAGS)
    try:
        for part in [part for part in real_dir.split('/') if part]:
            next_fd = os.open(part, WALK_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def rights_of(user):
    """Removals with the rights of the user who controls the interpreter (none given: as this module).

    That user may have made any path of theirs a link or a rename away from root's files; with
    their effective ids the kernel lets the removal do only what they could do themselves. Only
    the effective ids change: the saved uid stays this module's, so they come back after, and the
    kernel lets that user neither signal nor trace this process meanwhile."""
    if user is None:
        yield
        return
    groups, uid, gid = os.getgroups(), os.geteuid(), os.getegid()
    os.setgroups([])
    os.setegid(user.pw_gid)
    os.seteuid(user.pw_uid)
    try:
        yield
    finally:
        os.seteuid(uid)
        os.setegid(gid)
        os.setgroups(groups)


def remove(module, stale, real_dirs, user=None):
    """Unlink each stale pyc (not in check mode) from its real directory. Returns (removed, errors)."""
    if module.check_mode:
        return list(stale), []
    with rights_of(user):
        return unlink_all(stale, real_dirs)


def unlink_all(stale, real_dirs):
    removed, errors = [], []
    for item, real_dir in zip(stale, real_dirs):
        try:
            unlink_in(real_dir, os.path.basename(item['pyc']))
        except FileNotFoundError:
            pass  # gone already (an importer replaced or removed it): the goal is met
        except OSError as exc:
            errors.append({'path': item['pyc'], 'error': '[Errno %s] %s' % (exc.errno, exc.strerror)})
            continue
        removed.append(item)
    return removed, errors


ARGUMENT_SPEC = dict(
    paths=dict(type='list', elements='path'),
    modules=dict(type='list', elements='str'),
    python=dict(type='path'),
    mode=dict(type='str', default='stale', choices=['stale', 'all']),
    compare_code=dict(type='str', default='auto', choices=['auto', 'always', 'never']),
    probe_timeout=dict(type='float', default=600),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_one_of=[('paths', 'modules')],
        supports_check_mode=True,
    )
    started = time.monotonic()
    params = dict(module.params)
    params['python'] = params['python'] or sys.executable
    fail_on_problems(module, input_problems(params))
    python = params['python']
    request = {
        # '..' as the kernel resolves it; the probe resolves its own names (modules) the same way.
        'paths': [_pyc_probe.to_wire(_pyc_probe.resolve_path(path)) for path in params['paths'] or []],
        'modules': params['modules'] or [],
        'mode': params['mode'],
        'compare_code': params['compare_code'],
    }
    try:
        owner, environment = interpreter_owner(python)
    except Refused as exc:
        module.fail_json(msg=str(exc))
    user = service_user(module, python, owner)
    result = run_probe(module, python, request, params['probe_timeout'], user)
    info = python_info(result, user)
    if malformed(result):
        module.fail_json(msg='the probe under python %s gave an answer of the wrong shape (%s), nothing was removed'
                         % (printable(python), malformed(result)), python=info)
    result = local_names(result)
    targets = trusted_targets(module, params, result, user, environment, info)
    prefix = result.get('pycache_prefix') if user is None else forwarded_prefix()
    real_dirs = [removal_dir(item['pyc'], targets, prefix) for item in result['stale']]
    unsafe = [item['pyc'] for item, real_dir in zip(result['stale'], real_dirs) if real_dir is None]
    if unsafe:
        # The probe and the module disagree about what is a target: remove nothing.
        module.fail_json(msg='refusing to remove files outside __pycache__ under the targets, nothing removed: %s'
                         % ', '.join(printable(path) for path in unsafe[:10]), python=info)
    removed, errors = remove(module, result['stale'], real_dirs, user)
    removed = printable_items(removed, ('pyc', 'source'))
    errors = printable_items(errors, ('path',))
    problems = printable_items(result['problems'], ('path',))
    for problem in problems[:MAX_WARNINGS]:
        module.warn('%s: %s' % (problem['path'], shown(problem['problem'])))
    if len(problems) > MAX_WARNINGS:
        module.warn('%d more problems, see the problems result' % (len(problems) - MAX_WARNINGS))
    output = {
        'changed': bool(removed),
        'removed': [dict(item, reason=shown(item['reason'])) for item in removed],
        'checked': result['checked'],
        'kept': [dict(item, reason=shown(item['reason'])) for item in printable_items(result['skipped'], ('pyc', 'source'))],
        'problems': [dict(item, problem=shown(item['problem'])) for item in problems],
        'errors': errors,
        'targets': printable_items(targets, ('root',)),
        'python': info,
        'compared': result['compared'],
    }
    if module._diff:
        output['diff'] = {
            'before_header': 'bytecode of the targets that goes',
            'after_header': 'bytecode of the targets that goes',
            'before': ''.join('%s (%s)\n' % (item['pyc'], item['reason']) for item in output['removed']),
            'after': '',
        }
    output['elapsed_s'] = round(time.monotonic() - started, 3)
    if errors:
        module.fail_json(msg='could not remove %d stale bytecode file(s): %s' % (
            len(errors), '; '.join('%s: %s' % (item['path'], item['error']) for item in errors[:10])), **output)
    module.exit_json(**output)
