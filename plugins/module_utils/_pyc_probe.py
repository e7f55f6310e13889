# -*- coding: utf-8 -*-

# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private to this collection: the bytecode probe of cleanslate.gpu.pycache_purge.

The module does not run this file under its own interpreter. It sends a bootstrap holding
this file's source on stdin to the interpreter named in the task's `python` (`python -B -`),
because what makes a .pyc valid belongs to that interpreter: its cache tag, magic number,
source hash key, compiler, sys.path and import finders. The bootstrap prints STARTED, checks
the version, runs this source and calls run_main(). The probe only reads; it prints one JSON
object and the module removes files itself, after its own safety check.

So this file must run on Python 3.8 and later, import nothing outside the standard library,
and never import the packages it inspects (importing vLLM takes seconds and may crash).

Names travel as "wire" text (to_wire/from_wire): a file name's bytes decoded as UTF-8 with
surrogateescape, whatever the file system encoding of either interpreter, so that a name
that is not UTF-8 survives the JSON both ways and the module can escape it for Ansible.
"""

from __future__ import annotations

import errno
import importlib.machinery
import importlib.util
import json
import marshal
import os
import signal
import stat
import sys
import traceback
import types
import warnings

PROBE_ID = "cleanslate.gpu.pyc_probe"
# The first line the bootstrap prints: the interpreter runs Python, so whatever goes wrong after
# it is the probe's failure (a crash, a signal, a broken import), not a program that is not Python.
STARTED = PROBE_ID + " started"

# PEP 552 header (Python 3.7+): magic, flags, then mtime + size or an 8-byte source hash.
HEADER_SIZE = 16
FLAG_HASH_BASED = 1
FLAG_CHECK_SOURCE = 2

# compare_code=auto compiles a timestamp-valid pyc only when its source's inode changed (ctime)
# at or after the moment the pyc was written (its mtime). cp -p, rsync -t, tar and same-second
# edits can restore a source's mtime and size but never its ctime, which the kernel sets on
# every write, so a patch made after the pyc always triggers the comparison. Equal timestamps
# (coarse clocks) are compared too. The one gap left is Python's own: an edit that keeps mtime
# and size and lands while an importer is compiling that very file; compare_code=always closes
# it. A window here would cover it, but a fresh pip install compiles most files within a second
# of writing them, and every such file would then be compiled again on every run (measured:
# 315 of 575 files of ansible-core, 50 times slower).
RECHECK_WINDOW_NS = 0

# Full comparisons are spread over forked workers when there are enough of them to pay for it.
PARALLEL_MIN_ITEMS = 64
MAX_WORKERS = 16

# Finders every interpreter has; an unknown name lists only the others (editable installs...).
STANDARD_FINDERS = ("BuiltinImporter", "FrozenImporter", "PathFinder")

FILE_TYPES = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
              (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


class ProbeError(Exception):
    """A request the probe cannot serve; the message goes to the user as is."""


class NotRegularFile(OSError):
    """A name that is not a regular file where a source or a pyc was expected."""


def to_wire(name):
    """A local str name as wire text: its bytes decoded as UTF-8, undecodable bytes as surrogates."""
    return os.fsencode(name).decode("utf-8", "surrogateescape")


def from_wire(text):
    """Wire text back to a local str name (the same bytes on disk)."""
    return os.fsdecode(text.encode("utf-8", "surrogateescape"))


def message_to_wire(text):
    """A sentence that holds names, as wire text when the file system encoding can carry it."""
    try:
        return to_wire(text)
    except UnicodeError:
        return text


def resolve_path(path):
    """path made absolute with every '..' taken from where the kernel is at that point.

    os.path.normpath and abspath drop 'link/..' as text, but the kernel follows link first and
    then goes up from its target, so '/x/link/../pkg' names the pkg beside link's target, not
    /x/pkg. Each '..' here goes up from the real path of what precedes it; other components,
    symbolic links included, are kept as given (bytecode under PYTHONPYCACHEPREFIX is keyed
    by the path as spelled). The module and the probe both resolve with this function."""
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    resolved = os.sep
    for part in path.split(os.sep):
        if part in ("", "."):
            continue
        if part == "..":
            resolved = os.path.dirname(os.path.realpath(resolved))
        else:
            resolved = os.path.join(resolved, part)
    return resolved


def file_type(mode):
    for test, name in FILE_TYPES:
        if test(mode):
            return name
    return "special file"


def read_regular(path, size=-1):
    """The bytes of a regular file (the first `size` only when given) and its fstat.

    A FIFO, socket or device is never opened: stat first (a device's open can act, a FIFO's
    blocks until a writer comes), then open non-blocking and check the opened file itself, so a
    name swapped for a FIFO in between is refused, not waited on. Raises NotRegularFile."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(errno.EINVAL, "not a regular file ({0})".format(file_type(info.st_mode)), path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file ({0})".format(file_type(info.st_mode)), path)
        chunks = []
        left = size
        while left != 0:
            chunk = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            if left > 0:
                left -= len(chunk)
        return b"".join(chunks), info
    finally:
        os.close(fd)


def parse_pyc_name(name):
    """Split '<stem>.<tag>[.opt-N].pyc' into (stem, tag, opt), opt being '' or 'opt-N'.

    Returns None when the name carries no interpreter tag: importlib never loads such a file
    from __pycache__, so it cannot be matched to an interpreter.

    The inverse of importlib.util.cache_from_source, for every interpreter's tag. Not
    importlib.util.source_from_cache, which answers otherwise for names that
    cache_from_source writes or never writes: it refuses a stem with a dot in it
    (py_compile and compileall name the bytecode of foo.bar.py foo.bar.cpython-311.pyc),
    and takes mod.opt-1.pyc and .cpython-311.pyc for bytecode of mod.py and of .py."""
    if not name.endswith(".pyc"):
        return None
    base = name[:-4]
    head, dot, last = base.rpartition(".")
    if not dot:
        return None
    opt = ""
    if last.startswith("opt-"):
        opt = last
        head, dot, last = head.rpartition(".")
        if not dot:
            return None
    if not head or not last:
        return None
    return head, last, opt


def parse_header(data):
    """Decode a PEP 552 header into a dict; ValueError when it is truncated or malformed."""
    if len(data) < HEADER_SIZE:
        raise ValueError("truncated header ({0} bytes)".format(len(data)))
    flags = int.from_bytes(data[4:8], "little")
    if flags & ~(FLAG_HASH_BASED | FLAG_CHECK_SOURCE):
        raise ValueError("invalid flags {0:#x}".format(flags))
    header = {"magic": bytes(data[:4]), "flags": flags, "hash_based": bool(flags & FLAG_HASH_BASED)}
    if header["hash_based"]:
        header["checked"] = bool(flags & FLAG_CHECK_SOURCE)
        header["source_hash"] = bytes(data[8:16])
    else:
        header["mtime"] = int.from_bytes(data[8:12], "little")
        header["size"] = int.from_bytes(data[12:16], "little")
    return header


def same_code(pyc_body, source_bytes, source_path, level):
    """True when the pyc's code is what the source compiles to now under this interpreter.

    Code objects are compared with ==, not their marshal dumps: marshal output depends on
    reference counts at dump time (FLAG_REF), so two compiles of one source in two processes
    can differ byte for byte. Code equality compares what runs: bytecode, constants (nested
    code objects recursively, 0.0 and -0.0 kept apart), names, argument layout, line and
    exception tables; it ignores co_filename, which importlib rewrites on load anyway.
    compile() gets what importlib's source_to_code gives it: the raw bytes (so coding
    declarations and BOMs count alike), dont_inherit, and the level named by the opt tag."""
    code = marshal.loads(pyc_body)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = compile(source_bytes, source_path, "exec", dont_inherit=True, optimize=level)
    return code == fresh


def compare_one(item):
    """Worker for one full comparison: (pyc, source, level) -> (pyc, reason or None, problem or None)."""
    pyc, source, level = item
    try:
        body = read_regular(pyc)[0][HEADER_SIZE:]
    except OSError as exc:
        return pyc, None, "cannot read: {0}".format(exc.strerror or exc)
    try:
        source_bytes = read_regular(source)[0]
    except OSError as exc:
        return pyc, None, "cannot read its source {0}: {1}".format(source, exc.strerror or exc)
    try:
        if same_code(body, source_bytes, source, level):
            return pyc, None, None
        return pyc, "code differs", None
    except (SyntaxError, ValueError) as exc:
        # A pyc of a source that no longer compiles can only be older code than the source.
        if isinstance(exc, SyntaxError):
            return pyc, "source does not compile", None
        return pyc, "corrupt bytecode", None
    except (EOFError, TypeError):
        return pyc, "corrupt bytecode", None


def worker_count(items):
    if items < PARALLEL_MIN_ITEMS or not hasattr(os, "fork"):
        return 1
    try:
        workers = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        workers = os.cpu_count() or 1
    return max(1, min(workers, MAX_WORKERS, items))


def compare_all(items):
    """compare_one over items, in order; in forked workers when there are many and fork exists.

    Each worker takes every n-th item (files of one directory tend to be alike, so this spreads
    the big ones) and sends its verdicts back through its own pipe. Not multiprocessing: its
    Pool needs a POSIX semaphore, which glibc creates as a file in /dev/shm, so a read-only or
    full /dev/shm (exactly what a crashed node may have) made the probe die with EROFS or ENOSPC;
    and a Pool whose worker is killed (the OOM killer) waits forever. A pipe needs neither, and
    a dead worker is seen at once: its pipe ends early and waitpid says why."""
    workers = worker_count(len(items))
    if workers <= 1:
        return [compare_one(item) for item in items]
    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    results = [None] * len(items)
    try:
        for index in range(workers):
            share = items[index::workers]
            read_fd, write_fd = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(read_fd)
                os.close(write_fd)
                results[index::workers] = [compare_one(item) for item in share]
                continue
            if pid == 0:
                serve_share(share, write_fd, [fd for _pid, fd, _index in children] + [read_fd])
            os.close(write_fd)
            children.append((pid, read_fd, index))
        while children:
            pid, read_fd, index = children.pop(0)
            results[index::workers] = collect_share(pid, read_fd, items[index::workers])
    finally:
        for pid, read_fd, _index in children:
            # Only after an error above: stop and reap the workers still running.
            os.close(read_fd)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return results


def serve_share(share, write_fd, inherited):
    """In a forked worker: compare share, write the verdicts to write_fd, and exit."""
    status = 0
    try:
        for fd in inherited:
            os.close(fd)
        data = marshal.dumps([compare_one(item) for item in share])
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]
    except BaseException:  # noqa: B902 - nothing may unwind past a forked child's own exit
        status = 70
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: B902
            pass
    os._exit(status)


def collect_share(pid, read_fd, share):
    """The verdicts a worker sent, or ProbeError saying how it died."""
    chunks = []
    try:
        while True:
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    _pid, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        try:
            verdicts = [tuple(verdict) for verdict in marshal.loads(b"".join(chunks))]
        except (EOFError, ValueError, TypeError):
            verdicts = None
        if verdicts is not None and len(verdicts) == len(share):
            return verdicts
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            how = "was killed by signal {0} ({1})".format(signal.Signals(number).name, number)
        except ValueError:
            how = "was killed by signal {0}".format(number)
    elif os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        how = "exited with status {0}".format(os.WEXITSTATUS(status))
    else:
        how = "sent an incomplete answer"
    raise ProbeError("a code comparison worker (pid {0}) {1} while comparing {2} files, among them {3}".format(pid, how, len(share), share[0][0]))


def run_bounded(argv, data, timeout, drain, user=None, env=None):
    """Run argv with data on its stdin for at most timeout seconds: (rc, stdout, stderr, timed_out).

    With user (a pwd entry), argv runs as that user: no supplementary groups, the user's group and
    uid, set in the child before exec (Popen does setgroups, setregid, setreuid in that order); env
    replaces the environment when given.

    Used by the module, never by the probe. Not module.run_command, which has no timeout and
    shares the module's process group: argv gets a session of its own, so that at the timeout
    the whole group (the probe, its comparison workers, whatever else it started) is killed,
    while argv is not reaped yet and its pid, the group's id, cannot have been reused. And a
    program that is not Python may exit before it reads its stdin: communicate() ignores the
    broken pipe, so the caller can still say what the program printed."""
    import subprocess  # here: the probe itself never needs it
    # ansible-test 2.21 flags Popen in module_utils (run_command instead): see above for why not.
    as_user = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=ansible-bad-function
                            stderr=subprocess.PIPE, cwd="/", start_new_session=True, env=env, **as_user)
    try:
        out, err = proc.communicate(data, timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass  # the group is gone already
    try:
        out, err = proc.communicate(timeout=drain)
    except subprocess.TimeoutExpired:
        # Only a process that left the group (setsid) can hold the pipes this long.
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        proc.wait()
        out, err = b"", b""
    return proc.returncode, out, err, True


def finder_name(finder):
    name = getattr(finder, "__qualname__", None) or type(finder).__qualname__
    module = getattr(finder, "__module__", None) or type(finder).__module__
    return name if module in (None, "builtins", "_frozen_importlib", "_frozen_importlib_external") else module + "." + name


def find_spec(name, fullname, path, finders):
    """The first spec a finder gives for fullname, asking them in order as import does."""
    for finder in finders:
        method = getattr(finder, "find_spec", None)
        if method is None:
            continue  # a finder of the removed find_module protocol: import skips it too (3.12+)
        try:
            spec = method(fullname, path)
        except Exception as exc:  # noqa: B902 - any finder's failure is reported, as import would raise it
            raise ProbeError("module '{0}' cannot be looked up: the import finder {1} failed on '{2}': {3}: {4}".format(
                name, finder_name(finder), fullname, type(exc).__name__, exc))
        if spec is not None:
            return spec
    return None


def resolve_module(name, search_path=None):
    """Find where a dotted module lives without importing it or its parent packages.

    importlib.util.find_spec('a.b') imports 'a'. Here each name is looked up with the finders
    of sys.meta_path in order, as import does, so that packages only a finder knows are found
    (the __editable__ finder of a setuptools `pip install -e`, installed by a .pth file);
    a parent package is given to its submodules' lookup as a stand-in module holding only its
    search locations, never by running its code. With search_path, only sys.path's own
    PathFinder is asked, on that path. Returns the files or directories to purge: a module's
    source file, or a package's directories (several for a namespace package)."""
    parts = name.split(".")
    if not name or not all(part.isidentifier() for part in parts):
        raise ProbeError("'{0}' is not a dotted module name".format(name))
    if search_path is None:
        finders, path = list(sys.meta_path), None
    else:
        finders, path = [importlib.machinery.PathFinder], list(search_path)
    stand_ins = []
    try:
        for index, part in enumerate(parts):
            fullname = ".".join(parts[:index + 1])
            spec = find_spec(name, fullname, path, finders)
            if spec is None:
                raise ProbeError(not_found(name, parts, index, path, finders))
            # Read now: a namespace package's locations are recomputed from its parent's.
            locations = spec.submodule_search_locations
            locations = None if locations is None else list(locations)
            if index + 1 < len(parts):
                if locations is None:
                    raise ProbeError("module '{0}' not found: '{1}' is a module ({2}), not a package".format(
                        name, fullname, spec.origin))
                if fullname not in sys.modules:
                    stand_in = types.ModuleType(fullname)
                    stand_in.__path__ = locations
                    stand_in.__spec__ = spec
                    sys.modules[fullname] = stand_in
                    stand_ins.append(fullname)
                path = locations
                continue
            if locations is not None:
                return [resolve_path(location) for location in locations]
            if not spec.origin or not spec.has_location:
                raise ProbeError("module '{0}' has no file on disk (origin: {1})".format(name, spec.origin))
            return [resolve_path(spec.origin)]
    finally:
        for fullname in stand_ins:
            sys.modules.pop(fullname, None)
    raise ProbeError("module '{0}' not found".format(name))  # unreachable: the loop returns or raises


def not_found(name, parts, index, path, finders):
    if index == 0:
        where = "the sys.path of {0}".format(sys.executable)
        searched = sys.path if path is None else path
    else:
        where = "package '{0}'".format(".".join(parts[:index]))
        searched = path
    others = [finder_name(finder) for finder in finders
              if (getattr(finder, "__name__", None) or type(finder).__name__) not in STANDARD_FINDERS]
    return "module '{0}' not found: no '{1}' in {2}; searched: {3}{4}".format(
        name, parts[index], where, ", ".join(searched) or "(nothing)",
        "; also asked the import finders {0}".format(", ".join(others)) if others else "")


def prefix_mirror(prefix, directory):
    """Where importlib puts the bytecode of sources in `directory` when sys.pycache_prefix is set.

    The directory of importlib.util.cache_from_source(directory + '/x.py') for every directory
    but '/' itself, where cache_from_source raises IndexError when the working directory is '/'
    (the probe's) and otherwise names one under the working directory. The module computes its
    own safety check with this function too, given the prefix the probe reported."""
    return os.path.join(prefix, os.path.abspath(directory).lstrip(os.sep))


class Scan:
    """One pass over the targets: finds every pyc, decides fresh/stale/other, reports problems."""

    def __init__(self, mode, compare_code):
        self.mode = mode
        self.compare_code = compare_code
        self.tag = sys.implementation.cache_tag
        # What import appends to a source's stem to name its bytecode at each optimization
        # level, '.cpython-311.pyc', '.cpython-311.opt-1.pyc'...: importlib.util.cache_from_source
        # on a source anywhere but directly in '/' (see prefix_mirror).
        self.levels = {os.path.basename(importlib.util.cache_from_source("/x/x.py", optimization=opt))[1:]: level
                       for level, opt in ((0, ""), (1, 1), (2, 2))}
        self.magic = importlib.util.MAGIC_NUMBER
        self.prefix = getattr(sys, "pycache_prefix", None)
        self.suffixes = list(importlib.machinery.SOURCE_SUFFIXES)
        self.checked = 0
        self.stale = []
        self.skipped = []
        self.problems = []
        self.to_compare = []
        self.compare_sources = {}
        self.seen_dirs = set()
        self.seen_pyc = set()
        self.fast_fresh = 0

    # -- walking -----------------------------------------------------------------------

    def problem(self, path, text):
        self.problems.append({"path": path, "problem": text})

    def scan_root(self, root, real_roots):
        """Scan a directory tree or one source file given as a target."""
        if os.path.isdir(root):
            self.walk(root, real_roots)
            if self.prefix:
                self.scan_mirror(root)
        else:
            self.scan_file(root)

    def walk(self, root, real_roots):
        if os.path.basename(root) == "__pycache__":
            # A __pycache__ directory given as the target: its own pycs, sources one level up.
            self.scan_pyc_dir(root, os.path.dirname(root))
            return
        stack = [root]
        while stack:
            directory = stack.pop()
            try:
                info = os.stat(directory)
            except OSError as exc:
                self.problem(directory, "cannot stat directory: {0}".format(exc.strerror or exc))
                continue
            key = (info.st_dev, info.st_ino)
            if key in self.seen_dirs:
                continue
            self.seen_dirs.add(key)
            try:
                with os.scandir(directory) as iterator:
                    entries = list(iterator)
            except OSError as exc:
                self.problem(directory, "unreadable directory: {0}".format(exc.strerror or exc))
                continue
            names = {}
            for entry in entries:
                names[entry.name] = entry
            for entry in entries:
                if entry.name == "__pycache__":
                    if self.is_dir(entry, real_roots):
                        self.scan_pyc_dir(entry.path, directory, names)
                elif self.is_dir(entry, real_roots):
                    stack.append(entry.path)

    def is_dir(self, entry, real_roots):
        """Whether to descend into entry: real directories, and symlinks to directories that stay
        inside the targets and do not loop. Loops and links out of the targets are reported."""
        try:
            if not entry.is_symlink():
                return entry.is_dir(follow_symlinks=False)
            if not entry.is_dir():
                return False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self.problem(entry.path, "symlink loop")
            return False
        target = os.path.realpath(entry.path)
        here = os.path.realpath(os.path.dirname(entry.path))
        if here == target or here.startswith(target + os.sep):
            self.problem(entry.path, "symlink loop: points to its own ancestor {0}".format(target))
            return False
        if not any(target == real or target.startswith(real + os.sep) for real in real_roots):
            self.problem(entry.path, "symlink to {0}, outside the targets: not followed".format(target))
            return False
        return True

    def scan_file(self, source):
        """A single source file: its pycs in the __pycache__ beside it and under the prefix."""
        directory, filename = os.path.split(source)
        stem = None
        for suffix in self.suffixes:
            if filename.endswith(suffix):
                stem = filename[:-len(suffix)]
        if stem is None:
            self.problem(source, "not a Python source file: it has no bytecode to check")
            return
        pycache = os.path.join(directory, "__pycache__")
        if os.path.isdir(pycache):
            self.scan_pyc_dir(pycache, directory, only_stem=stem)
        if self.prefix:
            mirror = prefix_mirror(self.prefix, directory)
            if os.path.isdir(mirror):
                self.scan_pyc_dir(mirror, directory, only_stem=stem)

    def scan_mirror(self, root):
        """Walk the PYTHONPYCACHEPREFIX mirror of a target tree (for the root as given and as resolved)."""
        mirrors = {}
        for form in (os.path.abspath(root), os.path.realpath(root)):
            mirrors[prefix_mirror(self.prefix, form)] = form
        for mirror, source_root in sorted(mirrors.items()):
            if not os.path.isdir(mirror):
                continue
            for current, dirs, _files in os.walk(mirror, onerror=lambda exc: self.problem(
                    exc.filename, "unreadable directory: {0}".format(exc.strerror or exc))):
                dirs.sort()
                relative = os.path.relpath(current, mirror)
                source_dir = source_root if relative == "." else os.path.join(source_root, relative)
                self.scan_pyc_dir(current, source_dir)

    def scan_pyc_dir(self, pyc_dir, source_dir, names=None, only_stem=None):
        try:
            with os.scandir(pyc_dir) as iterator:
                entries = sorted(iterator, key=lambda entry: entry.name)
        except OSError as exc:
            self.problem(pyc_dir, "unreadable directory: {0}".format(exc.strerror or exc))
            return
        for entry in entries:
            if not entry.name.endswith(".pyc"):
                continue
            try:
                if not entry.is_file():
                    continue
            except OSError:
                continue
            parsed = parse_pyc_name(entry.name)
            if only_stem is not None and (parsed is None or parsed[0] != only_stem):
                continue
            if entry.path in self.seen_pyc:
                continue
            self.seen_pyc.add(entry.path)
            self.checked += 1
            self.judge(entry.path, parsed, source_dir, names)

    # -- judging -----------------------------------------------------------------------

    def find_source(self, source_dir, stem, names):
        """(source path, its stat, None) for the source importlib would load for stem in source_dir:
        the first suffix naming a regular file (symbolic links followed), as FileFinder requires.
        Otherwise (expected path, None, what the first existing name is instead, or None).
        (importlib.util.source_from_cache names the first suffix only, and looks at no file.)"""
        other = None
        for suffix in self.suffixes:
            candidate = os.path.join(source_dir, stem + suffix)
            if names is not None and (stem + suffix) not in names:
                continue
            try:
                info = os.stat(candidate)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                return candidate, info, None
            if other is None:
                other = (candidate, file_type(info.st_mode))
        if other is not None:
            return other[0], None, other[1]
        return os.path.join(source_dir, stem + self.suffixes[0]), None, None

    def judge(self, pyc, parsed, source_dir, names):
        if parsed is None:
            if self.mode == "all":
                self.stale.append({"pyc": pyc, "source": None, "reason": "mode all"})
            else:
                self.skipped.append({"pyc": pyc, "source": None, "reason": "no interpreter tag in the name; no interpreter loads it"})
            return
        stem, tag, opt = parsed
        source, source_stat, other_type = self.find_source(source_dir, stem, names)
        if self.mode == "all":
            self.stale.append({"pyc": pyc, "source": source, "reason": "mode all"})
            return
        if source_stat is None:
            # No interpreter loads a __pycache__ pyc whose source is gone, whatever its tag; nor
            # one whose source name is a FIFO, socket, device or directory: import only loads
            # (and only compiles) a regular file, and the probe never opens anything else.
            reason = "source is not a regular file ({0})".format(other_type) if other_type else "source missing"
            self.stale.append({"pyc": pyc, "source": source, "reason": reason})
            return
        if tag != self.tag:
            self.skipped.append({"pyc": pyc, "source": source, "reason": "compiled for {0}; this interpreter is {1}".format(tag, self.tag)})
            return
        level = self.levels.get(os.path.basename(pyc)[len(stem):])
        if level is None:
            self.skipped.append({"pyc": pyc, "source": source, "reason": "unknown optimization tag {0}".format(opt)})
            return
        reason = self.header_verdict(pyc, source, source_stat, level)
        if reason:
            self.stale.append({"pyc": pyc, "source": source, "reason": reason})

    def header_verdict(self, pyc, source, source_stat, level):
        """Reason the header proves staleness, or None (queued for a code comparison if needed)."""
        try:
            data, pyc_stat = read_regular(pyc, HEADER_SIZE)
        except OSError as exc:
            self.problem(pyc, "cannot read: {0}".format(exc.strerror or exc))
            return None
        try:
            header = parse_header(data)
        except ValueError as exc:
            return "corrupt header: {0}".format(exc)
        if header["magic"] != self.magic:
            return "magic number differs"
        if header["hash_based"]:
            try:
                source_bytes = read_regular(source)[0]
            except OSError as exc:
                self.problem(source, "cannot read: {0}".format(exc.strerror or exc))
                return None
            if importlib.util.source_hash(source_bytes) != header["source_hash"]:
                return "hash differs"
            # Same hash, same bytes: the code can only differ if compile() changed under the same magic.
            if self.compare_code == "always":
                self.to_compare.append((pyc, source, level))
            return None
        if header["mtime"] != (int(source_stat.st_mtime) & 0xFFFFFFFF):
            return "mtime differs"
        if header["size"] != (source_stat.st_size & 0xFFFFFFFF):
            return "size differs"
        if self.compare_code == "never":
            return None
        if self.compare_code == "auto" and source_stat.st_ctime_ns + RECHECK_WINDOW_NS < pyc_stat.st_mtime_ns:
            self.fast_fresh += 1
            return None
        self.to_compare.append((pyc, source, level))
        return None

    def finish(self):
        """Run the queued code comparisons and fold their verdicts in."""
        sources = {}
        for pyc, source, _level in self.to_compare:
            sources[pyc] = source
        for pyc, reason, problem in compare_all(self.to_compare):
            if problem:
                self.problem(pyc, problem)
            elif reason:
                self.stale.append({"pyc": pyc, "source": sources[pyc], "reason": reason})
        self.stale.sort(key=lambda item: item["pyc"])
        self.skipped.sort(key=lambda item: item["pyc"])


def run(request):
    """Serve one request dict; returns the result dict (never raises ProbeError)."""
    info = {
        "probe": PROBE_ID,
        "executable": sys.executable,
        "version": ".".join(str(part) for part in sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "cache_tag": sys.implementation.cache_tag,
        "pycache_prefix": getattr(sys, "pycache_prefix", None),
        "sys_path": list(sys.path),
    }
    try:
        if sys.version_info < (3, 8):
            raise ProbeError("Python {0} is too old: the probe needs Python 3.8 or later".format(info["version"]))
        if not info["cache_tag"]:
            raise ProbeError("{0} does not use cached bytecode (sys.implementation.cache_tag is None)".format(sys.executable))
        targets = []
        for path in request.get("paths") or []:
            targets.append({"root": resolve_path(from_wire(path)), "from": "paths"})
        for name in request.get("modules") or []:
            for location in resolve_module(name):
                targets.append({"root": location, "from": "module " + name})
        scan = Scan(request.get("mode", "stale"), request.get("compare_code", "auto"))
        real_roots = [os.path.realpath(target["root"]) for target in targets if os.path.isdir(target["root"])]
        for target in targets:
            scan.scan_root(target["root"], real_roots)
        scan.finish()
    except ProbeError as exc:
        info["error"] = str(exc)
        return wired(info)
    info.update({
        "error": None,
        "targets": targets,
        "checked": scan.checked,
        "stale": scan.stale,
        "skipped": scan.skipped,
        "problems": scan.problems,
        "compared": len(scan.to_compare),
        "fast_fresh": scan.fast_fresh,
    })
    return wired(info)


def wired(info):
    """The result with every name and every sentence as wire text."""
    for key in ("executable", "pycache_prefix"):
        if info.get(key):
            info[key] = to_wire(info[key])
    info["sys_path"] = [to_wire(entry) for entry in info["sys_path"]]
    if info.get("error"):
        info["error"] = message_to_wire(info["error"])
    for target in info.get("targets") or []:
        target["root"] = to_wire(target["root"])
    for key in ("stale", "skipped"):
        for item in info.get(key) or []:
            item["pyc"] = to_wire(item["pyc"])
            if item["source"] is not None:
                item["source"] = to_wire(item["source"])
            item["reason"] = message_to_wire(item["reason"])
    for item in info.get("problems") or []:
        item["path"] = to_wire(item["path"])
        item["problem"] = message_to_wire(item["problem"])
    return info


def run_main(request_json):
    """Entry point: the module's bootstrap, sent to `python -B -`, runs this file's source and then this."""
    # `python -` puts '' (the current directory) first on sys.path; the service never has it.
    if sys.path and sys.path[0] == "":
        del sys.path[0]
    # What an import finder prints goes to stderr: stdout carries the result line alone.
    stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        result = run(json.loads(request_json))
    finally:
        sys.stdout = stdout
    # ensure_ascii (the default) writes surrogates as \udcXX escapes: the output is ASCII.
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
