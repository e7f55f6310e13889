"""Run one of this collection's modules the way Ansible does on a target: a fresh
interpreter, the module file, and its arguments in a JSON file.

Functional tests use this instead of importing the module, so that argument parsing,
check mode, diff mode, exit codes and the JSON result are the real ones.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO / ".ansible" / "collections"
# The interpreter that runs the modules when a test names none: this one, or the target Python
# that `tools/versions.py modules` proves them on (Python 3.9, the oldest they declare).
MODULE_PYTHON_ENV = "CLEANSLATE_MODULE_PYTHON"


def ensure_collection_link() -> Path:
    """Link this checkout as ansible_collections/cleanslate/gpu (what `make setup` does)."""
    link = COLLECTIONS / "ansible_collections" / "cleanslate" / "gpu"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(REPO, link.parent))
    return COLLECTIONS


def run_module(name: str, params: dict, check: bool = False, diff: bool = False,
               env: dict | None = None, timeout: float = 180, python: str | None = None,
               collections: Path | None = None) -> dict:
    """Run plugins/modules/<name>.py with params; return its JSON result plus 'rc'.

    collections: a directory holding ansible_collections/cleanslate/gpu whose module runs instead
    of this checkout's (tests/readable_copy.py makes one that another user can read)."""
    root = collections / "ansible_collections" / "cleanslate" / "gpu" if collections else REPO
    module = root / "plugins" / "modules" / f"{name}.py"
    search = collections or ensure_collection_link()
    args = dict(params)
    args["_ansible_check_mode"] = check
    args["_ansible_diff"] = diff
    run_env = dict(os.environ)
    run_env.update(env or {})
    # The collection first; keep what the caller had (e.g. ansible installed with --target).
    run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(search), run_env.get("PYTHONPATH")]))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
        args_path = handle.name
    interpreter = python or os.environ.get(MODULE_PYTHON_ENV)
    command = [interpreter or sys.executable, str(module), args_path]
    # `make unit` and `make functional` measure the plugins' branch coverage (tests/coveragerc): a
    # module that this interpreter runs from this checkout runs under `coverage run`, in the same
    # process, and the processes it starts run as they would (not measured). A module run by another
    # interpreter (a wrapper, the oldest Python) or from a copy (as another user) is not measured.
    if os.environ.get("COVERAGE_RCFILE") and interpreter is None and collections is None:
        command[1:1] = ["-m", "coverage", "run"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=run_env, timeout=timeout, check=False)
    finally:
        os.unlink(args_path)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"module {name} printed no JSON (rc={proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        ) from exc
    result["rc"] = proc.returncode
    return result
