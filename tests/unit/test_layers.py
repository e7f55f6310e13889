"""The plugins' layers import only downward (docs/design.md, "Layout"): module_utils <- plugin_utils <-
filter, action, lookup; modules only module_utils. Every import of every plugins/**/*.py counts, those
inside functions too, absolute or relative."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
PACKAGE = ("ansible_collections", "cleanslate", "gpu", "plugins")
# Which layers a file of each layer may import from: its own and the ones below it. A filter, an
# action and a lookup sit side by side: none imports another kind (a filter that imports an action
# loads the action's module in every worker that templates, and the two cannot move apart).
MAY_IMPORT = {
    "module_utils": {"module_utils"},
    "modules": {"module_utils"},
    "plugin_utils": {"module_utils", "plugin_utils"},
    "filter": {"module_utils", "plugin_utils", "filter"},
    "action": {"module_utils", "plugin_utils", "action"},
    "lookup": {"module_utils", "plugin_utils", "lookup"},
    "doc_fragments": set(),
}


def imported_layers(path: Path, root: Path = PLUGINS) -> list:
    """[(line, the layer it imports from, the dotted name)] of every import of the collection's
    plugins in one file under `root` (the plugins directory)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = PACKAGE + path.relative_to(root).with_suffix("").parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level] if node.level else ()
            module = list(base) + (node.module.split(".") if node.module else [])
            # `from ...plugins import module_utils` names the layer in the imported name.
            names = [module + [alias.name] for alias in node.names] if tuple(module) == PACKAGE else [module]
        else:
            continue
        for parts in names:
            if tuple(parts[:len(PACKAGE)]) == PACKAGE and len(parts) > len(PACKAGE):
                found.append((node.lineno, parts[len(PACKAGE)], ".".join(parts)))
    return found


def layer_violations(root: Path = PLUGINS) -> list:
    """One line per import from a layer its file may not import from: file, line, what."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        layer = path.relative_to(root).parts[0]
        allowed = MAY_IMPORT.get(layer)
        if allowed is None:
            bad.append("%s: a layer this test does not know (%s); add it to MAY_IMPORT" % (path.relative_to(root.parent), layer))
            continue
        bad += ["%s:%d imports %s (%s may import %s only)"
                % (path.relative_to(root.parent), line, name, layer, ", ".join(sorted(allowed)) or "nothing of the collection")
                for line, imported, name in imported_layers(path, root) if imported not in allowed]
    return bad


def test_every_plugin_imports_only_its_own_layer_and_those_below():
    bad = layer_violations()
    assert not bad, "\n".join(bad)


def _plugins(tmp_path, files: dict) -> Path:
    """A scratch plugins tree under a scratch repository (so paths read as the real ones)."""
    for name, text in files.items():
        path = tmp_path / "plugins" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "plugins"


@pytest.mark.parametrize("name, text", [
    # A filter that reads an action's helper, at the top and inside a function.
    ("filter/f.py", "from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import host_row\n"),
    ("filter/f.py", "def f():\n    from ansible_collections.cleanslate.gpu.plugins.action import fleet_report\n"),
    # An action that reads a filter, by a relative import and by a plain import.
    ("action/a.py", "from ..filter.inference_service import secret_masker\n"),
    ("action/a.py", "import ansible_collections.cleanslate.gpu.plugins.filter.inference_service\n"),
    ("lookup/l.py", "from ansible_collections.cleanslate.gpu.plugins import action\n"),
    # The shared layers reaching up.
    ("plugin_utils/_p.py", "from ansible_collections.cleanslate.gpu.plugins.filter import node_reset\n"),
    ("module_utils/_m.py", "from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec\n"),
    ("modules/m.py", "from ansible_collections.cleanslate.gpu.plugins.plugin_utils._ranges import RANGES\n"),
])
def test_an_import_up_or_across_is_named(tmp_path, name, text):
    bad = layer_violations(_plugins(tmp_path, {name: text}))
    assert len(bad) == 1 and bad[0].startswith("plugins/%s:" % name), bad


def test_imports_down_and_within_a_layer_pass(tmp_path):
    root = _plugins(tmp_path, {
        "filter/f.py": "from ansible_collections.cleanslate.gpu.plugins.filter.g import x\n"
                       "from ..plugin_utils import _p\nfrom ansible_collections.cleanslate.gpu.plugins import module_utils\n",
        "plugin_utils/_p.py": "from . import _q\nfrom ansible_collections.cleanslate.gpu.plugins.module_utils._m import y\n",
        "modules/m.py": "from ansible.module_utils.basic import AnsibleModule\n"
                        "from ansible_collections.cleanslate.gpu.plugins.module_utils import _m\n",
    })
    assert layer_violations(root) == []
