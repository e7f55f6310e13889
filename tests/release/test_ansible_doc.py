"""ansible-doc renders every plugin and every role entry point of the installed tarball, and every
option and return value is described (what a user reads on Galaxy and in `ansible-doc`)."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.release.artifact import BIN, ansible_doc

# Plugin folders that hold no plugins ansible-doc lists on their own: shared code (module_utils,
# plugin_utils), documentation fragments, and action plugins (documented by the module file of
# the same name). Every other folder is a plugin type (filter, test, lookup...) that must render.
NOT_LISTED = {"module_utils", "plugin_utils", "doc_fragments", "action", "__pycache__"}
FOLDER_TYPES = {"modules": "module"}


def _undescribed(entries: dict, nested: str, prefix: str = "") -> list:
    """Names in `entries` (options or return values) with an empty description, recursively."""
    missing = []
    for name, spec in (entries or {}).items():
        description = spec.get("description")
        text = " ".join(description) if isinstance(description, list) else description or ""
        if not text.strip():
            missing.append(prefix + name)
        missing += _undescribed(spec.get(nested), nested, prefix + name + ".")
    return missing


def _plugin_types(root) -> list:
    """The ansible-doc types of the plugin folders the installed collection has."""
    folders = [path.name for path in (root / "plugins").iterdir() if path.is_dir() and path.name not in NOT_LISTED]
    return sorted(FOLDER_TYPES.get(folder, folder) for folder in folders)


def _listed(env, workdir, kind: str) -> dict:
    proc = ansible_doc(env, workdir, "-t", kind, "-l", "cleanslate.gpu", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_module_file_is_listed_with_its_short_description(installed):
    _collections, root, workdir, env = installed
    listed = _listed(env, workdir, "module")
    files = {"cleanslate.gpu." + path.stem for path in (root / "plugins" / "modules").glob("*.py")
             if path.stem != "__init__"}
    assert set(listed) == files
    assert "cleanslate.gpu.fleet_report" in listed  # the action plugin, documented by its module file
    assert all(summary and summary != "UNDOCUMENTED" for summary in listed.values()), listed


def test_every_plugin_renders_from_the_installed_tarball_with_every_option_and_return_described(installed):
    _collections, root, workdir, env = installed
    for kind in _plugin_types(root):
        names = sorted(_listed(env, workdir, kind))
        assert names, "ansible-doc lists no %s plugin of cleanslate.gpu" % kind
        proc = ansible_doc(env, workdir, "-t", kind, "--json", *names)
        assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
        docs = json.loads(proc.stdout)
        assert sorted(docs) == names
        for name, entry in docs.items():
            doc = entry["doc"]
            assert doc["filename"].startswith(str(root) + "/"), (name, doc["filename"])
            assert doc.get("short_description") and doc.get("description"), name
            assert not _undescribed(doc.get("options"), "suboptions"), (name, _undescribed(doc["options"], "suboptions"))
            assert not _undescribed(entry.get("return"), "contains"), (name, _undescribed(entry["return"], "contains"))
            if kind == "module":
                assert entry.get("return") and entry.get("examples"), "%s: no RETURN or EXAMPLES" % name
        text = ansible_doc(env, workdir, "-t", kind, *names)
        assert text.returncode == 0 and not text.stderr.strip(), text.stderr
        for name in names:
            assert "%s (%s/plugins/" % (name, root) in text.stdout, name  # the header names the installed file


# ansible-core 2.20 and 2.21 warn, on every `ansible-doc -t role`, that their own internal collection
# (ansible._protomatter, inside the ansible package) has no MANIFEST.json: about core, not about us.
CORE_INTERNAL = re.compile(r"^\[WARNING\]: Collection at '[^']*/ansible/_internal/ansible_collections/ansible/_protomatter'"
                           r" does not have a MANIFEST\.json file.*$", re.M)


def _own(stderr: str) -> str:
    """What ansible-doc printed on stderr about anything but ansible-core's internal collection."""
    return CORE_INTERNAL.sub("", stderr).strip()


def test_every_role_entry_point_renders_with_every_option_described(installed):
    _collections, root, workdir, env = installed
    listed = _listed(env, workdir, "role")
    roles = {"cleanslate.gpu." + path.parent.parent.name for path in root.glob("roles/*/meta/argument_specs.yml")}
    assert set(listed) == roles and roles, listed
    for role in sorted(roles):
        proc = ansible_doc(env, workdir, "-t", "role", "--json", role)
        assert proc.returncode == 0 and not _own(proc.stderr), proc.stderr
        doc = json.loads(proc.stdout)[role]
        assert doc["path"] == str(root), doc["path"]
        assert doc["entry_points"], role
        for entry, spec in doc["entry_points"].items():
            assert spec.get("short_description") and spec.get("description"), (role, entry)
            assert not _undescribed(spec.get("options"), "options"), (role, entry, _undescribed(spec["options"], "options"))
        text = ansible_doc(env, workdir, "-t", "role", role)
        assert text.returncode == 0 and not _own(text.stderr), text.stderr
        for entry in doc["entry_points"]:
            # (without colour ansible-doc marks the name as *main*)
            assert re.search(r"ENTRY POINT: \W*%s\W* - \w" % re.escape(entry), text.stdout), (role, entry)


@pytest.mark.parametrize("name", ["reset", "verify", "reset_and_serve", "heal", "heal_breaker_close"])
def test_each_playbook_is_found_by_its_fqcn_and_parses(installed, name):
    """`ansible-playbook cleanslate.gpu.NAME --syntax-check` from the installed tarball (the runs
    themselves are in test_installed_playbooks.py)."""
    _collections, root, workdir, env = installed
    if not (root / "playbooks" / f"{name}.yml").exists():
        pytest.skip(f"playbooks/{name}.yml is not in the tarball yet (reset_and_serve lands with issue 12)")
    inventory = workdir / "syntax-inventory.json"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"node": {}}}}}}))
    proc = subprocess.run([str(BIN / "ansible-playbook"), f"cleanslate.gpu.{name}", "--syntax-check", "-i",
                           str(inventory)], cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
