"""reset.yml inside the execution environment that `make ee` built from execution-environment.yml,
as an AWX execution node runs a job: `ansible-runner worker` in the EE container (podman), fed by
`ansible-runner transmit` and read back by `ansible-runner process`, against the fleet over SSH.

The EE holds no psutil and no nvidia-ml-py (they belong on the hosts, which have them), and no
project collection is installed for the job: the collection comes from the image.
Marked `ee`: `make ee` builds the image and runs this; `make integration` leaves it out.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from tests.integration.test_fleet_reset import HOSTS, _alive, _role_vars, _targets
from tests.integration.test_fleet_reset import crashed_fleet  # noqa: F401 pylint: disable=unused-import
from tests.integration.test_runner_fleet import job_dir
from tests.release.artifact import REPO
from tests.release.runner import run_job

pytestmark = pytest.mark.ee
VERSION = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
IMAGE = os.environ.get("CLEANSLATE_EE_IMAGE", f"localhost/cleanslate-gpu-ee:{VERSION}")
PODMAN_ENV = dict(os.environ, CONTAINERS_CONF=str(REPO / "tools" / "ee" / "containers.conf"))
# The worker's private data directory inside the container: /runner is the EE's work directory.
WORKER_DIR = "/runner/job"


def _podman(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=PODMAN_ENV, capture_output=True, text=True, timeout=300, check=check)


@pytest.fixture(scope="module")
def image():
    if _podman("image", "exists", IMAGE, check=False).returncode != 0:
        if os.environ.get("CLEANSLATE_EE_IMAGE"):
            pytest.fail(f"{IMAGE} does not exist: tools/ee/build.py did not build it")
        pytest.skip(f"{IMAGE} does not exist: `make ee` builds it and runs this test")
    return IMAGE


def test_the_image_has_the_controller_side_and_none_of_the_hosts_libraries(image):
    script = ("import importlib.util, json, ansible.release, ansible_runner; print(json.dumps({"
              "'core': ansible.release.__version__, 'paramiko': bool(importlib.util.find_spec('paramiko')), "
              "'psutil': bool(importlib.util.find_spec('psutil')), 'pynvml': bool(importlib.util.find_spec('pynvml'))}))")
    found = json.loads(_podman("run", "--rm", image, "python3", "-c", script).stdout)
    assert found == {"core": "2.19.14", "paramiko": True, "psutil": False, "pynvml": False}, found
    listing = _podman("run", "--rm", image, "ansible-galaxy", "collection", "list", "--format", "json").stdout
    collections = {name: info["version"] for names in json.loads(listing).values() for name, info in names.items()}
    assert collections.get("cleanslate.gpu") == VERSION and collections.get("community.proxmox") == "1.4.0", collections


def test_reset_runs_inside_the_ee_against_the_fleet_with_the_report_in_the_artifacts(
        image, fleet, crashed_fleet, tmp_path):  # noqa: F811 pylint: disable=redefined-outer-name
    ident = "reset"
    pdd = job_dir(fleet, {name: _role_vars(manifest) for name, manifest in crashed_fleet.items()}, None, tmp_path,
                  report_path=f"{WORKER_DIR}/artifacts/{ident}/reports")
    worker = ["podman", "run", "--rm", "-i", "--network", "host", image,
              "ansible-runner", "worker", "--private-data-dir", WORKER_DIR]
    os.environ["CONTAINERS_CONF"] = PODMAN_ENV["CONTAINERS_CONF"]  # the worker's podman
    job = run_job(pdd, "playbooks/reset.yml", tmp_path / "unused", ident, worker=worker)
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-6000:]
    results = job.node_reset_results()
    assert sorted(results) == list(HOSTS) and {r["status"] for r in results.values()} == {"ok"}, results
    for name, manifest in crashed_fleet.items():
        assert not any(_alive(fleet, name, pid) for pid in _targets(manifest)), name
    # Written inside the container, under the worker's artifacts: streamed back with them.
    reports = pdd / "artifacts" / ident / "reports"
    (report,) = reports.glob("reset-*.json")
    assert sorted(row["host"] for row in json.loads(report.read_text())["hosts"]) == list(HOSTS)
    assert "/usr/share/ansible/collections/ansible_collections/cleanslate/gpu" in job.stdout or any(
        "/usr/share/ansible/collections/ansible_collections/cleanslate/gpu/" in json.dumps(event.get("event_data", {}))
        for event in job.events)
