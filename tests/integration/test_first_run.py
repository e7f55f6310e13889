"""A first run as a new user makes it (issue 29): every run that targets no GPU node fails saying
so, whatever the inventory and the limit; a successful run ends without the phrase of a run that
targeted nothing; a host that does not answer is contacted once in a whole reset."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.role_vars import node_reset_vars

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# Answers, but every module fails: its interpreter does not exist (the run ends quickly).
BROKEN = {"ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"}
# What ssh says of a black-holed host, at once and without sending anything anywhere: each
# connection attempt is one line in the log (the wrapper stands in for the ssh client).
SILENT_SSH = """#!/bin/sh
echo "$*" >> %(log)s
echo "ssh: connect to host %(host)s port 22: Connection timed out" >&2
exit 255
"""


def _playbook(playbook, tmp_path, *args):
    return subprocess.run([ANSIBLE_PLAYBOOK, f"playbooks/{playbook}.yml",
                           "-e", "fleet_report_path=%s" % (tmp_path / "reports"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


def _inventory(tmp_path, content) -> str:
    path = tmp_path / "inventory.yml"
    path.write_text(content)
    return str(path)


@pytest.mark.parametrize("playbook", ["reset", "verify", "reset_and_serve"])
@pytest.mark.parametrize("case", ["missing inventory, -l gpu_nodes", "missing inventory, -l host",
                                  "empty inventory, -l host", "typo in the path, -l gpu_nodes",
                                  "no -i, -l host"])
def test_a_run_that_targets_no_gpu_node_fails_whatever_the_inventory_and_limit(tmp_path, playbook, case):
    """The limit removes the implicit localhost, so no task of any play can run: the guard is the
    first play's `hosts`, templated before the limit applies."""
    (tmp_path / "inventory").mkdir()
    real = _inventory(tmp_path / "inventory", json.dumps({"all": {"children": {"gpu_nodes": {
        "hosts": {"gpu-a01": BROKEN}}}}}))
    args = {
        "missing inventory, -l gpu_nodes": ["-i", str(tmp_path / "no-such-file.yml"), "-l", "gpu_nodes"],
        "missing inventory, -l host": ["-i", str(tmp_path / "no-such-file.yml"), "-l", "gpu-a01"],
        "empty inventory, -l host": ["-i", _inventory(tmp_path, ""), "-l", "gpu-a01"],
        "typo in the path, -l gpu_nodes": ["-i", real.replace("inventory.yml", "inventroy.yml"), "-l", "gpu_nodes"],
        "no -i, -l host": ["-l", "gpu-a01"],
    }[case]
    proc = _playbook(playbook, tmp_path, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "no host of the group gpu_nodes matches the limit" in out, out[-3000:]
    assert "nothing would be reset or checked" in out
    assert "TASK [" not in proc.stdout  # not a task ran, on any host
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("playbook", ["reset", "verify", "reset_and_serve"])
def test_a_syntax_check_runs_nothing_and_needs_no_inventory(tmp_path, playbook):
    """--syntax-check (ansible-lint's too) templates the first play's hosts but runs nothing."""
    proc = subprocess.run([ANSIBLE_PLAYBOOK, f"playbooks/{playbook}.yml", "--syntax-check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_limit_is_applied_as_ansible_playbook_applies_it(tmp_path):
    """Exclusions and intersections: a limit that leaves no host of gpu_nodes fails, one that
    leaves one runs that host only."""
    inventory = _inventory(tmp_path, json.dumps({"all": {"hosts": {"pve1": BROKEN}, "children": {"gpu_nodes": {
        "hosts": {"gpu-a01": BROKEN, "gpu-a02": BROKEN}}}}}))
    proc = _playbook("verify", tmp_path, "-i", inventory, "-l", "all:!gpu-a01:!gpu-a02")
    assert proc.returncode != 0 and "matches the limit 'all:!gpu-a01:!gpu-a02'" in proc.stdout + proc.stderr
    assert "TASK [" not in proc.stdout
    proc = _playbook("verify", tmp_path, "-i", inventory, "-l", "gpu_nodes:&gpu-a02")
    assert proc.returncode == 2, proc.stdout[-3000:]  # the broken host fails: it was targeted
    assert "[gpu-a02]" in proc.stdout and "[gpu-a01]" not in proc.stdout


def test_a_successful_run_does_not_end_with_no_hosts_matched(crashed_node, tmp_path):
    """`skipping: no hosts matched` is what the docs name as the sign of a wrong inventory: a run
    where every host is ok must not print it (its last play ends at once, silently)."""
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(crashed_node, fleet_report_path=str(tmp_path / "reports"))))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    for playbook, returncode in (("reset", 0), ("verify", 0)):
        proc = subprocess.run([ANSIBLE_PLAYBOOK, f"playbooks/{playbook}.yml", "-i", "inventory/simulated.yml",
                               "-l", "gpu_nodes", "-e", f"@{extra}"], cwd=REPO, capture_output=True, text=True,
                              timeout=300, check=False, env=env)
        assert proc.returncode == returncode, proc.stdout[-3000:]
        assert "no hosts matched" not in proc.stdout, proc.stdout[-2000:]
        assert "PLAY [Every host is ok]" in proc.stdout
        assert "Fail the hosts that are not ok" not in proc.stdout


def test_a_check_of_a_dirty_node_never_says_every_host_is_ok(crashed_node, tmp_path):
    """reset.yml --check fails no host for GPUs in use (it stopped nothing), yet its report says
    `1 not ok`: the last play's name, the run's last word, says why no host fails, not that every
    host is ok."""
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(crashed_node, fleet_report_path=str(tmp_path / "reports"))))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/reset.yml", "-i", "inventory/simulated.yml", "-l", "gpu_nodes",
                           "-e", f"@{extra}", "--check"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False, env=dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "1 host, 1 not ok." in proc.stdout, proc.stdout[-3000:]
    assert "Every host is ok" not in proc.stdout and "every host is ok" not in proc.stdout, proc.stdout[-2000:]
    assert "PLAY [Fail no host: a check stops nothing, and the hosts not ok are dirty" in proc.stdout


@pytest.mark.parametrize("playbook", ["reset", "verify"])
def test_a_host_that_does_not_answer_is_contacted_once(tmp_path, playbook):
    """With a unit and bytecode targets (the example inventory's bare-metal hosts), a reset used
    to wait for a black-holed host three times: the bytecode check, the GPU reading, and a ping in
    the last play. Once now, and the run still exits 4 (unreachable), not 2."""
    log = tmp_path / "ssh.log"
    ssh = tmp_path / "ssh"
    ssh.write_text(SILENT_SSH % {"log": log, "host": "gpu-a01"})
    ssh.chmod(0o755)
    inventory = _inventory(tmp_path, json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"gpu-a01": {
        "ansible_connection": "ssh", "ansible_ssh_executable": str(ssh),
        "ansible_python_interpreter": "/usr/bin/python3", "node_reset_unit": "vllm.service",
        "node_reset_pycache_purge_modules": ["vllm"], "node_reset_nvml_verify_expected_count": 8}}}}}}))
    proc = _playbook(playbook, tmp_path, "-i", inventory, "-l", "gpu_nodes")
    assert proc.returncode == 4, proc.stdout[-3000:]
    assert len(log.read_text().splitlines()) == 1, log.read_text()
    report = json.loads(next((tmp_path / "reports").glob(f"{playbook}-*.json")).read_text())["hosts"][0]
    assert report["status"] == "unreachable" and report["failed_step"] == "unreachable", report
    # (What the connection said depends on whether Ansible had begun to write to ssh's stdin.)
    assert report["problems"][0].startswith("unreachable: ") and "gpu-a01" in report["problems"][0], report
    # The task's own result names no step as failed: the host did not answer.
    assert '"failed_step": "pycache_purge"' not in proc.stdout and '"failed_step": "gpu_reset"' not in proc.stdout
