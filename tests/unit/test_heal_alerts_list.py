"""The alerts heal acts on are listed once, in the rulebook's condition
(extensions/eda/rulebooks/heal.yml): each must be an alert the shipped rules define (a misspelt name
would never heal), and docs/self_healing.md's table must name the same ones."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def healed_on() -> list:
    (rulebook,) = yaml.safe_load((REPO / "extensions" / "eda" / "rulebooks" / "heal.yml").read_text())
    (rule,) = rulebook["rules"]
    listed = re.search(r"event\.labels\.alertname in \[([^\]]*)\]", rule["condition"]).group(1)
    return re.findall(r'"(\w+)"', listed)


def test_the_rulebook_heals_on_alerts_the_rules_define_and_the_docs_name():
    rules = yaml.safe_load((REPO / "files" / "prometheus" / "cleanslate_gpu.rules.yml").read_text())
    defined = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    names = healed_on()
    assert names and set(names) <= defined, set(names) - defined
    docs = (REPO / "docs" / "self_healing.md").read_text()
    section = docs.split("## What heal acts on, and what decides", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `(CleanslateGpu\w+)` \|", section, re.M) == names
