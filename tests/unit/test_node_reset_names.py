"""Which node_reset_* names are the user's: every variable the role or the playbooks name
node_reset_* is declared in meta/argument_specs.yml or is node_reset_result; every name the
role keeps for itself (registers, facts, task and role vars) starts with __node_reset_."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "node_reset"
PUBLIC = set(yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"])
PUBLIC.add("node_reset_result")
# A node_reset_* name used in a template or condition, not a filter (cleanslate.gpu.node_reset_result)
# nor part of an internal name (__node_reset_x) or an attribute.
USED = re.compile(r"(?<![\w.])node_reset_[a-z0-9_]+")
FILES = sorted((ROLE / "tasks").glob("*.yml")) + [ROLE / "vars" / "main.yml"] + sorted(
    (REPO / "playbooks").glob("**/*.yml"))


def _tasks(node):
    """Every task and block in a task file, nested blocks included."""
    for item in node if isinstance(node, list) else []:
        if isinstance(item, dict):
            yield item
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
                yield from _tasks(item.get(key))


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            if key != "name":
                yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _defined_names():
    """(file, name) of every variable the role and the playbooks define."""
    for path in FILES:
        data = yaml.safe_load(path.read_text())
        if path.parent.name == "vars":
            yield from ((path.name, name) for name in data)
            continue
        for task in _tasks(data):
            if "register" in task:
                yield path.name, task["register"]
            yield from ((path.name, name) for name in task.get("vars") or {})
            yield from ((path.name, name) for name in task.get("ansible.builtin.set_fact") or {})


def test_the_roles_own_names_start_with_two_underscores():
    bad = [(path, name) for path, name in _defined_names()
           if name.startswith("node_reset_") and name not in PUBLIC
           # The playbooks hand the serve role its own internal names too (reset_and_serve.yml's step of each instance).
           or name.startswith("__")
           and not name.startswith(("__node_reset_", "__inference_service_", "__variable_checks_"))]
    assert bad == []
    # The check sees the role's internals at all.
    assert ("steps.yml", "__node_reset_steps") in set(_defined_names())


def test_every_node_reset_name_used_is_declared_or_the_result():
    used = {(path.name, name) for path in FILES for text in _strings(yaml.safe_load(path.read_text()))
            for name in USED.findall(text)}
    assert {(path, name) for path, name in used if name not in PUBLIC} == set()
    # The check sees the role's variables at all (the module steps' are read by name, vars/main.yml).
    assert ("steps.yml", "node_reset_unit") in used
