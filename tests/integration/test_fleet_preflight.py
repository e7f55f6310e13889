"""The fleet playbooks' first play (playbooks/fleet_preflight.yml, issue 17): a run that targets
no GPU node fails with a sentence that says so, and a misspelled role variable stops the run, named
with the nearest known one, once per run (unless cleanslate_allow_unknown_variables)."""
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


MISSPELLED = ["-e", "node_reset_grace_period=5", "-e", "fleet_serial=1", "-e", "inference_service_engin=vllm",
              "-e", "node_reset_zzzzzzzzzzzzzzzz=1"]


def _misspelled_inventory():
    host = dict(BROKEN, node_reset_nvml_verify_timout=5, __node_reset_mine=1, node_reset_result={})
    return {"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": host, "gpu2": BROKEN}}}}}


def test_misspelled_role_variables_stop_the_run_naming_the_nearest_known_one(tmp_path):
    """From -e and from the inventory; once each, though the run has two hosts, and before any host is
    touched (a default is often the widest choice: every GPU). The roles' own names (__node_reset_*),
    the facts they set and the playbooks' fleet_* are not named."""
    proc = _run("verify", _misspelled_inventory(), tmp_path, *MISSPELLED)
    assert proc.returncode == 2, proc.stdout[-3000:]
    out = proc.stdout + proc.stderr
    # One failure, of the run's first task (Ansible prints its message twice: the error and the result).
    (fatal,) = [line for line in proc.stdout.splitlines() if line.startswith("fatal:")]
    for wrong, near in [("node_reset_grace_period", "node_reset_gpu_reset_grace_period"),
                        ("node_reset_nvml_verify_timout", "node_reset_nvml_verify_timeout"),
                        ("inference_service_engin", "inference_service_engine")]:
        role = "node_reset" if wrong.startswith("node_reset_") else "inference_service"
        sentence = "%s is not a variable of the %s role: did you mean %s?" % (wrong, role, near)
        assert fatal.count(sentence) == 1, (sentence, out[-4000:])
    assert ("node_reset_zzzzzzzzzzzzzzzz is not a variable of the node_reset role (ansible-doc -t"
            " role cleanslate.gpu.node_reset lists its variables).") in out
    assert "set cleanslate_allow_unknown_variables=true" in out
    for quiet in ("__node_reset_mine", "node_reset_result is", "fleet_serial is"):
        assert quiet not in out, quiet
    assert "TASK [cleanslate.gpu.node_reset" not in proc.stdout and not (tmp_path / "reports").exists()


def test_with_unknown_names_allowed_they_are_warned_about_and_the_run_goes_on(tmp_path):
    proc = _run("verify", _misspelled_inventory(), tmp_path, *MISSPELLED,
                "-e", "cleanslate_allow_unknown_variables=true")
    assert proc.returncode == 2, proc.stdout[-3000:]  # the broken hosts fail; the warnings do not
    out = proc.stdout + proc.stderr
    assert ("node_reset_grace_period is not a variable of the node_reset role: did you mean"
            " node_reset_gpu_reset_grace_period?") in out, out[-3000:]
    assert "TASK [cleanslate.gpu.node_reset" in proc.stdout and list((tmp_path / "reports").glob("verify-*.json"))


def test_a_run_with_known_variables_only_warns_about_nothing(tmp_path):
    proc = _run("verify", {"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": BROKEN}}}}}, tmp_path,
                "-e", "node_reset_gpu_reset_grace_period=5")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "is not a variable of" not in proc.stdout + proc.stderr
