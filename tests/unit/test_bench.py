"""What `make bench` says it measured (issue 42): each checkout's own tree, dirty when it differs,
and --quick reaching every bench in its small form."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench import provenance
from bench.__main__ import QUICK, command

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "bench").glob("bench_*.py"))


def git(checkout: Path, *args) -> str:
    return subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args],
                          cwd=checkout, capture_output=True, text=True, check=True).stdout.strip()


def checkout(path: Path, text: str) -> Path:
    path.mkdir()
    git(path, "init", "-q")
    (path / "a.txt").write_text(text)
    git(path, "add", "a.txt")
    git(path, "commit", "-q", "-m", text)
    return path


def test_a_tree_is_dirty_by_the_count_of_files_that_differ_untracked_ones_included(tmp_path):
    repo = checkout(tmp_path / "repo", "one")
    commit = git(repo, "rev-parse", "--short", "HEAD")
    assert provenance.tree(repo)["label"] == commit
    (repo / "a.txt").write_text("changed")
    assert provenance.tree(repo)["label"] == commit + "+dirty 1"
    (repo / "new").mkdir()
    (repo / "new" / "b.txt").write_text("new")
    (repo / "new" / "c.txt").write_text("new")
    assert provenance.tree(repo)["label"] == commit + "+dirty 3"


def test_each_versus_checkout_is_reported_with_its_own_tree(tmp_path, capsys):
    other = checkout(tmp_path / "other", "another history")
    doc = provenance.begin("x", versus=[other])
    assert doc["tree"]["commit"] == git(REPO, "rev-parse", "--short", "HEAD")
    assert doc["versus"][0]["commit"] == git(other, "rev-parse", "--short", "HEAD") != doc["tree"]["commit"]
    printed = capsys.readouterr().out
    assert "versus %s (%s)" % (doc["versus"][0]["label"], other) in printed and doc["tree"]["label"] in printed


def test_a_folder_outside_git_is_an_unknown_tree_not_a_traceback(tmp_path):
    found = provenance.tree(tmp_path)
    assert found["commit"] is None and found["label"].startswith("unknown tree (")


def test_quick_gives_every_bench_its_small_form_with_options_it_has():
    assert sorted(QUICK) == sorted(script.stem[len("bench_"):] for script in SCRIPTS)
    for script in SCRIPTS:
        quick, full = command(script, quick=True), command(script, quick=False)
        assert full == [sys.executable, str(script)] and quick[:2] == full and len(quick) > 2
        known = set(re.findall(r'add_argument\("(--[a-z-]+)"', script.read_text()))
        assert {arg for arg in quick[2:] if arg.startswith("--")} <= known, script.name


def test_only_a_bench_that_does_not_exist_is_one_sentence_and_runs_nothing(capsys):
    """A typo in --only used to run no bench and print an empty table, read as "nothing to measure"."""
    from bench.__main__ import main  # pylint: disable=import-outside-toplevel
    try:
        main(["--only", "fleets"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--only fleets ran")
    err = capsys.readouterr().err
    assert "--only fleets: no such bench" in err and "fleet," in err
