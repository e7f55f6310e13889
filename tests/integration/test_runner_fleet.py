"""reset.yml and verify.yml as AWX job templates run them against the fleet of real systemd hosts
over SSH: ansible-runner with a private data directory, the collection from the release tarball,
and the machine credential as AWX hands it over (env/ssh_key, loaded into an ssh-agent by the
runner; the inventory names no key file)."""
from __future__ import annotations

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_fleet_reset import HOSTS, _alive, _role_vars, _targets
from tests.integration.test_fleet_reset import crashed_fleet  # noqa: F401 pylint: disable=unused-import
from tests.release.artifact import build_tarball
from tests.release.runner import private_data_dir, run_job


@pytest.fixture(scope="module")
def release_tarball(tmp_path_factory):
    return build_tarball(tmp_path_factory.mktemp("dist"))


def _crashed_vars(manifests) -> dict:
    return {name: _role_vars(manifest) for name, manifest in manifests.items()}


def job_dir(fleet, host_vars: dict, tarball, tmp_path, report_path=None):
    """A private data directory for a job on the fleet: the inventory with each host's variables
    (`host_vars`, by host) and no key file, the key as AWX's machine credential (env/ssh_key)."""
    inventory = yaml.safe_load(fleet.inventory.read_text())
    group = inventory["all"]["children"]["gpu_nodes"]
    key = group["vars"].pop("ansible_ssh_private_key_file")
    for name, values in host_vars.items():
        group["hosts"][name].update(values)
    pdd = private_data_dir(tmp_path / "pdd", inventory, {"fleet_report_path": report_path or str(tmp_path / "reports")},
                           tarball, tmp_path / "worker")
    (pdd / "env" / "ssh_key").write_text(open(key).read())
    return pdd


def test_reset_and_verify_jobs_over_ssh_succeed_and_carry_each_hosts_result(
        fleet, crashed_fleet, release_tarball, tmp_path):  # noqa: F811 pylint: disable=redefined-outer-name
    pdd = job_dir(fleet, _crashed_vars(crashed_fleet), release_tarball, tmp_path)
    job = run_job(pdd, "playbooks/reset.yml", tmp_path / "worker", "reset")
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-6000:]
    results = job.node_reset_results()
    assert sorted(results) == list(HOSTS)
    for name, manifest in crashed_fleet.items():
        assert results[name]["status"] == "ok" and results[name]["killed_count"] == len(_targets(manifest))
        assert not any(_alive(fleet, name, pid) for pid in _targets(manifest)), name
    rows = {row["host"]: row for row in job.fleet_report()["rows"]}
    assert sorted(rows) == list(HOSTS) and all(row["status"] == "ok" for row in rows.values()), rows
    assert len(list((tmp_path / "reports").glob("reset-*.json"))) == 1

    job = run_job(pdd, "playbooks/verify.yml", tmp_path / "worker", "verify")
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-6000:]
    assert {result["status"] for result in job.node_reset_results().values()} == {"clean"}
    # Each host's verify file for node_exporter (the fleet hosts have Debian's directory): its own role.
    for name in HOSTS:
        text = (fleet.hosts[name].root / "var/lib/prometheus/node-exporter/cleanslate_gpu_node_verify.prom").read_text()
        status, = [sample.labels for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == "cleanslate_gpu_run_status"]
        assert status == {"host": name, "role": "node_verify", "status": "clean"}, text


def test_a_host_that_does_not_answer_fails_the_job_with_the_report_written(
        fleet, crashed_fleet, release_tarball, tmp_path):  # noqa: F811 pylint: disable=redefined-outer-name
    fleet.pull_plug("node3")  # power lost: a clean poweroff waits out the crashed holders
    pdd = job_dir(fleet, _crashed_vars(crashed_fleet), release_tarball, tmp_path)
    job = run_job(pdd, "playbooks/reset.yml", tmp_path / "worker", "reset")
    assert (job.status, job.rc) == ("failed", 4), job.stdout[-6000:]
    rows = {row["host"]: row for row in job.fleet_report()["rows"]}
    assert rows["node3"]["status"] == "unreachable" and rows["node1"]["status"] == rows["node2"]["status"] == "ok"
    assert {event["event_data"]["host"] for event in job.events if event["event"] == "runner_on_unreachable"} == {
        "node3"}
    assert len(list((tmp_path / "reports").glob("reset-*.json"))) == 1
