"""The fleet's cap on heals and the breaker per server (docs/self_healing.md), through the real
action (action/heal_breaker.py) and the locked state file: at most N hosts healed within the
window, then every heal is held back until the close command; the percentage of the fleet
rounded down; concurrent heals counted exactly; on a host of several servers each unit its own
breaker; a state file of the first format still loads."""
from __future__ import annotations

import json
import multiprocessing
import time

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action import heal_breaker as action
from ansible_collections.cleanslate.gpu.plugins.module_utils._textfile import parse
from tests.unit.test_heal_breaker import args
from tests.unit.test_heal_guards import alertmanager_alert, rfc3339
from tests.unit.test_heal_alert import Run, tagged

UNITS = ["llama.service", "qwen.service"]


def heal(tmp_path, host, unit="", check_mode=False, **options):
    """One heal of `host` asked for by a fresh EngineDown alert, as heal.yml runs the action."""
    event = alertmanager_alert(rfc3339(time.time() + 1), unit)
    event["labels"]["host"] = tagged(host)
    options = dict({"host": host, "path": str(tmp_path / "state" / "breaker.json"), "metrics_dir": str(tmp_path),
                    "configured_units": [""], "secrets": []}, **options)
    return Run(options, check_mode).run(task_vars={"inventory_hostname": host, "ansible_eda": tagged({"event": event})})


def close(tmp_path, host="gpu0", **options):
    return Run(dict({"host": host, "path": str(tmp_path / "state" / "breaker.json"), "metrics_dir": str(tmp_path),
                     "state": "closed", "secrets": []}, **options)).run(task_vars={})


def state_of(tmp_path):
    return json.loads((tmp_path / "state" / "breaker.json").read_text())


def metrics_of(tmp_path):
    return parse((tmp_path / "cleanslate_gpu_heal.prom").read_text())


def test_past_the_cap_the_fleet_breaker_opens_and_holds_back_every_later_host_until_closed(tmp_path):
    cap = {"fleet_max_heals": 2, "fleet_window_s": 3600}
    assert [heal(tmp_path, "gpu%d" % n, **cap)["allowed"] for n in range(2)] == [True, True]
    # A host healed in the window adds no host: its own breaker limits it.
    assert heal(tmp_path, "gpu0", **cap)["allowed"]
    third = heal(tmp_path, "gpu2", **cap)
    assert not third["allowed"] and third["opened"] and third["fleet_open"] and third["changed"], third
    assert third["reason"] == (
        "gpu2: held back, the fleet's heal cap is reached, 2 hosts healed within 3600 s (gpu0, gpu1; at most 2): the fleet "
        "breaker is open and no host is healed until a human closes it (cleanslate.gpu.heal_breaker_close -e heal_close=fleet)")
    # Open: every later heal is refused, a host already healed included; a check-mode heal too.
    for host in ("gpu3", "gpu0", "gpu3"):
        later = heal(tmp_path, host, **cap)
        assert not later["allowed"] and not later["opened"] and later["open"], later
    assert not heal(tmp_path, "gpu4", check_mode=True, **cap)["allowed"]
    fleet = state_of(tmp_path)["fleet"]
    assert fleet["open"] and [(held["host"], held["unit"], held["alertname"]) for held in fleet["held_back"]] == [
        ("gpu2", "", "CleanslateGpuEngineDown"), ("gpu0", "", "CleanslateGpuEngineDown"),
        ("gpu3", "", "CleanslateGpuEngineDown")]  # one line per host, the newest last
    assert all(isinstance(held["at"], float) for held in fleet["held_back"])
    # A refused heal is counted by no host's breaker.
    assert [len(entry["heals"]) for host, entry in sorted(state_of(tmp_path)["hosts"].items())] == [2, 1, 0, 0]
    samples = metrics_of(tmp_path)
    assert [s["value"] for s in samples["cleanslate_gpu_heal_fleet_breaker_open"]] == [1]
    assert [s["value"] for s in samples["cleanslate_gpu_heal_fleet_recent_heals"]] == [2]
    assert [s["value"] for s in samples["cleanslate_gpu_heal_fleet_held_back"]] == [3]
    # The host's close command leaves the fleet's breaker open; the fleet's closes it and forgets.
    assert not close(tmp_path)["was_open"] and state_of(tmp_path)["fleet"]["open"]
    closed = close(tmp_path, fleet=True)
    assert closed["changed"] and closed["was_open"], closed
    fleet = state_of(tmp_path)["fleet"]
    assert not fleet["open"] and fleet["held_back"] == [] and fleet["heals"] == []
    assert close(tmp_path, fleet=True)["changed"] is False
    assert [s["value"] for s in metrics_of(tmp_path)["cleanslate_gpu_heal_fleet_held_back"]] == [0]
    assert [heal(tmp_path, host, **cap)["allowed"] for host in ("gpu2", "gpu3", "gpu4")] == [True, True, False]


@pytest.mark.parametrize("options, hosts", [
    ({"fleet_max_percent": 30, "fleet_size": 10}, 3),
    ({"fleet_max_percent": 29, "fleet_size": 100}, 29),  # 0.29 * 100 is 28.999999999999996
    ({"fleet_max_percent": 25, "fleet_size": 10}, 2),  # 2.5 hosts: 2, never 3
    ({"fleet_max_percent": "33.4", "fleet_size": "3"}, 1),
    ({"fleet_max_percent": 10, "fleet_size": 4}, 1),  # at least one
    ({"fleet_max_percent": 50, "fleet_size": 10, "fleet_max_heals": 3}, 3),  # the smaller wins
    ({"fleet_max_percent": 20, "fleet_size": 10, "fleet_max_heals": "3"}, 2),
    ({"fleet_max_heals": 4, "fleet_size": None}, 4),
])
def test_the_cap_is_the_smaller_of_n_and_p_percent_rounded_down(options, hosts):
    assert action.fleet_cap(args(**options)) == {"max_hosts": hosts, "window_s": 3600}
    assert action.fleet_cap(args()) is None


@pytest.mark.parametrize("options, variable", [
    ({"fleet_max_heals": 0}, "heal_fleet_max_heals"), ({"fleet_max_heals": "two"}, "heal_fleet_max_heals"),
    ({"fleet_max_percent": 101, "fleet_size": 4}, "heal_fleet_max_percent"),
    ({"fleet_max_percent": "nan", "fleet_size": 4}, "heal_fleet_max_percent"),
    ({"fleet_max_percent": 50}, "heal_fleet_size"), ({"fleet_max_percent": 50, "fleet_size": 0}, "heal_fleet_size"),
    ({"fleet_max_heals": 2, "fleet_window_s": -1}, "heal_fleet_window_s"),
])
def test_a_bad_cap_is_one_sentence_naming_the_variable(options, variable):
    with pytest.raises(AnsibleActionFail) as caught:
        action.check_args(args(**options))
    message = str(caught.value.message)
    assert "(the playbooks' %s)" % variable in message and "\n" not in message and "Traceback" not in message


def _heal_at_once(path, host, barrier, results):
    barrier.wait(60)
    event = alertmanager_alert(rfc3339(time.time() + 1))
    event["labels"]["host"] = host
    result = Run({"host": host, "path": path, "metrics_dir": "", "configured_units": [""], "secrets": [],
                  "fleet_max_heals": 5}).run(task_vars={"ansible_eda": {"event": event}})
    results.put((host, result["allowed"]))


def test_concurrent_heals_of_forty_hosts_let_exactly_n_through(tmp_path):
    """40 processes (the rulebook runs heals of different hosts at once, each its own
    ansible-playbook), released together, each asking the real action to heal its host under a
    cap of 5: exactly 5 pass, 35 are held back, the state file is whole and names them."""
    path = str(tmp_path / "state" / "breaker.json")
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(40), context.Queue()
    workers = [context.Process(target=_heal_at_once, args=(path, "gpu%02d" % n, barrier, results)) for n in range(40)]
    for worker in workers:
        worker.start()
    decisions = dict(results.get(timeout=120) for dummy in workers)
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    allowed = sorted(host for host, passed in decisions.items() if passed)
    assert len(decisions) == 40 and len(allowed) == 5, decisions
    fleet = json.loads(open(path, encoding="utf-8").read())["fleet"]
    assert fleet["open"] and sorted(heal["host"] for heal in fleet["heals"]) == allowed
    assert sorted(held["host"] for held in fleet["held_back"]) == sorted(set(decisions) - set(allowed))


def test_on_a_host_of_several_servers_each_unit_has_its_own_breaker(tmp_path):
    several = {"configured_units": UNITS, "max_heals": 3}
    assert [heal(tmp_path, "gpu1", UNITS[0], **several)["allowed"] for dummy in range(3)] == [True] * 3
    fourth = heal(tmp_path, "gpu1", UNITS[0], **several)
    assert fourth["opened"] and fourth["reason"].startswith("gpu1 (llama.service) was healed 3 times"), fourth
    # Three crashes of llama.service leave qwen.service's breaker, and the host's, closed.
    other = heal(tmp_path, "gpu1", UNITS[1], **several)
    assert other["allowed"] and other["unit"] == UNITS[1] and other["heals"] == 1, other
    assert heal(tmp_path, "gpu1", **several)["allowed"]  # no unit: the host's own breaker
    entry = state_of(tmp_path)["hosts"]["gpu1"]
    assert len(entry["heals"]) == 1 and not entry["open"]
    assert {unit: (len(b["heals"]), b["open"]) for unit, b in entry["units"].items()} == {UNITS[0]: (3, True), UNITS[1]: (1, False)}
    opened = {tuple(sorted(s["labels"].items())): s["value"] for s in metrics_of(tmp_path)["cleanslate_gpu_heal_breaker_open"]}
    assert opened == {(("host", "gpu1"),): 0, (("host", "gpu1"), ("unit", UNITS[0])): 1,
                      (("host", "gpu1"), ("unit", UNITS[1])): 0}
    # Closing one unit closes it alone; the host's close closes every breaker of the host.
    qwen = close(tmp_path, "gpu1", unit=UNITS[1])
    assert qwen["changed"] and not qwen["was_open"], qwen
    assert state_of(tmp_path)["hosts"]["gpu1"]["units"][UNITS[0]]["open"]
    assert close(tmp_path, "gpu1", unit=UNITS[0])["was_open"]
    assert heal(tmp_path, "gpu1", UNITS[0], **several)["allowed"]


def test_an_open_host_breaker_refuses_every_unit_of_the_host(tmp_path):
    """hold_open (a GPU that needs a reboot, the Xid path) opens the whole host's breaker."""
    several = {"configured_units": UNITS}
    assert heal(tmp_path, "gpu1", UNITS[0], **several)["allowed"]
    Run({"host": "gpu1", "path": str(tmp_path / "state" / "breaker.json"), "metrics_dir": "", "state": "open",
         "cause": "needs_reboot", "secrets": []}).run(task_vars={})
    for unit in UNITS + [""]:
        refused = heal(tmp_path, "gpu1", unit, **several)
        assert not refused["allowed"] and "needs_reboot" in refused["reason"], (unit, refused)
    assert close(tmp_path, "gpu1")["was_open"] and heal(tmp_path, "gpu1", UNITS[1], **several)["allowed"]


def test_a_state_file_of_the_first_format_loads_and_gains_the_fleet(tmp_path):
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "breaker.json").write_text(json.dumps({"hosts": {"gpu1": {
        "heals": [{"at": time.time() - 10, "alertname": "CleanslateGpuEngineDown"}], "open": False, "opened_at": None,
        "reason": "", "last_request_at": None, "refused": 0, "cause": ""}}}))
    first = heal(tmp_path, "gpu1", fleet_max_heals=1)
    assert first["allowed"] and first["heals"] == 2, first
    assert not heal(tmp_path, "gpu2", fleet_max_heals=1)["allowed"]
    assert [held["host"] for held in state_of(tmp_path)["fleet"]["held_back"]] == ["gpu2"]
