"""Test the collection on the Python and ansible-core versions it declares, each in a scratch virtual
environment under build/venvs (packages from PyPI, the versions pinned here and in constraints.txt).

  unit     tests/unit under every controller Python of ansible-core 2.19: 3.11, 3.12 and 3.13.
  modules  the functional tests of gpu_reset and shm_clean with the modules run by Python 3.9, the
           oldest the modules declare (tests/config.yml), with only psutil and nvidia-ml-py
           installed there and ansible's module_utils from the controller, as AnsiballZ ships them.
           A logging wrapper proves that Python 3.9 ran them.
  sanity   ansible-test's compile and import tests on every Python ansible-core 2.19 knows and
           pyenv has (3.8 to 3.13: modules and module_utils on all, controller plugins on 3.11+);
           `make sanity` runs every test on 3.11 only. pyenv's shims find only its global
           versions, and ansible-test keeps PATH alone of the environment: build/pythons holds
           a pythonX.Y link to each interpreter, first on PATH.
  cores    the installed tarball's playbooks by FQCN, ansible-doc and the tarball's contents
           (tests/release) under the lowest and every other ansible-core release that
           meta/runtime.yml's requires_ansible admits on this machine's Pythons: 2.17, 2.18
           (2.19 is the project's venv).
  controllers  2.20 and 2.21, which need Python >= 3.12: each in a venv inside a Debian 13 root
           file system (tools/controller): the release tests, the playbooks on the simulated node
           and the first run's guard, ansible-test sanity (all tests) and ansible-lint.

Usage: python tools/versions.py [--present-only] [unit] [modules] [sanity] [cores] [controllers]   (all by default)
Prints one line per run with its time; exits non-zero when a run failed or an interpreter is missing.
With --present-only (what `make test` uses: a CI machine may lack pyenv's interpreters), a missing
interpreter is a line saying so and its runs are skipped.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENVS = REPO / "build" / "venvs"
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
CONSTRAINTS = REPO / "constraints.txt"
HOST_LIBS = ["psutil==7.2.2", "nvidia-ml-py==13.615.71"]  # as pinned in requirements.txt
TEST_TOOLS = ["pytest==9.2.0", "pytest-timeout==2.4.0", "pytest-xdist==3.8.0", "pytest-mock==3.17.0",
              "prometheus_client==0.26.0"]  # as pinned in requirements-test.txt (the metrics tests parse with it)
UNIT_PYTHONS = ("3.11", "3.12", "3.13")
SANITY_PYTHONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
MODULE_PYTHON = "3.9"
# (ansible-core release, a controller Python it supports)
CORES = (("2.17.14", "3.12"), ("2.18.19", "3.13"))
MODULE_TESTS = ["tests/functional/test_gpu_reset.py", "tests/functional/test_gpu_reset_evidence.py",
                "tests/functional/test_gpu_reset_inputs.py", "tests/functional/test_gpu_reset_signals.py",
                "tests/functional/test_shm_clean.py"]
# The playbooks on the simulated node and the first run's guard, on the controllers of run_controllers.
CONTROLLER_TESTS = ["tests/integration/test_playbooks_local.py", "tests/integration/test_first_run.py",
                    "tests/integration/test_fleet_preflight.py"]
# What `make test` runs on 2.20 and 2.21 (versions-ci): ansible-doc of every plugin and role and
# the playbooks' syntax, and every case of the first run's guard with real ansible-playbook runs.
CONTROLLER_CI_TESTS = ["tests/release/test_ansible_doc.py", "tests/integration/test_first_run.py::"
                       "test_a_run_that_targets_no_gpu_node_fails_whatever_the_inventory_and_limit"]
RELEASE_TESTS = ["tests/release/test_installed_playbooks.py", "tests/release/test_ansible_doc.py",
                 "tests/release/test_tarball.py"]
# One file per module run (mktemp), never one shared file: runs at once appending to one log
# interleave their lines ('3.9.183.9.18'; tests/unit/test_versions_tool.py shows it).
LOGGING_PYTHON = """#!/bin/sh
# Records each module run, then runs it with Python %(version)s.
%(python)s -c 'import sys; print(sys.version.split()[0])'  > "$(mktemp %(log)s/run-XXXXXXXX)"
exec %(python)s "$@"
"""


class Missing(Exception):
    """An interpreter that is not installed, under --present-only."""


PRESENT_ONLY = []  # [True] under --present-only


def interpreter(version: str) -> str:
    """pythonX.Y from pyenv's versions (newest patch release), else from PATH."""
    found = sorted(glob.glob(str(PYENV / f"{version}.*" / "bin" / f"python{version}")))
    path = found[-1] if found else shutil.which(f"python{version}")
    if not path or subprocess.run([path, "-c", "pass"], capture_output=True, check=False).returncode:
        if PRESENT_ONLY:
            raise Missing(f"Python {version} is not installed here")
        raise SystemExit(f"versions: Python {version} is not installed (pyenv install {version})")
    return path


def skipped(label: str, why: Missing) -> tuple:
    return (f"skipped {label}: {why}", None)


def venv(name: str, python: str, packages: list, constraints: bool = True) -> Path:
    """build/venvs/NAME with `packages`, made once (a stamp names what it holds)."""
    path = VENVS / name
    stamp = path / ".installed"
    wanted = " ".join(packages)
    if stamp.exists() and stamp.read_text() == wanted:
        return path
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(path)], check=True)
    extra = ["-c", str(CONSTRAINTS)] if constraints else []
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *packages, *extra], check=True)
    stamp.write_text(wanted)
    return path


def pytest(python: Path, tests: list, env: dict | None = None, workers: int = 0) -> bool:
    args = [str(python), "-m", "pytest", "-q", *tests] + (["-n", str(workers)] if workers else [])
    return subprocess.run(args, cwd=REPO, env=dict(os.environ, **(env or {})), check=False).returncode == 0


def run_unit() -> list:
    results = []
    for version in UNIT_PYTHONS:
        try:
            python = interpreter(version)
        except Missing as why:
            results.append(skipped(f"unit tests, Python {version}", why))
            continue
        path = venv(f"unit-{version}", python, ["ansible-core", "pyyaml", *HOST_LIBS, *TEST_TOOLS])
        results.append((f"unit tests, Python {version}", pytest(path / "bin" / "python", ["tests/unit"])))
    return results


def logged_versions(log: Path) -> list:
    """The Python version of each module run that LOGGING_PYTHON recorded under `log`."""
    return [run.read_text().strip() for run in sorted(log.iterdir())]


def run_modules() -> list:
    try:
        python = interpreter(MODULE_PYTHON)
    except Missing as why:
        return [skipped(f"gpu_reset and shm_clean functional tests, modules on Python {MODULE_PYTHON}", why)]
    path = venv(f"modules-{MODULE_PYTHON}", python, HOST_LIBS)
    # The controller's ansible package alone on the path (not its site-packages): module_utils.
    module_path = path / "module_path"
    module_path.mkdir(exist_ok=True)
    link = module_path / "ansible"
    if not link.exists():
        import ansible  # pylint: disable=import-outside-toplevel
        link.symlink_to(Path(ansible.__file__).parent)
    log = path / "module-runs"
    shutil.rmtree(log, ignore_errors=True)
    log.mkdir()
    wrapper = path / "bin" / "python-logged"
    wrapper.write_text(LOGGING_PYTHON % {"version": MODULE_PYTHON, "python": path / "bin" / "python", "log": log})
    wrapper.chmod(0o755)
    env = {"CLEANSLATE_MODULE_PYTHON": str(wrapper),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(module_path), os.environ.get("PYTHONPATH")]))}
    passed = pytest(Path(sys.executable), MODULE_TESTS, env=env, workers=2)
    versions = logged_versions(log)
    print(f"versions: {len(versions)} module runs, by Python {sorted(set(versions))}")
    ran_by_39 = bool(versions) and all(v.startswith(MODULE_PYTHON + ".") for v in versions)
    return [(f"gpu_reset and shm_clean functional tests, modules on Python {MODULE_PYTHON}", passed and ran_by_39)]


def run_sanity() -> list:
    links = REPO / "build" / "pythons"
    links.mkdir(parents=True, exist_ok=True)
    present, results = [], []
    for version in SANITY_PYTHONS:
        link = links / f"python{version}"
        link.unlink(missing_ok=True)
        try:
            link.symlink_to(interpreter(version))
        except Missing as why:
            results.append(skipped(f"ansible-test sanity compile and import, Python {version}", why))
            continue
        present.append(version)
    bin_dir = Path(sys.executable).parent
    copy = subprocess.run([sys.executable, str(REPO / "tools" / "prepare_ansible_test.py"),
                           str(REPO / "build" / "ansible-test")], check=True, capture_output=True,
                          text=True).stdout.strip()
    env = dict(os.environ, PATH=os.pathsep.join([str(links), str(bin_dir), os.environ["PATH"]]))
    proc = subprocess.run([str(bin_dir / "ansible-test"), "sanity", "--venv", "--test", "compile", "--test", "import",
                           "--color", "no"], cwd=copy, env=env, check=False)
    return results + [(f"ansible-test sanity compile and import, Python {', '.join(present)}", proc.returncode == 0)]


def run_cores() -> list:
    results = []
    for core, version in CORES:
        try:
            python = interpreter(version)
        except Missing as why:
            results.append(skipped(f"release tests, ansible-core {core}", why))
            continue
        path = venv(f"core-{core}", python, [f"ansible-core=={core}", *HOST_LIBS, *TEST_TOOLS],
                    constraints=False)
        results.append((f"release tests, ansible-core {core} on Python {version}",
                        pytest(path / "bin" / "python", RELEASE_TESTS)))
    return results


def run_controllers(ci: bool = False) -> list:
    """ansible-core 2.20 and 2.21 (Python >= 3.12) as the controller, each in its venv inside the
    Debian 13 root file system of tools/controller: the release tests and the playbooks on the
    simulated node (the tests run here and call the controller's programs through a shim), then
    ansible-test sanity (every test, Python 3.13) and ansible-lint's production profile there.
    With `ci` (controllers-ci, in `make test`): ansible-doc of everything, the first run's guard
    and the playbooks' syntax, no more."""
    sys.path.insert(0, str(REPO / "tools" / "controller"))
    import controller  # pylint: disable=import-outside-toplevel
    results = []
    copy = None if ci else subprocess.run([sys.executable, str(REPO / "tools" / "prepare_ansible_test.py"),
                                           str(REPO / "build" / "ansible-test")], check=True, capture_output=True,
                                          text=True).stdout.strip()
    for core, release in controller.CORES.items():
        python = controller.shim(core, REPO / "build" / "controller" / f"shim-{core}")
        tests = CONTROLLER_CI_TESTS if ci else RELEASE_TESTS + CONTROLLER_TESTS
        what = "ansible-doc and first-run tests" if ci else "release and playbook tests"
        results.append((f"{what}, ansible-core {release} on Debian 13's Python", pytest(python, tests)))
        if ci:
            continue
        shutil.rmtree(Path(copy) / "tests" / "output", ignore_errors=True)
        sanity = subprocess.run([sys.executable, str(REPO / "tools" / "controller" / "controller.py"), "run", core,
                                 "ansible-test", "sanity", "--venv", "--python", "3.13", "--color", "no"],
                                cwd=copy, check=False)
        results.append((f"ansible-test sanity, ansible-core {release}", sanity.returncode == 0))
        lint = subprocess.run([str(python.parent / "ansible-lint"), "--profile", "production"], cwd=REPO, check=False)
        results.append((f"ansible-lint --profile production, ansible-core {release}", lint.returncode == 0))
    return results


def main(argv) -> int:
    runs = {"unit": run_unit, "modules": run_modules, "sanity": run_sanity, "cores": run_cores,
            "controllers": run_controllers, "controllers-ci": lambda: run_controllers(ci=True)}
    if "--present-only" in argv:
        PRESENT_ONLY.append(True)
        argv = [arg for arg in argv if arg != "--present-only"]
    chosen = argv or list(runs)
    unknown = set(chosen) - set(runs)
    if unknown:
        raise SystemExit(f"versions: unknown run {sorted(unknown)}; choose from {sorted(runs)}")
    table = []
    for name in chosen:
        started = time.monotonic()
        for label, passed in runs[name]():
            table.append((label, passed))
        table.append((f"  ({name}: {time.monotonic() - started:.0f} s, venvs included)", None))
    for label, passed in table:
        print(label if passed is None else f"{'passed' if passed else 'FAILED'}  {label}")
    return 0 if all(passed is not False for _label, passed in table) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
