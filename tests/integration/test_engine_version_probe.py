"""inference_service_engine_version empty (issue 25): the role asks the host's installed engine
for its version (the Python its executable names) and checks the command line with that
version's flag data; a version without data, or an engine that cannot tell, is refused with the
versions known, in check mode too, and never checked with the newest data instead.

The engine here is a venv with the package metadata pip leaves (a dist-info); the role runs only
its validation (tasks_from: validate), on this machine, through ansible-playbook."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
PLAY = """
- name: Validate the service's settings
  hosts: all
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: cleanslate.gpu.inference_service
        tasks_from: validate
    - name: Show the version whose data checked the command line
      ansible.builtin.debug:
        msg: "checked with {{ __inference_service_args.engine_version }}"
"""


def fake_engine(root: Path, engine: str, version: str, shebang: str = "") -> Path:
    """A venv whose Python reports `engine` installed at `version`, and its bin/<engine>."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]
    info = Path(purelib) / ("%s-%s.dist-info" % (engine, version))
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (engine, version))
    executable = venv / "bin" / engine
    executable.write_text((shebang or "#!%s/bin/python" % venv) + "\nimport sys\nsys.exit(0)\n")
    executable.chmod(0o755)
    return venv


def validate(tmp_path: Path, *args, **variables) -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(dict({"inference_service_model": "org/model"}, **variables)))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", str(play), "-e", f"@{extra}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)


def test_an_installed_version_without_data_is_refused_with_the_versions_known_in_check_mode(tmp_path):
    venv = fake_engine(tmp_path, "vllm", "0.30.0")
    proc = validate(tmp_path, "--check", inference_service_venv=str(venv))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert ("inference_service: the host's vllm is version '0.30.0' (inference_service_engine_version is empty), "
            "which has no flag data; known versions: 0.31.0, 0.32.0, 0.33.0") in proc.stdout, proc.stdout[-3000:]
    assert "checked with" not in proc.stdout


@pytest.mark.parametrize("engine, version, only_newer", [
    ("vllm", "0.31.0", "--disable-chunked-prefill"),           # 0.31.0 spells it --no-enable-chunked-prefill
    ("sglang", "0.5.21", "--enable-watermark"),
])
def test_the_installed_version_picks_the_data_not_the_newest(tmp_path, engine, version, only_newer):
    """An option only the newest version has is refused for the host's older engine, naming it."""
    venv = fake_engine(tmp_path, engine, version)
    common = {"inference_service_engine": engine, "inference_service_venv": str(venv),
              "inference_service_unit": engine + ".service"}
    proc = validate(tmp_path, "--check", **common, inference_service_extra_args=[only_newer])
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "%s is not an option of %s %s" % (only_newer, engine, version) in proc.stdout, proc.stdout[-3000:]
    proc = validate(tmp_path, "--check", **common, inference_service_fail_host=False)
    assert "checked with %s" % version in proc.stdout, proc.stdout[-3000:]


def test_an_engine_that_cannot_tell_its_version_is_refused_naming_why(tmp_path):
    proc = validate(tmp_path, "--check", inference_service_venv=str(tmp_path / "none"))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert ("inference_service_engine_version is empty and the host's vllm did not tell its version (there is no "
            "%s/none/bin/vllm); set inference_service_engine_version to one of the versions known: "
            "0.31.0, 0.32.0, 0.33.0" % tmp_path) in proc.stdout, proc.stdout[-3000:]


def test_the_python_of_an_env_shebang_is_asked(tmp_path):
    """#!/usr/bin/env python3 names the Python on PATH: with no engine installed there, it says so."""
    venv = fake_engine(tmp_path, "vllm", "0.31.0", shebang="#!/usr/bin/env python3-no-such-python")
    proc = validate(tmp_path, "--check", inference_service_venv=str(venv))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "did not tell its version (timeout: failed to run command" in proc.stdout, proc.stdout[-3000:]


def test_a_given_version_is_not_asked_for(tmp_path):
    venv = fake_engine(tmp_path, "vllm", "0.30.0")
    # -v prints what the host look found: no engine_version line, the installed engine was not asked.
    proc = validate(tmp_path, "--check", "-v", inference_service_venv=str(venv), inference_service_engine_version="0.32.0",
                    inference_service_fail_host=False)
    assert "checked with 0.32.0" in proc.stdout, proc.stdout[-3000:]
    assert "Look at the engine's version, the executable" in proc.stdout and "unit_file=" in proc.stdout, proc.stdout[-3000:]
    assert "engine_version=0.30.0" not in proc.stdout, proc.stdout[-3000:]
