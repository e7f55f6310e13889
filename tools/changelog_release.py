"""Rehearse the release's changelog: `antsibull-changelog release` in a scratch copy of the checkout,
never in the checkout itself (the real release runs it once in the checkout, with galaxy.yml's
version bumped: `antsibull-changelog release --version X`, then commit CHANGELOG.rst and
changelogs/changelog.yaml).

The copy is laid out as ansible_collections/cleanslate/gpu under SCRATCH, so that the plugin
listing antsibull-changelog takes from ansible-doc finds the collection. Prints the path of the
CHANGELOG.rst it generated. With --generate, the copy's CHANGELOG.rst is regenerated from
changelogs/changelog.yaml alone (`antsibull-changelog generate`), to compare with the committed one.

Usage: python tools/changelog_release.py [--generate] SCRATCH [VERSION]   (VERSION: galaxy.yml's by default)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from checkout_copy import copy_checkout

REPO = Path(__file__).resolve().parent.parent


def rehearse(scratch: Path, version: str | None = None, generate: bool = False) -> Path:
    copy = copy_checkout(REPO, scratch / "ansible_collections" / "cleanslate" / "gpu")
    version = version or yaml.safe_load((copy / "galaxy.yml").read_text())["version"]
    bin_dir = Path(sys.executable).parent
    path = os.pathsep.join([str(bin_dir), os.environ["PATH"]])
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(scratch), PATH=path)
    command = ["generate"] if generate else ["release", "--version", version, "--date", "2026-01-01"]
    subprocess.run([str(bin_dir / "antsibull-changelog")] + command,
                   cwd=copy, env=env, check=True, stdout=sys.stderr)  # stdout: the path alone
    return copy / "CHANGELOG.rst"


def main(argv) -> int:
    generate = argv[:1] == ["--generate"]
    argv = argv[1:] if generate else argv
    if not argv or len(argv) > 2:
        raise SystemExit(__doc__)
    print(rehearse(Path(argv[0]).resolve(), argv[1] if len(argv) > 1 else None, generate))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
