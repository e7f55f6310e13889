"""The shipped rulebook (extensions/eda/rulebooks/heal.yml) run by the real ansible-rulebook, fed
Alertmanager's webhook payloads directly: what starts a heal and what never does, without a
fleet. The hosts of the inventory point at a closed port on this machine, so a heal that starts
reaches the breaker on the controller and then finds its host unreachable: nothing can be touched.
The whole loop with the real Prometheus, Alertmanager and fleet: test_heal_fleet.py."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.heal import REPO, Rulebook, alert, hostile_alert, hostile_text, payload, shown, stretched

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
CANARY = "sk-canary-heal-7Qx2v9"


def wait_until(what, probe, timeout=120):
    timeout = stretched(timeout)  # the same rule as the loop's (heal.py): these held at load 8 on 2 cores
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.3)
    pytest.fail("%s: not within %d s" % (what, timeout))


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("heal")
    inventory = workdir / "inventory"
    inventory.mkdir()
    (workdir / "metrics").mkdir()
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        # node3 to node5 carry a canary key (for the hostile alerts); node8 is in heal_hosts only.
        "hosts": {"node1": None, "node2": None, "node3": {"inference_service_secrets": {"hf_token": CANARY}},
                  "node4": {"inference_service_secrets": {"api_key": CANARY}},
                  "node5": {"inference_service_instances": [{"unit": "vllm-a.service", "secrets": {"api_key": CANARY}}]},
                  "node6": None, "node7": None, "node10": None},
        "vars": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_python_interpreter": "/usr/bin/python3",
                 "heal_state_path": str(workdir / "state" / "breaker.json"),
                 "heal_metrics_dir": str(workdir / "metrics"), "fleet_report_path": str(workdir / "reports")}}}}}))
    rulebook = Rulebook(workdir, inventory, hosts=["node1", "node2", "node4", "node5", "node8", "node6", "node7", "node10"])
    rulebook.workdir, rulebook.inventory = workdir, inventory
    try:
        yield rulebook
    finally:
        rulebook.stop()


def state(loop) -> dict:
    path = loop.workdir / "state" / "breaker.json"
    return json.loads(path.read_text())["hosts"] if path.exists() else {}


def test_bad_payloads_and_hosts_start_nothing_and_the_rulebook_lives_on(loop):
    posts = [
        payload(alert("node9")),  # not in the inventory
        payload(alert("node3")),  # in the inventory, not in heal_hosts
        payload(alert("node1", status="resolved")),  # resolved: nothing to do
        payload(alert("node1", name="CleanslateGpuAcceptanceLow")),  # not a down alert, not labelled for healing
        payload(alert("node1", cleanslate_heal="false", name="SomeoneElses")),
        payload(dict(alert("node1"), labels={"alertname": "CleanslateGpuEngineDown"})),  # no host label
        payload(dict(alert("node1"), labels={"alertname": "CleanslateGpuEngineDown", "host": ["node1"]})),
        payload(dict(alert("node1"), status="FIRING\n")),
        b"not json", b"\xff\xfe{", b"", b"[1, 2]", b"null", b'{"alerts": "node1"}', b'{"alerts": {"host": "node1"}}',
        b'{"alerts": [1, null, "s", {"labels": 5}, {"status": "firing", "labels": null}]}',
        b'{"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": "CleanslateGpuEngineDown", "host": "node1\\n"}}]}',
        b'{"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": "CleanslateGpuEngineDown", "host": "node1 "}}]}',
        json.dumps(payload(*[alert("node%d" % n) for n in range(100, 400)])).encode(),
    ]
    for body in posts:
        loop.post(body)
    # The right alert without the token, and with a wrong one: refused at the door.
    assert loop.post(payload(alert("node1")), token=None) == 401
    assert loop.post(payload(alert("node1")), token="guess") == 401
    assert loop.alive(), loop.text()[-3000:]
    # Events are handled in order: once a good alert (node2's) has run, every earlier one was seen.
    assert loop.post(payload(alert("node2"))) == 200
    wait_until("node2's heal", lambda: loop.finished() >= 1)
    time.sleep(2)
    assert loop.alive(), loop.text()[-3000:]
    assert loop.runs() == 1, loop.text()[-5000:]
    assert list(state(loop)) == ["node2"]


def test_a_flood_of_duplicates_starts_one_run_that_names_its_alert(loop):
    before = loop.runs()
    first = alert("node1", fingerprint="f100000000000001")
    # Alertmanager's repeats, both down alerts of one crash, and a replay in one batch.
    for dummy in range(25):
        loop.post(payload(first, alert("node1", name="CleanslateGpuServerDown", unit="inference-server.service")))
        loop.post(payload(first, first))
    wait_until("node1's heal", lambda: loop.finished() >= before + 1)
    time.sleep(3)
    assert loop.runs() == before + 1, loop.text()[-5000:]
    (heal,) = state(loop)["node1"]["heals"]
    assert heal["alertname"] == "CleanslateGpuEngineDown" and heal["fingerprint"] == "f100000000000001"
    reports = sorted((loop.workdir / "reports").glob("reset_and_serve-*.json"))
    triggers = [json.loads(path.read_text()).get("trigger") for path in reports]
    assert {"by": "cleanslate.gpu.heal", "alertname": "CleanslateGpuEngineDown", "fingerprint": "f100000000000001",
            "starts_at": "2026-12-02T01:00:00Z", "heals_in_window": 1} in triggers, triggers
    metrics = (loop.workdir / "metrics" / "cleanslate_gpu_heal.prom").read_text()
    assert 'cleanslate_gpu_heal_last_timestamp_seconds{alertname="CleanslateGpuEngineDown",fingerprint="f100000000000001",host="node1"}' \
        in metrics


def play_heal(loop, *extra):
    return subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/heal.yml", "-i", str(loop.inventory), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def test_heal_by_hand_without_an_alert_touches_no_host(loop):
    before = state(loop)
    proc = play_heal(loop)
    assert proc.returncode != 0
    for host in ("node1", "node2", "node3"):
        assert "%s: not healed, the alert names no host" % host in proc.stdout, proc.stdout[-3000:]
    assert "PLAY [Reset and serve]" not in proc.stdout and state(loop) == before


def test_an_alert_for_another_host_or_unit_heals_nothing(loop):
    before = state(loop)
    event = {"event": alert("node2", name="CleanslateGpuServerDown", unit="sshd.service")}
    proc = play_heal(loop, "-l", "node2", "-e", json.dumps({"ansible_eda": event}))
    assert proc.returncode != 0
    assert ("node2: the alert CleanslateGpuServerDown is about sshd.service, but the host serves "
            "inference-server.service (inference_service_unit, inference_service_instances): nothing is healed") in proc.stdout, \
        proc.stdout[-3000:]
    # A host with several servers is served with each of their units (a server without a unit of
    # its own with inference_service_unit); an alert about another unit is still refused.
    servers = {"inference_service_unit": "vllm-c.service", "inference_service_instances": [
        {"unit": "vllm-a.service", "port": 8001}, {"unit": "vllm-b.service", "port": 8002}, {"port": 8003}]}
    proc = play_heal(loop, "-l", "node2", "-e", json.dumps(dict(servers, ansible_eda=event)))
    assert proc.returncode != 0
    assert ("is about sshd.service, but the host serves vllm-a.service, vllm-b.service, vllm-c.service "
            "(inference_service_unit, inference_service_instances): nothing is healed") in proc.stdout, proc.stdout[-3000:]
    proc = play_heal(loop, "-l", "node1", "-e", json.dumps({"ansible_eda": event}))
    assert "node1: not healed, the alert names host 'node2'" in proc.stdout, proc.stdout[-3000:]
    assert state(loop) == before


@pytest.mark.parametrize("name, value", [("heal_max_heals", "nan"), ("heal_window_s", "-1"), ("heal_quiet_s", "inf")])
def test_bad_breaker_settings_refuse_the_heal_with_one_sentence(loop, name, value):
    before = state(loop)
    event = {"event": alert("node2")}
    proc = play_heal(loop, "-l", "node2", "-e", json.dumps({"ansible_eda": event, name: value}))
    assert proc.returncode != 0
    option = name[len("heal_"):]
    assert "%s must be" % option in proc.stdout and "got %r" % value in proc.stdout, proc.stdout[-3000:]
    assert "PLAY [Reset and serve]" not in proc.stdout and state(loop) == before


def test_the_close_command_forgets_the_hosts_heals_and_touches_nothing_else(loop):
    assert state(loop)["node1"]["heals"]  # the flood's heal
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/heal_breaker_close.yml", "-i", str(loop.inventory), "-l", "node1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "changed=1" in proc.stdout, proc.stdout[-3000:]
    after = state(loop)
    assert after["node1"]["heals"] == [] and not after["node1"]["open"]
    assert after["node2"]["heals"], after  # another host's count is kept
    metrics = (loop.workdir / "metrics" / "cleanslate_gpu_heal.prom").read_text()
    assert 'cleanslate_gpu_heal_recent_heals{host="node1"} 0' in metrics, metrics


def everything_written(loop) -> str:
    files = [path for folder in ("state", "metrics", "reports") for path in (loop.workdir / folder).rglob("*") if path.is_file()]
    return "".join(path.read_text(errors="replace") for path in files) + loop.text()


def test_a_hostile_alert_runs_no_template_and_copies_no_secret(loop):
    """Issue 35, 1 and 2: template code in every field of alerts the rule lets through, posted to
    the rulebook, and (at the same time, to save the wall time) the same trust path without it:
    extra vars from a file, `ansible-playbook heal.yml -e @event.json`, whose alert also carries the
    key itself. On main the lookups ran, as the controller's user, and the canary key reached the
    breaker's state, the metrics, the reports and the rulebook's output."""
    ran, before = loop.workdir / "ran-by-an-alert", loop.finished()
    event = hostile_alert("node3", ran)
    event["labels"]["alertname"] = "Custom " + CANARY
    (loop.workdir / "event.json").write_text(json.dumps({"ansible_eda": {"event": event}}))
    by_hand = subprocess.Popen(  # pylint: disable=consider-using-with
        [ANSIBLE_PLAYBOOK, "playbooks/heal.yml", "-i", str(loop.inventory), "-l", "node3", "-v",
         "-e", "@%s" % (loop.workdir / "event.json")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    loop.post(payload(hostile_alert("node4", ran),
                      # Refused (a unit node5 is not served with), its sentence showing the unit's text.
                      hostile_alert("node5", ran, alertname="CleanslateGpuEngineDown", unit=hostile_text(ran)),
                      # In heal_hosts, not in the inventory: the run matches no host and ends.
                      alert("node8")))
    output = by_hand.communicate(timeout=300)[0]
    wait_until("the three runs", lambda: loop.finished() >= before + 3)
    assert not ran.exists()
    assert CANARY not in everything_written(loop) + output, output[-3000:]
    # The literal text, by the rule, wherever it is kept.
    (heal,) = state(loop)["node4"]["heals"]
    assert heal["alertname"] == shown(ran) and heal.get("starts_at") == shown(ran) and heal["fingerprint"] == shown(ran, 2)
    reports = [json.loads(path.read_text()) for path in (loop.workdir / "reports").glob("reset_and_serve-*.json")]
    (trigger,) = [report["trigger"] for report in reports if report.get("trigger", {}).get("alertname") == shown(ran)]
    assert trigger["fingerprint"] == heal["fingerprint"], trigger
    assert "lookup('pipe', 'touch %s')" % ran in (loop.workdir / "metrics" / "cleanslate_gpu_heal.prom").read_text()
    assert "node5: the alert CleanslateGpuEngineDown is about {{ lookup('pipe', 'touch %s') }}" % ran in loop.text()
    assert "node5" not in state(loop)
    assert "Could not match supplied host pattern, ignoring: node8" in loop.text() and "node8" not in state(loop)
    assert loop.alive()
    # The event file's run: the key the alert carried is masked.
    (heal,) = state(loop)["node3"]["heals"]
    assert heal["alertname"] == "Custom ********" and heal["fingerprint"] == shown(ran, 2)
    assert "Triggered by cleanslate.gpu.heal: alertname Custom ********, fingerprint {{ lookup('pipe', 'touch %s') }}" % ran \
        in output, output[-3000:]


def test_a_hung_server_a_failing_probe_and_a_crash_loop_each_start_a_heal(loop):
    """Issue 39, 1 and 3: the alerts beside the down ones that heal acts on, each for a host of its
    own (the throttle lets one heal per host through). Each run reaches the breaker, which keeps the
    alert's name; reset_and_serve's assessment then decides what is reset (a busy or loading server
    never is: test_inference_service_assessment.py)."""
    before = loop.finished()
    names = {"node6": "CleanslateGpuServerHung", "node7": "CleanslateGpuProbeFailing", "node10": "CleanslateGpuCrashLoop"}
    assert loop.post(payload(*[alert(host, name=name, unit="inference-server.service") for host, name in names.items()])) == 200
    wait_until("the three heals", lambda: loop.finished() >= before + 3)
    assert {host: [heal["alertname"] for heal in state(loop).get(host, {}).get("heals", [])] for host in names} == \
        {host: [name] for host, name in names.items()}, loop.text()[-5000:]
