"""The fleet report's Markdown, as an operator reads it after a run."""
from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import human_bytes, render_markdown


def row(host, ok=True, status="ok", **values):
    base = {"host": host, "ok": ok, "status": status, "killed": 0, "mib_freed": 0, "shm_bytes_freed": 0,
            "bytecode_removed": 0, "seconds": 0.0, "problems": []}
    base.update(values)
    return base


def test_sizes_read_like_df():
    assert human_bytes(0) == "0 Bytes"
    assert human_bytes(512) == "512 Bytes"
    assert human_bytes(1052672) == "1.0 MiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"


def test_one_row_per_host_then_the_hosts_that_are_not_ok_with_why():
    text = render_markdown("reset", "20261129T101500Z", [
        row("node1", killed=9, mib_freed=565000, shm_bytes_freed=1052672, bytecode_removed=1, seconds=4.25),
        row("node2", ok=False, status="unreachable"),
        row("node3", ok=False, status="failed", problems=["GPU 3: 1200 MiB used", "pid 77 (D state)"]),
    ])
    lines = text.splitlines()
    assert lines[0] == "# Fleet reset report 20261129T101500Z"
    assert "| node1 | ok | 9 | 565000 | 1.0 MiB | 1 | 4.2 |" in lines
    assert "| node2 | unreachable | 0 | 0 | 0 Bytes | 0 | 0.0 |" in lines
    assert "3 hosts, 2 not ok." in lines
    assert "- node2 (unreachable): no details" in lines
    assert "- node3 (failed): GPU 3: 1200 MiB used; pid 77 (D state)" in lines


def test_an_empty_fleet_still_gives_a_table():
    lines = render_markdown("verify", "T", []).splitlines()
    assert lines[2].startswith("| host | status |")
    assert "0 hosts, 0 not ok." in lines
