"""The self-healing loop's parts for the tests (docs/self_healing.md): the shipped rulebook run by
ansible-rulebook from its own venv (build/venvs/rulebook, `make rulebook`), Alertmanager's
webhook payloads, and Debian's Alertmanager with a route to the rulebook."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULEBOOK_VENV = REPO / "build" / "venvs" / "rulebook"
RULEBOOK = REPO / "extensions" / "eda" / "rulebooks" / "heal.yml"
RULES = REPO / "files" / "prometheus" / "cleanslate_gpu.rules.yml"
TOKEN = "t0ken-for-the-heal-tests"
# The loop's deadlines held on CI's 2 cores at load 8 and one failed at load 20: beyond the load
# per core they were seen to hold at, each stretches in proportion (a process gets that much less
# of a core), never shrinks.
HELD_AT_LOAD_PER_CPU = 4.0


def stretched(seconds: float, load: float | None = None, cpus: int | None = None) -> float:
    """`seconds`, a deadline that held at HELD_AT_LOAD_PER_CPU, for this machine's load now (the
    1-minute load average, or `load` on `cpus` cores)."""
    load = os.getloadavg()[0] if load is None else load
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    return seconds * max(1.0, load / cpus / HELD_AT_LOAD_PER_CPU)


def alert_deadline(scrape_s: float, scrape_timeout_s: float, evaluation_s: float, for_s: float) -> float:
    """How long the down alert of an engine killed now may take to fire: the scrape that fails (its
    interval, then its timeout), the evaluation that makes it pending, its `for:` and the
    evaluation that fires it; 12 times that (60 s for the test's 1 s intervals, which held at load 8)."""
    return 12 * (scrape_s + scrape_timeout_s + 2 * evaluation_s + for_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alert(host, name="CleanslateGpuEngineDown", status="firing", fingerprint=None, **labels) -> dict:
    """One alert as Alertmanager's webhook (payload version 4) lists it."""
    return {"status": status, "labels": dict(alertname=name, host=host, severity="critical", **labels),
            "annotations": {"summary": "down"}, "startsAt": "2026-12-02T01:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus/graph",
            "fingerprint": fingerprint or "%016x" % (abs(hash((host, name))) % 2 ** 64)}


def payload(*alerts, status="firing") -> dict:
    return {"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": status, "receiver": "heal",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager",
            "alerts": list(alerts)}


def hostile_text(ran) -> str:
    """Template code in both forms ansible-core runs, each host's secrets by name (written to render
    on any host), and what the rule escapes."""
    return ("{{ lookup('pipe', 'touch %s') }}{%% set x = lookup('pipe', 'touch %s') %%}"
            "{{ inference_service_secrets.api_key | default('') }}"
            "{{ ((inference_service_instances | default([{}]) | first).secrets | default({})).api_key | default('') }}"
            "\u2003\n}\"'" % (ran, ran))


def shown(ran, times=1) -> str:
    """hostile_text as the heal keeps it (docs/self_healing.md): the literal text, U+2003 and the
    newline escaped, cut to 256 characters (the last one an ellipsis)."""
    text = hostile_text(ran).replace("\u2003", "\\u2003").replace("\n", "\\n") * times
    return text if len(text) <= 256 else text[:255] + "\u2026"


def hostile_alert(host, ran, **labels) -> dict:
    """Hostile text in every field the rule lets through (it reads only status, host, alertname, cleanslate_heal)."""
    text = hostile_text(ran)
    return {"status": "firing", "startsAt": text, "endsAt": text, "generatorURL": text, "fingerprint": text * 2,
            "labels": dict({"alertname": text, "host": host, "cleanslate_heal": "true", "instance": text, "severity": text,
                            text[:40]: text}, **labels),
            "annotations": {"summary": text, "description": text}}


def rulebook_missing() -> str:
    if not (RULEBOOK_VENV / "bin" / "ansible-rulebook").exists():
        return "ansible-rulebook is not installed in %s (make rulebook)" % RULEBOOK_VENV
    if not shutil.which("java"):
        return "ansible-rulebook needs Java 17 (Debian: openjdk-17-jre-headless)"
    return ""


class Rulebook:
    """ansible-rulebook running `rulebook` (the shipped one by default) on a free port, with an
    inventory directory (copied whole at each run, host_vars included)."""

    def __init__(self, workdir: Path, inventory_dir: Path, hosts, rulebook: Path = RULEBOOK):
        missing = rulebook_missing()
        if missing:
            pytest.fail(missing)  # a failure, not a skip: CI must not go green without the loop's parts
        self.workdir, self.port = workdir, free_port()
        self.vars = workdir / "heal_vars.yml"
        self.vars.write_text(yaml.safe_dump({"heal_webhook_host": "127.0.0.1", "heal_webhook_port": self.port,
                                             "heal_webhook_token": TOKEN, "heal_hosts": list(hosts)}))
        env = dict(os.environ, PATH="%s:%s" % (RULEBOOK_VENV / "bin", os.environ["PATH"]),
                   ANSIBLE_COLLECTIONS_PATH=str(REPO / ".ansible" / "collections"),
                   ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_RESULT_FORMAT="yaml")
        self.log_path = workdir / "rulebook.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [str(RULEBOOK_VENV / "bin" / "ansible-rulebook"), "-r", str(rulebook), "-i", str(inventory_dir),
             "--vars", str(self.vars), "-vv"], cwd=workdir, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        limit = stretched(90)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.text()[-3000:]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        pytest.fail("the rulebook's webhook did not listen within %d s:\n%s" % (limit, self.text()[-3000:]))

    def text(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def post(self, body, token=TOKEN) -> int:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = "Bearer " + token
        request = urllib.request.Request("http://127.0.0.1:%d/alerts" % self.port, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def alive(self) -> bool:
        return self.proc.poll() is None

    def runs(self) -> int:
        """Playbook runs started so far (ansible-rulebook says each one's job start)."""
        return self.text().count("Calling Ansible runner")

    def finished(self) -> int:
        """Playbook runs ended so far."""
        return self.text().count("Ansible runner rc:")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()


class Alertmanager:
    """Debian's prometheus-alertmanager routing every alert to the rulebook's webhook, fast."""

    def __init__(self, workdir: Path, webhook_port: int):
        self.port = free_port()
        config = {
            "route": {"receiver": "heal", "group_by": ["alertname", "host"], "group_wait": "0s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "heal", "webhook_configs": [{
                "url": "http://127.0.0.1:%d/alerts" % webhook_port, "send_resolved": True,
                "http_config": {"authorization": {"credentials": TOKEN}}}]}],
        }
        path = workdir / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = open(workdir / "alertmanager.log", "wb")  # noqa: SIM115  # closed in stop()
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if not binary:
            pytest.fail("prometheus-alertmanager is not installed (tools/install_os_deps.sh)")
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [binary, "--config.file=%s" % path, "--storage.path=%s" % (workdir / "alertmanager-data"),
             "--web.listen-address=127.0.0.1:%d" % self.port, "--cluster.listen-address="],
            stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


def short_rules(path: Path, for_s: int, window_s: int | None = None) -> Path:
    """The shipped rules with every `for:` at for_s seconds and, with window_s, every range of an
    expression (`[3m]`) at window_s seconds: the tests' only changes to them."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "%ds" % for_s
            if window_s:
                rule["expr"] = re.sub(r"\[\d+[smh]\]", "[%ds]" % window_s, rule["expr"])
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def short_throttle(path: Path) -> Path:
    """The shipped rulebook with its throttle at 5 seconds (shipped: 10 minutes)."""
    rulebook = yaml.safe_load(RULEBOOK.read_text())
    for rule in rulebook[0]["rules"]:
        rule["throttle"]["once_within"] = "5 seconds"
    path.write_text(yaml.safe_dump(rulebook, sort_keys=False))
    return path


class Prometheus:
    """Debian's Prometheus on a free local port: `scrape_configs`, the rules file, alerts sent to
    Alertmanager's port; scrapes and evaluations every scrape_s seconds."""

    def __init__(self, workdir: Path, scrape_configs: list, rules: Path, alertmanager_port: int,
                 scrape_s: int = 1, scrape_timeout_s: float = 0.9):
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "%ds" % scrape_s, "evaluation_interval": "%ds" % scrape_s,
                       "scrape_timeout": "%dms" % (scrape_timeout_s * 1000)},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:%d" % alertmanager_port]}]}]},
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [shutil.which("prometheus"), "--config.file=%s" % (workdir / "prometheus.yml"),
             "--storage.tsdb.path=%s" % (workdir / "tsdb"), "--web.listen-address=127.0.0.1:%d" % self.port],
            stdout=self.log, stderr=subprocess.STDOUT)
        limit = stretched(60)
        deadline = time.monotonic() + limit
        while not self._ready():
            assert self.proc.poll() is None, "Prometheus ended: %s" % (workdir / "prometheus.log")
            if time.monotonic() > deadline:
                pytest.fail("Prometheus was not ready within %d s" % limit)
            time.sleep(0.3)

    def _ready(self) -> bool:
        try:
            return "Ready" in self.get("/-/ready")
        except OSError:
            return False

    def get(self, path: str) -> str:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=10) as response:
            return response.read().decode("utf-8")

    def alerts(self) -> list:
        return json.loads(self.get("/api/v1/alerts"))["data"]["alerts"]

    def query(self, expression: str) -> list:
        return json.loads(self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expression})))["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()
