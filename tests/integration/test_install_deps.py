"""node_reset_install_deps on a host whose interpreter lacks psutil and nvidia-ml-py, without
internet: the role installs them from a local wheel directory, then the reset runs with them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.sim.role_vars import node_reset_vars

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "build" / "wheels"
PACKAGES = ["psutil==7.2.2", "nvidia-ml-py==13.615.71"]  # as pinned in requirements.txt


def _wheels() -> Path:
    """The two wheels, fetched once into build/ (the test itself then runs with --no-index)."""
    if len(list(WHEELS.glob("*.whl"))) < len(PACKAGES):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(WHEELS)] + PACKAGES, check=True)
    return WHEELS


def _imports(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", "import " + module], capture_output=True, check=False).returncode == 0


def test_the_role_installs_the_libraries_from_local_wheels_then_resets(crashed_node, tmp_path):
    wheels = _wheels()
    venv = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    assert not _imports(python, "psutil") and not _imports(python, "pynvml")

    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(
        crashed_node, node_reset_install_deps=True,
        node_reset_pip_extra_args="--no-index --find-links %s" % wheels,
        fleet_report_path=str(tmp_path / "reports"))))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset.yml",
                           "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}",
                           "-e", f"ansible_python_interpreter={python}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=python))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _imports(python, "psutil") and _imports(python, "pynvml")
    report = json.loads(next((tmp_path / "reports").glob("*.json")).read_text())["hosts"][0]
    assert report["status"] == "ok" and report["killed"] > 0
