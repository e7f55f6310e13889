"""reset_and_serve.yml's first check on a mixed fleet, a real ansible-playbook run (local, no fleet): a host
with several servers (inference_service_instances) next to a host with one is checked as a host with several
servers, whichever of the two comes first in the batch.

ansible-core templates an include_role's tasks_from once, with the first host's variables, and runs that file
on every host of the batch (ansible/ansible#38838): a tasks_from chosen from a host's variables ran validate.yml
on the host with instances, so none of its instances was checked (it was refused for the single-service
executable instead, and an instance's own refusals were never said)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def test_each_host_of_a_mixed_batch_is_checked_with_its_own_servers(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    missing = tmp_path / "no-venv"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "inference_service_model": "/models/llama", "inference_service_engine_version": "0.33.0",
             "inference_service_metrics_dir": str(tmp_path / "metrics"), "inference_service_venv": str(missing)}
    hosts = {
        # First in the batch: the host whose variables ansible-core templated the include with.
        "single": dict(local),
        # Two servers on one port: refused on the controller, before the host is looked at.
        "multi": dict(local, inference_service_instances=[
            {"unit": "vllm-a.service", "port": 8001, "environment": {"CUDA_VISIBLE_DEVICES": "0"}},
            {"unit": "vllm-b.service", "port": 8001, "environment": {"CUDA_VISIBLE_DEVICES": "1"}}]),
        # One server of its own venv: refused by the instance's own check on the host.
        "own-venv": dict(local, inference_service_instances=[
            {"unit": "vllm-a.service", "port": 8001, "venv": str(tmp_path / "a-venv"),
             "environment": {"CUDA_VISIBLE_DEVICES": "0"}}]),
        # No list: refused by a sentence, whichever check it goes to (a length of 5 would be a templating error).
        "a-number": dict(local, inference_service_instances=5),
        "a-null": dict(local, inference_service_instances=None),
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/reset_and_serve.yml", "-i", str(inventory),
                           "-e", "fleet_report_path=%s" % reports],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    written = sorted(reports.glob("*.json"))
    assert len(written) == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    rows = {row["host"]: row for row in json.loads(written[0].read_text())["hosts"]}
    # Every host refused before anything was touched: the run fails them, after the report.
    assert proc.returncode == 2, proc.stdout[-4000:]
    # The host with one server: refused for its own executable, and nothing said about instances.
    assert rows["single"]["status"] == "invalid", rows["single"]
    assert rows["single"]["problems"] == [
        "inference_service: on single, the executable %s/bin/vllm does not exist or is not executable "
        "(set inference_service_executable or inference_service_venv)" % missing], rows["single"]
    # The hosts with instances: refused for what its instances are, on the controller, before the host was
    # looked at; the single-service executable (which no instance of it runs here) is not its problem.
    assert rows["multi"]["status"] == "invalid", rows["multi"]
    assert rows["multi"]["problems"] == [
        "inference_service: inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] "
        "(vllm-b.service) share the port 8001: the second server could not listen on it."], rows["multi"]
    assert rows["own-venv"]["status"] == "invalid", rows["own-venv"]
    # Named by its unit, with its own executable.
    assert rows["own-venv"]["problems"] == [
        "vllm-a.service: inference_service: on own-venv, the executable %s/bin/vllm does not exist or is not "
        "executable (set inference_service_executable or inference_service_venv)" % (tmp_path / "a-venv")], \
        rows["own-venv"]
    for host, said in (("a-number", "inference_service_instances is 5: it must be a list of instances"),
                       ("a-null", "inference_service_instances is null: it must be a list")):
        assert rows[host]["status"] == "invalid", rows[host]
        assert len(rows[host]["problems"]) == 1 and rows[host]["problems"][0].startswith(
            "inference_service: " + said), rows[host]
