"""Fixtures shared by every test layer: the fake NVML library and the crashed node."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.fake_nvml import FakeNvml, build_library
from tests import sim

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """Directory holding the fake libnvidia-ml.so.1, built once per session by gcc."""
    return build_library(REPO / "build" / "fake_nvml")


@pytest.fixture
def fake_nvml(tmp_path, fake_nvml_lib) -> FakeNvml:
    """A fresh 8 x H200 fake NVML state; `fake_nvml.env()` gives the variables that make
    the real pynvml load the fake library and read this state."""
    state = FakeNvml(tmp_path / "nvml", lib_dir=fake_nvml_lib)
    state.create(gpu_count=8)
    return state


@pytest.fixture
def crashed_node(tmp_path, fake_nvml_lib):
    """A simulated crashed node under a fresh root; everything it started is killed after."""
    root = tmp_path / "node"
    manifest = sim.crash(root, lib_dir=fake_nvml_lib)
    try:
        yield manifest
    finally:
        sim.clean(root)
