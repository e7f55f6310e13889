"""The inference_service role in a user's own play (docs/inference_service.md, "In your own play"): the
entry points validate, assess and serve, each for a host with two instances (inference_service_instances),
on the local simulated node (inventory/simulated.yml), a real ansible-playbook run.

No systemd runs here: the play is run with --check (nothing is written, no unit is started) and a
`systemctl` of the test's own answers that no unit is installed. What is checked is what each step
did for each instance with that instance's own variables: assess's look per unit, serve's command
line per unit (its port, its served name), and that serve took validate's findings for each instance
instead of checking it again (the host look runs once per instance in the play that validates first,
and serve alone checks each instance itself)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
LOOK = "Look at the engine's version, the executable, the user, the secrets' directory and the units on the host"
LOOK_ALL = "Look at the host for every instance, in one host contact"
# `systemctl show` of a unit that is not installed: the values alone (--value, service.yml's read)
# or key=value lines (the readiness module's look).
SYSTEMCTL = r'''#!/bin/sh
case " $* " in
  *" --value "*) printf 'not-found\ninactive\n' ;;
  *" show "*) printf 'LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\nMainPID=0\n'
             printf 'NRestarts=0\nInvocationID=\nExecMainStatus=0\nExecMainStartTimestampMonotonic=0\nControlGroup=\n' ;;
esac
'''
INSTANCES = [
    {"unit": "vllm-a.service", "port": 8001, "served_name": "model-a", "environment": {"CUDA_VISIBLE_DEVICES": "0"}},
    {"unit": "vllm-b.service", "port": 8002, "served_name": "model-b", "environment": {"CUDA_VISIBLE_DEVICES": "1"}},
]


def _include(step: str) -> dict:
    return {"name": "The role's %s" % step, "ansible.builtin.include_role": {
        "name": "cleanslate.gpu.inference_service", "tasks_from": step}}


def _keep(out: Path, step: str, fact: str) -> dict:
    """A task writing the fact the step set, also under --check."""
    return {"name": "Keep what %s said" % step, "check_mode": False, "ansible.builtin.copy": {
        "dest": "%s/%s.json" % (out, step), "content": "{{ %s | default({}) | to_json }}" % fact}}


def _play(tmp_path: Path, name: str, tasks: list, instances=None, **more) -> subprocess.CompletedProcess:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "vllm").write_text("#!/bin/sh\nexit 0\n")
    (venv / "bin" / "vllm").chmod(0o755)
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "systemctl").write_text(SYSTEMCTL)
    (fake / "systemctl").chmod(0o755)
    playbook = tmp_path / ("%s.yml" % name)
    playbook.write_text(json.dumps([{"name": "My own play", "hosts": "gpu_nodes", "gather_facts": False,
                                     "tasks": tasks}]))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({
        "inference_service_model": "/models/llama", "inference_service_engine_version": "0.33.0",
        "inference_service_venv": str(venv), "inference_service_config_dir": str(tmp_path / "config"),
        "inference_service_metrics_dir": str(tmp_path / "metrics"), "inference_service_instances": instances or INSTANCES,
        **more}))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable, PATH="%s:%s" % (fake, os.environ["PATH"]))
    return subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "--check", "-i", "inventory/simulated.yml",
                           "-l", "gpu_nodes", "-e", "@%s" % extra],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)


def _looks(proc: subprocess.CompletedProcess, name: str = LOOK) -> int:
    """How many times the host look ran (each a host contact; a skipped one is none)."""
    tasks = proc.stdout.split("\nTASK [")
    return sum(1 for task in tasks if task.split("\n", 1)[0].find(name) >= 0
               and "\nok: [simulated-node]" in task)


def _by_unit(items: list) -> dict:
    return {item["unit"]: item for item in items}


def test_validate_assess_and_serve_each_act_on_each_instance_with_its_own_variables(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = _play(tmp_path, "steps", [
        _include("validate"), _keep(out, "validate", "inference_service_result"),
        _include("assess"), _keep(out, "assess", "inference_service_assessment"),
        _include("serve"), _keep(out, "serve", "inference_service_result")])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # validate refused nothing, and serve took what it found for each instance: one look at the host for
    # both instances (issue 42), none of its own for either.
    assert json.loads((out / "validate.json").read_text()) == {}
    assert _looks(proc, LOOK_ALL) == 1 and _looks(proc) == 0, proc.stdout[-4000:]

    assessment = json.loads((out / "assess.json").read_text())
    assessed = _by_unit(assessment["instances"])
    assert sorted(assessed) == ["vllm-a.service", "vllm-b.service"], assessment
    assert assessed["vllm-a.service"]["gpus"] == [0] and assessed["vllm-b.service"]["gpus"] == [1], assessment
    assert assessment["healthy"] is False  # no unit is installed here

    result = json.loads((out / "serve.json").read_text())
    served = _by_unit(result["instances"])
    assert sorted(served) == ["vllm-a.service", "vllm-b.service"], result
    for unit, port, name in (("vllm-a.service", 8001, "model-a"), ("vllm-b.service", 8002, "model-b")):
        # Each instance's own command line: another instance's check never stands in for its own.
        assert served[unit]["status"] == "check" and served[unit]["ok"], served[unit]
        assert "--port %d" % port in served[unit]["command_line"], served[unit]
        assert served[unit]["served_name"] == name and served[unit]["url"].endswith(":%d" % port), served[unit]
    assert result["ok"] is True and result["host"] == "simulated-node", result


def test_serve_alone_checks_each_instance_first(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = _play(tmp_path, "serve", [_include("serve"), _keep(out, "serve", "inference_service_result")])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert _looks(proc) == 2, proc.stdout[-4000:]
    served = _by_unit(json.loads((out / "serve.json").read_text())["instances"])
    assert "--port 8001" in served["vllm-a.service"]["command_line"], served
    assert "--port 8002" in served["vllm-b.service"]["command_line"], served


def test_an_instance_validate_refused_is_not_served_after_a_neighbour_it_let_through(tmp_path):
    """Whether validate let a server's settings through is said once per server (checked.yml, issue 42): a
    server refused after a neighbour that passed is checked again by serve, refused in its own words and
    left unserved, and the neighbour is served. Kept from the neighbour, the answer would serve it."""
    out = tmp_path / "out"
    out.mkdir()
    instances = [INSTANCES[0], dict(INSTANCES[1], extra_args=["--no-such-flag"])]
    proc = _play(tmp_path, "refused", [_include("validate"), _include("serve"),
                                       _keep(out, "serve", "inference_service_result")],
                 instances=instances, inference_service_fail_host=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    served = _by_unit(json.loads((out / "serve.json").read_text())["instances"])
    assert served["vllm-a.service"]["status"] == "check" and "--port 8001" in served["vllm-a.service"]["command_line"]
    refused = served["vllm-b.service"]
    assert refused["stage"] == "validate" and not refused["ok"], refused
    assert "--no-such-flag is not an option of vllm 0.33.0" in refused["reason"], refused
    # serve looked at the host once more for the refused server alone, and built no command line for it.
    assert _looks(proc) == 1 and "--port 8002" not in refused.get("command_line", ""), proc.stdout[-4000:]


def test_rotation_out_takes_each_instance_out_under_its_own_name_and_a_balancer_not_told_fails_the_host(tmp_path):
    """The entry point rotation_out in a user's play (issue 40): each instance is its own server on
    the balancer; a balancer that cannot be told fails the host, before the play stops anything."""
    instances = [dict(item, rotation_server="node1-" + item["unit"][5]) for item in INSTANCES]
    hook = {"balancer": "command", "host": "localhost", "command": ["/bin/true"], "marker_dir": str(tmp_path / "m")}
    proc = _play(tmp_path, "out", [_include("rotation_out")], instances=instances, inference_service_rotation=hook)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # --check: the hook is not run; the balancer's one call names each server as it would move it.
    assert "changed: [simulated-node -> localhost] => (item=node1-a, node1-b)" in proc.stdout, proc.stdout[-4000:]
    socket = str(tmp_path / "no-such.sock")
    proc = _play(tmp_path, "out", [_include("rotation_out"), {"name": "Stop the servers", "ansible.builtin.debug":
                                                              {"msg": "STOPPING"}}],
                 instances=instances, inference_service_rotation={"host": "localhost", "backend": "vllm", "socket": socket,
                                                                  "marker_dir": str(tmp_path / "m")})
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert "not reset, the server still takes traffic: there is no HAProxy socket at %s" % socket in proc.stdout
    assert "STOPPING" not in proc.stdout  # the host failed before the play's next task
