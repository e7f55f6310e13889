"""Install the stand-in engine (tests/sim/engine) on a fleet host as /usr/local/bin/vllm and
/usr/local/bin/sglang, with the role's flag data it parses its command line with, and a fake
NVML state of the host's four GPUs for it to register memory in.

Written through the host's overlay root from this machine, so it works on a running host.
The host must have this repository's tests/ at /opt/cleanslate/tests (the fleet's copy_in).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.fixtures.fake_nvml import FakeNvml

REPO = Path(__file__).resolve().parents[3]
PARENT = "/opt/cleanslate"
FLAGS = REPO / "roles" / "inference_service" / "files" / "flags"
NVML_STATE = "/var/lib/fake-nvml"
GPUS = 4  # /dev/nvidia0..3 (host.DEVICE_NAMES)
WRAPPER = """#!/usr/bin/python3
# The cleanslate stand-in for `{engine} serve` (tests/sim/engine), installed by the fleet tests.
import sys
sys.path.insert(0, "{parent}")
from tests.sim.engine import main
sys.exit(main("{engine}", sys.argv[1:]))
"""


def install(root: Path) -> dict:
    """Install into the host whose root file system is `root`; returns the host-side paths."""
    root = Path(root)
    flags = root / PARENT.lstrip("/") / "roles" / "inference_service" / "files" / "flags"
    if flags.exists():
        shutil.rmtree(flags)
    shutil.copytree(FLAGS, flags)
    bin_dir = root / "usr/local/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for engine in ("vllm", "sglang"):
        path = bin_dir / engine
        path.write_text(WRAPPER.format(engine=engine, parent=PARENT))
        path.chmod(0o755)
    FakeNvml(root / NVML_STATE.lstrip("/")).create(gpu_count=GPUS)
    return {"executables": ["/usr/local/bin/vllm", "/usr/local/bin/sglang"], "nvml_state": NVML_STATE}


def uninstall(root: Path) -> None:
    root = Path(root)
    for engine in ("vllm", "sglang"):
        (root / "usr/local/bin" / engine).unlink(missing_ok=True)
    shutil.rmtree(root / NVML_STATE.lstrip("/"), ignore_errors=True)
    shutil.rmtree(root / PARENT.lstrip("/") / "roles", ignore_errors=True)
