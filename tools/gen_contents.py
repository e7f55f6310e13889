"""Write what the collection ships and the ansible-core releases it accepts into the pages that name
them, from the collection itself, so that a page cannot list fewer modules than `ansible-doc -l`
(issue 38: the README named 11 of 13) or other releases than meta/runtime.yml (getting_started.md
said 2.19 where the collection accepts 2.21).

Blocks (tools/_generated.py):
  README.md                `plugins`       one line per module (plugins/modules), lookup (plugins/lookup)
                                           and role (roles/*/meta/argument_specs.yml), with its short
                                           description
  README.md, docs/getting_started.md
                           `ansible-core`  the releases of meta/runtime.yml's requires_ansible

Usage: python tools/gen_contents.py [--check] [--root DIR]
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools import _generated  # noqa: E402  pylint: disable=wrong-import-position

TOOL = _generated.tool_of(__file__)
README = Path("README.md")
GETTING_STARTED = Path("docs/getting_started.md")
# requires_ansible as the collection writes it: a lower bound and an exclusive upper one, X.Y.0 each.
REQUIRES = re.compile(r">=(\d+)\.(\d+)\.0,\s*<(\d+)\.(\d+)\.0\Z")


def plugin_documentation(path: Path) -> dict:
    """The DOCUMENTATION of a module or plugin file, read without importing it."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(target, "id", None) for target in node.targets] == ["DOCUMENTATION"]:
            return yaml.safe_load(node.value.value)
    raise SystemExit("%s has no DOCUMENTATION" % path)


def fqcn(root: Path, name: str) -> str:
    galaxy = yaml.safe_load(_generated.read(root, Path("galaxy.yml")))
    return "%s.%s.%s" % (galaxy["namespace"], galaxy["name"], name)


def plugin_lines(root: Path) -> list:
    """`- kind `fqcn`: short description` for every module, lookup and role, each kind by name."""
    lines = []
    for kind, directory in (("module", "plugins/modules"), ("lookup", "plugins/lookup")):
        for path in sorted((root / directory).glob("*.py")):
            if path.name.startswith("_") or path.name == "__init__.py":
                continue
            short = plugin_documentation(path)["short_description"]
            lines.append("- %s `%s`: %s" % (kind, fqcn(root, path.stem), short))
    for spec in sorted(root.glob("roles/*/meta/argument_specs.yml")):
        role = spec.parents[1].name
        short = yaml.safe_load(_generated.read(root, spec.relative_to(root)))["argument_specs"]["main"]["short_description"]
        lines.append("- role `%s`: %s" % (fqcn(root, role), short))
    return lines


def ansible_core_lines(root: Path) -> list:
    """The sentence naming the releases meta/runtime.yml accepts."""
    requires = str(yaml.safe_load(_generated.read(root, Path("meta/runtime.yml")))["requires_ansible"])
    bounds = REQUIRES.fullmatch(requires.strip())
    if not bounds:
        raise SystemExit("meta/runtime.yml: requires_ansible %r is not >=X.Y.0,<X.Z.0" % requires)
    low_major, low_minor, high_major, high_minor = (int(part) for part in bounds.groups())
    if high_major != low_major or high_minor <= low_minor:
        raise SystemExit("meta/runtime.yml: requires_ansible %r spans no release of one major version" % requires)
    return ["The controller needs ansible-core %d.%d to %d.%d (`meta/runtime.yml`: `%s`), on a Python that release"
            % (low_major, low_minor, high_major, high_minor - 1, requires), "supports."]


def generated(root: Path) -> dict:
    """{README.md, docs/getting_started.md: their texts with the blocks regenerated}."""
    core = ansible_core_lines(root)
    return {
        README: _generated.replace_labelled(_generated.read(root, README), TOOL, str(README),
                                            {"plugins": plugin_lines(root), "ansible-core": core}),
        GETTING_STARTED: _generated.replace_labelled(_generated.read(root, GETTING_STARTED), TOOL,
                                                     str(GETTING_STARTED), {"ansible-core": core}),
    }


def main(argv=None) -> int:
    return _generated.main(argv, generated, __doc__, TOOL)


if __name__ == "__main__":
    sys.exit(main())
