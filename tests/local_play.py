"""Runs plays a test wrote with ansible-playbook on localhost (`-c local`), with this interpreter and
from the repository root, so the role's own tasks and expressions run as a user's play runs them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def run_local_play(playbook: Path, plays: list) -> None:
    """Writes `plays` to `playbook`, runs it and asserts it succeeded."""
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
