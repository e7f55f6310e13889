"""node_reset's variables: meta/argument_specs.yml and defaults/main.yml stay in step, and bad
values are rejected before anything runs (the crashed node is left exactly as it was)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sim import procinfo

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "node_reset"
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
PYTHON_TYPES = {"str": str, "path": str, "bool": bool, "int": int, "float": (int, float), "list": list, "dict": dict}


def test_every_variable_is_declared_with_a_type_and_the_same_default():
    options = SPECS["main"]["options"]
    assert sorted(options) == sorted(DEFAULTS), "declared in one file only: %s" % sorted(
        set(options).symmetric_difference(DEFAULTS))
    for name, spec in options.items():
        assert name.startswith("node_reset_"), name
        assert spec.get("description"), name
        assert spec["default"] == DEFAULTS[name], name
        assert isinstance(DEFAULTS[name], PYTHON_TYPES[spec["type"]]), name
        if "choices" in spec:
            values = DEFAULTS[name] if spec["type"] == "list" else [DEFAULTS[name]]
            assert set(values) <= set(spec["choices"]), name


def test_the_verify_entry_point_takes_the_same_variables():
    assert SPECS["verify"]["options"] == SPECS["main"]["options"]


def test_module_defaults_are_the_roles_defaults():
    """A role default that differs from its module's default would change behaviour silently."""
    sys.path.insert(0, str(REPO / ".ansible" / "collections"))
    for module, option, variable in [
        ("gpu_reset", "device_paths", "node_reset_gpu_reset_device_paths"),
        ("gpu_reset", "protect_names", "node_reset_gpu_reset_protect_names"),
        ("gpu_reset", "grace_period", "node_reset_gpu_reset_grace_period"),
        ("shm_clean", "patterns", "node_reset_shm_clean_patterns"),
        ("nvml_verify", "checks", "node_reset_nvml_verify_checks"),
        ("nvml_verify", "max_memory_used_mib", "node_reset_nvml_verify_max_memory_used_mib"),
    ]:
        doc = (REPO / "plugins" / "modules" / f"{module}.py").read_text()
        documentation = yaml.safe_load(doc.split('DOCUMENTATION = r"""')[1].split('"""')[0]
                                       if 'DOCUMENTATION = r"""' in doc else doc.split("DOCUMENTATION = r'''")[1].split("'''")[0])
        assert documentation["options"][option]["default"] == DEFAULTS[variable], (module, option)


@pytest.fixture
def node_vars(crashed_node, tmp_path):
    manifest = crashed_node
    values = {
        "node_reset_environment": manifest["nvml"]["env"],
        "node_reset_gpu_reset_device_paths": manifest["device_paths"],
        "node_reset_gpu_reset_cmdline_patterns": [manifest["api_server_pattern"]],
        "node_reset_shm_clean_path": manifest["shm_dir"],
    }
    return manifest, values


def _alive(entry) -> bool:
    return procinfo.alive(entry["pid"])


@pytest.mark.parametrize("bad, message", [
    ({"node_reset_gpu_reset_grace_period": "soon"}, "node_reset_gpu_reset_grace_period"),
    ({"node_reset_gpu_reset_device_paths": {"not": "a list"}}, "node_reset_gpu_reset_device_paths"),
    ({"node_reset_pycache_purge_mode": "everything"}, "node_reset_pycache_purge_mode"),
    ({"node_reset_nvml_verify_checks": ["memory", "temperature"]}, "node_reset_nvml_verify_checks"),
    ({"node_reset_gpu_reset_grace_period": -1}, "out of range"),
    ({"node_reset_nvml_verify_poll_interval": 0}, "out of range"),
    ({"node_reset_pve_vmid": 7, "node_reset_pve_host": "pve"}, "out of range"),
    ({"node_reset_pve_host": "no-such-node", "node_reset_pve_vmid": 129}, "not a host of the inventory"),
])
def test_a_bad_variable_is_rejected_before_anything_runs(node_vars, tmp_path, bad, message):
    manifest, values = node_vars
    values.update(bad)
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(values))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset.yml",
                           "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}",
                           "-e", f"fleet_report_path={tmp_path / 'reports'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert message in proc.stdout
    assert "Stop every process that holds a GPU" not in proc.stdout
    for entries in manifest["processes"].values():
        assert all(_alive(entry) for entry in entries)
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
