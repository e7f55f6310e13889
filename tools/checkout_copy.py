"""Copy this checkout as git sees it: tracked files and untracked files that are not ignored.

Shared by tools/prepare_ansible_test.py (the collection copy ansible-test runs from) and
tools/mutate.py (the scratch copies that mutants are applied to, never the working tree).
"""
import shutil
import subprocess
from pathlib import Path


def copy_checkout(repo: Path, dest: Path) -> Path:
    """Copy repo's tracked and untracked-but-not-ignored files into dest (emptied first)."""
    if dest.exists():
        shutil.rmtree(dest)
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, listing):
        src = repo / rel
        if not src.is_file() or src.is_symlink() and not src.exists():
            continue  # deleted in the work tree, or a dangling link
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    return dest
