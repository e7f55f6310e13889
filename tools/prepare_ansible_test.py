"""Prepare an offline-capable ansible-test run.

1. Install tools/offline_get_pip.py where ansible-test looks for its cached get-pip
   (~/.ansible/test/cache/get_pip_<version>.py), for the pip version this ansible-test pins.
2. Copy the collection (tracked and untracked-but-not-ignored files) to
   BUILD/ansible_collections/cleanslate/gpu, the only kind of path ansible-test runs from.

Usage: python tools/prepare_ansible_test.py BUILD_DIR  (prints the collection copy's path)
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import ansible_test

from checkout_copy import copy_checkout

REPO = Path(__file__).resolve().parent.parent


def pinned_pip_version(ansible_test_dir: Path | None = None) -> str:
    """The pip version the ansible-test in ansible_test_dir (this venv's by default) pins."""
    source = Path(ansible_test_dir or Path(ansible_test.__file__).parent) / "_internal" / "python_requirements.py"
    match = re.search(r"default_packages = dict\(\s*pip='([0-9.]+)'", source.read_text())
    if not match:
        sys.exit("prepare_ansible_test: cannot find the pip version ansible-test pins in " + str(source))
    return match.group(1)


def install_bootstrap(home: Path | None = None, ansible_test_dir: Path | None = None) -> Path:
    """The stand-in get-pip under home's (~ by default) cache, for the pip ansible_test_dir pins."""
    version = pinned_pip_version(ansible_test_dir)
    target = Path(home or Path.home()) / ".ansible" / "test" / "cache" / ("get_pip_%s.py" % version.replace(".", "_"))
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "tools" / "offline_get_pip.py", target)
    return target


def copy_collection(build: Path) -> Path:
    dest = copy_checkout(REPO, build / "ansible_collections" / "cleanslate" / "gpu")
    # The copy sits inside this checkout's ignored build/, where ansible-test's `git ls-files`
    # would see nothing: give it a repository of its own that lists exactly these files.
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    return dest


def main():
    build = Path(sys.argv[1]).resolve()
    install_bootstrap()
    print(copy_collection(build))


if __name__ == "__main__":
    main()
