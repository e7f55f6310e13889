"""The shell blocks of the pages a newcomer follows, each with the marker on the line before it:

    <!-- doc-commands: run -->               tests/integration/test_doc_commands.py runs it as written
    <!-- doc-commands: not run: REASON -->   it cannot run here (a real host, Galaxy); the reason says why,
                                             and tests/functional/test_readme_commands.py checks it instead

A shell block (```sh, ```bash, ```shell, ```console or a bare ```) without a marker fails both tests.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/getting_started.md")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!-- doc-commands: (?:(?P<run>run)|not run: (?P<why>\S.*?)) -->")
SHELL_LANGS = ("", "sh", "bash", "shell", "console")


@dataclass
class Block:
    page: str
    line: int            # the fence's line, 1-based
    marker: str | None   # the marker line before the fence, as written (None: unmarked)
    run: bool
    lines: list          # [(line number, text)] of the block's non-empty lines

    @property
    def where(self) -> str:
        return "%s:%d" % (self.page, self.line)


def shell_blocks(page: str) -> list:
    """The page's shell blocks, in order."""
    text = (REPO / page).read_text(encoding="utf-8")
    found = []
    for fence in FENCE.finditer(text):
        if fence.group("lang") not in SHELL_LANGS:
            continue
        line = text.count("\n", 0, fence.start()) + 1
        before = text[:fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        body = [(line + 1 + offset, row) for offset, row in enumerate(fence.group("body").split("\n")) if row.strip()]
        found.append(Block(page, line, before if marker else None, bool(marker and marker.group("run")), body))
    return found
