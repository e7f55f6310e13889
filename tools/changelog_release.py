"""Rehearse the release's changelog: `antsibull-changelog release` in a scratch copy of the checkout,
never in the checkout itself (the real release runs it once, with the version bumped).

The copy is laid out as ansible_collections/cleanslate/gpu under SCRATCH, so that the plugin
listing antsibull-changelog takes from ansible-doc finds the collection. Prints the path of the
CHANGELOG.rst it generated.

Usage: python tools/changelog_release.py SCRATCH [VERSION]   (VERSION: galaxy.yml's by default)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from checkout_copy import copy_checkout

REPO = Path(__file__).resolve().parent.parent


def rehearse(scratch: Path, version: str | None = None) -> Path:
    copy = copy_checkout(REPO, scratch / "ansible_collections" / "cleanslate" / "gpu")
    version = version or yaml.safe_load((copy / "galaxy.yml").read_text())["version"]
    bin_dir = Path(sys.executable).parent
    path = os.pathsep.join([str(bin_dir), os.environ["PATH"]])
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(scratch), PATH=path)
    subprocess.run([str(bin_dir / "antsibull-changelog"), "release", "--version", version, "--date", "2026-01-01"],
                   cwd=copy, env=env, check=True, stdout=sys.stderr)  # stdout: the path alone
    return copy / "CHANGELOG.rst"


def main(argv) -> int:
    if not argv or len(argv) > 2:
        raise SystemExit(__doc__)
    print(rehearse(Path(argv[0]).resolve(), argv[1] if len(argv) > 1 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
