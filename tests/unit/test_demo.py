"""`make demo`'s tables (issue 38, 5): the processes that must survive the reset marked before it,
and after it each one shown alive or stopped, a wrong fate counted; the stand-in engine named as one."""
from __future__ import annotations

import re

from tests.sim.processes import SPARED
from tools import demo, demo_serve

STOPPED = ("api_server", "worker", "orphan_worker", "term_ignorer", "unpinned_worker", "forked_child")


def procs() -> dict:
    roles = list(STOPPED) + list(SPARED)
    return {role: [{"pid": 100 + index, "name": role[:15], "gpus": [index % 4] if role in STOPPED else []}]
            for index, role in enumerate(roles)}


def by_role(lines) -> dict:
    return {line.split()[0]: line for line in lines}


def test_the_opening_table_marks_exactly_the_processes_that_must_survive():
    lines, wrong = demo.table(procs())
    assert wrong == 0
    rows = by_role(lines)
    assert sorted(role for role, line in rows.items() if "* must survive" in line) == sorted(SPARED)
    assert sorted(role for role, line in rows.items() if "to be stopped" in line) == sorted(STOPPED)


def test_after_the_reset_a_spared_process_gone_or_a_holder_alive_is_wrong():
    table = procs()
    right = {entry["pid"] for role in SPARED for entry in table[role]}
    lines, wrong = demo.table(table, lambda pid: pid in right)
    assert wrong == 0 and "WRONG" not in "".join(lines)
    assert all(re.search(r" alive +\* must survive", by_role(lines)[role]) for role in SPARED)
    assert all(re.search(r" stopped +to be stopped", by_role(lines)[role]) for role in STOPPED)

    monitor, worker = table["monitor"][0]["pid"], table["worker"][0]["pid"]
    lines, wrong = demo.table(table, lambda pid: (pid in right) != (pid in (monitor, worker)))
    assert wrong == 2
    assert [role for role, line in by_role(lines).items() if "WRONG" in line] == ["worker", "monitor"]


def test_the_stand_in_note_names_paths_that_exist():
    text = demo_serve.STAND_IN
    assert "stand-in" in text and "`make vllm-cpu`" in text
    assert re.search(r"^vllm-cpu:", (demo.REPO / "Makefile").read_text(), re.M)
    for path in re.findall(r"(?:tests|docs)/[\w/.]+\w", text):
        assert (demo.REPO / path).exists(), path
    assert "## Tested how" in (demo.REPO / "docs" / "inference_service.md").read_text()
