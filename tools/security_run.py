"""The trust boundaries' run: every test docs/security.md names, run once, reported by rule.

    .venv/bin/python tools/security_run.py [pytest options]

docs/security.md gives each rule the tests that fail when it breaks (tests/unit/test_docs_links.py
keeps the names true). This runs exactly those tests (unit, functional and the fleet's), then prints,
for each section and rule, how many of its tests passed: the run behind the issue's closing note,
repeatable by anyone. Exit status: pytest's.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "security.md"
sys.path.insert(0, str(REPO))

from tests.unit.test_docs_links import NAMED_TEST  # noqa: E402  (one reading of `path::name`)

SECTION = re.compile(r"^### (.+)$")


def rules(text: str) -> list:
    """[(section, rule's first words, [node ids])] of the page's tables, in order."""
    found, section, last = [], "", None
    for line in text.splitlines():
        heading = SECTION.match(line)
        if heading:
            section = heading.group(1)
            continue
        if not line.startswith("| ") or line.startswith("| rule") or line.startswith("| ---"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        ids = []
        for path, name in NAMED_TEST.findall(cells[-1]):
            last = path or last
            ids.append("%s::%s" % (last, name))
        if ids:
            found.append((section, " ".join(cells[0].replace("`", "").split()[:12]), ids))
    return found


def in_file_order(node: str) -> tuple:
    """(file, line of its def) of a node id `path::name`."""
    path, name = node.split("::")
    lines = (REPO / path).read_text().splitlines()
    return path, next((number for number, line in enumerate(lines) if line.startswith("def %s(" % name)), len(lines))


def outcomes(report: Path) -> dict:
    """{node id without parameters: [passed, failed or errored, skipped]} from pytest's JUnit XML."""
    counts = {}
    for case in ElementTree.parse(report).iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        node = "%s::%s" % (path, case.get("name", "").split("[")[0])
        tally = counts.setdefault(node, [0, 0, 0])
        kinds = {child.tag for child in case}
        tally[1 if kinds & {"failure", "error"} else 2 if "skipped" in kinds else 0] += 1
    return counts


def main(argv) -> int:
    table = rules(PAGE.read_text())
    # In each file's own order: a module's fixture is shared by its tests in that order (a heal loop
    # counts the runs its earlier tests started).
    ids = sorted({node for dummy, dummy2, nodes in table for node in nodes}, key=in_file_order)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        status = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 "--junitxml", str(report)] + list(argv) + ids, cwd=REPO, check=False).returncode
        counts = outcomes(report) if report.exists() else {}
    print("\n%d rules, %d tests named (%d cases run)" % (len(table), len(ids), sum(map(sum, counts.values()))))
    section = None
    for name, rule, nodes in table:
        if name != section:
            section = name
            print("\n" + name)
        passed, failed, skipped = (sum(counts.get(node, [0, 0, 0])[index] for node in nodes) for index in range(3))
        missing = [node for node in nodes if node not in counts]
        verdict = "FAIL" if failed or missing else "ok"
        print("  %-4s %3d passed %2d failed %2d skipped  %s%s" % (
            verdict, passed, failed, skipped, rule, ("  (not run: %s)" % ", ".join(missing)) if missing else ""))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
