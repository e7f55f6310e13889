"""The newcomer's pages work as typed (issue 38): every shell block of README.md and
docs/getting_started.md marked `run` (tests/doc_blocks.py) runs line by line as written, in one
shell per page, as a new user who cloned the checkout into root's home (a directory of mode 0700,
HOME too) with nothing of the project's on PATH and no ANSIBLE_* variable: `.venv` exists, as
`make setup` leaves it, and nothing else is prepared. Each line must exit as its comment says
(`exits N`, `fails`: not 0; else 0) and print each `quoted` text of its comment. The shell runs in
a private PID namespace, so whatever the simulated node left running dies with it.

A shell block without a marker fails: a new block is run here, or says why it cannot be."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.doc_blocks import PAGES, REPO, shell_blocks
from tools.checkout_copy import copy_checkout

BLOCKS = [block for page in PAGES for block in shell_blocks(page)]
COMMENT = re.compile(r"\s#\s(.*)\Z")
# A reader's shell: the system's PATH, none of the venv's (the README once said nothing of it:
# `ansible-playbook: command not found`).
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_every_shell_block_says_whether_it_runs_here():
    unmarked = [block.where for block in BLOCKS if not block.marker]
    assert not unmarked, ("shell blocks without `<!-- doc-commands: run -->` or `<!-- doc-commands: not run: REASON -->` "
                          "on the line before: %s" % ", ".join(unmarked))
    assert any(block.run for block in BLOCKS if block.page == "README.md"), "README.md runs no block"


def _expected(line: str):
    """(exit status: an int, or 'nonzero'; the texts its output must hold) from the line's comment."""
    comment = COMMENT.search(line)
    text = comment.group(1) if comment else ""
    status = re.search(r"\bexits (\d+)\b", text)
    return (int(status.group(1)) if status else "nonzero" if re.search(r"\bfails\b", text) else 0,
            re.findall(r"`([^`]+)`", text))


def _clone(top: Path) -> Path:
    """The checkout as a clone has it, under `top`, with the venv that `make setup` made (linked, and
    newer than its requirements, as after `make setup`) and the wheel cache make setup reads."""
    clone = copy_checkout(REPO, top / "cleanslate.gpu")
    (clone / ".venv").symlink_to((REPO / ".venv").resolve())
    (clone / "build").mkdir(exist_ok=True)
    (clone / "build" / "wheels").symlink_to((REPO / "build" / "wheels").resolve())
    made = (clone / ".venv" / ".installed").stat().st_mtime
    prerequisites = re.search(r"^\$\(VENV\)/\.installed: (.*)$", (clone / "Makefile").read_text(), re.M).group(1)
    for name in prerequisites.split():
        os.utime(clone / name, (made - 1, made - 1))
    return clone


@pytest.mark.parametrize("page", [page for page in PAGES if any(b.run for b in BLOCKS if b.page == page)])
def test_the_pages_commands_work_as_typed(page, tmp_path):
    top = tmp_path / "root-home"
    top.mkdir(mode=0o700)
    top.chmod(0o700)
    clone = _clone(top)
    lines = [(number, text) for block in BLOCKS if block.page == page and block.run for number, text in block.lines]
    logs = tmp_path / "logs"
    logs.mkdir()
    # Each line as written, in one shell (`. .venv/bin/activate` holds for the lines after it); its
    # output and exit status go to files named by its line number.
    script = "".join('{ %s\n} > %s/%d.out 2>&1\necho $? > %s/%d.rc\n' % (text, logs, number, logs, number)
                     for number, text in lines)
    env = {"PATH": PATH, "HOME": str(top), "LANG": "C.UTF-8", "USER": "root", "LOGNAME": "root"}
    subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c", script],
                   cwd=clone, env=env, capture_output=True, text=True, timeout=600, check=False)
    for number, text in lines:
        where = "%s:%d: %s" % (page, number, text.split("  #")[0].strip())
        assert (logs / ("%d.rc" % number)).is_file(), "%s never ran" % where
        status = int((logs / ("%d.rc" % number)).read_text())
        out = (logs / ("%d.out" % number)).read_text(errors="replace")
        expected, texts = _expected(text)
        assert status != 0 if expected == "nonzero" else status == expected, \
            "%s exited %d, not %s:\n%s" % (where, status, expected, out[-3000:])
        missing = [quoted for quoted in texts if quoted not in out]
        assert not missing, "%s printed none of %s:\n%s" % (where, missing, out[-3000:])
        assert "Traceback" not in out, "%s:\n%s" % (where, out[-3000:])
