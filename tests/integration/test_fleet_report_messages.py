"""What an operator reads in the fleet report after a run (issue 17): each problem once, one per line, and counts,
sizes and seconds that mean what they say."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import sim
from tests.fixtures.fake_nvml import FakeNvml
from tests.sim.role_vars import node_reset_vars

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


@pytest.fixture
def crashed_8gpu_node(tmp_path, fake_nvml_lib):
    root = tmp_path / "node8"
    manifest = sim.crash(root, gpus=8, tp=8, lib_dir=fake_nvml_lib)
    try:
        yield manifest
    finally:
        sim.clean(root)


def _play(name, manifest, tmp_path, *args, **overrides):
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"), **overrides)))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    return subprocess.run([ANSIBLE_PLAYBOOK, f"playbooks/{name}.yml", "-i", "inventory/simulated.yml",
                           "-l", "gpu_nodes", "-e", f"@{extra}", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False, env=env)


def _report(tmp_path, name):
    found = sorted((tmp_path / "reports").glob(f"{name}-*.json"))
    assert found, "no report"
    return json.loads(found[-1].read_text())["hosts"][0], found[-1].with_suffix(".md").read_text()


def test_a_dirty_8_gpu_host_says_each_gpus_problem_once_one_per_line(crashed_8gpu_node, tmp_path):
    """Memory stuck on all 8 GPUs after the reset: each GPU's sentence is printed once (in the
    report's list, one line each), the failure names the host and its status without repeating
    them, and the JSON row has each once. Before: three copies of each, ~13.7 KB of output."""
    manifest = crashed_8gpu_node
    nvml = FakeNvml(manifest["nvml"]["state_dir"])
    for index in range(8):
        nvml.inject("stuck_memory", gpu=index, mib=500)
    proc = _play("reset", manifest, tmp_path, node_reset_nvml_verify_timeout=1)
    assert proc.returncode == 2, proc.stdout[-3000:]
    row, markdown = _report(tmp_path, "reset")
    assert row["status"] == "dirty"
    for index in range(8):
        head = "GPU %d (" % index
        assert proc.stdout.count(head) == 1, (index, proc.stdout[-6000:])
        assert sum(problem.startswith(head) for problem in row["problems"]) == 1, row["problems"]
        assert markdown.count(head) == 1
    assert len(row["problems"]) == len(set(row["problems"])) == 8, row["problems"]
    assert "simulated-node is dirty: its problems are listed in the fleet report above" in proc.stdout
    listed = [line for line in markdown.splitlines() if line.startswith("  - GPU ")]
    assert len(listed) == 8, markdown
    assert "1 host, 1 not ok." in markdown.splitlines()
    # The host's own seconds: the sum of its steps' measured times.
    assert row["seconds"] == pytest.approx(sum(row["seconds_per_step"].values()), abs=0.011), row
    # The report once (its Markdown, with each stopped process) and the run's frame (the task lines,
    # the recap: 3.5 KB here); the 8 problems printed twice more (as before) add 2.4 KB beyond it.
    assert len(proc.stdout) < len(markdown) + 4500, (len(proc.stdout), len(markdown))


def test_a_skipped_step_has_no_seconds(crashed_node, tmp_path):
    """No pycache paths or modules: pycache_purge is skipped and has no time of its own."""
    proc = _play("reset", crashed_node, tmp_path, node_reset_pycache_purge_paths=[])
    assert proc.returncode == 0, proc.stdout[-3000:]
    row, _markdown = _report(tmp_path, "reset")
    assert "pycache_purge" not in row["seconds_per_step"], row
    # shm_before: shm_clean's look before anything is signalled (which segments a stopped process held);
    # evidence: what was kept before the first signal.
    assert set(row["seconds_per_step"]) == {"evidence", "shm_before", "gpu_reset", "shm_clean", "nvml_verify"}, row
    assert row["seconds"] == pytest.approx(sum(row["seconds_per_step"].values()), abs=0.011), row


def test_reset_and_serve_refuses_bad_service_variables_in_one_line_each_and_reports_invalid(tmp_path):
    """inference_service's variables: a type, a range and a secret of the wrong type, each one
    line (the secret's value never shown), the host `invalid` in the report, and no argument spec
    dump (ansible-core's validation task printed the whole spec and ended the host before the
    report; the range assertion listed all nine rules)."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"node1": {
        "ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"}}}}}}))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"fleet_report_path": str(tmp_path / "reports"), "inference_service_model": "m",
                                 "inference_service_engine_version": "0.33.0", "inference_service_port": "abc",
                                 "inference_service_poll_interval": "nan", "inference_service_secrets": "hunter2"}))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/reset_and_serve.yml", "-i", str(inventory), "-e", f"@{extra}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    row, _markdown = _report(tmp_path, "reset_and_serve")
    assert row["status"] == "invalid", row
    assert row["problems"] == [
        "inference_service: "
        'inference_service_port is "abc": it must be a TCP port from 1 to 65535.',
        'inference_service_poll_interval is "nan": it must be a number of seconds above 0, at most 3600.',
        "inference_service_secrets is (hidden): it must be a mapping of names to values."], row["problems"]
    assert "hunter2" not in proc.stdout + proc.stderr
    assert "argument_spec_data" not in proc.stdout and "out of range: ready_timeout" not in proc.stdout
