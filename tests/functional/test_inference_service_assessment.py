"""What reset_and_serve.yml does with each verdict of the look (issue 37): the role's own tasks,
taken from roles/inference_service/tasks/assess.yml ("Record what the look found") and gate.yml
(the gate's `baseline`), run by ansible-playbook on localhost with a registered probe result of
each verdict. The assessment's `healthy` (the playbook resets a host whose assessment is not
healthy) is the look's `needs_reset` negated: `loading` and `busy` are spared, `hung` is reset like
`unhealthy`; the gate adopts a loading server's invocation unless this run restarted the unit."""
from __future__ import annotations

import json

import yaml

from tests.local_play import REPO, run_local_play
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
    run_local_play(tmp_path / "play.yml", plays)
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


def test_each_instance_is_assessed_from_its_own_answer_of_the_hosts_one_probe(tmp_path):
    """Several servers (issue 42): one probe looks at every instance, the first from the task's own answer,
    the others from its `servers` answers, in their order. Each instance's assessment is its own answer's:
    the hung instance is reset and its healthy neighbours are spared, whatever their place; a look that
    failed is its instance's alone; the Xid records the task read are the host's."""
    tasks = yaml.safe_load((REPO / "roles/inference_service/tasks/instances.yml").read_text())
    collect = dict(next(task for task in tasks if task["name"] == "Collect the instances' assessments into the host's"))
    collect.pop("when")
    healthy = {"verdict": "healthy", "needs_reset": False, "healthy_monotonic": 7.25, "last_seen": "HTTP 200", "unit": UNIT}
    probe = dict(PROBES["busy"], xid_look={"xid_action": None, "gpus": []},
                 servers=[PROBES["hung"], healthy, PROBES["failed"]])
    looked = [{"unit": "vllm-%s.service" % name, "gpus": [index], "look": {"url": "http://h:%d" % index}}
              for index, name in enumerate("abcd")]
    play = [{"name": "several", "hosts": "localhost", "gather_facts": False,
             "vars": {"__inference_service_probe": probe, "__inference_service_collected": looked},
             "tasks": [collect, {"name": "Show", "ansible.builtin.copy": {
                 "dest": str(tmp_path / "host.json"), "content": "{{ inference_service_assessment | to_json }}"}}]}]
    run_local_play(tmp_path / "several.yml", play)
    host = json.loads((tmp_path / "host.json").read_text())
    by_unit = {item["unit"]: item for item in host["instances"]}
    assert [item["unit"] for item in host["instances"]] == ["vllm-%s.service" % name for name in "abcd"]
    assert {unit: (item["verdict"], item["healthy"]) for unit, item in by_unit.items()} == {
        "vllm-a.service": ("busy", True), "vllm-b.service": ("hung", False), "vllm-c.service": ("healthy", True),
        "vllm-d.service": ("unhealthy", False)}, by_unit
    assert by_unit["vllm-c.service"]["healthy_seen"] == {"invocation_id": "a" * 32, "monotonic": 7.25}
    assert by_unit["vllm-d.service"]["reason"] == "the look failed: systemctl show vllm.service failed: ..."
    assert [by_unit["vllm-%s.service" % name]["gpus"] for name in "abcd"] == [[0], [1], [2], [3]]
    assert host["healthy"] is False and host["verdict"] == "hung" and host["xid_look"] == {"xid_action": None, "gpus": []}
