"""README.md's variable tables against the roles' argument specs (tools/gen_variables_table.py):
every declared variable is in the README with its type and default, and a spec change that the
README does not follow fails the check until the tool is run."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "gen_variables_table.py"
ROLES = ("node_reset", "inference_service")


def _options(root: Path, role: str) -> dict:
    specs = yaml.safe_load((root / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"]["main"]["options"]


def _readme_rows(text: str, role: str) -> dict:
    """{variable: (type cell, default cell)} from the README's table of the role, read here
    independently of the tool."""
    begin = "<!-- BEGIN VARIABLES %s " % role
    assert text.count(begin) == 1, "README.md has no (or more than one) variable table of %s" % role
    block = text.split(begin, 1)[1].split("<!-- END VARIABLES %s -->" % role, 1)[0]
    rows = {}
    for line in block.splitlines():
        match = re.match(r"\| `([a-z_0-9]+)` \| ([^|]*) \| ((?:[^|\\]|\\\|)*) \|", line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3).strip())
    return rows


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--check", "--root", str(root)],
                          capture_output=True, text=True, check=False)


def test_readme_tables_are_in_sync_with_the_specs():
    result = _check(REPO)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("role", ROLES)
def test_every_declared_variable_is_in_the_readme_with_its_default(role):
    rows = _readme_rows((REPO / "README.md").read_text(), role)
    options = _options(REPO, role)
    assert list(rows) == list(options), "README.md's %s table lists other variables than its spec" % role
    for name, spec in options.items():
        kind, default = rows[name]
        assert kind.startswith(spec.get("type", "str")), (name, kind)
        if spec.get("default") in (None,):
            assert default == "not set", (name, default)
        elif isinstance(spec["default"], (bool, int, float)) and not isinstance(spec["default"], bool):
            assert default == "`%s`" % spec["default"], (name, default)
        elif isinstance(spec["default"], bool):
            assert default == "`%s`" % str(spec["default"]).lower(), (name, default)
        elif isinstance(spec["default"], str) and spec["default"]:
            assert default == "`%s`" % spec["default"], (name, default)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The README and the specs in a scratch root, for the tool to compare and rewrite."""
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    for role in ROLES:
        meta = tmp_path / "roles" / role / "meta"
        meta.mkdir(parents=True)
        shutil.copy(REPO / "roles" / role / "meta" / "argument_specs.yml", meta / "argument_specs.yml")
    return tmp_path


def test_a_changed_default_fails_the_check_until_the_table_is_regenerated(checkout):
    spec = checkout / "roles" / "node_reset" / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace(
        "      node_reset_gpu_reset_grace_period:\n        type: float\n        default: 30\n",
        "      node_reset_gpu_reset_grace_period:\n        type: float\n        default: 45\n"))
    assert "default: 45" in spec.read_text()
    result = _check(checkout)
    assert result.returncode == 1
    assert "node_reset table differs" in result.stderr
    assert "inference_service" not in result.stderr
    subprocess.run([sys.executable, str(TOOL), "--root", str(checkout)], check=True, capture_output=True)
    assert _check(checkout).returncode == 0
    assert _readme_rows((checkout / "README.md").read_text(), "node_reset")[
        "node_reset_gpu_reset_grace_period"][1] == "`45`"


def test_a_new_variable_without_a_readme_row_fails_the_check(checkout):
    spec = checkout / "roles" / "inference_service" / "meta" / "argument_specs.yml"
    text = spec.read_text()
    marker = "      inference_service_fail_host:\n"
    assert marker in text
    spec.write_text(text.replace(marker, "      inference_service_new_knob:\n        type: int\n        default: 3\n"
                                 "        description:\n          - A knob with a|pipe and C(code).\n" + marker, 1))
    result = _check(checkout)
    assert result.returncode == 1 and "inference_service table differs" in result.stderr
    subprocess.run([sys.executable, str(TOOL), "--root", str(checkout)], check=True, capture_output=True)
    readme = (checkout / "README.md").read_text()
    assert "| `inference_service_new_knob` | int | `3` | A knob with a\\|pipe and `code`. |" in readme
    # The rest of the README is kept as it was.
    assert readme.split("<!-- BEGIN VARIABLES")[0] == (REPO / "README.md").read_text().split("<!-- BEGIN VARIABLES")[0]


def test_a_readme_without_the_markers_is_refused(checkout):
    readme = checkout / "README.md"
    readme.write_text(readme.read_text().replace("<!-- END VARIABLES node_reset -->", ""))
    result = _check(checkout)
    assert result.returncode != 0
    assert "README.md needs exactly one" in result.stderr
