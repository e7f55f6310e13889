"""tools/install_bundled_collection.py, run as `make setup` runs it, on a small wheel of our own
(already in the cache directory, so no download): what it installs, and what it refuses."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "install_bundled_collection.py"
PREFIX = "ansible_collections/community/proxmox/"
PLUGIN = "plugins/connection/proxmox_pct_remote.py"


def _wheel(wheels: Path, version="1.4.0", tamper=False) -> Path:
    """ansible-12.3.0-py3-none-any.whl holding community.proxmox `version` (and another collection)."""
    plugin = b"# the connection\n"
    files = [{"name": ".", "ftype": "dir", "chksum_type": None, "chksum_sha256": None, "format": 1},
             {"name": PLUGIN, "ftype": "file", "chksum_type": "sha256",
              "chksum_sha256": hashlib.sha256(plugin).hexdigest(), "format": 1}]
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / "ansible-12.3.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(PREFIX + "MANIFEST.json", json.dumps({"collection_info": {"version": version}}))
        archive.writestr(PREFIX + "FILES.json", json.dumps({"files": files}))
        archive.writestr(PREFIX + PLUGIN, plugin + (b"# changed\n" if tamper else b""))
        archive.writestr("ansible_collections/community/general/MANIFEST.json", "{}")
    return wheel


def _pin(tmp_path: Path, wheel: Path, digest=None) -> Path:
    requirements = tmp_path / "requirements-collections.txt"
    digest = digest or hashlib.sha256(wheel.read_bytes()).hexdigest()
    requirements.write_text(f"# pinned\nansible==12.3.0 --hash=sha256:{digest}\n")
    return requirements


def _run(tmp_path, requirements, version="1.4.0"):
    return subprocess.run([sys.executable, str(TOOL), str(requirements), str(tmp_path / "wheels"),
                           str(tmp_path / "collections"), "community.proxmox", version],
                          capture_output=True, text=True, check=False)


def _installed(tmp_path) -> Path:
    return tmp_path / "collections" / "ansible_collections" / "community" / "proxmox"


def test_installs_only_the_named_collection_from_the_cached_wheel(tmp_path):
    requirements = _pin(tmp_path, _wheel(tmp_path / "wheels"))
    proc = _run(tmp_path, requirements)
    assert proc.returncode == 0, proc.stderr
    assert (_installed(tmp_path) / PLUGIN).read_bytes() == b"# the connection\n"
    assert not (tmp_path / "collections" / "ansible_collections" / "community" / "general").exists()
    # Again: the same result, replacing the previous copy.
    (_installed(tmp_path) / "stray.txt").write_text("left by hand")
    assert _run(tmp_path, requirements).returncode == 0
    assert not (_installed(tmp_path) / "stray.txt").exists()


@pytest.mark.parametrize("case, message", [
    ("hash", "does not have the pinned sha256"),
    ("version", "bundles community.proxmox 1.3.0, not the pinned 1.4.0"),
    ("tampered", f"{PLUGIN} does not match the collection's FILES.json"),
    ("two pins", "must hold exactly one line"),
    ("no pin", "must hold exactly one line"),
])
def test_refuses_a_wheel_or_pin_that_is_not_the_pinned_release_and_keeps_what_was_installed(tmp_path, case, message):
    good = _pin(tmp_path, _wheel(tmp_path / "wheels"))
    assert _run(tmp_path, good).returncode == 0
    before = (_installed(tmp_path) / PLUGIN).read_bytes()
    if case == "hash":
        requirements = _pin(tmp_path, _wheel(tmp_path / "wheels"), digest="0" * 64)
    elif case == "version":
        requirements = _pin(tmp_path, _wheel(tmp_path / "wheels", version="1.3.0"))
    elif case == "tampered":
        requirements = _pin(tmp_path, _wheel(tmp_path / "wheels", tamper=True))
    else:
        requirements = tmp_path / "requirements-collections.txt"
        requirements.write_text(good.read_text() * 2 if case == "two pins" else "ansible==12.3.0\n")
    proc = _run(tmp_path, requirements)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1  # one sentence, no traceback
    assert (_installed(tmp_path) / PLUGIN).read_bytes() == before
    assert sorted(p.name for p in _installed(tmp_path).parent.iterdir()) == ["proxmox"]  # no partial copy left


def test_says_how_to_call_it_when_arguments_are_missing(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), "only-one"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("Usage: python tools/install_bundled_collection.py")


@pytest.mark.parametrize("name", ["proxmox", "community.proxmox.extra", "../proxmox", "community/proxmox", ""])
def test_refuses_a_collection_name_that_is_not_namespace_dot_name(tmp_path, name):
    requirements = _pin(tmp_path, _wheel(tmp_path / "wheels"))
    proc = subprocess.run([sys.executable, str(TOOL), str(requirements), str(tmp_path / "wheels"),
                           str(tmp_path / "collections"), name, "1.4.0"], capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "is not a collection name of the form namespace.name" in proc.stderr
    assert not (tmp_path / "collections").exists()
