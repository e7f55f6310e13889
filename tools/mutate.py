"""Mutation check of the safety logic: does a realistic bug in it make a test fail?

Each mutation in tests/mutations/*.yml (one file per module; the file's name is the group in the
score table) is one small textual change:

    - id: recheck-dropped                      # unique within its file
      file: plugins/module_utils/_shm_clean_module.py       # relative to the repository root
      original: |                              # must occur exactly once in file
        ...
      replacement: |
        ...
      reason: the bug this stands for, in one line
      tests:                                   # pytest arguments; node ids and paths share one
        - tests/functional/test_x.py::test_y   # run, an item with options (-k ...) runs alone
      timeout: 120                             # optional, seconds for this mutant's runs
      unobservable: why no test can see it     # optional: reported, left out of the score

Each mutant is applied to a scratch copy of the checkout (build/mutate/w<N>, made from what
git lists, so uncommitted tests count; the working tree is never touched) and its tests run
there, stopping at the first failure. A failure, a collection error or a run past the timeout
kills it; a run where everything passes means it survived. An original snippet that is not
found (the code moved), that occurs twice, or a replacement that does not compile is an error
naming the mutation, so the list is kept in step with the code. Before the mutants, the same
tests run once on the unmutated copy: a test that fails there would kill every mutant.

Usage: python tools/mutate.py [--only GLOB] [--jobs N] [--mutations PATH ...] [--check]
Exit status: 0 when the score reaches --min-score, 1 when it does not, 2 on an error.
"""
from __future__ import annotations

import argparse
import difflib
import fnmatch
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from checkout_copy import copy_checkout

REPO = Path(__file__).resolve().parent.parent
MUTATIONS = REPO / "tests" / "mutations"
FIELDS = {"id", "file", "original", "replacement", "reason", "tests", "timeout", "unobservable"}
# A mutant's tests together: far below pytest.ini's 600 s per test. A hung mutant counts as
# killed, but the tests are meant to fail fast; a mutation that needs longer says so itself.
DEFAULT_TIMEOUT = 120
# Bytecode is never written: a mutant and its restored original can have the same size and
# mtime second, and a cached .pyc of the mutant would then run in place of the original.
RUN_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}


class MutationError(Exception):
    """A mutation list that does not match the code or cannot be run; the message names it."""


@dataclass
class Mutation:
    group: str
    id: str
    file: str
    original: str
    replacement: str
    reason: str
    tests: list
    timeout: float = DEFAULT_TIMEOUT
    unobservable: str | None = None

    @property
    def name(self):
        return "%s/%s" % (self.group, self.id)


@dataclass
class Outcome:
    mutation: Mutation
    verdict: str  # killed | survived | error
    detail: str = ""
    seconds: float = 0.0
    counts: dict = field(default_factory=dict)


def load(paths):
    """Every mutation in the given files or directories, in file order; MutationError on a bad entry."""
    files = []
    for path in paths:
        path = Path(path)
        files.extend(sorted(path.glob("*.yml")) if path.is_dir() else [path])
    mutations, seen = [], set()
    for path in files:
        entries = yaml.safe_load(path.read_text()) or []
        if not isinstance(entries, list):
            raise MutationError("%s: a list of mutations expected" % path)
        for index, entry in enumerate(entries):
            where = "%s entry %d" % (path, index + 1)
            if not isinstance(entry, dict):
                raise MutationError("%s: a mapping expected" % where)
            where = "%s (%s)" % (where, entry.get("id"))
            unknown = set(entry) - FIELDS
            missing = {"id", "file", "original", "replacement", "reason"} - set(entry)
            if unknown or missing:
                raise MutationError("%s: unknown keys %s, missing keys %s" % (where, sorted(unknown), sorted(missing)))
            tests = entry.get("tests") or []
            if not isinstance(tests, list) or not all(isinstance(t, str) and t.strip() for t in tests):
                raise MutationError("%s: tests must be a list of pytest arguments" % where)
            if not tests and not entry.get("unobservable"):
                raise MutationError("%s: no tests, and not marked unobservable" % where)
            if entry["original"] == entry["replacement"]:
                raise MutationError("%s: the replacement is the original" % where)
            mutation = Mutation(group=path.stem, id=str(entry["id"]), file=entry["file"], original=entry["original"],
                                replacement=entry["replacement"], reason=entry["reason"], tests=tests,
                                timeout=float(entry.get("timeout", DEFAULT_TIMEOUT)),
                                unobservable=entry.get("unobservable"))
            if mutation.name in seen:
                raise MutationError("%s: id used twice in %s" % (mutation.id, path))
            seen.add(mutation.name)
            mutations.append(mutation)
    return mutations


def _indent(line):
    return len(line) - len(line.lstrip(" \t"))


def locate(text, original):
    """Where original occurs in text: ([(start, end, indentation)], the snippet's own indentation).

    A snippet that ends in a newline is whole lines, found at any indentation (YAML strips the
    block's own): its lines must appear consecutively with one extra indentation in common.
    Any other snippet is a piece of text, found as it is."""
    if not original.endswith("\n"):
        return [(m.start(), m.end(), "") for m in re.finditer(re.escape(original), text)], 0
    lines = original[:-1].split("\n")
    common = min(_indent(line) for line in lines if line.strip())
    parts = ["(?P<ind>[ \t]*)" + re.escape(lines[0][common:])]
    parts += ["(?P=ind)" + re.escape(line[common:]) if line.strip() else "[ \t]*" for line in lines[1:]]
    pattern = re.compile("^" + "\n".join(parts) + "\n", re.M)
    return [(m.start(), m.end(), m.group("ind")) for m in pattern.finditer(text)], common


def reindent(replacement, common, indentation):
    """replacement's lines moved from the snippet's indentation to the code's."""
    if not replacement.endswith("\n"):
        return replacement
    out = []
    for line in replacement[:-1].split("\n"):
        line = line[min(common, _indent(line)):]
        out.append(indentation + line if line.strip() else "")
    return "\n".join(out) + "\n"


def mutated_text(root, mutation):
    """(text, mutated text) of the mutation's file; MutationError unless it applies exactly once."""
    path = root / mutation.file
    try:
        text = path.read_text()
    except OSError as exc:
        raise MutationError("%s: cannot read %s: %s" % (mutation.name, mutation.file, exc.strerror))
    found, common = locate(text, mutation.original)
    if not found:
        raise MutationError("%s: original snippet not found in %s (the code moved?): %r" % (
            mutation.name, mutation.file, mutation.original[:120]))
    if len(found) > 1:
        raise MutationError("%s: original snippet found %d times in %s; make it unique" % (
            mutation.name, len(found), mutation.file))
    start, end, indentation = found[0]
    changed = text[:start] + reindent(mutation.replacement, common, indentation) + text[end:]
    if changed == text:
        raise MutationError("%s: the mutant is the original text" % mutation.name)
    if mutation.file.endswith(".py"):
        try:
            compile(changed, mutation.file, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise MutationError("%s: the mutant does not compile (a syntax error is not a realistic bug): %s" % (
                mutation.name, exc))
    return text, changed


def invocations(tests):
    """pytest argument lists: node ids and paths in one run, each item with options in its own."""
    plain, alone = [], []
    for item in tests:
        words = shlex.split(item)
        if len(words) == 1 and not words[0].startswith("-"):
            plain.extend(words)
        else:
            alone.append(words)
    return ([plain] if plain else []) + alone


def run_pytest(root, args, timeout, report):
    """(rc or None when timed out, counts, tail of output) of one pytest run in root."""
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "--no-header", "-p", "no:randomly",
            "--junitxml", str(report), *args]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **RUN_ENV), start_new_session=True)
    try:
        out, _err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        # The whole session: pytest, the module it runs and every process a test started.
        os.killpg(proc.pid, signal.SIGKILL)
        out, _err = proc.communicate()
        rc = None
    counts = {}
    try:
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = dict((key, int(suite.get(key, 0))) for key in ("tests", "failures", "errors", "skipped"))
    except (OSError, ET.ParseError, AttributeError):
        pass
    return rc, counts, out.decode("utf-8", "replace")


def judge(mutation, root, report):
    """Run the mutant's tests in root (already mutated); the Outcome."""
    started = time.monotonic()
    totals = {}
    for args in invocations(mutation.tests):
        left = mutation.timeout - (time.monotonic() - started)
        rc, counts, out = run_pytest(root, args, max(left, 1), report) if left > 0 else (None, {}, "")
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
        seconds = time.monotonic() - started
        if rc is None:
            return Outcome(mutation, "killed", "timed out after %.0f s" % mutation.timeout, seconds, totals)
        if rc in (1, 2):
            return Outcome(mutation, "killed", "collection error" if rc == 2 else "", seconds, totals)
        if rc != 0:
            # 3: pytest's own error, 4: usage (a node id that does not exist), 5: no tests selected.
            return Outcome(mutation, "error", "pytest %s exited %d: %s" % (
                " ".join(args), rc, " | ".join(out.strip().splitlines()[-3:])), seconds, totals)
    return Outcome(mutation, "survived", "", time.monotonic() - started, totals)


def prepare(scratch):
    """A fresh scratch copy of the checkout, ready for pytest (collection link, fake NVML)."""
    copy_checkout(REPO, scratch)
    link = scratch / ".ansible" / "collections" / "ansible_collections" / "cleanslate" / "gpu"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(scratch, link.parent))
    built = REPO / "build" / "fake_nvml"
    if built.is_dir():  # compiled once by `make setup`; the copy would otherwise compile its own
        (scratch / "build").mkdir(exist_ok=True)
        subprocess.run(["cp", "-a", str(built), str(scratch / "build" / "fake_nvml")], check=True)
    return scratch


def baseline(mutations, root, timeout):
    """Run every mutation's tests once on the unmutated copy; MutationError naming what fails."""
    plain, alone = [], []
    for mutation in mutations:
        for args in invocations(mutation.tests):
            target = plain if len(args) and not any(a.startswith("-") for a in args) else alone
            if target is plain:
                plain.extend(a for a in args if a not in plain)
            elif args not in alone:
                alone.append(args)
    for args in ([plain] if plain else []) + alone:
        rc, counts, out = run_pytest(root, args, timeout, root / "baseline.xml")
        if rc != 0:
            raise MutationError("the tests fail without any mutation (rc %s), so they cannot judge mutants: "
                                "pytest %s\n%s" % (rc, " ".join(args), "\n".join(out.strip().splitlines()[-15:])))


def line_for(outcome, index, total):
    mutation = outcome.mutation
    verdict = outcome.verdict.upper() if outcome.verdict != "killed" else "killed"
    if mutation.unobservable and outcome.verdict != "error":
        verdict = "unobservable"
    counts = outcome.counts
    ran = ""
    if counts:
        ran = " %d test%s" % (counts.get("tests", 0), "" if counts.get("tests") == 1 else "s")
        if counts.get("failures") or counts.get("errors"):
            ran += ", %d failed" % (counts.get("failures", 0) + counts.get("errors", 0))
        if counts.get("skipped"):
            ran += ", %d skipped" % counts["skipped"]
    text = "[%*d/%d] %-12s %-45s %6.1f s%s" % (
        len(str(total)), index, total, verdict, mutation.name, outcome.seconds, ran)
    if outcome.detail:
        text += " (%s)" % outcome.detail
    if mutation.unobservable:
        text += "\n        %s tests; unobservable: %s" % (
            "killed by its" if outcome.verdict == "killed" else "survived its" if mutation.tests else "no", mutation.unobservable)
    elif outcome.verdict == "survived":
        text += "\n        survived: %s" % mutation.reason
    return text


def table(outcomes):
    """The score table (one row per group) and (killed, scored)."""
    groups = {}
    for outcome in outcomes:
        row = groups.setdefault(outcome.mutation.group, {"killed": 0, "survived": 0, "unobservable": 0, "error": 0})
        if outcome.verdict == "error":
            row["error"] += 1
        elif outcome.mutation.unobservable:
            row["unobservable"] += 1
        else:
            row[outcome.verdict] += 1
    lines = ["%-16s %7s %9s %13s %6s" % ("group", "killed", "survived", "unobservable", "error")]
    total = {"killed": 0, "survived": 0, "unobservable": 0, "error": 0}
    for group in sorted(groups):
        row = groups[group]
        lines.append("%-16s %7d %9d %13d %6d" % (group, row["killed"], row["survived"], row["unobservable"], row["error"]))
        for key in total:
            total[key] += row[key]
    lines.append("%-16s %7d %9d %13d %6d" % (
        "total", total["killed"], total["survived"], total["unobservable"], total["error"]))
    return lines, total["killed"], total["killed"] + total["survived"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--mutations", nargs="+", default=[str(MUTATIONS)], help="mutation files or directories")
    parser.add_argument("--only", action="append", default=[], help="run only mutations whose group/id matches (glob)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATE_JOBS", "2")), help="scratch copies run at once")
    parser.add_argument("--scratch", default=str(REPO / "build" / "mutate"), help="where the scratch copies go")
    parser.add_argument("--min-score", type=float, default=95.0, help="percent of scored mutants that must be killed")
    parser.add_argument("--check", action="store_true", help="only check that every mutation applies; run nothing")
    parser.add_argument("--diff", action="store_true", help="print each mutant as a diff; run nothing")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the tests without mutations")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        mutations = load(args.mutations)
        if args.only:
            mutations = [m for m in mutations if any(fnmatch.fnmatchcase(m.name, pattern) for pattern in args.only)]
        if not mutations:
            raise MutationError("no mutations selected")
        problems = []
        for mutation in mutations:
            try:
                original, changed = mutated_text(REPO, mutation)
            except MutationError as exc:
                problems.append(str(exc))
                continue
            if args.diff:
                sys.stdout.writelines(difflib.unified_diff(
                    original.splitlines(True), changed.splitlines(True), "a/" + mutation.file, "b/" + mutation.file,
                    n=1))
                print("    ^ %s: %s\n" % (mutation.name, mutation.reason))
        if problems:
            raise MutationError("\n".join(problems))
    except (MutationError, yaml.YAMLError) as exc:
        print("mutate: error: %s" % exc, file=sys.stderr)
        return 2
    if args.check or args.diff:
        print("%d mutations apply to the code" % len(mutations))
        return 0
    scratch = Path(args.scratch).resolve()
    jobs = max(1, min(args.jobs, len(mutations)))
    roots = queue.Queue()
    for number in range(jobs):
        roots.put(prepare(scratch / ("w%d" % (number + 1))))
    print("%d mutations, %d at a time, in scratch copies under %s" % (len(mutations), jobs, scratch), flush=True)
    if not args.no_baseline:
        root = roots.get()
        try:
            baseline([m for m in mutations if m.tests], root, max(m.timeout for m in mutations) * 4)
        except MutationError as exc:
            print("mutate: error: %s" % exc, file=sys.stderr)
            return 2
        finally:
            roots.put(root)
        print("baseline: every listed test passes without mutations (%.0f s)" % (time.monotonic() - started), flush=True)
    lock = threading.Lock()
    done = []

    def one(mutation):
        root = roots.get()
        path = root / mutation.file
        original = None
        try:
            original, changed = mutated_text(root, mutation)
            path.write_text(changed)
            if mutation.tests:
                outcome = judge(mutation, root, root / "report.xml")
            else:
                outcome = Outcome(mutation, "survived", "")
        except Exception as exc:  # noqa: B902 - reported per mutation; the others still run
            outcome = Outcome(mutation, "error", "%s: %s" % (type(exc).__name__, exc))
        finally:
            if original is not None:
                path.write_text(original)
            roots.put(root)
        with lock:
            done.append(outcome)
            print(line_for(outcome, len(done), len(mutations)), flush=True)
        return outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, mutations))
    lines, killed, scored = table(done)
    print()
    print("\n".join(lines))
    score = 100.0 * killed / scored if scored else 100.0
    print("score: %d of %d scored mutants killed = %.1f%% (minimum %.0f%%); %.0f s" % (
        killed, scored, score, args.min_score, time.monotonic() - started))
    errors = [o for o in done if o.verdict == "error"]
    if errors:
        print("mutate: error: %d mutation(s) could not be judged: %s" % (
            len(errors), ", ".join(o.mutation.name for o in errors)), file=sys.stderr)
        return 2
    return 0 if score >= args.min_score else 1


if __name__ == "__main__":
    sys.exit(main())
