"""The tarball `ansible-galaxy collection build` makes holds what the collection ships and nothing
that only develops or tests it (galaxy.yml's build_ignore), and installs intact."""
from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import yaml

from tests.release.artifact import BIN, REPO, build_tarball, isolated_env, tarball_members
from tools.checkout_copy import copy_checkout

GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
# Directories and files of the checkout that must never ship: tests (the simulator and the fake
# NVML live there), benchmarks, developer tools, CI, virtual environments, build output, reports,
# Ansible's and pytest's working areas, wheels, the checkout's settings and pins.
FORBIDDEN_TOP = {"tests", "bench", "tools", ".ci", ".venv", "venv", "build", "dist", "reports", ".ansible",
                 ".pytest_cache", ".whl", ".git", ".gitignore", ".ansible-lint", "ansible.cfg", "Makefile",
                 "pytest.ini", "constraints.txt", "collections", "execution-environment.yml", "context", "awx"}
FORBIDDEN_SUFFIXES = (".whl", ".tar.gz", ".pyc", ".retry")
# Shipped: the code, the roles and playbooks, the metadata, the user docs, the licence, the changelog,
# the alert rules (files/prometheus, docs/observability.md), the self-healing rulebook (extensions/eda,
# where ansible-rulebook and EDA controller look for it: docs/self_healing.md).
REQUIRED_TREES = ("plugins", "roles", "playbooks", "meta", "docs", "LICENSES", "changelogs", "files", "extensions")
REQUIRED_FILES = ("README.md", "COPYING", "MANIFEST.json", "FILES.json", "meta/runtime.yml",
                  "meta/execution-environment.yml", "changelogs/changelog.yaml", "changelogs/config.yaml")


def _forbidden(members) -> list:
    bad = []
    for member in members:
        path = member.rstrip("/")
        top = path.split("/")[0]
        if (top in FORBIDDEN_TOP or top.startswith("requirements") or path.endswith(FORBIDDEN_SUFFIXES)
                or "__pycache__" in path.split("/") or path == "inventory/simulated.yml"
                or path == "changelogs/.plugin-cache.yaml"):
            bad.append(path)
    return bad


def _tracked(*trees) -> set:
    out = subprocess.run(["git", "ls-files", "--", *trees], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout
    return {path for path in out.splitlines() if (REPO / path).is_file()}


def test_the_tarball_is_named_for_the_version_and_its_manifest_agrees_with_galaxy_yml(release_tarball):
    assert release_tarball.name == "cleanslate-gpu-%s.tar.gz" % GALAXY["version"]
    with tarfile.open(release_tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == ("cleanslate", "gpu", GALAXY["version"])
    assert manifest["license"] == GALAXY["license"] and manifest["dependencies"] == GALAXY["dependencies"]


def test_the_tarball_holds_nothing_that_only_develops_or_tests_the_collection(release_tarball):
    members = tarball_members(release_tarball)
    assert not _forbidden(members), "in the release tarball: %s" % _forbidden(members)[:20]
    # The simulated node's inventory stays out; the example inventories ship.
    assert "inventory/fleet.example.yml" in members and "inventory/pve_remote.example.yml" in members


def test_the_tarball_holds_every_file_the_collection_ships(release_tarball):
    members = set(tarball_members(release_tarball))
    missing = sorted(set(REQUIRED_FILES) - members)
    missing += sorted(_tracked(*REQUIRED_TREES) - members - {"changelogs/.plugin-cache.yaml"})
    assert not missing, "missing from the release tarball: %s" % missing
    for module in (REPO / "plugins" / "modules").glob("*.py"):
        assert "plugins/modules/%s" % module.name in members


def test_build_ignore_keeps_out_what_a_working_checkout_accumulates(tmp_path):
    """A copy of the checkout with every kind of leftover a developer's or CI's checkout has (venvs,
    build output with the fake NVML, reports, wheels, bytecode, an earlier tarball, ansible-test and
    pytest output): none of it reaches the tarball, everything tracked still does."""
    source = copy_checkout(REPO, tmp_path / "checkout")
    leftovers = [".venv/bin/python", "venv/pyvenv.cfg", "build/fake_nvml/libnvidia-ml.so.1", "build/bench/x.json",
                 "dist/cleanslate-gpu-0.0.1.tar.gz", "reports/reset-20260101T000000Z.json",
                 ".ansible/collections/ansible_collections/community/proxmox/MANIFEST.json",
                 ".pytest_cache/v/cache/nodeids", ".whl/psutil-7.2.2-cp36-abi3-linux_x86_64.whl",
                 "psutil-7.2.2-cp36-abi3-linux_x86_64.whl", "cleanslate-gpu-0.0.1.tar.gz",
                 "plugins/modules/__pycache__/gpu_reset.cpython-311.pyc", "plugins/module_utils/_procs.pyc",
                 "tests/output/.tmp/sanity.json", "changelogs/.plugin-cache.yaml", "context/Containerfile"]
    for rel in leftovers:
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text("leftover\n")
    members = tarball_members(build_tarball(tmp_path / "out", source))
    assert not _forbidden(members), "leftovers in the tarball: %s" % _forbidden(members)[:20]
    shipped = _tracked(*REQUIRED_TREES) - {"changelogs/.plugin-cache.yaml"}
    assert shipped <= set(members)


def test_the_installed_tarball_is_intact_and_the_only_cleanslate_gpu_ansible_sees(installed):
    collections, root, workdir, env = installed
    assert not (root / "tests").exists() and (root / "plugins" / "modules" / "gpu_reset.py").is_file()
    verify = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "verify", "--offline", "-p", str(collections),
                             "cleanslate.gpu"], cwd=workdir, env=env, capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    listing = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "list", "--format", "json"], cwd=workdir,
                             env=isolated_env(collections, workdir), capture_output=True, text=True, check=True)
    found = {path: names for path, names in json.loads(listing.stdout).items() if "cleanslate.gpu" in names}
    assert list(found) == [str(collections / "ansible_collections")], found


def test_make_dist_packs_the_example_inventories_never_the_users_own(tmp_path):
    """The Quick start has users copy inventory/fleet.example.yml to inventory/fleet.yml and fill
    in their hosts: `make dist` (tools/dist.py) must not ship that file, nor any other inventory
    they make there, whatever its name (issue 29)."""
    checkout = copy_checkout(REPO, tmp_path / "checkout")
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    subprocess.run(["git", "add", "-A"], cwd=checkout, check=True)
    for name in ("fleet.yml", "serve.yml", "site-b.yml"):
        (checkout / "inventory" / name).write_text("all: {vars: {ansible_password: hunter2}}\n")
    proc = subprocess.run([str(BIN / "python"), str(REPO / "tools" / "dist.py"), str(checkout), str(tmp_path / "dist")],
                          capture_output=True, text=True, check=True)
    members = tarball_members(Path(proc.stdout.strip()))
    inventories = sorted(member for member in members if member.startswith("inventory/") and member.endswith(".yml"))
    assert inventories == sorted("inventory/" + path.name for path in (REPO / "inventory").glob("*.example.yml"))
