"""What a bench measured: the tree (commit, +dirty N) of each checkout it ran, and the machine's load.

Each bench_*.py calls begin() before its first measurement (it prints one line) and puts end()'s
document in its JSON as "measured_on"; `python -m bench` prints it under the table. A figure is only
comparable with another of the same tree and a like load: both travel with it.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _git(checkout: Path, *args) -> str:
    return subprocess.run(["git", *args], cwd=checkout, capture_output=True, text=True, check=True,
                          timeout=60).stdout


def tree(checkout: Path) -> dict:
    """The checkout's commit and the number of files that differ from it (untracked ones included)."""
    checkout = Path(checkout).resolve()
    try:
        commit = _git(checkout, "rev-parse", "--short", "HEAD").strip()
        changed = len(_git(checkout, "status", "--porcelain", "--untracked-files=all").splitlines())
    except (OSError, subprocess.SubprocessError) as exc:
        # A tarball or a copy without .git: the figures stand, their tree is said to be unknown.
        reason = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()
        return {"path": str(checkout), "commit": None, "changed_files": None,
                "label": "unknown tree (%s)" % (reason[-1] if reason else "git failed")}
    return {"path": str(checkout), "commit": commit, "changed_files": changed,
            "label": commit + ("+dirty %d" % changed if changed else "")}


def versus_checkouts(parser, paths, playbook="reset_and_serve.yml") -> list:
    """The --versus checkouts, resolved: each once, not this one, each with the playbook the bench
    runs; otherwise the parser's error, one sentence."""
    checkouts = [Path(path).resolve() for path in paths]
    missing = [str(path) for path in checkouts if not (path / "playbooks" / playbook).is_file()]
    if missing:
        parser.error("--versus %s: no playbooks/%s there" % (", ".join(missing), playbook))
    if len(set(checkouts)) < len(checkouts) or REPO in checkouts:
        parser.error("--versus: each checkout once, and not this one")
    return checkouts


def begin(name: str, versus=()) -> dict:
    """Read this checkout's tree and those of `versus` (other checkouts whose playbooks run), the
    core count and the load; print them on one line."""
    doc = {"tree": tree(REPO), "versus": [tree(path) for path in versus], "cores": os.cpu_count(),
           "load_1min": {"start": round(os.getloadavg()[0], 2), "end": None}}
    print("bench %s: tree %s%s; load %.2f on %d cores" % (
        name, doc["tree"]["label"], "".join("; versus %s (%s)" % (one["label"], one["path"]) for one in doc["versus"]),
        doc["load_1min"]["start"], doc["cores"]), flush=True)
    return doc


def end(doc: dict) -> dict:
    """`doc` with the load at the end, for the bench's JSON ("measured_on")."""
    return dict(doc, load_1min=dict(doc["load_1min"], end=round(os.getloadavg()[0], 2)))


def describe(doc: dict) -> str:
    """One line for a table: the trees and the load from start to end."""
    trees = " vs ".join([doc["tree"]["label"]] + [one["label"] for one in doc["versus"]])
    load = doc["load_1min"]
    return "tree %s; load %s -> %s on %s cores" % (trees, load["start"], load["end"], doc["cores"])
