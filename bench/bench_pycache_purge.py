"""Benchmark: pycache_purge's stale check over a site-packages-sized tree.

    .venv/bin/python bench/bench_pycache_purge.py [--files 20000] [--rebuild]

Builds (once; reused while the parameters match) a synthetic site-packages tree of about
20,000 .py files under build/bench/pycache_site, compiled the way pip does (all sources
written, then `python -m compileall -j0`: timestamp pycs). Then, each round:

  1. plants stale bytecode: patches that keep size and mtime (cp -p), patches that change the
     size, and orphaned pycs whose source was deleted;
  2. runs the real module (run_module: fresh interpreter, real probe) in check mode, then for
     real, then once more on the clean tree; each must find exactly what was planted;
  3. times the manual ritual's lower bound side by side: `find TREE -name '*.pyc'` (listing
     only; the ritual then deletes everything and the next start recompiles it all, whose
     cost is the compileall time measured at build);
  4. times compare_code=always on one top package, reported per 1,000 files.

Prints a table and writes build/bench/pycache_purge.json. Target: stale check under 5 s.
"""
from __future__ import annotations

import argparse
import json
import os
import py_compile
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.run_module import run_module  # noqa: E402
from bench import provenance  # noqa: E402

BENCH = REPO / "build" / "bench"
TREE = BENCH / "pycache_site"
STAMP = TREE / ".bench-stamp.json"
PYTHON = sys.executable
TARGET_S = 5.0


def module_text(index):
    """A module of 0.5 to 8 KB (sizes spread like a real site-packages), deterministic per index."""
    functions = 4 + (index * 7919) % 76
    parts = ['"""Synthetic module %d."""\nimport os\n\nCONST_%d = %d\n' % (index, index, index)]
    for k in range(functions):
        parts.append('\n\ndef f_%d_%d(x, y=%d):\n    """Return a list."""\n    return [x, y, os.sep, %d.5]\n'
                     % (index, k, k, k))
    return "".join(parts)


def layout(files):
    """(top packages, subpackages per top, modules per subpackage) giving about `files` modules."""
    tops, subs = 20, 10
    return tops, subs, max(1, round(files / (tops * subs)))


def build(files, rebuild):
    tops, subs, mods = layout(files)
    wanted = {"tops": tops, "subs": subs, "mods": mods, "python": PYTHON,
              "version": list(sys.version_info[:3]), "generator": 1}
    if TREE.exists() and not rebuild:
        try:
            stamp = json.loads(STAMP.read_text())
            if stamp["params"] == wanted:
                return stamp
        except (OSError, ValueError, KeyError):
            pass
    shutil.rmtree(TREE, ignore_errors=True)
    TREE.mkdir(parents=True)
    index = 0
    started = time.perf_counter()
    for top in range(tops):
        top_dir = TREE / ("pkg%02d" % top)
        top_dir.mkdir()
        (top_dir / "__init__.py").write_text("")
        for sub in range(subs):
            sub_dir = top_dir / ("sub%02d" % sub)
            sub_dir.mkdir()
            (sub_dir / "__init__.py").write_text("")
            for mod in range(mods):
                (sub_dir / ("m%04d.py" % mod)).write_text(module_text(index))
                index += 1
    written = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run([PYTHON, "-m", "compileall", "-q", "-j", "0", str(TREE)], check=True)
    compiled = time.perf_counter() - started
    py_files = index + tops + tops * subs
    stamp = {"params": wanted, "py_files": py_files, "write_s": round(written, 3), "compileall_s": round(compiled, 3)}
    STAMP.write_text(json.dumps(stamp))
    return stamp


def plant(round_no):
    """Stale bytecode of three kinds in known places; returns {pyc: expected reason}."""
    expected = {}
    for n in range(20):
        source = TREE / ("pkg%02d" % (n % 20)) / ("sub%02d" % (n % 10)) / ("m%04d.py" % (n * 3 % 50))
        original = source.read_text()
        source.write_text(original)  # the source as the pyc will know it
        pyc = py_compile.compile(str(source), doraise=True)
        # Same length, mtime put back: what cp -p or rsync -t of a one-character fix does.
        patched = original.replace("[x, y,", "[y, x,", 1) if round_no % 2 == 0 else original.replace("[y, x,", "[x, y,", 1)
        if patched == original:
            patched = original.replace("[x, y,", "[y, x,", 1)
        st = os.stat(source)
        source.write_text(patched)
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
        expected[pyc] = "code differs"
    for n in range(10):
        source = TREE / ("pkg%02d" % n) / "sub09" / ("m%04d.py" % (60 + n))
        text = source.read_text()
        pyc = py_compile.compile(str(source), doraise=True)
        st = os.stat(source)
        source.write_text(text + "# patched\n" if not text.endswith("# patched\n") else text[:-len("# patched\n")])
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
        expected[pyc] = "size differs"
    orphans = TREE / "pkg19" / "orphans"
    orphans.mkdir(exist_ok=True)
    (orphans / "__init__.py").write_text("")
    for n in range(10):
        source = orphans / ("gone%d.py" % n)
        source.write_text("X = %d\n" % n)
        expected[py_compile.compile(str(source), doraise=True)] = "source missing"
        source.unlink()
    return expected


def timed(params, check=False):
    started = time.perf_counter()
    result = run_module("pycache_purge", dict(params, python=PYTHON), check=check, timeout=900)
    elapsed = time.perf_counter() - started
    if result["rc"] != 0:
        raise SystemExit("module failed: %s" % result.get("msg"))
    return elapsed, result


def verify(result, expected, label):
    found = {item["pyc"]: item["reason"] for item in result["removed"]}
    if found != expected:
        missing = sorted(set(expected) - set(found))[:5]
        extra = sorted(set(found) - set(expected))[:5]
        raise SystemExit("%s: removed differs from what was planted; missing %s, unexpected %s" % (label, missing, extra))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20000, help="about how many .py modules to generate")
    parser.add_argument("--rebuild", action="store_true", help="regenerate the tree even if it matches")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    measured_on = provenance.begin("pycache_purge")
    stamp = build(args.files, args.rebuild)
    py_files = stamp["py_files"]
    per_k = 1000.0 / py_files
    rows = []
    for round_no in range(args.rounds):
        expected = plant(round_no)
        check_s, planned = timed({"paths": [str(TREE)]}, check=True)
        verify(planned, expected, "check mode")
        real_s, done = timed({"paths": [str(TREE)]})
        verify(done, expected, "real run")
        clean_s, clean = timed({"paths": [str(TREE)]})
        verify(clean, {}, "second run")
        started = time.perf_counter()
        listed = subprocess.run(["find", str(TREE), "-name", "*.pyc"], capture_output=True, text=True, check=True)
        find_s = time.perf_counter() - started
        rows.append({"check_s": check_s, "real_s": real_s, "clean_s": clean_s, "find_s": find_s,
                     "checked": done["checked"], "compared": done["compared"], "module_elapsed_s": done["elapsed_s"],
                     "pyc_listed": len(listed.stdout.split())})

    subtree = TREE / "pkg00"
    always_s, always = timed({"paths": [str(subtree)], "compare_code": "always"})
    auto_s, auto = timed({"paths": [str(subtree)]})

    best = {key: min(row[key] for row in rows) for key in ("check_s", "real_s", "clean_s", "find_s")}
    report = {
        "python": PYTHON,
        "version": sys.version.split()[0],
        "cpus": len(os.sched_getaffinity(0)),
        "tree": str(TREE),
        "py_files": py_files,
        "pyc_files": rows[0]["checked"],
        "stale_planted": len(expected),
        "rounds": rows,
        "best": best,
        "per_1000_files_s": {key: value * per_k for key, value in best.items()},
        "ratio_check_to_find_listing": best["real_s"] / best["find_s"],
        "ritual_recompile_s": stamp["compileall_s"],
        "compare_code_always": {"files": always["checked"], "seconds": always_s, "auto_seconds": auto_s,
                                "per_1000_files_s": always_s * 1000.0 / max(1, always["checked"]),
                                "auto_per_1000_files_s": auto_s * 1000.0 / max(1, auto["checked"])},
        "target_s": TARGET_S,
        "meets_target": best["real_s"] < TARGET_S,
        "measured_on": provenance.end(measured_on),
    }
    median_real = statistics.median(row["real_s"] for row in rows)
    median_find = statistics.median(row["find_s"] for row in rows)
    report["summary"] = [
        {"measure": "stale check, %d .py files (median)" % py_files, "ours_s": median_real,
         "baseline": "find -name '*.pyc' (lists only)", "baseline_s": median_find,
         "ratio": median_real / median_find, "target": "< %.0f s" % TARGET_S, "met": median_real < TARGET_S},
        {"measure": "stale check per 1,000 files", "ours_s": median_real * per_k, "baseline": "compileall (ritual)",
         "baseline_s": stamp["compileall_s"] * per_k, "ratio": median_real / stamp["compileall_s"],
         "target": "", "met": None},
    ]
    BENCH.mkdir(parents=True, exist_ok=True)
    (BENCH / "pycache_purge.json").write_text(json.dumps(report, indent=2))

    print("pycache_purge stale check: %d .py files, %d .pyc, %d stale planted, Python %s, %d CPUs"
          % (py_files, report["pyc_files"], len(expected), report["version"], report["cpus"]))
    print("%-44s %9s %14s" % ("", "best s", "s per 1,000"))
    for key, label in (("check_s", "module, check mode (finds all planted)"),
                       ("real_s", "module, real run (removes them)"),
                       ("clean_s", "module, second run (nothing stale)"),
                       ("find_s", "find -name '*.pyc' (listing only)")):
        print("%-44s %9.3f %14.4f" % (label, best[key], best[key] * per_k))
    print("ratio module real run / find listing: %.1fx; the ritual's delete-all then costs a full recompile: %.1f s"
          % (report["ratio_check_to_find_listing"], stamp["compileall_s"]))
    print("compare_code=always on %d pyc: %.2f s (%.3f s per 1,000); auto on the same: %.2f s"
          % (always["checked"], always_s, report["compare_code_always"]["per_1000_files_s"], auto_s))
    print("target < %.1f s: %s" % (TARGET_S, "met" if report["meets_target"] else "NOT met"))
    print("wrote %s" % (BENCH / "pycache_purge.json"))


if __name__ == "__main__":
    main()
