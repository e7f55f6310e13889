"""The fleet playbooks' first play (playbooks/fleet_preflight.yml, issue 17): a run that targets
no GPU node fails with a sentence that says so, and a misspelled role variable is named with the
nearest known one, once per run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# Answers, but every module fails: its interpreter does not exist (the run ends quickly).
BROKEN = {"ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"}
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def _run(playbook, inventory, tmp_path, *args):
    path = tmp_path / "inventory.yml"
    path.write_text(json.dumps(inventory))
    return subprocess.run([ANSIBLE_PLAYBOOK, f"playbooks/{playbook}.yml", "-i", str(path),
                           "-e", "fleet_report_path=%s" % (tmp_path / "reports"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("playbook", ["reset", "verify", "reset_and_serve"])
@pytest.mark.parametrize("inventory, limit, where", [
    # The limit matches a host, but none of gpu_nodes.
    ({"all": {"hosts": {"pve": LOCAL}, "children": {"gpu_nodes": {"hosts": {"gpu1": BROKEN}}}}}, ["-l", "pve"],
     "matches the limit pve"),
    # A wrong inventory: no gpu_nodes group at all, no limit.
    ({"all": {"hosts": {"other": LOCAL}}}, [], "matches this inventory, which has no such group"),
    # The group is there but empty.
    ({"all": {"hosts": {"other": LOCAL}, "children": {"gpu_nodes": {}}}}, [], "matches this inventory"),
    # An empty inventory: only the implicit localhost.
    ({"all": {}}, [], "matches this inventory"),
])
def test_a_run_that_targets_no_gpu_node_fails_with_a_sentence(tmp_path, playbook, inventory, limit, where):
    proc = _run(playbook, inventory, tmp_path, *limit)
    assert proc.returncode != 0, proc.stdout[-3000:]
    # The guard is the first play's hosts (issue 29): Ansible's error, on stderr.
    assert "no host of the group gpu_nodes %s" % where in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "TASK [cleanslate.gpu" not in proc.stdout  # no role ran
    assert not (tmp_path / "reports").exists()


def test_misspelled_role_variables_are_named_with_the_nearest_known_one(tmp_path):
    """From -e and from the inventory; once each, though the run has two hosts. The roles' own
    names (__node_reset_*), the facts they set and the playbooks' fleet_* are not warned about."""
    host = dict(BROKEN, node_reset_nvml_verify_timout=5, __node_reset_mine=1, node_reset_result={})
    inventory = {"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": host, "gpu2": BROKEN}}}}}
    proc = _run("verify", inventory, tmp_path, "-e", "node_reset_grace_period=5", "-e", "fleet_serial=1",
                "-e", "inference_service_engin=vllm", "-e", "node_reset_zzzzzzzzzzzzzzzz=1")
    assert proc.returncode == 2, proc.stdout[-3000:]  # the broken hosts fail; the warnings do not
    out = proc.stdout + proc.stderr
    for wrong, near in [("node_reset_grace_period", "node_reset_gpu_reset_grace_period"),
                        ("node_reset_nvml_verify_timout", "node_reset_nvml_verify_timeout"),
                        ("inference_service_engin", "inference_service_engine")]:
        role = "node_reset" if wrong.startswith("node_reset_") else "inference_service"
        sentence = "%s is not a variable of the %s role, and is ignored: did you mean %s?" % (wrong, role, near)
        assert out.count(sentence) == 1, (sentence, out[-4000:])
    assert ("node_reset_zzzzzzzzzzzzzzzz is not a variable of the node_reset role, and is ignored (ansible-doc -t"
            " role cleanslate.gpu.node_reset lists its variables).") in out
    for quiet in ("__node_reset_mine", "node_reset_result is", "fleet_serial is"):
        assert quiet not in out, quiet


def test_a_run_with_known_variables_only_warns_about_nothing(tmp_path):
    proc = _run("verify", {"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": BROKEN}}}}}, tmp_path,
                "-e", "node_reset_gpu_reset_grace_period=5")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "is not a variable of" not in proc.stdout + proc.stderr
