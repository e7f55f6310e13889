"""Self-healing end to end with the real parts, all local (issue 28, docs/self_healing.md):
two fleet hosts (nspawn, real systemd) served by the stand-in engine; Debian's Prometheus scraping
the engines' /metrics and evaluating the shipped rules; Debian's Alertmanager routing the alerts to
the shipped rulebook's webhook; ansible-rulebook (its own venv) running cleanslate.gpu.heal.

Two test-only changes, both copies made here: the rules' `for:` durations are set to 1s (shipped:
2 minutes), and the rulebook's throttle to 5 seconds (shipped: 10 minutes). The engine crashes with
SIGKILL; the unit's RestartSec is an hour, so systemd does not bring it back by itself.

Crash node1: with no step of the test's the host is reset and answers a completion again; the
times of each part are printed. Crash node1 and node2 together: both heal, each on its own. Crash
node1 a third time: the breaker (2 heals per hour here) opens and nothing more is run for it."""
from __future__ import annotations

import datetime
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.fleet import engines
from tests.integration.heal import REPO, Alertmanager, Prometheus, Rulebook, alert_deadline, hostile_alert, payload, \
    short_rules, short_throttle, shown, stretched
from tests.integration.test_inference_service_fleet import UNIT, base_vars
from tests.integration.test_observe_fleet import wait_for

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
HOSTS = ("node1", "node2")
MAX_HEALS = 2
# node2 is served with a key (the canary of the hostile alert's test); node1 without one.
CANARY = "sk-canary-heal-fleet-" + secrets.token_hex(4)
KEYS = {"node2": CANARY}
METRICS = "/var/lib/prometheus/node-exporter"
# The test's Prometheus: scrapes and evaluations every second, every rule's `for:` 1 s.
SCRAPE_S, SCRAPE_TIMEOUT_S, EVALUATION_S, FOR_S = 1, 0.9, 1, 1


class Loop:
    def __init__(self, fleet, workdir: Path):
        self.fleet, self.workdir = fleet, workdir
        self.inventory = workdir / "inventory"
        (self.inventory / "host_vars").mkdir(parents=True)
        (workdir / "metrics").mkdir()
        shutil.copy(fleet.inventory, self.inventory / "hosts.yml")
        (self.inventory / "group_vars").mkdir()
        (self.inventory / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump({
            "heal_state_path": str(workdir / "state" / "breaker.json"), "heal_metrics_dir": str(workdir / "metrics"),
            "heal_max_heals": MAX_HEALS, "fleet_report_path": str(workdir / "reports")}))
        for host in HOSTS:
            values = dict(base_vars("node3"), inference_service_restart_sec=3600)
            if host in KEYS:
                values["inference_service_secrets"] = {"api_key": KEYS[host]}
            (self.inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))
        self.procs = []

    def address(self, host):
        return self.fleet.hosts[host].address

    def serve(self):
        proc = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/reset_and_serve.yml", "-i", str(self.inventory),
                               "-l", ",".join(HOSTS)], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout[-6000:]

    def start(self):
        self.rulebook = Rulebook(self.workdir, self.inventory, HOSTS, short_throttle(self.workdir / "heal.yml"))
        self.procs.append(self.rulebook)
        self.alertmanager = Alertmanager(self.workdir, self.rulebook.port)
        self.procs.append(self.alertmanager)
        self.prometheus = Prometheus(self.workdir, [{"job_name": "cleanslate_gpu_engine", "static_configs": [
            {"targets": [f"{self.address(host)}:8000"], "labels": {"host": host}} for host in HOSTS]}],
            short_rules(self.workdir / "rules.yml", FOR_S), self.alertmanager.port, SCRAPE_S, SCRAPE_TIMEOUT_S)
        self.procs.append(self.prometheus)

    def stop(self):
        for proc in reversed(self.procs):
            proc.stop()

    def firing(self, host) -> float:
        """When Prometheus's EngineDown alert of `host` fired (its activeAt plus the copy's `for:` of
        1 s, Prometheus's own clock), 0 while it does not."""
        found = self.prometheus.alerts()
        return next((stamp(a["activeAt"]) + FOR_S for a in found if a["labels"].get("alertname") == "CleanslateGpuEngineDown"
                     and a["labels"].get("host") == host and a["state"] == "firing"), 0)

    def up(self, host) -> bool:
        return bool(self.prometheus.query('up{job="cleanslate_gpu_engine",host="%s"} == 1' % host))

    def completes(self, host) -> bool:
        base = f"http://{self.address(host)}:8000"
        headers = {"Content-Type": "application/json"}
        if host in KEYS:
            headers["Authorization"] = "Bearer " + KEYS[host]
        try:
            with urllib.request.urlopen(urllib.request.Request(base + "/v1/models", headers=headers), timeout=3) as response:
                model = json.loads(response.read())["data"][0]["id"]
            body = json.dumps({"model": model, "prompt": "Say something", "max_tokens": 8}).encode()
            request = urllib.request.Request(base + "/v1/completions", data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=10) as response:
                return bool(json.loads(response.read())["choices"])
        except (OSError, ValueError, KeyError, IndexError):
            return False

    def crash(self, host) -> float:
        self.fleet.run(host, ["systemctl", "kill", "--signal=SIGKILL", UNIT])
        return time.time()

    def breaker(self) -> dict:
        path = self.workdir / "state" / "breaker.json"
        return json.loads(path.read_text())["hosts"] if path.exists() else {}

    def heal_reports(self) -> list:
        """The fleet reports of the runs the rulebook started."""
        documents = [json.loads(path.read_text()) for path in sorted((self.workdir / "reports").glob("reset_and_serve-*.json"))]
        return [document for document in documents if "trigger" in document]

    def heals(self, host) -> list:
        return self.breaker().get(host, {}).get("heals", [])


def report_time(text: str) -> float:
    """A report's stamp (UTC, to the second) as seconds, rounded up: the report was written in that second."""
    return datetime.datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc).timestamp() + 1


def stamp(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def loop(fleet_session, tmp_path_factory):
    fleet = fleet_session
    for host in HOSTS:
        if not fleet.hosts[host].running():
            fleet.boot(host)
        engines.install(fleet.hosts[host].root)
    state = Loop(fleet, tmp_path_factory.mktemp("heal"))
    try:
        state.serve()
        state.start()
        yield state
    finally:
        state.stop()
        for host in HOSTS:
            if fleet.hosts[host].running():
                fleet.run(host, ["systemctl", "disable", "--now", UNIT], check=False, timeout=120)
                fleet.run(host, ["sh", "-c", f"rm -rf /etc/systemd/system/{UNIT} /etc/cleanslate /dev/shm/nccl-standin-*; "
                                             f"systemctl daemon-reload; systemctl reset-failed {UNIT}"], check=False)
            engines.uninstall(fleet.hosts[host].root)


def heal(loop, crashed: dict, heals_before: dict) -> dict:
    """Wait for the heal of each crashed host (host -> when it crashed); host -> the times of its
    heal's parts, in seconds after its crash. The hosts are watched together, each part seen when
    it happens: a host watched only after another's heal could be healed already, its alert
    resolved (at load 20, node2's heal ended before node1's and its firing was never seen). Each
    part's deadline runs from the one before it."""
    stages = (("the alert firing", loop.firing,
               alert_deadline(SCRAPE_S, SCRAPE_TIMEOUT_S, EVALUATION_S, FOR_S)),
              ("the heal counted", lambda host: len(loop.heals(host)) > heals_before[host] and time.time(), 120),
              ("a completion again", lambda host: loop.completes(host) and time.time(), 300))
    seen = {host: [] for host in crashed}
    since = {host: time.monotonic() for host in crashed}
    while any(len(times) < len(stages) for times in seen.values()):
        for host, times in seen.items():
            if len(times) == len(stages):
                continue
            what, probe, deadline = stages[len(times)]
            try:
                found = probe(host)
            except OSError:
                found = 0
            limit = stretched(deadline)
            if found:
                times.append(found)
                since[host] = time.monotonic()
            elif time.monotonic() - since[host] > limit:
                pytest.fail("%s: %s: not within %d s (load %.1f)" % (host, what, limit, os.getloadavg()[0]))
        time.sleep(0.2)
    parts = {}
    for host, (fired, _counted, ready) in seen.items():
        record = loop.heals(host)[-1]
        parts[host] = {"alert firing": fired - crashed[host], "rulebook receives": stamp(record["received_at"]) - crashed[host],
                       "playbook starts": record["at"] - crashed[host], "server ready": ready - crashed[host]}
        print("%s heal %d: %s" % (host, heals_before[host] + 1, ", ".join("%s %.1f s" % item for item in parts[host].items())))
        assert record["alertname"] == "CleanslateGpuEngineDown" and record["fingerprint"]
        assert list(parts[host].values()) == sorted(parts[host].values()), parts[host]
    return parts


def test_a_crash_heals_by_itself_again_and_again_until_the_breaker_opens(loop):
    for host in HOSTS:
        wait_for(f"{host} scraped up", lambda host=host: loop.up(host), timeout=stretched(60))
    assert not loop.breaker()

    # One crash: reset and served again with nobody's help.
    first = heal(loop, {"node1": loop.crash("node1")}, {"node1": 0})["node1"]
    # The server answers before the run ends (the gate, the metrics, then the report).
    (document,) = wait_for("the heal's report", loop.heal_reports, timeout=stretched(120))
    assert document["trigger"]["alertname"] == "CleanslateGpuEngineDown", document.get("trigger")
    assert document["trigger"]["fingerprint"] == loop.heals("node1")[0]["fingerprint"]
    (row,) = document["hosts"]
    assert row["host"] == "node1" and row["status"] == "ok" and row["service"]["status"] == "ready", row
    wait_for("node1's alert resolved", lambda: not loop.firing("node1"), timeout=stretched(60))

    # Both hosts crash at once: each is healed, on its own (one lock per host).
    crashed = {host: loop.crash(host) for host in HOSTS}
    both = heal(loop, crashed, {"node1": 1, "node2": 0})
    second, other = both["node1"], both["node2"]
    wait_for("both alerts resolved", lambda: not loop.firing("node1") and not loop.firing("node2"), timeout=stretched(60))
    # In parallel: each heal started before the other's run ended (its report is written last).
    reports = wait_for("both heals' reports", lambda: len(loop.heal_reports()) == 3 and loop.heal_reports(), timeout=stretched(120))
    ended = {document["hosts"][0]["host"]: report_time(document["time"]) for document in reports[1:]}
    started = {host: loop.heals(host)[-1]["at"] for host in HOSTS}
    assert started["node1"] < ended["node2"] and started["node2"] < ended["node1"], (started, ended)
    runs_before = loop.rulebook.runs()

    # The third crash of node1 within the window: the breaker opens, nothing is reset, node1 stays down.
    loop.crash("node1")
    wait_for("the breaker open", lambda: loop.breaker().get("node1", {}).get("open"), timeout=stretched(120))
    wait_for("the refused run ended", lambda: loop.rulebook.finished() == runs_before + 1, timeout=stretched(300))
    time.sleep(10)
    assert loop.rulebook.runs() == runs_before + 1, loop.rulebook.text()[-4000:]
    assert len(loop.heal_reports()) == 3  # no reset_and_serve ran
    assert len(loop.heals("node1")) == MAX_HEALS and not loop.completes("node1")
    assert loop.fleet.run("node1", ["systemctl", "is-active", UNIT], check=False).stdout.strip() != "active"
    metrics = (loop.workdir / "metrics" / "cleanslate_gpu_heal.prom").read_text()
    assert 'cleanslate_gpu_heal_breaker_open{host="node1"} 1' in metrics and \
        'cleanslate_gpu_heal_breaker_open{host="node2"} 0' in metrics, metrics
    assert "cleanslate.gpu heal breaker opened: node1 was healed 2 times within 3600 s" in loop.rulebook.text()
    assert loop.rulebook.alive()
    print("recovery (crash -> completion): %.1f s, %.1f s; node2 %.1f s" % (
        first["server ready"], second["server ready"], other["server ready"]))


def test_a_hostile_alert_for_a_served_host_runs_no_template_and_copies_no_secret_anywhere(loop):
    """Issue 35, 1 and 2, through the whole loop: an alert posted to the rulebook's webhook for node2
    (in heal_hosts, served with a canary key), template code in every field the rule lets through
    (a name of its own labelled cleanslate_heal="true", no unit: so the heal is let through), the
    host's key among it by name. The heal runs reset_and_serve.yml on node2, whose healthy server
    it leaves running. On d3c1d0d the lookups ran as the controller's user and the key, rendered
    from node2's own vars, reached the breaker's state, the heal metrics, the report and the
    rulebook's output."""
    ran = "/tmp/cleanslate-heal-fleet-ran-" + secrets.token_hex(4)
    wait_for("node2 answering", lambda: loop.completes("node2"), timeout=stretched(60))
    heals, finished = len(loop.heals("node2")), loop.rulebook.finished()
    assert loop.rulebook.post(payload(hostile_alert("node2", ran))) == 200
    wait_for("the hostile alert's run", lambda: loop.rulebook.finished() > finished, timeout=stretched(300))
    for host in HOSTS:
        assert loop.fleet.run(host, ["test", "-e", ran], check=False).returncode == 1, host
    assert not Path(ran).exists()
    # The heal ran, counted, and kept the alert's literal text by the rule (escaped, cut, masked).
    heal = loop.heals("node2")[-1]
    assert len(loop.heals("node2")) == heals + 1, loop.rulebook.text()[-5000:]
    assert heal["alertname"] == shown(ran) and heal["starts_at"] == shown(ran) and heal["fingerprint"] == shown(ran, 2)
    (document,) = [document for document in loop.heal_reports() if document["trigger"]["alertname"] == shown(ran)]
    assert document["trigger"]["fingerprint"] == shown(ran, 2) and document["trigger"]["starts_at"] == shown(ran)
    (row,) = document["hosts"]
    assert row["host"] == "node2" and row["service"]["status"] == "ready", row
    assert loop.completes("node2")
    # The key is node2's own (its server holds it), and is found nowhere else.
    root = loop.fleet.hosts["node2"].root
    assert CANARY in (root / "etc/cleanslate/inference/inference-server.env").read_text()
    texts = {
        "breaker state": (loop.workdir / "state" / "breaker.json").read_text(),
        "heal metrics": "".join(path.read_text() for path in (loop.workdir / "metrics").iterdir()),
        "reports (JSON and Markdown)": "".join(path.read_text() for path in (loop.workdir / "reports").iterdir()),
        "rulebook output": loop.rulebook.text(),
        "journal (-o cat)": loop.fleet.run("node2", ["journalctl", "--no-pager", "-o", "cat"]).stdout,
        "journal (-o json)": loop.fleet.run("node2", ["journalctl", "--no-pager", "-o", "json"]).stdout,
        "host metrics": "".join(path.read_text() for path in sorted((root / METRICS.lstrip("/")).glob("*.prom"))),
    }
    assert "lookup('pipe', 'touch %s')" % ran in texts["heal metrics"] and "Triggered by cleanslate.gpu.heal" in \
        texts["reports (JSON and Markdown)"] and "cleanslate_gpu" in texts["host metrics"], texts["heal metrics"]
    assert "{{ lookup('pipe', 'touch %s') }}" % ran in texts["rulebook output"]  # the event reached it as it was
    assert [where for where, text in texts.items() if CANARY in text] == []
    assert loop.rulebook.alive()
