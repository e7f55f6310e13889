"""Install the stand-in engine (tests/sim/engine) on a fleet host as /usr/local/bin/vllm and
/usr/local/bin/sglang, with the role's flag data it parses its command line with, and a fake
NVML state of the host's GPUs for it to register memory in. Each engine also gets the
package metadata pip would leave (a dist-info of its version in the host Python's
dist-packages): the role asks the executable's Python for the installed version, and the
stand-in takes its flag data by the same version.

Written through the host's overlay root from this machine, so it works on a running host.
The host must have this repository's tests/ at /opt/cleanslate/tests (the fleet's copy_in).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.fixtures.fake_nvml import FakeNvml
from tests.integration.fleet.host import GPUS as HOST_GPUS
from tests.sim.engine import DEFAULTS as STANDIN_ENGINES  # the engines the stand-in plays

REPO = Path(__file__).resolve().parents[3]
PARENT = "/opt/cleanslate"
FLAGS = REPO / "roles" / "inference_service" / "files" / "flags"
NVML_STATE = "/var/lib/fake-nvml"
GPUS = HOST_GPUS  # /dev/nvidia0..3 (host.DEVICE_NAMES), unless install() is told the host has more
WRAPPER = """#!/usr/bin/python3
# The cleanslate stand-in for `{engine} serve` (tests/sim/engine), installed by the fleet tests.
import sys
sys.path.insert(0, "{parent}")
from tests.sim.engine import main
sys.exit(main("{engine}", sys.argv[1:]))
"""


DIST_PACKAGES = "usr/lib/python3/dist-packages"  # on Debian's python3 path, whatever its minor version


def newest(engine: str) -> str:
    versions = [path.stem.split("-", 1)[1] for path in FLAGS.glob(engine + "-*.json")]
    return max(versions, key=lambda version: [int(part) for part in version.split(".")])


def set_version(root: Path, engine: str, version: str) -> None:
    """The installed engine's package metadata, as pip writes it (only Name and Version are read)."""
    packages = Path(root) / DIST_PACKAGES
    for old in packages.glob(engine + "-*.dist-info"):
        shutil.rmtree(old)
    info = packages / ("%s-%s.dist-info" % (engine, version))
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (engine, version))


def install(root: Path, gpus: int = GPUS) -> dict:
    """Install into the host whose root file system is `root` (with `gpus` GPUs: its Host.gpus);
    returns the host-side paths."""
    root = Path(root)
    flags = root / PARENT.lstrip("/") / "roles" / "inference_service" / "files" / "flags"
    if flags.exists():
        shutil.rmtree(flags)
    shutil.copytree(FLAGS, flags)
    bin_dir = root / "usr/local/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for engine in STANDIN_ENGINES:
        path = bin_dir / engine
        path.write_text(WRAPPER.format(engine=engine, parent=PARENT))
        path.chmod(0o755)
        set_version(root, engine, newest(engine))
    FakeNvml(root / NVML_STATE.lstrip("/")).create(gpu_count=gpus)
    return {"executables": ["/usr/local/bin/" + engine for engine in STANDIN_ENGINES], "nvml_state": NVML_STATE}


def install_venv(root: Path, venv: str, engine: str, python: str, owner: int) -> str:
    """The stand-in as `engine` in a venv at `venv` on the host (over the host's /usr/bin/python3,
    `python` its pythonX.Y), owned by the user `owner` as a service user's venv is, with the
    dist-info pip leaves; returns the host-side site-packages, where that user may drop a .pth."""
    prefix = Path(root) / venv.lstrip("/")
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3").symlink_to("/usr/bin/python3")
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    site = prefix / "lib" / python / "site-packages"
    info = site / ("%s-%s.dist-info" % (engine, newest(engine)))
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (engine, newest(engine)))
    executable = prefix / "bin" / engine
    executable.write_text(WRAPPER.format(engine=engine, parent=PARENT).replace("#!/usr/bin/python3", "#!%s/bin/python3" % venv, 1))
    executable.chmod(0o755)
    for path in [prefix, *prefix.rglob("*")]:
        os.lchown(path, owner, owner)
    return "/" + str(site.relative_to(root))


def uninstall(root: Path) -> None:
    root = Path(root)
    for engine in STANDIN_ENGINES:
        (root / "usr/local/bin" / engine).unlink(missing_ok=True)
        for info in (root / DIST_PACKAGES).glob(engine + "-*.dist-info"):
            shutil.rmtree(info)
    shutil.rmtree(root / NVML_STATE.lstrip("/"), ignore_errors=True)
    shutil.rmtree(root / PARENT.lstrip("/") / "roles", ignore_errors=True)


def set_fault(root: Path, fault_file: str, **settings) -> None:
    """The stand-in's STANDIN_FAULT_FILE on the host whose root is `root`: `settings` for its next
    start (tests/sim/engine/settings.py), or none (the file removed)."""
    path = root / fault_file.lstrip("/")
    if settings:
        path.write_text(json.dumps(settings))
    else:
        path.unlink(missing_ok=True)
