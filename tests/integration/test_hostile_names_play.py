"""The inference_service role's first check on a real ansible-playbook run (local, no fleet): a served
name and a unit name that reach the role as literal text (`!unsafe` in a vars file, or `{{ '{{' }}`
escaped, so that ansible-core hands the role the Jinja text itself) are refused by the role's first
task, one sentence each, and the role never renders them: no marker file appears, and the task that
hands the unit name to the host (the look at the unit) never runs.

A Jinja text given plainly in the inventory or a vars file is the operator's own input: ansible-core
renders it before the role sees it, and that is not the role's boundary (docs/security.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def _hostile(marker: Path, what: str) -> str:
    return "{{ lookup('pipe', 'echo %s >> %s') }}" % (what, marker)


def test_hostile_served_and_unit_names_are_refused_by_the_first_check_and_never_rendered(tmp_path):
    marker = tmp_path / "rendered"
    out = tmp_path / "out"
    out.mkdir()
    # One host per way a literal Jinja text reaches the role; both run in the one playbook run.
    vars_file = tmp_path / "hostile.yml"
    vars_file.write_text("\n".join([
        "unsafe_served: !unsafe %s" % json.dumps(_hostile(marker, "served")),
        "unsafe_unit: !unsafe %s" % json.dumps(_hostile(marker, "unit") + ".service"),
        "unsafe_instance_unit: !unsafe %s" % json.dumps(
            "{%% set x = lookup('pipe', 'echo instance >> %s') %%}.service" % marker),
        "",
    ]))
    escaped = "{{ '{{' }} lookup('pipe', 'echo escaped >> %s') }}" % marker
    role = {"inference_service_model": "/models/llama", "inference_service_fail_host": False,
            "inference_service_metrics_dir": str(tmp_path / "metrics"), "inference_service_engine_version": "0.33.0"}
    hosts = {
        "unsafe": dict(role, ansible_connection="local", ansible_python_interpreter=sys.executable,
                       inference_service_served_name="{{ unsafe_served }}",
                       inference_service_unit="{{ unsafe_unit }}"),
        "escaped": dict(role, ansible_connection="local", ansible_python_interpreter=sys.executable,
                        inference_service_served_name=escaped, inference_service_unit=escaped + ".service"),
        "instances": dict(role, ansible_connection="local", ansible_python_interpreter=sys.executable,
                          inference_service_instances=[
                              {"unit": "{{ unsafe_instance_unit }}", "port": 8001, "served_name": "{{ unsafe_served }}",
                               "environment": {"CUDA_VISIBLE_DEVICES": "0"}}]),
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{
        "name": "The role's first check", "hosts": "all", "gather_facts": False,
        "vars_files": [str(vars_file)],
        "tasks": [
            # The entry point for one server and for several alike (by file name: the role's own check,
            # not ansible-core's validation task, says what is wrong).
            {"name": "Validate", "ansible.builtin.include_role": {
                "name": "cleanslate.gpu.inference_service", "tasks_from": "validate.yml"}},
            {"name": "Keep what the role said", "ansible.builtin.copy": {
                "dest": "%s/{{ inventory_hostname }}.json" % out,
                "content": "{{ {'result': inference_service_result | default({}),"
                           " 'looked': __inference_service_host_check is defined and __inference_service_host_check is not skipped}"
                           " | to_json }}"}},
        ]}]))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", str(inventory)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert not marker.exists(), "the role rendered a name it was given as text: %s" % marker.read_text()
    said = {host: json.loads((out / ("%s.json" % host)).read_text()) for host in hosts}
    for host, expected in (("unsafe", ["inference_service_served_name is ", "inference_service_unit is "]),
                           ("escaped", ["inference_service_served_name is ", "inference_service_unit is "]),
                           ("instances", ["inference_service_instances[0].served_name is ",
                                          "inference_service_instances[0].unit is "])):
        result = said[host]["result"]
        assert not said[host]["looked"], "%s: the unit name reached the host before it was checked" % host
        assert result["status"] == "failed" and result["stage"] == "validate", (host, result)
        lines = [line.removeprefix("inference_service: ") for line in result["reason"].split("\n")]
        # One sentence per name, nothing else: the first check refused them, before the host was looked at.
        assert len(lines) == 2, (host, lines)
        for line, start in zip(sorted(lines), expected):
            assert line.startswith(start), (host, line)
            assert "lookup('pipe', 'echo" in line or "lookup(\\'pipe\\'" in line, (host, line)
    # The instance is named by its index alone: its unit is no unit, shown once, in its own sentence.
    instance_lines = said["instances"]["result"]["reason"].split("\n")
    assert sum("{%" in line for line in instance_lines) == 1, instance_lines
