"""The files an AWX project of this repository reads agree with the collection they run:
collections/requirements.yml names this release and the execution environment's collections."""
from __future__ import annotations

import yaml

from tests.release.artifact import REPO

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
