"""The fleet's heal cap through the real loop's front (docs/self_healing.md, "The fleet's cap"):
a storm of firing alerts for every host of a six-host inventory sent to Debian's Alertmanager,
routed to the shipped rulebook run by the real ansible-rulebook, with heal_fleet_max_heals 2.
The hosts point at a closed port on this machine (as test_heal_rulebook.py's), so a heal that
passes the breakers reaches nothing. Exactly two heals pass, the fleet breaker opens, the four
others are held back (named in the state and the rulebook's log), the metric says open, and the
close playbook closes it."""
from __future__ import annotations

import datetime
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from tests.integration.heal import REPO, Alertmanager, Rulebook, stretched
from tests.integration.test_heal_rulebook import wait_until

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
HOSTS = ["node%d" % n for n in range(1, 7)]
CAP = 2


def send_to_alertmanager(port, hosts):
    """A storm: every host's EngineDown firing at once, as Prometheus sends it (API v2)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = json.dumps([{"labels": {"alertname": "CleanslateGpuEngineDown", "host": host, "severity": "critical"},
                        "annotations": {"summary": "down"}, "startsAt": now} for host in hosts]).encode()
    request = urllib.request.Request("http://127.0.0.1:%d/api/v2/alerts" % port, data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def listening(port) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_a_storm_of_alerts_heals_at_most_n_hosts_and_opens_the_fleet_breaker(tmp_path):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (tmp_path / "metrics").mkdir()
    state_path = tmp_path / "state" / "breaker.json"
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "hosts": {host: None for host in HOSTS},
        "vars": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_python_interpreter": "/usr/bin/python3",
                 "heal_state_path": str(state_path), "heal_metrics_dir": str(tmp_path / "metrics"),
                 "fleet_report_path": str(tmp_path / "reports"), "heal_fleet_max_heals": CAP}}}}}))
    rulebook = Rulebook(tmp_path, inventory, HOSTS)
    alertmanager = Alertmanager(tmp_path, rulebook.port)
    try:
        wait_until("Alertmanager listening", lambda: listening(alertmanager.port), 60)
        send_to_alertmanager(alertmanager.port, HOSTS)
        wait_until("a heal run for every host", lambda: rulebook.finished() >= len(HOSTS), 180)
        time.sleep(1)
        assert rulebook.runs() == len(HOSTS), rulebook.text()[-5000:]
    finally:
        alertmanager.stop()
        rulebook.stop()
    fleet = json.loads(state_path.read_text())["fleet"]
    healed = sorted(heal["host"] for heal in fleet["heals"])
    held = sorted(item["host"] for item in fleet["held_back"])
    assert fleet["open"] and len(healed) == CAP and held == sorted(set(HOSTS) - set(healed)), fleet
    assert {item["alertname"] for item in fleet["held_back"]} == {"CleanslateGpuEngineDown"}
    log = rulebook.text()
    # One run opened it (ansible-rulebook echoes a run's output more than once: the distinct lines).
    opened = set(re.findall(r"cleanslate\.gpu heal fleet breaker opened: (\S+): held back", log))
    assert len(opened) == 1 and opened <= set(held), log[-5000:]
    for host in held:
        assert "%s: held back, the fleet's heal cap is reached, %d hosts healed within 3600 s (%s; at most %d)" % (
            host, CAP, ", ".join(healed), CAP) in log, host
    metrics = (tmp_path / "metrics" / "cleanslate_gpu_heal.prom").read_text()
    assert "cleanslate_gpu_heal_fleet_breaker_open 1\n" in metrics and "cleanslate_gpu_heal_fleet_held_back 4\n" in metrics
    closing = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/heal_breaker_close.yml", "-i", str(inventory),
                              "-e", "heal_close=fleet"], cwd=REPO, capture_output=True, text=True,
                             timeout=stretched(120), check=False)
    assert closing.returncode == 0 and "changed=1" in closing.stdout, closing.stdout[-3000:]
    fleet = json.loads(state_path.read_text())["fleet"]
    assert not fleet["open"] and fleet["held_back"] == [] and fleet["heals"] == []
    assert "cleanslate_gpu_heal_fleet_breaker_open 0\n" in (tmp_path / "metrics" / "cleanslate_gpu_heal.prom").read_text()
