"""The files an AWX project of this repository reads agree with the collection they run:
collections/requirements.yml names this release and the execution environment's collections."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.release.artifact import BIN, REPO

GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
EE = yaml.safe_load((REPO / "execution-environment.yml").read_text())


def _collections(entries) -> dict:
    return {entry["name"]: entry.get("version") for entry in entries}


def test_the_project_requirements_name_this_release_and_the_ees_collections():
    project = _collections(yaml.safe_load((REPO / "collections" / "requirements.yml").read_text())["collections"])
    assert project["cleanslate.gpu"] == GALAXY["version"], "collections/requirements.yml names another release"
    ee = _collections(EE["dependencies"]["galaxy"]["collections"])
    assert set(project) == set(ee)
    assert project["community.proxmox"] == ee["community.proxmox"]


def test_the_docs_name_the_playbooks_and_variables_the_job_templates_use():
    """docs/awx.md's job templates point at playbooks that exist (or are announced as landing)
    and at variables the playbooks and roles declare."""
    text = (REPO / "docs" / "awx.md").read_text()
    for playbook in ("playbooks/reset.yml", "playbooks/verify.yml"):
        assert playbook in text and (REPO / playbook).exists()
    assert "playbooks/reset_and_serve.yml" in text
    specs = yaml.safe_load((REPO / "roles" / "node_reset" / "meta" / "argument_specs.yml").read_text())
    assert "node_reset_install_deps" in specs["argument_specs"]["main"]["options"] and "node_reset_install_deps" in text
    for variable in ("fleet_serial", "fleet_max_fail_percentage", "fleet_report_path"):
        assert variable in text and variable in (REPO / "playbooks" / "reset.yml").read_text() + (
            REPO / "playbooks" / "fleet_report.yml").read_text(), variable


def _configure(tmp_path, *args):
    """awx/configure.yml as a user runs it, with no AWX anywhere: CONTROLLER_HOST names a closed port."""
    env = {"CONTROLLER_HOST": "https://127.0.0.1:9", "CONTROLLER_OAUTH_TOKEN": "x", "PATH": str(BIN) + ":/usr/bin:/bin",
           "ANSIBLE_PYTHON_INTERPRETER": str(BIN / "python"), "HOME": str(tmp_path)}
    return subprocess.run([str(BIN / "ansible-playbook"), "awx/configure.yml", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_awx_configuration_parses_and_hands_the_draft_model_expression_to_awx_untemplated(tmp_path):
    """Syntax check, then the reset-and-serve template's extra variables as the job_template task
    gets them: the expression AWX must template at launch, as written (not templated, nor an error,
    here where serve_draft_model is undefined)."""
    assert _configure(tmp_path, "--syntax-check").returncode == 0
    proc = subprocess.run([str(BIN / "ansible"), "localhost", "-m", "ansible.builtin.debug", "-a",
                           "msg={{ cleanslate_awx_job_templates[2].extra_vars | to_json }}", "-e", "@awx/vars.yml"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": str(BIN) + ":/usr/bin:/bin", "HOME": str(tmp_path),
                               "ANSIBLE_PYTHON_INTERPRETER": str(BIN / "python")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = json.loads(json.loads(proc.stdout.split("=>", 1)[1])["msg"])
    assert shown["inference_service_speculative"].startswith("{{ {} if not serve_draft_model"), shown


@pytest.mark.parametrize("extra, sentence", [
    ([], "cleanslate_awx_scm_url is not set"),
    (["-e", "cleanslate_awx_scm_url=https://git.invalid/x.git", "-e", "cleanslate_awx_ee_image= "],
     "cleanslate_awx_ee_image is not set"),
    (["-e", "cleanslate_awx_scm_url=u", "-e", "cleanslate_awx_ee_image=i", "-e", "cleanslate_awx_ssh_key_file=k",
      "-e", "cleanslate_awx_input_inventory=Datacenter", "-e", "cleanslate_awx_input_group=gpu' or 'x"],
     "cleanslate_awx_input_group must be the name of a group of Datacenter"),
])
def test_the_awx_configuration_refuses_missing_or_hostile_variables_before_contacting_awx(tmp_path, extra, sentence):
    proc = _configure(tmp_path, *extra)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert sentence in proc.stdout, proc.stdout[-2000:]
    assert "awx.awx" not in proc.stdout.split(sentence)[0].split("TASK [")[-1]
    assert "Register the execution environment" not in proc.stdout
