"""The roles in a user's own play (README, Quick start: `roles: [cleanslate.gpu.node_reset]`), from the
installed tarball, in a directory outside the checkout, against the simulated crashed node.

ansible-core validates a role's entry point with its own task, before the role's first task: a bad
value must still get the role's sentence (not ansible-core's type error and argument spec), a
misspelled variable must stop the run before anything is touched, a good run prints what it did,
and fleet_report.yml imported after the play writes the report (docs/node_reset.md, "In your own play")."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.release.artifact import BIN, simulated_inventory
from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars

# ansible-core's words when its own validation task refuses a value.
CORE_REFUSAL = "Validation of arguments failed"


def _own_play(installed, tmp_path: Path, plays: list, extra: dict) -> subprocess.CompletedProcess:
    """ansible-playbook of the user's own playbook, in the work directory of the installed tarball."""
    _collections, _root, workdir, env = installed
    playbook = tmp_path / "site.yml"
    playbook.write_text(json.dumps(plays))
    extra_file = tmp_path / "vars.json"
    extra_file.write_text(json.dumps(extra))
    return subprocess.run([str(BIN / "ansible-playbook"), str(playbook), "-i",
                           str(simulated_inventory(tmp_path / "inventory.json")), "-e", f"@{extra_file}"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=300, check=False)


def _role_play(role: str, **play) -> dict:
    return dict({"name": "My own play", "hosts": "gpu_nodes", "gather_facts": False, "roles": [role]}, **play)


def _pids(manifest: dict) -> list:
    return [entry["pid"] for entries in manifest["processes"].values() for entry in entries]


def test_a_bad_value_gets_the_roles_sentence_and_touches_nothing(installed, crashed_node, tmp_path):
    proc = _own_play(installed, tmp_path, [_role_play("cleanslate.gpu.node_reset")],
                     node_reset_vars(crashed_node, node_reset_gpu_reset_kill_timeout="abc"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert 'node_reset_gpu_reset_kill_timeout is "abc": it must be a number of seconds from 0 to 3600.' in out, out[-3000:]
    assert CORE_REFUSAL not in out and "argument_spec_data" not in out, out[-3000:]
    assert all(procinfo.alive(pid) for pid in _pids(crashed_node))


def test_a_misspelled_gpu_selector_stops_before_any_process_is_killed(installed, crashed_node, tmp_path):
    # node_reset_gpu_reset_gpu for node_reset_gpu_reset_gpus: ignored, the default would reset every GPU.
    proc = _own_play(installed, tmp_path, [_role_play("cleanslate.gpu.node_reset")],
                     node_reset_vars(crashed_node, node_reset_gpu_reset_gpu=["1"]))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert ("node_reset_gpu_reset_gpu is not a variable of the node_reset role: did you mean"
            " node_reset_gpu_reset_gpus?") in out, out[-3000:]
    assert "TASK [cleanslate.gpu.node_reset" not in proc.stdout, proc.stdout[-3000:]
    assert all(procinfo.alive(pid) for pid in _pids(crashed_node))


def test_inference_service_in_an_own_play_gets_its_sentence(installed, tmp_path):
    proc = _own_play(installed, tmp_path, [_role_play("cleanslate.gpu.inference_service")],
                     {"inference_service_model": "/models/llama", "inference_service_port": "abc"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert 'inference_service_port is "abc": it must be' in out and CORE_REFUSAL not in out, out[-3000:]


def test_a_reset_in_an_own_play_prints_its_summary_and_fleet_report_yml_writes_the_report(installed, crashed_node,
                                                                                          tmp_path):
    reports = tmp_path / "reports"
    plays = [_role_play("cleanslate.gpu.node_reset", vars={"node_reset_fail_host": False}),
             {"name": "The fleet report", "ansible.builtin.import_playbook": "cleanslate.gpu.fleet_report",
              "vars": {"fleet_report_kind": "reset", "fleet_report_path": str(reports)}}]
    proc = _own_play(installed, tmp_path, plays, node_reset_vars(crashed_node))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    workers = len(crashed_node["processes"]["worker"])
    summary = proc.stdout.split("Say what the role did", 1)[1].split("TASK [", 1)[0]
    row_line = next(line for line in summary.splitlines() if "| simulated-node |" in line)
    cells = [cell.strip() for cell in row_line.strip().strip('",').strip("|").split("|")]
    assert cells[1] == "ok" and int(cells[2]) >= workers and int(cells[3]) > 0, summary
    assert "The whole result is in node_reset_result" in summary, summary
    (report,) = reports.glob("reset-*.json")
    row = json.loads(report.read_text())["hosts"][0]
    assert row["status"] == "ok" and row["killed"] >= workers and row["shm_bytes_freed"] > 0, row
    assert all(procinfo.alive(entry["pid"]) for role in ("bystander", "persistenced")
               for entry in crashed_node["processes"][role])
