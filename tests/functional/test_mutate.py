"""tools/mutate.py, the runner of `make mutate`, on small mutation lists of its own: it kills a
bug a test catches, reports one that survives and one marked unobservable, scores only what
counts, never touches the working tree, and names a mutation that no longer matches the code.
The committed list (tests/mutations) must always apply to the code as it is."""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUTATE = REPO / "tools" / "mutate.py"
TARGET = "plugins/module_utils/_shm_clean_module.py"

CAUGHT = """\
- id: caught
  file: plugins/module_utils/_shm_clean_module.py
  original: |
        if '..' in pattern:
  replacement: |
        if '..' == pattern:
  reason: a pattern such as '..*' is accepted
  tests:
    - tests/unit/test_shm_clean.py::test_unsafe_patterns_are_refused
"""
SURVIVED = """\
- id: survived
  file: plugins/module_utils/_shm_clean_module.py
  original: |
    SHOWN_PIDS = 10
  replacement: |
    SHOWN_PIDS = 12
  reason: a reason names twelve unreadable pids before it says "and N more"
  tests:
    - tests/unit/test_shm_clean.py::test_defaults_are_valid_input
"""
UNOBSERVABLE = """\
- id: invisible
  file: plugins/module_utils/_shm_clean_module.py
  original: "# How many unreadable pids a reason names"
  replacement: "# How many pids a reason names"
  reason: a comment reworded
  unobservable: comments do not run
"""


def mutate(tmp_path, text, *args):
    listing = tmp_path / "selftest.yml"
    listing.write_text(text)
    return subprocess.run([sys.executable, str(MUTATE), "--mutations", str(listing), "--scratch",
                           str(tmp_path / "scratch"), "--jobs", "1", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def digest(path):
    return hashlib.sha256((REPO / path).read_bytes()).hexdigest()


def test_a_caught_bug_is_killed_a_missed_one_survives_and_the_score_counts_only_scored_ones(tmp_path):
    before = digest(TARGET)

    run = mutate(tmp_path, CAUGHT + SURVIVED + UNOBSERVABLE)

    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout + run.stderr  # 1 of 2 scored: under 95%
    verdicts = {line.split()[2]: line.split()[1] for line in lines if line.startswith("[")}
    assert verdicts == {"selftest/caught": "killed", "selftest/survived": "SURVIVED",
                        "selftest/invisible": "unobservable"}
    assert "1 failed" in next(line for line in lines if "selftest/caught" in line)
    assert '        survived: a reason names twelve unreadable pids before it says "and N more"' in lines
    assert "        no tests; unobservable: comments do not run" in lines
    assert "selftest               1         1             1      0" in lines
    assert any(line.startswith("score: 1 of 2 scored mutants killed = 50.0% (minimum 95%)") for line in lines)
    assert digest(TARGET) == before, "the runner changed the working tree"
    scratch = tmp_path / "scratch" / "w1" / TARGET
    assert scratch.read_bytes() == (REPO / TARGET).read_bytes(), "the scratch copy was not restored"


def test_the_score_passes_when_every_scored_mutant_is_killed(tmp_path):
    run = mutate(tmp_path, CAUGHT + UNOBSERVABLE, "--no-baseline")

    assert run.returncode == 0, run.stdout + run.stderr
    assert "score: 1 of 1 scored mutants killed = 100.0% (minimum 95%)" in run.stdout


def test_a_mutation_whose_code_moved_is_an_error_that_names_it(tmp_path):
    moved = CAUGHT.replace("if '..' in pattern:", "if '..' in the_old_name:", 1).replace("id: caught", "id: moved")
    twice = textwrap.dedent("""\
        - id: twice
          file: plugins/module_utils/_shm_clean_module.py
          original: "module.warn("
          replacement: "print("
          reason: matches more than one place
          tests: [tests/unit/test_shm_clean.py]
        """)

    run = mutate(tmp_path, moved + twice)

    assert run.returncode == 2
    assert "selftest/moved: original snippet not found in plugins/module_utils/_shm_clean_module.py (the code moved?)" in run.stderr
    # However many times shm_clean warns today: more than once.
    assert re.search(r"selftest/twice: original snippet found [2-9] times in plugins/module_utils/_shm_clean_module\.py; "
                     r"make it unique", run.stderr), run.stderr
    assert not (tmp_path / "scratch").exists(), "nothing may run while the list does not match the code"


def test_a_mutant_that_does_not_compile_is_refused(tmp_path):
    broken = CAUGHT.replace("if '..' == pattern:", "if '..' = pattern:")

    run = mutate(tmp_path, broken)

    assert run.returncode == 2
    assert "selftest/caught: the mutant does not compile" in run.stderr


def test_every_committed_mutation_applies_to_the_code():
    """Keeps tests/mutations in step with the code: a snippet that moved fails here, in make test."""
    run = subprocess.run([sys.executable, str(MUTATE), "--check"], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=False)

    assert run.returncode == 0, run.stderr
    assert run.stdout.endswith(" mutations apply to the code\n")
