"""The unit file the inference_service role writes (roles/inference_service/templates/unit.service.j2),
rendered with Ansible's filters and read as systemd reads its [Service] section.

Issue 39, 3: an engine that exits 0 on a fault (vllm-project/vllm#48966) must be restarted.
systemd.service(5): Restart=on-failure skips a clean exit (status 0, or SIGHUP, SIGINT, SIGTERM,
SIGPIPE); Restart=always restarts whatever the end, except after a stop request (systemctl stop or
restart, node_reset's stop), so the role's own stops never meet a restart."""
from __future__ import annotations

import pathlib

import jinja2
import pytest
from ansible.plugins.filter.core import FilterModule

TEMPLATE = pathlib.Path(__file__).resolve().parents[2] / "roles/inference_service/templates/unit.service.j2"

CONTEXT = {
    "__inference_service_unit_marker": "# Managed by Ansible (cleanslate.gpu.inference_service)",
    "__inference_service_args": {"engine": "vllm", "engine_version": "0.33.0", "served_name": "m",
                                 "environment_lines": ['"CUDA_VISIBLE_DEVICES=0"'], "env_file": "/etc/x/vllm.env",
                                 "exec_start": '"/opt/vllm/bin/vllm" \\\n    "serve"', "timeout_stop_sec": 60},
    "__inference_service_sglang_key_logged": False, "__inference_service_systemd": 252,
    "inference_service_start_limit_interval": 600, "inference_service_start_limit_burst": 3,
    "inference_service_user": "vllm", "inference_service_restart_sec": 10, "inference_service_unit": "vllm.service",
}


def service_section(text: str) -> dict:
    """[Service]'s settings, each name with its values in order (continuation lines joined)."""
    settings, section, logical = {}, None, ""
    for line in text.splitlines():
        logical += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        line, logical = logical.strip(), ""
        if line.startswith("[") and line.endswith("]"):
            section = line
        elif line and not line.startswith("#") and section == "[Service]":
            name, _, value = line.partition("=")
            settings.setdefault(name, []).append(value)
    return settings


@pytest.fixture(name="unit")
def fixture_unit() -> dict:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(FilterModule().filters())
    return service_section(env.from_string(TEMPLATE.read_text()).render(**CONTEXT))


def test_an_engine_that_ends_without_a_stop_request_is_restarted_whatever_its_status(unit):
    assert unit["Restart"] == ["always"]
    # Nothing takes status 0 or a clean signal out of it again.
    assert "RestartPreventExitStatus" not in unit and "SuccessExitStatus" not in unit
    assert unit["RestartSec"] == ["10"]
