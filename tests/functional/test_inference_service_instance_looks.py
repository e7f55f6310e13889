"""Issue 42: the validate step looks at the host once for every instance of a node (instances.yml),
and each instance's validation takes its own answer (validate.yml's __inference_service_instance_look):
picked by its unit, never by its place; none for an instance whose options the look refused or for a
host that did not answer (that instance then looks itself, and says why in its own words); none in
another step, whose look would be older than the run's. The role's own expression, run by
ansible-playbook on localhost with a registered look."""
from __future__ import annotations

import json

import yaml

from tests.local_play import REPO, run_local_play


def answer(unit, version):
    return {"unit": {"name": unit, "file": "managed"}, "engine": {"version": version}, "changed": False}


def taken(tmp_path, looks, cases) -> dict:
    """{case: the look the instance takes} for each (case, unit, step, in a loop)."""
    tasks = yaml.safe_load((REPO / "roles/inference_service/tasks/validate.yml").read_text())
    block = next(task for task in tasks if task["name"] == "Check the configuration")
    expression = block["vars"]["__inference_service_instance_look"]
    plays = [{"name": case, "hosts": "localhost", "gather_facts": False,
              "vars": dict({"__inference_service_instance_looks": looks, "inference_service_unit": unit,
                            "__inference_service_step": step, "__inference_service_instance_look": expression},
                           **({"__inference_service_instance": {"unit": unit}} if in_loop else {})),
              "tasks": [{"name": "Show", "ansible.builtin.copy": {
                  "dest": str(tmp_path / ("%s.json" % case)), "content": "{{ __inference_service_instance_look | to_json }}"}}]}
             for case, unit, step, in_loop in cases]
    run_local_play(tmp_path / "looks.yml", plays)
    return {case: json.loads((tmp_path / ("%s.json" % case)).read_text()) for case, *dummy in cases}


def test_each_instance_takes_its_own_answer_by_unit_and_none_where_it_has_none(tmp_path):
    # The module answers in the instances' order; the units here are not in that order's alphabet.
    looks = dict(answer("vllm-c.service", "0.32.0"), instances=[
        answer("vllm-a.service", "0.31.0"),
        {"failed": True, "msg": "instances[1]: unit must be a unit name such as vllm.service, got 'b/x'"},
        answer("vllm-d.service", "0.30.0")])
    seen = taken(tmp_path, looks, [("c", "vllm-c.service", "validate", True), ("a", "vllm-a.service", "validate", True),
                                   ("d", "vllm-d.service", "validate", True), ("b", "b/x", "validate", True),
                                   ("serve", "vllm-a.service", "serve", True), ("one", "vllm-a.service", "validate", False)])
    assert seen["c"]["engine"]["version"] == "0.32.0" and seen["c"]["instances"] == [], seen["c"]
    assert seen["a"]["engine"]["version"] == "0.31.0" and seen["d"]["engine"]["version"] == "0.30.0", seen
    assert seen["b"] == {} and seen["serve"] == {} and seen["one"] == {}, seen


def test_a_host_that_did_not_answer_gives_no_instance_a_look(tmp_path):
    unreachable = {"unreachable": True, "msg": "Failed to connect to the host via ssh", "changed": False}
    skipped = {"skipped": True, "changed": False}
    seen = taken(tmp_path, unreachable, [("a", "vllm-a.service", "validate", True)])
    seen.update({"skipped": taken(tmp_path, skipped, [("skipped", "vllm-a.service", "validate", True)])["skipped"]})
    assert seen == {"a": {}, "skipped": {}}, seen
