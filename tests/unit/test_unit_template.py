"""The unit file the inference_service role writes (roles/inference_service/templates/unit.service.j2),
rendered with Ansible's filters and read as systemd reads its [Service] section.

Issue 39, 3: an engine that exits 0 on a fault (vllm-project/vllm#48966) must be restarted.
systemd.service(5): Restart=on-failure skips a clean exit (status 0, or SIGHUP, SIGINT, SIGTERM,
SIGPIPE); Restart=always restarts whatever the end, except after a stop request (systemctl stop or
restart, node_reset's stop), so the role's own stops never meet a restart. Before each start, those
restarts included, the unit's cleanup runs as root (ExecStartPre=+): only files root owns may run."""
from __future__ import annotations

import pathlib

import jinja2
import pytest
from ansible.plugins.filter.core import FilterModule

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _serve_command
from tests.unit.test_inference_args import build
from tests.unit.test_systemd_quote import systemd_reads

# The template writes regex_replace('\\.service$', ...) as Ansible reads it; Jinja warns of the escape.
pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
TEMPLATE = pathlib.Path(__file__).resolve().parents[2] / "roles/inference_service/templates/unit.service.j2"

CONTEXT = {
    "__inference_service_unit_marker": "# Managed by Ansible (cleanslate.gpu.inference_service)",
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
            name, value = line.split("=", 1)
            settings.setdefault(name, []).append(value)
    return settings


def rendered(user: str = "vllm") -> dict:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(FilterModule().filters())
    context = dict(CONTEXT, inference_service_user=user, __inference_service_args=build(user=user))
    return service_section(env.from_string(TEMPLATE.read_text()).render(**context))


@pytest.fixture(name="unit")
def fixture_unit() -> dict:
    return rendered()


def test_an_engine_that_ends_without_a_stop_request_is_restarted_whatever_its_status(unit):
    assert unit["Restart"] == ["always"]
    # Nothing takes status 0 or a clean signal out of it again.
    assert "RestartPreventExitStatus" not in unit and "SuccessExitStatus" not in unit
    assert unit["RestartSec"] == ["10"]


def words(line: str) -> list:
    """The command systemd runs for an Exec line the role wrote: its prefixes, then each quoted item."""
    prefixes = line[:len(line) - len(line.lstrip("-+@:!"))]
    return [prefixes] + [systemd_reads(item, exec_start=True) for item in line[len(prefixes):].split(" ") if item]


@pytest.mark.parametrize("user, runs_for", [("vllm", "vllm"), ("", "root"), ("svc_ai-1", "svc_ai-1")])
def test_before_each_start_roots_own_python_runs_the_cleanup_for_the_units_user(user, runs_for):
    unit = rendered(user)
    assert len(unit["ExecStartPre"]) == 1
    # "+": as root whatever User= says (only root reads every process's maps); "-": never stops the start.
    prefixes, *argv = words(unit["ExecStartPre"][0])
    assert sorted(prefixes) == ["+", "-"]
    assert argv == ["/usr/bin/python3", "-I", _serve_command.PRESTART_DIR + "/prestart_clean.py", "--user", runs_for]
    # Root runs nothing the server's user could write: not the engine's venv, not a relative path.
    assert not argv[2].startswith(("/opt", "/home", "/tmp")) and argv[0] == _serve_command.PRESTART_PYTHON
