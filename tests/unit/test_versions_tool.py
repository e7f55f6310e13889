"""tools/versions.py's record of which Python ran each module: one clean version per run, however
many runs happen at once (the pytest workers of the modules run; one shared log printed
'3.9.183.9.18'); the test files it names exist (a renamed one made pytest run nothing on 2.20 and
2.21: "file or directory not found")."""
from __future__ import annotations

import platform
import subprocess
import sys

from tools import versions


def test_every_module_run_is_recorded_with_its_version_when_runs_overlap(tmp_path):
    log = tmp_path / "runs"
    log.mkdir()
    wrapper = tmp_path / "python-logged"
    wrapper.write_text(versions.LOGGING_PYTHON % {"version": "X.Y", "python": sys.executable, "log": log})
    wrapper.chmod(0o755)
    runs = [subprocess.Popen([str(wrapper), "-c", "pass"]) for _run in range(60)]
    assert all(run.wait(timeout=120) == 0 for run in runs)
    assert versions.logged_versions(log) == [platform.python_version()] * 60


def test_every_test_file_the_tool_names_exists():
    named = versions.MODULE_TESTS + versions.CONTROLLER_TESTS + versions.CONTROLLER_CI_TESTS + versions.RELEASE_TESTS
    missing = [name for name in named if not (versions.REPO / name.partition("::")[0]).is_file()]
    assert not missing, missing
