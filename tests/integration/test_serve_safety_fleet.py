"""The serve layer touches only its own service and tells the truth about it: reset_and_serve.yml
on real systemd hosts (the fleet of test_inference_service_fleet.py, served the same way), each
promise asserted from outside the playbook (systemctl, files and /proc inside the host).

Units: the role writes, stops and restarts only a unit it wrote itself; a hand-written unit is
refused unless adopted (then kept as a backup); the host's own services are always refused; an
older unit of the role that still runs is refused by name, its workers untouched.
"""
from __future__ import annotations

import hashlib

import pytest

from tests.integration.fleet.reports import rows_by_host
from tests.integration.test_inference_service_fleet import (  # noqa: F401 pylint: disable=unused-import
    HOSTS, UNIT, base_vars, recap, served)

BILLING = "billing.service"
BILLING_UNIT = "[Unit]\nDescription=Billing (hand-written)\n\n[Service]\nExecStart=/bin/sleep infinity\n"


def unit_file(served_fleet, name, unit) -> bytes:
    path = served_fleet.fleet.hosts[name].root / "etc/systemd/system" / unit
    return path.read_bytes() if path.exists() else b""


def backups(served_fleet, name, unit) -> list:
    return sorted(p.name for p in (served_fleet.fleet.hosts[name].root / "etc/systemd/system").glob(unit + ".*~"))


def main_pid(served_fleet, name, unit) -> int:
    out = served_fleet.fleet.run(name, ["systemctl", "show", "--property=MainPID", "--value", unit]).stdout
    return int(out.strip() or 0)


def workers(served_fleet, name) -> list:
    """The pids of the unit's processes (its control group), the server and its GPU workers."""
    out = served_fleet.fleet.run(name, ["systemctl", "show", "--property=ControlGroup", "--value", UNIT]).stdout
    procs = served_fleet.fleet.run(name, ["cat", f"/sys/fs/cgroup{out.strip()}/cgroup.procs"]).stdout
    return sorted(int(pid) for pid in procs.split())


def answers(served_fleet, name) -> bool:
    try:
        return served_fleet.get(name, "/health")[0] == 200
    except OSError:  # refused, reset or timed out: URLError is an OSError
        return False


@pytest.fixture
def billing(served):
    """node3 runs a hand-written billing.service (not the role's) beside the role's server."""
    fleet = served.fleet
    (fleet.hosts["node3"].root / "etc/systemd/system" / BILLING).write_text(BILLING_UNIT)
    fleet.run("node3", ["sh", "-c", f"systemctl daemon-reload && systemctl start {BILLING}"])
    try:
        yield hashlib.sha256(BILLING_UNIT.encode()).hexdigest()
    finally:
        fleet.run("node3", ["sh", "-c", f"systemctl stop {BILLING}; rm -f /etc/systemd/system/{BILLING}*; "
                                        "systemctl daemon-reload"], check=False)
        served.vars["node3"] = base_vars("node3")
        if not answers(served, "node3") or \
                served.fleet.run("node3", ["systemctl", "is-enabled", UNIT], check=False).stdout.strip() != "enabled":
            served.heal("node3")


def test_a_hand_written_unit_is_refused_before_anything_is_touched(served, billing):
    billing_pid = main_pid(served, "node3", BILLING)
    server_pids = workers(served, "node3")
    served.vars["node3"]["inference_service_unit"] = BILLING
    proc, report = served.play(limit="node3")
    assert proc.returncode == 2, proc.stdout[-6000:]
    row = rows_by_host(report)["node3"]
    assert row["status"] == "invalid" and row["killed"] == 0, row
    problems = "\n".join(row["problems"])
    assert "/etc/systemd/system/billing.service exists and this role did not write it" in problems
    assert "set inference_service_adopt_unit: true" in problems
    # The role's own server, still running under its old name, is named too: the reset for
    # billing.service would have killed its GPU workers from under it.
    assert "inference-server.service, a unit this role wrote earlier, still runs" in problems
    assert hashlib.sha256(unit_file(served, "node3", BILLING)).hexdigest() == billing
    assert backups(served, "node3", BILLING) == []
    assert main_pid(served, "node3", BILLING) == billing_pid
    assert workers(served, "node3") == server_pids
    assert "Stop the unit" not in proc.stdout


def test_a_renamed_unit_never_kills_the_old_units_workers(served):
    """The inventory now names another unit; the old one (the role's, healthy) keeps its server
    and GPU workers, and the run names it instead of resetting the GPUs under it."""
    server_pids = workers(served, "node3")
    assert len(server_pids) >= 3  # the API server and two TP workers
    served.vars["node3"]["inference_service_unit"] = "llama-renamed.service"
    try:
        proc, report = served.play(limit="node3")
        assert proc.returncode == 2, proc.stdout[-6000:]
        row = rows_by_host(report)["node3"]
        assert row["status"] == "invalid" and row["killed"] == 0, row
        assert row["problems"] == [
            "inference_service: on node3, inference-server.service, a unit this role wrote earlier, still runs but "
            "the inventory now declares llama-renamed.service: a reset would kill its GPU workers from under it; "
            "stop it first (systemctl disable --now inference-server.service), or declare it as "
            "inference_service_unit or in inference_service_instances"], row
        assert workers(served, "node3") == server_pids
        assert served.get("node3", "/health")[0] == 200
        assert unit_file(served, "node3", "llama-renamed.service") == b""
    finally:
        served.vars["node3"] = base_vars("node3")


def test_system_units_are_always_refused(served):
    before = {name: main_pid(served, name, unit) for name, unit in
              (("node1", "ssh.service"), ("node2", "systemd-journald.service"), ("node3", "dbus.service"))}
    for name, unit in (("node1", "ssh.service"), ("node2", "systemd-journald.service"), ("node3", "dbus.service")):
        served.vars[name]["inference_service_unit"] = unit
        served.vars[name]["inference_service_adopt_unit"] = True
    try:
        proc, report = served.play()
        assert proc.returncode == 2, proc.stdout[-6000:]
        rows = rows_by_host(report)
        for name, unit in (("node1", "ssh.service"), ("node2", "systemd-journald.service"),
                           ("node3", "dbus.service")):
            assert rows[name]["status"] == "invalid", rows[name]
            assert f"inference_service_unit {unit} is a system unit" in "\n".join(rows[name]["problems"])
            assert main_pid(served, name, unit) == before[name] != 0
            assert unit_file(served, name, unit) == b""
    finally:
        for name in HOSTS:
            served.vars[name] = base_vars(name)


def test_an_adopted_unit_is_backed_up_and_shown_in_the_diff(served, billing):
    fleet = served.fleet
    fleet.run("node3", ["systemctl", "disable", "--now", UNIT])
    served.vars["node3"].update(inference_service_unit=BILLING, inference_service_adopt_unit=True)
    check, dummy = served.play(limit="node3", check=True)
    assert check.returncode == 0, check.stdout[-6000:]
    assert "-ExecStart=/bin/sleep infinity" in check.stdout and "+# Managed by Ansible" in check.stdout
    assert hashlib.sha256(unit_file(served, "node3", BILLING)).hexdigest() == billing
    proc, report = served.play(limit="node3")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert rows_by_host(report)["node3"]["service"]["status"] == "ready"
    kept = backups(served, "node3", BILLING)
    assert len(kept) == 1, kept
    root = fleet.hosts["node3"].root / "etc/systemd/system"
    assert (root / kept[0]).read_text() == BILLING_UNIT
    assert unit_file(served, "node3", BILLING).startswith(b"# Managed by Ansible (cleanslate.gpu.inference_service)")
    # Adopted once: the next run sees the role's own unit and changes nothing.
    again, dummy = served.play(limit="node3")
    assert again.returncode == 0 and recap(again.stdout)["node3"]["changed"] == 0, again.stdout[-4000:]
    assert backups(served, "node3", BILLING) == kept


# A server of someone else's on the inference port: answers everything the gate asks, as a
# real OpenAI-compatible server would, with a too-good acceptance rate. Standard library only.
FOREIGN = r'''#!/usr/bin/python3
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
SERVED = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, body, kind="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        if self.path.startswith("/metrics"):
            self._send(b"vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 20\n"
                       b"vllm:spec_decode_num_accepted_tokens_total 19\n", "text/plain")
        elif self.path.startswith("/v1/models"):
            self._send({"data": [{"id": SERVED}]})
        else:
            self._send({})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"choices": [{"text": " Paris, says someone else's server"}]})
HTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
'''


def crash_journal_is_this_invocations(lines: list) -> bool:
    """The journal lines of the invocation that died only: none of the stop of the one before."""
    return not any("SIGTERM, draining" in line or line.startswith("Stopping ") for line in lines)


def test_a_slow_server_is_never_reset_and_slow_is_told_apart_from_refused(served):
    """node1 answers everything, but /health takes 6 s (SGLang's can take 20 s under load): it is
    healthy for the engine's own timeout (vLLM 10 s) and left running; with a 2 s timeout it is
    `slow`, still not reset, and the report says slow, not refused."""
    fleet = served.fleet
    served.fault("node1", health_delay_s=6)
    fleet.run("node1", ["systemctl", "restart", UNIT])
    try:
        served.wait_health("node1", timeout=60)
        pid = main_pid(served, "node1", UNIT)
        since = float(fleet.run("node1", ["date", "+%s"]).stdout) - 1
        proc, report = served.play(limit="node1")
        assert proc.returncode == 0, proc.stdout[-6000:]
        row = rows_by_host(report)["node1"]
        assert row["killed"] == 0 and "no reset" in row.get("note", ""), row
        assert row["service"]["status"] == "ready"
        # The whole deadline of an hour: the gate must not wait for it (issue 35, 9).
        served.vars["node1"].update(inference_service_health_timeout=2, inference_service_ready_timeout=3600)
        proc, report = served.play(limit="node1")
        row = rows_by_host(report)["node1"]
        assert row["killed"] == 0 and row["seconds_per_step"] == {}, row
        assert "slow" in row.get("note", "") and "refused" not in row.get("note", ""), row
        # Never reset, never restarted: the same process, no start in the journal.
        assert main_pid(served, "node1", UNIT) == pid
        assert served.starts_since("node1", since) == 0
        # The gate could not see it answer in 2 s either: `slow` at its first poll (not failed after an
        # hour), a warning, the host not failed (the run left it running), and the report says why.
        service = row["service"]
        assert proc.returncode == 0 and service["status"] == "slow" and service["gate_s"] < 30, service
        assert "no answer within 2" in service["reason"] and "left it running" in service["reason"], service
        assert row["ok"] is False and any(problem.startswith("service slow: ") for problem in row["problems"]), row
    finally:
        served.fault("node1")
        served.vars["node1"] = base_vars("node1")
        served.heal("node1")


# The modules as a root without CAP_SYS_PTRACE, as in a container that drops it: the host's Python
# for this run (ansible_python_interpreter), through setpriv.
NO_PTRACE = "/usr/local/bin/python3-no-ptrace"
NO_PTRACE_WRAPPER = "#!/bin/sh\nexec setpriv --bounding-set=-sys_ptrace --inh-caps=-sys_ptrace -- /usr/bin/python3 \"$@\"\n"


def test_a_healthy_server_the_modules_cannot_attribute_is_left_running_and_reported_unproven(served):
    """Issue 35, 8: without CAP_SYS_PTRACE the modules may not follow the engine's descriptors (it
    runs with capabilities the reader lacks), the look called a healthy server unhealthy, and
    node_reset stopped it (its GPU memory freed, a new MainPID). Now: `unproven`, left running, not
    reset, the gate ends at once, the report says what to do, and the run does not fail the host."""
    fleet = served.fleet
    wrapper = fleet.hosts["node3"].root / NO_PTRACE.lstrip("/")
    wrapper.write_text(NO_PTRACE_WRAPPER)
    wrapper.chmod(0o755)
    pid, server_pids = main_pid(served, "node3", UNIT), workers(served, "node3")
    since = float(fleet.run("node3", ["date", "+%s"]).stdout) - 1
    served.vars["node3"]["ansible_python_interpreter"] = NO_PTRACE
    try:
        proc, report = served.play(limit="node3")
        assert proc.returncode == 0, proc.stdout[-6000:]
        row = rows_by_host(report)["node3"]
        assert row["killed"] == 0 and row["mib_freed"] == 0 and row["seconds_per_step"] == {}, row
        assert row.get("note", "").startswith("server unproven (HTTP 200, but cannot prove that unit %s answers on "
                                              "port 8000: the descriptors of " % UNIT), row
        service = row["service"]
        assert service["status"] == "unproven" and service["gate_s"] < 30, service
        assert "(do the modules run without CAP_SYS_PTRACE, in a container that drops it?); give the modules' root " \
               "CAP_SYS_PTRACE" in service["reason"], service["reason"]
        assert row["ok"] is False and any(problem.startswith("service unproven: ") for problem in row["problems"]), row
        assert "[WARNING]: unproven: HTTP 200, but cannot prove" in proc.stdout + proc.stderr
        # Left running: the same process and workers, no start in the journal.
        assert main_pid(served, "node3", UNIT) == pid and workers(served, "node3") == server_pids
        assert served.starts_since("node3", since) == 0
    finally:
        del served.vars["node3"]["ansible_python_interpreter"]
        wrapper.unlink()


def test_a_foreign_server_on_the_port_is_not_ready(served):
    """node3's server crashed; while its replacement is still importing (not listening yet, as
    real vLLM for a minute), another program answers on :8000. The gate names it instead of
    reporting the host ready with someone else's answers, and the program is left alone."""
    fleet = served.fleet
    root = fleet.hosts["node3"].root
    (root / "usr/local/bin/foreign-llm").write_text(FOREIGN)
    (root / "usr/local/bin/foreign-llm").chmod(0o755)
    fleet.run("node3", ["systemctl", "stop", UNIT])
    served.fault("node3", import_s=60)
    # A long-running service of its own (systemd-run returns once it started), outside the unit.
    fleet.run("node3", ["systemd-run", "--unit=foreign-llm", "--collect", "--quiet", "--",
                        "/usr/local/bin/foreign-llm", "8000", "sim/Llama-3.1-8B-Instruct"])
    try:
        foreign = main_pid(served, "node3", "foreign-llm.service")
        served.wait_health("node3", timeout=30)
        proc, report = served.play(limit="node3")
        assert proc.returncode == 2, proc.stdout[-6000:]
        service = rows_by_host(report)["node3"]["service"]
        assert service["status"] == "failed", service
        assert f"port 8000 is held by pid {foreign}" in service["reason"], service["reason"]
        assert service["acceptance_rate"] is None  # none of the foreign server's figures
        assert main_pid(served, "node3", "foreign-llm.service") == foreign  # not ours: untouched
    finally:
        fleet.run("node3", ["systemctl", "stop", "foreign-llm.service"], check=False)
        served.fault("node3")
        served.heal("node3")


def test_a_server_that_dies_just_after_readiness_is_not_reported_ready(served):
    """node3's engine answers, passes the smoke completions, then crashes 2 s after readiness: the
    gate reads the unit again after inference_service_stable_s and fails the host with the journal
    lines of the invocation that died, none of the one before."""
    served.fault("node3", crash_after_s=2)
    try:
        proc, report = served.play(limit="node3", force=["node3"])
        assert proc.returncode == 2, proc.stdout[-6000:]
        service = rows_by_host(report)["node3"]["service"]
        assert service["status"] == "failed", service
        assert "died" in service["reason"] or "restarted" in service["reason"], service["reason"]
        journal = "\n".join(service["journal"])
        assert "unspecified launch failure" in journal, journal
        assert crash_journal_is_this_invocations(service["journal"]), journal
    finally:
        served.fault("node3")
        served.heal("node3")
