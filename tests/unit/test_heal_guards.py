"""The heal's guards at their edges, through the real action (action/heal_breaker.py) where the alert
is read as Alertmanager sends it: a repeat of an alert a heal answered heals nothing, a host served
under the role's default unit is healed for that unit and no other, and a heal exactly one window old
no longer counts; a check-mode heal counts nothing, and the options' bounds are allowed."""
from __future__ import annotations

import json
import time

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action import heal_breaker as action
from ansible_collections.cleanslate.gpu.plugins.action.heal_breaker import LONGEST_S
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _heal_breaker as breaker
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import load_spec
from tests.unit.test_heal_alert import run, tagged
from tests.unit.test_heal_breaker import args, heal

DEFAULT_UNIT = load_spec("inference_service")["inference_service_unit"]["default"]


def alertmanager_alert(starts_at, unit=""):
    """One alert as Alertmanager's webhook sends it, with the rulebook's meta."""
    labels = {"alertname": "CleanslateGpuEngineDown", "host": "gpu1", "severity": "critical"}
    if unit:
        labels["unit"] = unit
    return {"status": "firing", "labels": {key: tagged(value) for key, value in labels.items()},
            "annotations": {"summary": "engine down"}, "startsAt": tagged(starts_at),
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus:9090/graph",
            "fingerprint": tagged("c0ffee12"), "meta": {"received_at": tagged("2026-12-02T01:00:05Z")}}


def rfc3339(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + ".123456789Z"


def state_of(tmp_path):
    return json.loads((tmp_path / "state" / "breaker.json").read_text())["hosts"]["gpu1"]


def test_a_repeat_of_an_alert_a_heal_answered_heals_nothing_and_counts_nothing(tmp_path):
    began = rfc3339(time.time() - 120)  # the crash, two minutes ago
    first = run(tmp_path, alertmanager_alert(began))
    assert first["allowed"] and first["changed"] and first["trigger"]["starts_at"] == began, first
    for check_mode in (True, False):
        # Alertmanager's repeat_interval: the same alert, the same startsAt, after the heal began.
        repeat = run(tmp_path, alertmanager_alert(began), check_mode=check_mode)
        assert not repeat["allowed"] and repeat["answered"] and not repeat["changed"], repeat
        assert "not healed again, the alert CleanslateGpuEngineDown began before the heal" in repeat["reason"]
    assert len(state_of(tmp_path)["heals"]) == 1
    # A new crash, after the heal started: healed.
    later = run(tmp_path, alertmanager_alert(rfc3339(time.time() + 1)))
    assert later["allowed"] and later["heals"] == 2, later


@pytest.mark.parametrize("configured", [[""], None, [DEFAULT_UNIT]])
def test_a_host_served_under_the_default_unit_is_healed_for_that_unit_alone(tmp_path, configured):
    began = rfc3339(time.time() - 60)
    for stranger in ("billing.service", "vllm.service", DEFAULT_UNIT + ".d", DEFAULT_UNIT.upper()):
        refused = run(tmp_path, alertmanager_alert(began, unit=stranger), configured_units=configured)
        assert not refused["allowed"], (stranger, refused)
        assert "is about %s, but the host serves %s (" % (stranger, DEFAULT_UNIT) in refused["reason"], refused
    assert not (tmp_path / "state").exists()
    healed = run(tmp_path, alertmanager_alert(began, unit=DEFAULT_UNIT), configured_units=configured)
    assert healed["allowed"] and healed["trigger"]["unit"] == DEFAULT_UNIT, healed


def test_a_host_with_its_own_unit_and_a_default_one_is_healed_for_either_alone(tmp_path):
    began = rfc3339(time.time() - 60)
    served = ["vllm-a.service", ""]
    refused = run(tmp_path, alertmanager_alert(began, unit="billing.service"), configured_units=served)
    assert "but the host serves vllm-a.service, %s (" % DEFAULT_UNIT in refused["reason"], refused
    assert run(tmp_path, alertmanager_alert(began, unit=DEFAULT_UNIT), configured_units=served)["allowed"]


def test_a_heal_exactly_one_window_old_no_longer_counts():
    state = {"hosts": {}}
    for when in (0, 100, 200):
        assert heal(state, "gpu1", when)["allowed"]
    exactly = heal(state, "gpu1", 3600)  # the heal at 0 left the window at 3600
    assert exactly["allowed"] and exactly["heals"] == 3, exactly
    samples = breaker.metric_families(state, 3700, 3600)[1]["samples"]
    assert samples == [{"labels": {"host": "gpu1"}, "value": 2}]  # 100 left at 3700 too; 200 and 3600 remain


def test_a_heal_in_check_mode_is_decided_but_counts_nothing(tmp_path):
    began = rfc3339(time.time() - 60)
    for dummy in range(5):
        checked = run(tmp_path, alertmanager_alert(began), check_mode=True)
        assert checked["allowed"] and checked["changed"] and checked["heals"] == 1, checked
    assert not (tmp_path / "state").exists()
    assert run(tmp_path, alertmanager_alert(began))["heals"] == 1


def test_the_options_bounds_are_inclusive():
    limits = action.check_args(args(max_heals="1000", window_s=1, quiet_s=LONGEST_S))
    assert limits == {"max_heals": 1000, "window_s": 1.0, "quiet_s": float(LONGEST_S), "fleet": None}
    for name, value in (("max_heals", 1001), ("window_s", LONGEST_S + 1), ("quiet_s", 0.999)):
        with pytest.raises(AnsibleActionFail, match="^%s must be" % name):
            action.check_args(args(**{name: value}))


@pytest.mark.parametrize("name, value", [("max_heals", "9" * 100000), ("window_s", "1\n{{ }}"),
                                         ("quiet_s", "\u00a0" * 5000), ("path", "relative\n" * 5000),
                                         ("metrics_dir", "x" * 100000)])
def test_a_bad_option_is_one_short_line_naming_the_playbooks_variable(name, value):
    """heal.yml's first task: a huge or multi-line value of heal_window_s... is shown cut, on one line,
    with the variable the playbook read it from."""
    with pytest.raises(AnsibleActionFail) as caught:
        action.check_args(args(**{name: value}))
    sentence = str(caught.value.message)
    assert sentence.startswith(name + " ") and "(the playbooks' %s)" % action.VARIABLE_OF[name] in sentence
    assert "\n" not in sentence and len(sentence) < 300 and sentence.isprintable(), sentence
