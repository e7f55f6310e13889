"""inference_service's variables: meta/argument_specs.yml and defaults/main.yml stay in step, every
entry point takes the same variables, and the role's internal names keep to its prefix."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "inference_service"
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
PYTHON_TYPES = {"str": str, "path": str, "bool": bool, "int": int, "float": (int, float), "list": list, "dict": dict}


def test_every_variable_is_declared_with_a_type_and_the_same_default():
    options = SPECS["main"]["options"]
    assert sorted(options) == sorted(DEFAULTS), "declared in one file only: %s" % sorted(
        set(options).symmetric_difference(DEFAULTS))
    for name, spec in options.items():
        assert name.startswith("inference_service_"), name
        assert spec.get("description"), name
        assert spec["default"] == DEFAULTS[name], name
        assert isinstance(DEFAULTS[name], PYTHON_TYPES[spec["type"]]), name
        if "choices" in spec:
            assert DEFAULTS[name] in spec["choices"], name


def test_the_issue_names_are_the_interface():
    for name in ("engine", "engine_version", "model", "served_name", "speculative", "extra_args", "environment",
                 "secrets", "unit", "ready_timeout", "min_acceptance_rate"):
        assert "inference_service_" + name in DEFAULTS, name


def test_every_entry_point_takes_the_same_variables():
    assert sorted(SPECS) == ["assess", "main", "rotation_out", "serve", "validate"]
    for entry in ("validate", "assess", "serve"):
        assert SPECS[entry]["options"] == SPECS["main"]["options"]
        assert (ROLE / "tasks" / f"{entry}.yml").exists()


def test_secrets_are_no_log_in_the_spec():
    secrets = SPECS["main"]["options"]["inference_service_secrets"]
    assert secrets["no_log"] is True
    assert all(option["no_log"] is True for option in secrets["options"].values())


def test_internal_names_keep_to_the_prefix():
    """Registered and set facts are __inference_service_* (internal) or inference_service_* (results)."""
    for path in sorted((ROLE / "tasks").glob("*.yml")) + [ROLE / "vars" / "main.yml"]:
        text = path.read_text()
        for name in re.findall(r"^\s*register:\s*(\S+)", text, re.M):
            assert name.startswith("__inference_service_"), (path.name, name)
        for block in re.findall(r"set_fact:\n((?:\s{8,}\S.*\n)+)", text):
            for name in re.findall(r"^\s{8}(\w+):", block, re.M):
                assert re.match(r"^(__)?inference_service_", name), (path.name, name)
