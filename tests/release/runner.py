"""A job run as AWX runs it: ansible-runner with a private data directory.

AWX lays out the private data directory on its control node (the project checkout, the inventory,
env/extravars and env/envvars, the collections that the project's collections/requirements.yml
names, installed under requirements_collections), then streams it to an execution node:
`ansible-runner transmit` there, `ansible-runner worker` on the execution node, and `ansible-runner
process` back on the control node, which writes the artifacts (status, rc, stdout and one JSON file
per job event). Receptor carries the stream between nodes; here a pipe does.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.release.artifact import BIN, REPO, install_tarball
from tools.checkout_copy import copy_checkout


@dataclass
class Job:
    status: str
    rc: int
    stdout: str
    events: list = field(default_factory=list)

    def ok_results(self, predicate) -> dict:
        """{host: res} of the runner_on_ok events whose event_data passes `predicate`."""
        return {event["event_data"]["host"]: event["event_data"]["res"] for event in self.events
                if event["event"] == "runner_on_ok" and predicate(event["event_data"])}

    def node_reset_results(self) -> dict:
        """{host: node_reset_result} as the set_fact events carry them (what AWX shows per host)."""
        found = self.ok_results(lambda data: "node_reset_result" in data.get("res", {}).get("ansible_facts", {}))
        return {host: res["ansible_facts"]["node_reset_result"] for host, res in found.items()}

    def fleet_report(self) -> dict:
        """The fleet_report task's result (rows, paths, table), from its event."""
        found = self.ok_results(lambda data: data.get("task_action") == "cleanslate.gpu.fleet_report")
        assert len(found) == 1, "no single fleet_report event: %s" % sorted(found)
        return next(iter(found.values()))


def private_data_dir(pdd: Path, inventory: dict, extravars: dict, tarball: Path | None = None,
                     worker_dir: Path | None = None, envvars: dict | None = None) -> Path:
    """Lay out `pdd` as AWX does for a job of a project that is this repository.

    With `tarball`, the collection comes from the release tarball, installed under
    requirements_collections (AWX installs the project's collections/requirements.yml there;
    Galaxy is not reachable here), and ANSIBLE_COLLECTIONS_PATH names where the worker will find
    it, as AWX names /runner/requirements_collections. Without it, the execution environment's
    own collections are used (/usr/share/ansible/collections, in the project's ansible.cfg)."""
    copy_checkout(REPO, pdd / "project")
    variables = dict(envvars or {})
    if tarball:
        install_tarball(tarball, pdd / "requirements_collections", pdd)
        (pdd / "ansible.cfg").unlink(missing_ok=True)  # install_tarball's own config, not AWX's
        variables.update(ANSIBLE_COLLECTIONS_PATH=str(worker_dir / "requirements_collections"),
                         ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False")
    (pdd / "inventory").mkdir()
    (pdd / "inventory" / "hosts").write_text(json.dumps(inventory))
    (pdd / "env").mkdir()
    (pdd / "env" / "extravars").write_text(yaml.safe_dump(extravars))
    if variables:
        (pdd / "env" / "envvars").write_text(yaml.safe_dump(variables))
    return pdd


def run_job(pdd: Path, playbook: str, worker_dir: Path, ident: str, timeout: float = 540,
            limit: str = "gpu_nodes", worker: list | None = None) -> Job:
    """transmit | worker | process, as AWX's control and execution nodes do; the artifacts land in
    pdd/artifacts/IDENT. `worker`: the worker's command line, e.g. `podman run -i <EE>
    ansible-runner worker ...` as an execution node runs it in the job's execution environment;
    by default `ansible-runner worker` on this machine, in worker_dir."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")
           and key != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    runner = str(BIN / "ansible-runner")
    transmit = subprocess.Popen([runner, "transmit", str(pdd), "-p", playbook, "--ident", ident, "--limit", limit],
                                stdout=subprocess.PIPE, env=env)
    worker = subprocess.Popen(worker or [runner, "worker", "--private-data-dir", str(worker_dir), "--delete"],
                              stdin=transmit.stdout, stdout=subprocess.PIPE, env=env)
    transmit.stdout.close()
    process = subprocess.run([runner, "process", str(pdd), "--ident", ident], stdin=worker.stdout,
                             capture_output=True, text=True, env=env, timeout=timeout, check=False)
    worker.stdout.close()
    codes = (transmit.wait(timeout=60), worker.wait(timeout=60))
    artifacts = pdd / "artifacts" / ident
    assert artifacts.is_dir(), process.stdout[-3000:] + process.stderr[-3000:]
    files = sorted((artifacts / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-")[0]))
    events = [json.loads(path.read_text()) for path in files]
    job = Job(status=(artifacts / "status").read_text().strip(), rc=int((artifacts / "rc").read_text()),
              stdout=(artifacts / "stdout").read_text(), events=events)
    # The worker exits with the playbook's status; AWX reads the job's from the stream, as here.
    assert codes == (0, job.rc), "transmit, worker exit statuses: %s\n%s" % (codes, process.stderr)
    return job
