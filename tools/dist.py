"""`make dist`: the collection tarball built from the files git sees (tracked, and untracked but
not ignored), copied to a scratch tree first: a file the checkout holds but git ignores, such as
the inventory/fleet.yml a user made from the example (with their hosts, maybe a secret), is not
packed, whatever galaxy.yml's build_ignore forgets.

Usage: python tools/dist.py [CHECKOUT] [OUTPUT-DIRECTORY]   (this checkout, build/dist)
Prints the tarball's path.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.checkout_copy import copy_checkout  # noqa: E402  pylint: disable=wrong-import-position


def build(checkout: Path, out_dir: Path) -> Path:
    source = copy_checkout(checkout, out_dir / "source")
    subprocess.run([str(Path(sys.executable).parent / "ansible-galaxy"), "collection", "build", "--force",
                    "--output-path", str(out_dir), str(source)], check=True, capture_output=True, text=True)
    return max(out_dir.glob("*-*-*.tar.gz"), key=lambda path: path.stat().st_mtime)


if __name__ == "__main__":
    repo = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print(build(repo.resolve(), (Path(sys.argv[2]) if len(sys.argv) > 2 else repo / "build" / "dist").resolve()))
