"""Every plugin's documentation is YAML of the shape ansible-doc reads, checked in the unit suite:
a ': ' in a sentence turns a description into a mapping, and only ansible-test sanity (minutes)
would say so otherwise."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = sorted(path for kind in ("modules", "action", "filter", "lookup") for path in (ROOT / "plugins" / kind).glob("*.py")
                 if not path.name.startswith("_"))
FILTER_DOCS = sorted((ROOT / "plugins" / "filter").glob("*.yml"))


def doc_strings(path: Path) -> dict:
    """{DOCUMENTATION|EXAMPLES|RETURN: text} assigned at the module's top level."""
    found = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    found[target.id] = node.value.value
    return found


def descriptions(options: dict, where: str):
    """(where, description) of every option, suboptions included."""
    for name, spec in (options or {}).items():
        yield "%s.%s" % (where, name), spec.get("description")
        yield from descriptions(spec.get("suboptions") or spec.get("options"), "%s.%s" % (where, name))


def check_documentation(text: str, where: str) -> None:
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict), "%s: DOCUMENTATION is no mapping" % where
    texts = [("description", doc.get("description"))] + list(descriptions(doc.get("options"), "options"))
    for place, description in texts:
        items = description if isinstance(description, list) else [description]
        assert all(isinstance(item, str) for item in items), "%s: %s holds a non-text (a ': ' made a mapping?): %r" % (
            where, place, description)


@pytest.mark.parametrize("path", PLUGINS, ids=lambda path: "%s/%s" % (path.parent.name, path.name))
def test_the_documentation_of_each_plugin_is_yaml_of_texts(path):
    docs = doc_strings(path)
    if path.parent.name in ("modules", "lookup"):
        assert "DOCUMENTATION" in docs, "%s has no DOCUMENTATION" % path.name
    if "DOCUMENTATION" in docs:
        check_documentation(docs["DOCUMENTATION"], path.name)
    for name in ("EXAMPLES", "RETURN"):
        if name in docs:
            yaml.safe_load(docs[name])


@pytest.mark.parametrize("path", FILTER_DOCS, ids=lambda path: path.name)
def test_the_documentation_of_each_filter_is_yaml_of_texts(path):
    docs = yaml.safe_load(path.read_text(encoding="utf-8"))
    check_documentation(yaml.safe_dump(docs["DOCUMENTATION"]), path.name)


def test_a_colon_in_a_sentence_is_found():
    broken = "module: x\nshort_description: y\ndescription:\n  - One thing: another\noptions: {}\n"
    with pytest.raises(AssertionError, match="non-text"):
        check_documentation(broken, "x.py")
