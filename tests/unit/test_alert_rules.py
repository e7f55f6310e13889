"""The shipped alert rules (files/prometheus/cleanslate_gpu.rules.yml) with Debian's promtool:
`check rules` passes, and `test rules` runs tests/prometheus/*.test.yml, where
every alert is evaluated both firing and not firing."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._metric_families import FAMILIES, PREFIX
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._heal_breaker import metric_families

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "files" / "prometheus" / "cleanslate_gpu.rules.yml"
TESTS = [REPO / "tests" / "prometheus" / name for name in ("cleanslate_gpu.rules.test.yml", "cleanslate_gpu.stale.test.yml")]


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        # A failure, not a skip: CI must not pass because the package was never installed.
        pytest.fail("promtool is missing: install Debian's prometheus package (tools/install_os_deps.sh)")
    return path


def alerts() -> list:
    return [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_shipped_rules():
    proc = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: %d rules found" % len(alerts()) in proc.stdout


def test_promtool_unit_tests_of_every_alert_pass():
    proc = subprocess.run([promtool(), "test", "rules", *[path.name for path in TESTS]], cwd=TESTS[0].parent,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    tested = {}
    for case in [case for path in TESTS for case in yaml.safe_load(path.read_text())["tests"]]:
        for check in case.get("alert_rule_test", []):
            tested.setdefault(check["alertname"], set()).add(bool(check.get("exp_alerts")))
    assert {name: tested.get(name) for name in alerts()} == {name: {True, False} for name in alerts()}


def test_the_rules_read_only_metrics_the_roles_and_the_heal_breaker_write():
    used = set(re.findall(r"\b%s[a-z_]+" % PREFIX, RULES.read_text()))
    used -= {PREFIX + "engine", PREFIX + "probe"}  # the engines' and the probe's job names, not metrics
    written = {PREFIX + name for name in FAMILIES} | {family["name"] for family in metric_families({"hosts": {}}, 0, 1)}
    assert used and used <= written, used - written


def test_the_documented_thresholds_are_the_files():
    """docs/observability.md's table of fixed thresholds: each value, as the table quotes it, is in
    the expression (or `for:`) of every alert the row names, so the docs never name a stale value."""
    docs = (REPO / "docs" / "observability.md").read_text()
    section = docs.split("### Change the thresholds", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| [^|]+ \| ((?:`CleanslateGpu\w+`(?:, )?)+) \| `([^`]+)` \|$", section, re.M)
    rules = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert len(rows) == 7, rows
    for names, written in rows:
        for name in re.findall(r"`(\w+)`", names):
            rule = rules[name]
            text = "for: %s" % rule.get("for", "0s") if written.startswith("for: ") else " ".join(rule["expr"].split())
            assert written in text, (name, written, text)


def test_the_heal_rulebook_never_heals_a_gpu_that_needs_a_reboot_or_service():
    """A heal resets the host's processes and reloads the model: on a GPU whose Xid a reset cannot
    clear it would only fail again. The rulebook heals on the alerts its condition names or on a
    cleanslate_heal label: neither may be an alert of the Xid metric."""
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    xid_alerts = {rule["alert"] for rule in rules if PREFIX + "reset_gpu_xid_action" in rule["expr"]}
    assert xid_alerts == {"CleanslateGpuNeedsReboot", "CleanslateGpuNeedsService"}
    rulebook = (REPO / "extensions" / "eda" / "rulebooks" / "heal.yml").read_text()
    (condition,) = [rule["condition"] for ruleset in yaml.safe_load(rulebook) for rule in ruleset["rules"]]
    healed = set(re.findall(r"\"(CleanslateGpu\w+)\"", condition))
    assert healed and not healed & xid_alerts, healed & xid_alerts
    assert all((rule.get("labels") or {}).get("cleanslate_heal") != "true" for rule in rules if rule["alert"] in xid_alerts)


def test_the_heal_rulebook_never_heals_on_a_breakers_alert():
    """A breaker's alert says healing stopped for a human: a rulebook that healed on it would undo
    the breaker (the fleet's cap first of all)."""
    rules = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    breakers = {"CleanslateGpuHealBreakerOpen", "CleanslateGpuHealFleetBreakerOpen"}
    assert breakers <= set(rules)
    rulebook = (REPO / "extensions" / "eda" / "rulebooks" / "heal.yml").read_text()
    (condition,) = [rule["condition"] for ruleset in yaml.safe_load(rulebook) for rule in ruleset["rules"]]
    assert not breakers & set(re.findall(r"\"(CleanslateGpu\w+)\"", condition))
    assert all((rules[name].get("labels") or {}).get("cleanslate_heal") != "true" for name in breakers)
