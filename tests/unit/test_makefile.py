"""The Makefile's help, its fast loop and the Debian packages each target installs (issue 38, 5 and 7)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.fleet.fleet import REQUIRED_TOOLS
REPO = Path(__file__).resolve().parents[2]
MAKEFILE = REPO / "Makefile"
OS_DEPS = REPO / "tools" / "install_os_deps.sh"
# What only the tests run: the self-healing loop (Prometheus, Alertmanager, Java), promtool, shellcheck.
TEST_ONLY = {"prometheus", "prometheus-alertmanager", "openjdk-17-jre-headless", "shellcheck"}
DURATION = re.compile(r"^(instant|\d+(\.\d+)? (s|min|h)\+?( once)?)$")


def phony_targets() -> list:
    text = MAKEFILE.read_text().replace("\\\n", " ")
    return [name for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for name in line.split()]


def make(*args) -> str:
    # The Makefile as a user's `make` reads it: not the variables of a make that runs these tests
    # (`make check` passes SETUP=prepared down through MAKEFLAGS, and `make -n unit` lost its apt step).
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SETUP")}
    proc = subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def packages(name) -> list:
    return subprocess.run(["bash", str(OS_DEPS), "--list", name], capture_output=True, text=True,
                          check=True).stdout.split()


def test_make_help_lists_every_target_with_a_duration_and_a_line():
    listed = {}
    for line in make("help").splitlines()[1:]:
        match = re.match(r"^  (\S+) +(instant|\S+ \S+(?: once)?) +(\S.*)$", line)
        assert match, line
        listed[match.group(1)] = match.group(2)
    phony = phony_targets()
    assert sorted(listed) == sorted(phony), "every .PHONY target needs its `## DURATION | WHAT` line"
    assert [name for name, duration in listed.items() if not DURATION.match(duration)] == []


def test_make_check_runs_lint_sanity_and_the_unit_tests_without_apt():
    commands = make("-n", "check")
    assert "install_os_deps" not in commands and "apt-get" not in commands
    for step in ("ansible-lint --profile production", "ansible-test sanity", "pytest tests/unit"):
        assert step in commands, step


def test_the_demo_installs_only_its_packages_and_the_tests_all_of_theirs():
    demo, test = packages("demo"), packages("test")
    assert TEST_ONLY <= set(test) and not TEST_ONLY & set(demo)
    assert set(demo) <= set(test), "make test runs the demo's tools too"
    assert "tools/install_os_deps.sh demo" in make("-n", "demo") and "install_os_deps.sh test" not in make("-n", "demo")
    for target in ("test", "unit", "sanity", "integration"):
        assert "tools/install_os_deps.sh test" in make("-n", target), target
    assert "tools/install_os_deps.sh ee" in make("-n", "ee")


def test_only_install_os_deps_runs_apt():
    """It waits for another holder of the dpkg lock; an apt-get of a target's own would fail at once."""
    assert "apt-get" not in MAKEFILE.read_text()


@pytest.mark.skipif(not shutil.which("dpkg"), reason="Debian's package database")
def test_the_demo_set_has_every_tool_its_systemd_host_needs():
    """Each program the fleet harness checks for comes from a demo package or one every Debian has."""
    demo = set(packages("demo"))
    paths = {tool: shutil.which(tool) for tool in REQUIRED_TOOLS}
    assert all(paths.values()), paths
    # /bin and /usr/bin merged: dpkg knows one of the two paths; one query for all of them.
    asked = [alias for path in paths.values() for alias in (path, re.sub(r"^/usr/(s?bin)/", r"/\1/", path))]
    owners = {}
    for line in subprocess.run(["dpkg", "-S", *asked], capture_output=True, text=True, check=False).stdout.splitlines():
        package, path = line.split(": ", 1)
        owners[path] = package
    packages_of = {tool: owners.get(path) or owners[re.sub(r"^/usr/(s?bin)/", r"/\1/", path)] for tool, path in paths.items()}
    priority = dict(line.split() for line in subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Priority}\n", *set(packages_of.values())],
        capture_output=True, text=True, check=True).stdout.splitlines())
    assert [(tool, package) for tool, package in packages_of.items()
            if package not in demo and priority[package] != "required"] == []
