"""cleanslate.gpu.reset_steps, as a playbook calls it: the four modules in the reset's order, in
one task, stopping at the first that fails, with check and diff mode passed to each."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.sim import procinfo

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def _run(tmp_path: Path, env: dict, steps, *args) -> tuple:
    """One play on this machine: reset_steps with `steps` as its arguments; returns (process,
    the registered result)."""
    out = tmp_path / "result.json"
    out.unlink(missing_ok=True)
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [
            {"name": "Run the steps", "cleanslate.gpu.reset_steps": steps, "environment": env,
             "register": "result", "ignore_errors": True},
            {"name": "Keep the result", "delegate_to": "localhost", "check_mode": False,
             "ansible.builtin.copy": {"content": "{{ result | to_json }}", "dest": str(out)}},
        ]}]))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


def _steps(manifest: dict, **changes) -> dict:
    """The four steps aimed at the simulated node, as the node_reset role aims them."""
    steps = {
        "gpu_reset": {"device_paths": manifest["device_paths"], "grace_period": 3,
                      "cmdline_patterns": [manifest["api_server_pattern"]]},
        "shm_clean": {"path": manifest["shm_dir"]},
        "pycache_purge": {"paths": [manifest["site_packages"]["path"]], "python": manifest["python"]},
        "nvml_verify": {"expected_count": manifest["gpu_count"], "timeout": 10},
    }
    steps.update(changes)
    return {name: value for name, value in steps.items() if value is not None}


def _pids(manifest: dict, *roles) -> list:
    return [entry["pid"] for role in roles for entry in manifest["processes"][role]]


def test_the_steps_run_in_order_and_leave_the_node_clean(crashed_node, tmp_path):
    manifest = crashed_node
    proc, result = _run(tmp_path, manifest["nvml"]["env"], _steps(manifest))
    assert "failed" not in result or not result["failed"], result.get("msg")
    assert list(result["steps"]) == ["pycache_purge", "shm_before", "gpu_reset", "shm_clean", "nvml_verify"]
    assert result["changed"] is True
    # The look before the signals: who held each leftover then (the worker the reset then stopped).
    held = {item["path"]: item["pids"] for item in result["steps"]["shm_before"]["in_use"]}
    assert {item["path"]: [item["pid"]] for item in manifest["shm"]["in_use"]}.items() <= held.items(), held
    assert not any(procinfo.alive(pid) for pid in _pids(manifest, "api_server", "worker"))
    assert all(procinfo.alive(pid) for pid in _pids(manifest, "bystander", "persistenced"))
    assert not any(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert not Path(manifest["site_packages"]["pyc"]).exists()
    assert result["steps"]["nvml_verify"]["ok"] is True, result["steps"]["nvml_verify"].get("msg")
    # Each step's own result, as the module returns it.
    assert {entry["pid"] for entry in result["steps"]["gpu_reset"]["killed"]} >= set(_pids(manifest, "worker"))
    assert result["steps"]["shm_clean"]["bytes_freed"] > 0
    # The real step removed every leftover and says so: the look before it removed none.
    assert {entry["path"] for entry in result["steps"]["shm_clean"]["removed"]} >= set(manifest["shm"]["leftovers"])


def test_the_steps_reach_the_host_as_one_module_run(crashed_node, tmp_path):
    """Issue 42: the four steps, the evidence and the look before the signals are one module run on
    the host (one host contact, one interpreter), not one each; each step still answers as its own
    module, in the reset's order."""
    manifest = crashed_node
    evidence = {"path": str(tmp_path / "evidence"), "cmdline_patterns": [manifest["api_server_pattern"]]}
    proc, result = _run(tmp_path, manifest["nvml"]["env"], _steps(manifest, evidence=evidence), "-vvv")
    assert "failed" not in result or not result["failed"], result.get("msg")
    assert list(result["steps"]) == ["pycache_purge", "evidence", "shm_before", "gpu_reset", "shm_clean", "nvml_verify"]
    assert result["steps"]["evidence"]["files"], result["steps"]["evidence"]
    ran = [line.rsplit("/", 1)[-1] for line in proc.stdout.splitlines()
           if line.startswith("Using module file ") and "/plugins/modules/" in line]
    assert ran == ["reset_steps.py"], ran


def test_a_failing_step_stops_the_steps_after_it_and_says_why(crashed_node, tmp_path):
    """A refused shm_clean path: pycache_purge and gpu_reset (before it) ran; nvml_verify (after
    it) did not, and no shared memory was removed."""
    manifest = crashed_node
    proc, result = _run(tmp_path, manifest["nvml"]["env"], _steps(manifest, shm_clean={"path": "relative/shm"}))
    assert result["failed"] is True and result["failed_step"] == "shm_clean"
    assert "relative/shm" in result["msg"] and "absolute" in result["msg"], result["msg"]
    # The look before the signals failed the same way: it names no holder, and fails nothing.
    assert list(result["steps"]) == ["pycache_purge", "shm_before", "gpu_reset", "shm_clean"]
    assert result["steps"]["shm_before"] == {}
    assert not any(procinfo.alive(pid) for pid in _pids(manifest, "worker"))
    assert not Path(manifest["site_packages"]["pyc"]).exists()
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    # Ansible prints the module's own message, as for a task of its own.
    assert "relative/shm" in proc.stdout


def test_check_mode_lists_what_each_step_would_do_and_changes_nothing(crashed_node, tmp_path):
    manifest = crashed_node
    proc, result = _run(tmp_path, manifest["nvml"]["env"],
                        _steps(manifest, nvml_verify={"timeout": 0, "checks": ["count"]}), "--check", "--diff")
    every_pid = _pids(manifest, "api_server", "worker", "bystander", "persistenced")
    assert all(procinfo.alive(pid) for pid in every_pid)
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()
    # What a reset would do, each step in check mode.
    assert "failed" not in result or not result["failed"], result.get("msg")
    assert result["changed"] is True
    assert set(_pids(manifest, "worker")) <= {entry["pid"] for entry in result["steps"]["gpu_reset"]["targets"]}
    assert result["steps"]["gpu_reset"]["killed"] == []
    assert {entry["path"] for entry in result["steps"]["shm_clean"]["removed"]} >= set(manifest["shm"]["leftovers"])
    assert result["steps"]["pycache_purge"]["removed"], result["steps"]["pycache_purge"]
    # --diff: each step's diff, in order, printed as a task of its own prints it: the bytecode
    # first, then the processes, then the shm directory's names.
    assert isinstance(result["diff"], list) and len(result["diff"]) == 3, result["diff"]
    leftover = Path(manifest["shm"]["leftovers"][0]).name
    lines = proc.stdout.splitlines()
    assert any(line.startswith("-") and leftover in line for line in lines), proc.stdout[-3000:]
    worker = "%d " % _pids(manifest, "worker")[0]
    assert any(line.startswith("-" + worker) for line in lines), proc.stdout[-3000:]


def test_a_dirty_gpu_fails_the_last_step_with_every_result_kept(crashed_node, tmp_path):
    """In check mode nothing was stopped, so NVML still shows the memory: nvml_verify fails, and
    the task with it, naming it; the results of the steps before it are there."""
    manifest = crashed_node
    proc, result = _run(tmp_path, manifest["nvml"]["env"], _steps(manifest, nvml_verify={"timeout": 0}), "--check")
    assert result["failed"] is True and result["failed_step"] == "nvml_verify"
    assert list(result["steps"]) == ["pycache_purge", "gpu_reset", "shm_clean", "nvml_verify"]
    assert result["steps"]["nvml_verify"]["ok"] is False and "MiB" in result["msg"], result["msg"]


def test_only_the_steps_given_run(crashed_node, tmp_path):
    manifest = crashed_node
    proc, result = _run(tmp_path, manifest["nvml"]["env"], {"shm_clean": {"path": manifest["shm_dir"]}})
    assert list(result["steps"]) == ["shm_clean"], proc.stdout[-2000:]
    assert all(procinfo.alive(pid) for pid in _pids(manifest, "api_server", "worker"))
    assert Path(manifest["site_packages"]["pyc"]).exists()


def test_no_step_or_a_step_that_is_not_a_mapping_is_refused_before_anything_runs(crashed_node, tmp_path):
    manifest = crashed_node
    env = manifest["nvml"]["env"]
    proc, result = _run(tmp_path, env, {})
    assert result["failed"] is True and "one of the following is required" in result["msg"], result["msg"]
    for value in ("now", 5, ["path"]):
        proc, result = _run(tmp_path, env, {"gpu_reset": {"device_paths": manifest["device_paths"]},
                                            "shm_clean": value})
        assert result["failed"] is True and "shm_clean" in result["msg"], result["msg"]
        assert "steps" not in result or not result["steps"], result
        assert all(procinfo.alive(pid) for pid in _pids(manifest, "worker"))
    # An option that is no step (`unit` is one since issue 42's seventh pass: the units stopped first).
    proc, result = _run(tmp_path, env, {"gpu_reset": {"device_paths": manifest["device_paths"]}, "service": "vllm"})
    assert result["failed"] is True and "service" in result["msg"], result["msg"]
    assert all(procinfo.alive(pid) for pid in _pids(manifest, "worker"))


def test_a_bytecode_target_the_host_refuses_stops_everything_before_any_signal(crashed_node, tmp_path):
    """pycache_purge runs first: a module name that does not resolve on the host fails it before
    gpu_reset could signal anything, and before any segment is removed."""
    manifest = crashed_node
    proc, result = _run(tmp_path, manifest["nvml"]["env"], _steps(manifest, pycache_purge={
        "modules": ["vllm.no_such_module"], "python": manifest["python"]}))
    assert result["failed"] is True and result["failed_step"] == "pycache_purge", result.get("msg")
    assert "vllm.no_such_module" in result["msg"], result["msg"]
    assert list(result["steps"]) == ["pycache_purge"]
    assert all(procinfo.alive(pid) for pid in _pids(manifest, "api_server", "worker"))
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])


def test_a_host_that_does_not_answer_is_unreachable_named_by_its_first_step(tmp_path):
    """The steps reach the host in one module run: a host that does not answer ends the task as
    unreachable, no step is tried again, the first step given holds why, and Ansible counts the
    host unreachable."""
    out = tmp_path / "result.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{
        "hosts": "dead", "gather_facts": False,
        "tasks": [
            {"name": "Run the steps", "register": "result", "ignore_unreachable": True,
             "cleanslate.gpu.reset_steps": {"shm_clean": {"path": "/nonexistent"},
                                            "nvml_verify": {"timeout": 0}}},
            {"name": "Keep the result", "delegate_to": "localhost",
             "ansible.builtin.copy": {"content": "{{ result | to_json }}", "dest": str(out)}},
        ]}]))
    inventory = tmp_path / "inventory.json"
    # Nothing listens on the discard port: ssh is refused at once.
    inventory.write_text(json.dumps({"all": {"hosts": {
        "dead": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9},
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", str(inventory)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.exists(), proc.stdout[-3000:]
    result = json.loads(out.read_text())
    # The first step is in `steps`; failed_step names no step that did not fail (issue 29).
    assert result["unreachable"] is True and result["failed_step"] == "unreachable", result
    assert list(result["steps"]) == ["shm_clean"] and result["steps"]["shm_clean"]["unreachable"] is True
    assert "fatal: [dead]: UNREACHABLE!" in proc.stdout, proc.stdout[-2000:]
