"""reset.yml and verify.yml as AWX job templates run them (ansible-runner, a private data
directory, the collection from the release tarball), against the simulated crashed node."""
from __future__ import annotations

import sys

from tests.release.runner import private_data_dir, run_job
from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars

SIMULATED = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# Answers, but every module fails: its interpreter does not exist.
BROKEN = {"ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"}


def _inventory(**hosts) -> dict:
    return {"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}


def test_reset_then_verify_jobs_succeed_and_their_events_carry_each_hosts_result(
        release_tarball, crashed_node, tmp_path):
    reports = tmp_path / "reports"
    worker = tmp_path / "worker"
    pdd = private_data_dir(tmp_path / "pdd", _inventory(**{"simulated-node": SIMULATED}),
                           node_reset_vars(crashed_node, fleet_report_path=str(reports)), release_tarball, worker)

    job = run_job(pdd, "playbooks/reset.yml", worker, "reset")
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-3000:]
    result = job.node_reset_results()["simulated-node"]
    assert result["status"] == "ok" and result["killed_count"] >= len(crashed_node["processes"]["worker"]), result
    report = job.fleet_report()
    assert [row["host"] for row in report["rows"]] == ["simulated-node"] and report["rows"][0]["status"] == "ok"
    assert report["json_path"].startswith(str(reports) + "/") and (reports / report["json_path"].split("/")[-1]).exists()
    assert not any(procinfo.alive(entry["pid"]) for entry in crashed_node["processes"]["worker"])
    # The rows also reach the job's artifacts (set_stats), which AWX keeps with the job.
    stats = [event["event_data"].get("artifact_data") or {} for event in job.events
             if event["event"] == "playbook_on_stats"]
    assert len(stats) == 1 and "cleanslate_gpu_fleet_report" in stats[0], stats
    kept = stats[0]["cleanslate_gpu_fleet_report"]
    assert kept["kind"] == "reset" and [row["host"] for row in kept["hosts"]] == ["simulated-node"], kept
    assert kept["hosts"][0]["status"] == "ok" and kept["json_path"] == report["json_path"], kept

    job = run_job(pdd, "playbooks/verify.yml", worker, "verify")
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-3000:]
    assert job.node_reset_results()["simulated-node"]["status"] == "clean"
    assert job.fleet_report()["rows"][0]["status"] == "clean"


def test_a_failing_host_fails_the_job_and_the_report_is_still_written(release_tarball, crashed_node, tmp_path):
    """What AWX shows as a failed job: status `failed`, rc 2; the report names both hosts and
    the events carry the failure of the host that is not ok."""
    reports = tmp_path / "reports"
    worker = tmp_path / "worker"
    pdd = private_data_dir(tmp_path / "pdd", _inventory(**{"simulated-node": SIMULATED, "broken-node": BROKEN}),
                           node_reset_vars(crashed_node, fleet_report_path=str(reports)), release_tarball, worker)
    job = run_job(pdd, "playbooks/reset.yml", worker, "reset")
    assert (job.status, job.rc) == ("failed", 2), job.stdout[-3000:]
    rows = {row["host"]: row for row in job.fleet_report()["rows"]}
    # broken-node's first module run is pycache_purge, the first of the module steps, before anything is stopped.
    assert rows["simulated-node"]["status"] == "ok", rows
    assert rows["broken-node"]["status"] == "failed at pycache_purge", rows
    assert len(list(reports.glob("reset-*.json"))) == 1 and len(list(reports.glob("reset-*.md"))) == 1
    failed = [event["event_data"] for event in job.events if event["event"] == "runner_on_failed"
              and not event["event_data"].get("ignore_errors")]
    # The first module's failure (rescued by the role), then the verdict after the report.
    assert {data["host"] for data in failed} == {"broken-node"}, failed
    assert failed[-1]["task"] == "Fail the hosts that are not ok"
    assert "broken-node is failed at pycache_purge" in failed[-1]["res"]["msg"]
