"""What reset_and_serve.yml does with each verdict of the look (issue 37): the role's own tasks,
taken from roles/inference_service/tasks/assess.yml ("Record what the look found") and gate.yml
(the gate's `baseline`), run by ansible-playbook on localhost with a registered probe result of
each verdict. The assessment's `healthy` (the playbook resets a host whose assessment is not
healthy) is the look's `needs_reset` negated: `loading` and `busy` are spared, `hung` is reset like
`unhealthy`; the gate adopts a loading server's invocation unless this run restarted the unit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
UNIT = {"InvocationID": "a" * 32, "NRestarts": "2", "MainPID": "42", "ActiveState": "active"}
PROBES = {
    "loading": {"verdict": "loading", "needs_reset": False, "unit": UNIT,
                "last_seen": "started 14 s ago, main pid 42 alive, connection refused: the model is loading (...)"},
    "busy": {"verdict": "busy", "needs_reset": False, "healthy_monotonic": 12.5, "unit": UNIT,
             "last_seen": "busy: /health answered 200 and a 1-token completion got no answer in 20 s, ..."},
    "hung": {"verdict": "hung", "needs_reset": True, "unit": UNIT,
             "last_seen": "hung: /health answered 200 but a 1-token completion got no answer in 20 s and ..."},
    "unhealthy": {"verdict": "unhealthy", "needs_reset": True, "unit": UNIT, "last_seen": "connection refused"},
    "failed": {"failed": True, "msg": "systemctl show vllm.service failed: ..."},
}


def run_tasks(tmp_path, restarted=False, started_with_files=False):
    """{verdict: (the assessment, the gate's baseline)} from the role's own task and expressions (the
    start of this run, whichever task did it: vars/main.yml's __inference_service_start)."""
    start = yaml.safe_load((REPO / "roles/inference_service/vars/main.yml").read_text())["__inference_service_start"]
    tasks = yaml.safe_load((REPO / "roles/inference_service/tasks/assess.yml").read_text())
    record = dict(next(task for task in tasks if task["name"] == "Record what the look found"))
    record.pop("when")
    gate = yaml.safe_load((REPO / "roles/inference_service/tasks/gate.yml").read_text())[0]
    baseline = gate["cleanslate.gpu.inference_ready"]["baseline"]
    plays = [{"name": name, "hosts": "localhost", "gather_facts": False,
              "vars": {"__inference_service_probe": probe, "inference_service_unit": "vllm.service"},
              "tasks": [record, {
                  "name": "Show", "ansible.builtin.copy": {
                      "dest": str(tmp_path / ("%s.json" % name)),
                      "content": "{{ {'assessment': inference_service_assessment, 'baseline': (%s)} | to_json }}"
                                 % baseline.strip().replace("{{", "").replace("}}", "")},
                  "vars": {"__inference_service_restarted": {"changed": restarted},
                           "__inference_service_started": {"skipped": True} if started_with_files else {"changed": False},
                           "__inference_service_unit_state": {"started": started_with_files},
                           "__inference_service_start": start}}]}
             for name, probe in PROBES.items()]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
                          cwd=REPO, capture_output=True, text=True, env=dict(os.environ), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return {name: json.loads((tmp_path / ("%s.json" % name)).read_text()) for name in PROBES}


def test_only_unhealthy_and_hung_are_reset_and_the_gate_adopts_a_loading_invocation(tmp_path):
    seen = run_tasks(tmp_path)
    spared = {name for name, found in seen.items() if found["assessment"]["healthy"]}
    assert spared == {"loading", "busy"}, seen
    assert seen["loading"]["assessment"]["reason"].startswith("started 14 s ago")
    assert seen["failed"]["assessment"]["verdict"] == "unhealthy"  # a look that failed is no verdict of health
    assert seen["loading"]["baseline"] == {"invocation_id": "a" * 32, "n_restarts": 2}
    assert all(found["baseline"] == {} for name, found in seen.items() if name != "loading")


def test_a_unit_this_run_restarted_is_gated_from_its_new_invocation(tmp_path):
    seen = run_tasks(tmp_path, restarted=True)
    assert seen["loading"]["baseline"] == {}, seen["loading"]


def test_a_unit_the_files_task_started_is_gated_from_its_new_invocation(tmp_path):
    """The start after a reset is the files task's (inference_files' unit.start; service.yml's start is
    skipped): a loading invocation the look saw is not the one this run started."""
    seen = run_tasks(tmp_path, started_with_files=True)
    assert seen["loading"]["baseline"] == {}, seen["loading"]
