# -*- coding: utf-8 -*-

# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private to this collection: the bytecode probe of cleanslate.gpu.pycache_purge.

The module does not run this file under its own interpreter. It sends this file's source,
followed by one call of run_request(), on stdin to the interpreter named in the task's
`python`, because what makes a .pyc valid belongs to that interpreter: its cache tag, magic
number, source hash key, compiler and sys.path. The probe only reads; it prints one JSON
object and the module removes files itself, after its own safety check.

So this file must run on Python 3.8 and later, import nothing outside the standard library,
and never import the packages it inspects (importing vLLM takes seconds and may crash).
"""

from __future__ import annotations

import errno
import importlib.machinery
import importlib.util
import json
import marshal
import os
import stat
import sys
import warnings

PROBE_ID = "cleanslate.gpu.pyc_probe"

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

OPT_LEVELS = {"": 0, "opt-1": 1, "opt-2": 2}


class ProbeError(Exception):
    """A request the probe cannot serve; the message goes to the user as is."""


def parse_pyc_name(name):
    """Split '<stem>.<tag>[.opt-N].pyc' into (stem, tag, opt), opt being '' or 'opt-N'.

    Returns None when the name carries no interpreter tag: importlib never loads such a file
    from __pycache__, so it cannot be matched to an interpreter."""
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
        with open(pyc, "rb") as handle:
            body = handle.read()[HEADER_SIZE:]
        with open(source, "rb") as handle:
            source_bytes = handle.read()
    except OSError as exc:
        return pyc, None, "cannot read: {0}".format(exc.strerror or exc)
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


def compare_all(items):
    """Run compare_one over items, in forked workers when there are many and fork exists."""
    workers = 1
    if len(items) >= PARALLEL_MIN_ITEMS:
        try:
            workers = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            workers = os.cpu_count() or 1
        workers = min(workers, MAX_WORKERS)
    if workers > 1:
        try:
            import multiprocessing
            context = multiprocessing.get_context("fork")
        except (ImportError, ValueError):
            context = None
        if context is not None:
            # fork, not spawn: the probe's __main__ is stdin, which a spawned child cannot re-import.
            pool = context.Pool(workers)
            try:
                return pool.map(compare_one, items, chunksize=max(1, len(items) // (workers * 8)))
            finally:
                pool.close()
                pool.join()
    return [compare_one(item) for item in items]


def resolve_module(name, search_path=None):
    """Find where a dotted module lives without importing it or its parent packages.

    importlib.util.find_spec('a.b') imports 'a'; PathFinder.find_spec with an explicit path
    does not, so the walk goes one name at a time down the packages' search locations.
    Returns the list of files or directories to purge: a module's source file, or a
    package's directories (several for a namespace package)."""
    parts = name.split(".")
    if not name or not all(part.isidentifier() for part in parts):
        raise ProbeError("'{0}' is not a dotted module name".format(name))
    path = list(sys.path if search_path is None else search_path)
    for index, part in enumerate(parts):
        fullname = ".".join(parts[:index + 1])
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            where = "the sys.path of {0}".format(sys.executable) if index == 0 else "package '{0}'".format(".".join(parts[:index]))
            raise ProbeError("module '{0}' not found: no '{1}' in {2}; searched: {3}".format(
                name, part, where, ", ".join(path) or "(nothing)"))
        locations = spec.submodule_search_locations
        if index + 1 < len(parts):
            if locations is None:
                raise ProbeError("module '{0}' not found: '{1}' is a module ({2}), not a package".format(
                    name, fullname, spec.origin))
            path = list(locations)
            continue
        if locations is not None:
            return [os.path.abspath(location) for location in locations]
        if not spec.origin or not spec.has_location:
            raise ProbeError("module '{0}' has no file on disk (origin: {1})".format(name, spec.origin))
        return [os.path.abspath(spec.origin)]
    raise ProbeError("module '{0}' not found".format(name))  # unreachable: the loop returns or raises


def prefix_mirror(prefix, directory):
    """Where importlib puts the bytecode of sources in `directory` when sys.pycache_prefix is set."""
    return os.path.join(prefix, os.path.abspath(directory).lstrip(os.sep))


class Scan(object):
    """One pass over the targets: finds every pyc, decides fresh/stale/other, reports problems."""

    def __init__(self, mode, compare_code):
        self.mode = mode
        self.compare_code = compare_code
        self.tag = sys.implementation.cache_tag
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
        """The existing source file for stem in source_dir, or (expected path, None)."""
        for suffix in self.suffixes:
            candidate = os.path.join(source_dir, stem + suffix)
            if names is not None and (stem + suffix) not in names:
                continue
            try:
                info = os.stat(candidate)
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                return candidate, info
        return os.path.join(source_dir, stem + self.suffixes[0]), None

    def judge(self, pyc, parsed, source_dir, names):
        if parsed is None:
            if self.mode == "all":
                self.stale.append({"pyc": pyc, "source": None, "reason": "mode all"})
            else:
                self.skipped.append({"pyc": pyc, "source": None, "reason": "no interpreter tag in the name; no interpreter loads it"})
            return
        stem, tag, opt = parsed
        source, source_stat = self.find_source(source_dir, stem, names)
        if self.mode == "all":
            self.stale.append({"pyc": pyc, "source": source, "reason": "mode all"})
            return
        if source_stat is None:
            # No interpreter loads a __pycache__ pyc whose source is gone, whatever its tag.
            self.stale.append({"pyc": pyc, "source": source, "reason": "source missing"})
            return
        if tag != self.tag:
            self.skipped.append({"pyc": pyc, "source": source, "reason": "compiled for {0}; this interpreter is {1}".format(tag, self.tag)})
            return
        if opt not in OPT_LEVELS:
            self.skipped.append({"pyc": pyc, "source": source, "reason": "unknown optimization tag {0}".format(opt)})
            return
        reason = self.header_verdict(pyc, source, source_stat, OPT_LEVELS[opt])
        if reason:
            self.stale.append({"pyc": pyc, "source": source, "reason": reason})

    def header_verdict(self, pyc, source, source_stat, level):
        """Reason the header proves staleness, or None (queued for a code comparison if needed)."""
        try:
            with open(pyc, "rb") as handle:
                data = handle.read(HEADER_SIZE)
                pyc_stat = os.fstat(handle.fileno())
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
                with open(source, "rb") as handle:
                    source_bytes = handle.read()
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
            targets.append({"root": path, "from": "paths"})
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
        return info
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
    return info


def run_main(request_json):
    """Entry point when sent on stdin: `python -B -` with a call to this function appended."""
    # `python -` puts '' (the current directory) first on sys.path; the service never has it.
    if sys.path and sys.path[0] == "":
        del sys.path[0]
    sys.stdout.write(json.dumps(run(json.loads(request_json))))
    sys.stdout.write("\n")
    sys.stdout.flush()
