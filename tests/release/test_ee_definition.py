"""execution-environment.yml renders offline into a build context (`ansible-builder create`) with
the controller side only: ansible-core within requires_ansible, ansible-runner, the collections,
paramiko; the GPU hosts' psutil and nvidia-ml-py never reach the image."""
from __future__ import annotations

import re
import shutil
import subprocess

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.release.artifact import BIN, REPO

HOST_ONLY = ("psutil", "nvidia-ml-py", "pynvml")
PROXMOX = REPO / ".ansible" / "collections" / "ansible_collections" / "community" / "proxmox"


def _pins() -> dict:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    return {Requirement(line).name.lower(): line for line in lines if line and not line.startswith("#")}


def _names(requirements) -> set:
    return {Requirement(line.split("#")[0].strip()).name.lower() for line in requirements
            if line.split("#")[0].strip()}


def test_the_build_context_renders_offline_with_the_controller_side_only(tmp_path):
    proc = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", str(REPO / "execution-environment.yml"),
                           "-c", str(tmp_path / "context"), "--output-filename", "Containerfile"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    containerfile = (tmp_path / "context" / "Containerfile").read_text()
    build = tmp_path / "context" / "_build"

    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="(.*)"$', containerfile, re.M).group(1).split()
    core = next(Requirement(ref) for ref in refs if Requirement(ref).name == "ansible-core")
    (version,) = [spec.version for spec in core.specifier]
    requires = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    assert version in SpecifierSet(requires), (version, requires)
    pins = _pins()
    assert set(refs) == {pins["ansible-core"], pins["ansible-runner"]}  # what the tests run

    collections = [entry["name"] for entry in yaml.safe_load((build / "requirements.yml").read_text())["collections"]]
    assert collections == ["cleanslate.gpu", "community.proxmox"]
    python = (build / "requirements.txt").read_text().splitlines()
    assert pins["paramiko"] in python
    assert not _names(python) & set(HOST_ONLY)
    assert re.search(r"^FROM \$EE_BASE_IMAGE AS base$", containerfile, re.M)
    assert "ansible-galaxy collection install" in containerfile and "USER 1000" in containerfile


def test_introspection_of_the_installed_collections_adds_paramiko_and_no_host_library(installed, tmp_path):
    """What ansible-builder reads from the collections themselves (meta/execution-environment.yml):
    cleanslate.gpu asks for paramiko, community.proxmox for proxmoxer; nothing for the GPU hosts."""
    _collections, root, _workdir, _env = installed
    assert PROXMOX.joinpath("MANIFEST.json").exists(), "make setup installs community.proxmox"
    tree = tmp_path / "collections" / "ansible_collections"
    shutil.copytree(root, tree / "cleanslate" / "gpu")
    shutil.copytree(PROXMOX, tree / "community" / "proxmox")
    proc = subprocess.run([str(BIN / "ansible-builder"), "introspect", "--sanitize", str(tmp_path / "collections")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = yaml.safe_load(proc.stdout.split("---", 1)[1])
    by_collection = {}
    for line in data["python"]:
        requirement, origin = line.split("# from collection ")
        by_collection.setdefault(origin.strip(), set()).update(_names([requirement]))
    assert by_collection == {"cleanslate.gpu": {"paramiko"}, "community.proxmox": {"proxmoxer"}}, data
    assert not data["system"]
