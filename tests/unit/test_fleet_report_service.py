"""The fleet report of reset_and_serve: the service columns, and a degraded or failed service
listed with its reason. Rows without a service (reset, verify) keep the table they had."""
from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import render_markdown


def row(host, service, ok=True, status="ok", **values):
    base = {"host": host, "ok": ok, "status": status, "killed": 0, "mib_freed": 0, "shm_bytes_freed": 0,
            "bytecode_removed": 0, "seconds": 1.0, "problems": [], "service": service}
    base.update(values)
    return base


def test_served_rows_gain_the_service_columns_and_not_ready_services_are_listed():
    text = render_markdown("reset_and_serve", "T", [
        row("node1", {"engine": "vllm", "engine_version": "0.33.0", "status": "ready", "ready_s": 412.66,
                      "first_completion_ms": 842.4, "acceptance_rate": 0.7132}, killed=9, mib_freed=565000),
        row("node2", {"engine": "sglang", "engine_version": "0.5.23", "status": "degraded", "ready_s": None,
                      "first_completion_ms": 301.0, "acceptance_rate": 0.15,
                      "reason": "speculative decoding accepts 15% of drafted tokens"}),
        row("node3", {"engine": "vllm", "status": "failed", "reason": "unit died while loading"}),
        row("node4", {}, ok=False, status="unreachable"),
    ])
    lines = text.splitlines()
    assert lines[2].endswith("| seconds | engine | ready s | first completion ms | acceptance | service |")
    assert "| node1 | ok | 9 | 565000 | 0 Bytes | 0 | 1.0 | vllm 0.33.0 | 412.7 | 842 | 71% | ready |" in lines
    assert "| node2 | ok | 0 | 0 | 0 Bytes | 0 | 1.0 | sglang 0.5.23 | - | 301 | 15% | degraded |" in lines
    assert "| node3 | ok | 0 | 0 | 0 Bytes | 0 | 1.0 | vllm | - | - | - | failed |" in lines
    assert "| node4 | unreachable | 0 | 0 | 0 Bytes | 0 | 1.0 | - | - | - | - | - |" in lines
    assert "4 hosts, 3 not ok." in lines
    assert "- node2 (ok): service degraded: speculative decoding accepts 15% of drafted tokens" in lines
    assert "- node3 (ok): service failed: unit died while loading" in lines
    assert "- node4 (unreachable): no details" in lines


def test_reset_rows_keep_their_table():
    lines = render_markdown("reset", "T", [row("node1", {})]).splitlines()
    assert lines[2] == "| host | status | killed | MiB freed | shm freed | bytecode removed | seconds |"
    assert "1 hosts, 0 not ok." in lines
