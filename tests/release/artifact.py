"""The released artifact, as a user gets it: the tarball `ansible-galaxy collection build` makes,
installed into a collections path of its own, run by an Ansible that sees nothing else.

Shared by the release tests (tests/release) and the fleet tests that run the same artifact over
SSH (tests/integration/test_runner_fleet.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NAMESPACE, NAME = "cleanslate", "gpu"


def build_tarball(out_dir: Path, source: Path = REPO) -> Path:
    """`ansible-galaxy collection build` of `source` (the checkout itself by default) into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(out_dir),
                    str(source)], check=True, capture_output=True, text=True, timeout=300)
    (tarball,) = out_dir.glob(f"{NAMESPACE}-{NAME}-*.tar.gz")
    return tarball


def isolated_env(collections: Path, workdir: Path, **extra) -> dict:
    """The environment of an Ansible that finds collections in `collections` only.

    No ANSIBLE_* variable of the caller's (the Makefile exports some), no PYTHONPATH, no sys.path
    scan (a site-packages with ansible_collections would count), and a config file of its own, so
    that neither the checkout's ansible.cfg nor its .ansible/collections link is read.
    """
    config = workdir / "ansible.cfg"
    if not config.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        config.write_text("[defaults]\nretry_files_enabled = False\n")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("ANSIBLE_") and key != "PYTHONPATH"}
    env.update(ANSIBLE_CONFIG=str(config), ANSIBLE_COLLECTIONS_PATH=str(collections),
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(workdir / "tmp"), ANSIBLE_HOME=str(workdir / "home"))
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env.update(extra)
    return env


def install_tarball(tarball: Path, collections: Path, workdir: Path) -> Path:
    """Install the tarball into an empty collections path; returns the installed collection's root."""
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-p", str(collections),
                           str(tarball)], cwd=workdir, env=isolated_env(collections, workdir),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return collections / "ansible_collections" / NAMESPACE / NAME


def tarball_members(tarball: Path) -> list:
    """The paths in the tarball, as `tar tzf` lists them (directories end with /)."""
    out = subprocess.run(["tar", "tzf", str(tarball)], check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


def ansible_doc(env: dict, cwd: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ansible-doc"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def simulated_inventory(path: Path, hosts: dict | None = None) -> Path:
    """An inventory with the simulated node (local connection, this interpreter: it has psutil and
    nvidia-ml-py) in gpu_nodes, plus `hosts`."""
    members = {"simulated-node": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    members.update(hosts or {})
    path.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": members}}}}))
    return path
