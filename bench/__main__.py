"""`make bench`: every benchmark in bench/, then one table of medians and ratios.

Each bench/bench_*.py runs on its own (see its docstring), writes its full JSON under
build/bench/, and puts the rows for this table in that JSON's "summary" list:
    {"measure", "ours_s", "baseline", "baseline_s", "ratio", "target", "met"}
The table shows ours against the baseline as "N.Nx faster" or "N.Nx slower" (computed here from
the two medians, whichever way a bench stored its ratio). The table is printed and written to build/bench/summary.json.
Under it, each bench's tree and load (its JSON's "measured_on", bench/provenance.py) and its seconds.

    .venv/bin/python -m bench [--quick] [--only NAME ...]

--quick runs each bench in its smallest honest form (QUICK below: one round, fewer hosts), a single
figure per row in about 4.5 minutes (264 s at load 1 to 2); its figures say less than the full run's medians.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "bench"
sys.path.insert(0, str(REPO))
from bench.provenance import describe  # noqa: E402  pylint: disable=wrong-import-position

# Each bench's arguments under --quick: one round, the fewest hosts that still show the measure.
QUICK = {
    "fleet": ["--hosts", "2", "--repeat", "1"],
    "gpu_reset": ["--repeat", "1", "--procs", "500"],
    "inference_service": ["--repeat", "1"],
    "instances": ["--repeat", "1"],
    "node_reset": ["--repeat", "1"],
    "nvml_verify": ["--trials", "1"],
    "pycache_purge": ["--rounds", "1"],
    "rotation": ["--repeat", "1"],
    "shm_clean": ["--repeat", "1"],
}


def command(script: Path, quick: bool) -> list:
    """The bench's command line; under --quick, with its QUICK arguments."""
    name = script.stem[len("bench_"):]
    if quick and name not in QUICK:
        raise SystemExit("%s has no quick form: add its arguments to QUICK in bench/__main__.py" % script.name)
    return [sys.executable, str(script)] + (QUICK[name] if quick else [])


def run(script: Path, quick: bool) -> dict:
    name = script.stem[len("bench_"):]
    json_path = OUT / ("%s.json" % name)
    if json_path.exists():
        json_path.unlink()
    start = time.monotonic()
    proc = subprocess.run(command(script, quick), cwd=REPO, check=False)
    seconds = time.monotonic() - start
    if proc.returncode != 0 or not json_path.exists():
        return {"name": name, "error": "exit %d, no %s" % (proc.returncode, json_path.name), "seconds": seconds}
    doc = json.loads(json_path.read_text())
    return {"name": name, "summary": doc.get("summary", []), "measured_on": doc.get("measured_on"), "seconds": seconds}


def fmt(value, spec="%.3f"):
    return "-" if value is None else spec % value


def versus(ours, baseline) -> str:
    """One reading for every row, whichever way a bench stored its ratio."""
    if not ours or not baseline:
        return "-"
    return "%.1fx faster" % (baseline / ours) if ours <= baseline else "%.1fx slower" % (ours / baseline)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--only", nargs="*", default=None, help="bench names, e.g. gpu_reset shm_clean")
    parser.add_argument("--quick", action="store_true", help="each bench's smallest form: one round, fewer hosts")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    scripts = sorted((REPO / "bench").glob("bench_*.py"))
    if args.only:
        names = [s.stem[len("bench_"):] for s in scripts]
        unknown = [name for name in args.only if name not in names]
        if unknown:
            parser.error("--only %s: no such bench; the benches are %s" % (", ".join(unknown), ", ".join(names)))
        scripts = [s for s in scripts if s.stem[len("bench_"):] in args.only]
    results = [run(script, args.quick) for script in scripts]
    rows = []
    print("\n%-16s %-44s %10s %-30s %10s %13s  %s" % ("bench", "measure", "ours s", "baseline", "baseline s",
                                                      "ours vs base", "target"))
    for result in results:
        if "error" in result:
            print("%-16s %s" % (result["name"], result["error"]))
            continue
        for row in result["summary"]:
            rows.append(dict(row, bench=result["name"]))
            print("%-16s %-44s %10s %-30s %10s %13s  %s %s" % (
                result["name"], row["measure"][:44], fmt(row.get("ours_s")), (row.get("baseline") or "-")[:30],
                fmt(row.get("baseline_s")), versus(row.get("ours_s"), row.get("baseline_s")), row.get("target") or "",
                {True: "(met)", False: "(NOT met)"}.get(row.get("met"), "")))
    print()
    for result in results:
        where = describe(result["measured_on"]) if result.get("measured_on") else "-"
        print("%-16s %5.0f s  %s" % (result["name"], result["seconds"], where))
    (OUT / "summary.json").write_text(json.dumps({"quick": args.quick, "rows": rows, "runs": results}, indent=2) + "\n")
    print("\nwritten: %s" % (OUT / "summary.json"))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
