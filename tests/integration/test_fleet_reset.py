"""reset.yml on a fleet of real systemd hosts over SSH, each running the crashed-node simulator.

Each host builds its crashed node under a directory bound at the same path on this machine,
so the host-side sweep (a Proxmox node's view of its containers) sees the same device files.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import HOST_NVML_LIB, HOST_PARENT, REPO
from tests.integration.fleet.reports import clear_reports, newest_report, playbook_command, rows_by_host
from tests.sim.role_vars import node_reset_vars

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
HOSTS = ("node1", "node2", "node3")


def _crash(fleet, name) -> dict:
    host = fleet.hosts[name]
    root = host.shared / "sim"
    argv = ["python3", "-m", "tests.sim", "crash", "--root", str(root),
            "--lib-dir", HOST_NVML_LIB, "--python", "/usr/bin/python3"]
    fleet.spawn(name, "crashed-server", argv, cwd=HOST_PARENT, timeout=180)
    return json.loads((root / "manifest.json").read_text())


def _uncrash(fleet, name) -> None:
    root = fleet.hosts[name].shared / "sim"
    if fleet.hosts[name].running():
        fleet.run(name, ["python3", "-m", "tests.sim", "clean", "--root", str(root)], check=False, timeout=120,
                  env={"PYTHONPATH": HOST_PARENT})
        fleet.run(name, ["systemctl", "stop", "crashed-server.service"], check=False)
        fleet.run(name, ["systemctl", "start", "ssh.service"], check=False)
    else:
        # Powered off: everything the simulator started died with the host; only files remain.
        shutil.rmtree(root, ignore_errors=True)


def _role_vars(manifest) -> dict:
    return node_reset_vars(manifest, node_reset_nvml_verify_timeout=20,
                           # not installed on the hosts: skipped with a note
                           node_reset_unit="vllm.service")


@pytest.fixture
def crashed_fleet(fleet, tmp_path):
    """Every host crashed; host_vars beside the fleet's inventory point the role at each one."""
    manifests = {}
    host_vars = fleet.inventory.parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    try:
        for name in HOSTS:
            manifests[name] = _crash(fleet, name)
            (host_vars / f"{name}.yml").write_text(yaml.safe_dump(_role_vars(manifests[name])))
        yield manifests
    finally:
        for name in HOSTS:
            (host_vars / f"{name}.yml").unlink(missing_ok=True)
            _uncrash(fleet, name)


def _playbook(fleet, tmp_path, playbook="reset.yml", limit="gpu_nodes", extra_inventory=None, extra=None):
    reports = tmp_path / "reports"
    more = ["-i", str(extra_inventory)] if extra_inventory else []
    for key, value in (extra or {}).items():
        more += ["-e", f"{key}={value}"]
    proc = subprocess.run(playbook_command(fleet, reports, limit, more, playbook=playbook),
                          cwd=REPO, capture_output=True, text=True, timeout=540, check=False)
    report = newest_report(reports, playbook[:-4])
    clear_reports(reports)
    return proc, report


def _recap(output: str) -> dict:
    return {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+: (ok=.*)$", output, re.M)}


def _alive(fleet, name, pid) -> bool:
    return fleet.run(name, ["kill", "-0", str(pid)], check=False).returncode == 0


def _pids(manifest, *roles):
    return [entry["pid"] for role in roles for entry in manifest["processes"].get(role, [])]


def _targets(manifest):
    # The processes that hold GPU memory (`gpus` in the manifest) and the API server the role's
    # pattern names; the bystander, the GPU clients (nvidia-persistenced, the monitor, a CUDA
    # init without a context) and a process that only maps a shm segment are spared.
    return [entry["pid"] for role, entries in manifest["processes"].items() for entry in entries
            if entry["gpus"] or role == "api_server"]


def test_reset_cleans_every_host_spares_bystanders_and_a_second_run_changes_nothing(fleet, crashed_fleet, tmp_path):
    proc, report = _playbook(fleet, tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    for name, manifest in crashed_fleet.items():
        assert all(not _alive(fleet, name, pid) for pid in _targets(manifest)), name
        assert all(_alive(fleet, name, pid) for pid in _pids(manifest, "bystander", "persistenced", "shm_mapper")), name
        for leftover in manifest["shm"]["leftovers"]:
            assert not Path(leftover).exists()
    assert "unit vllm.service does not exist: skipped" in proc.stderr  # a warning, said once for the run
    rows = rows_by_host(report)
    assert sorted(rows) == list(HOSTS)
    for name, row in rows.items():
        assert row["status"] == "ok" and row["ok"], row
        assert row["killed"] == len(_targets(crashed_fleet[name])), row
        assert row["mib_freed"] > 0 and row["shm_bytes_freed"] > 0 and row["bytecode_removed"] >= 1, row
    assert "| host | status | killed | MiB freed |" in proc.stdout  # the table is printed

    proc, report = _playbook(fleet, tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:]
    recap = _recap(proc.stdout)
    assert {name: recap[name]["changed"] for name in HOSTS} == {name: 0 for name in HOSTS}, proc.stdout[-3000:]
    assert all(row["killed"] == 0 and row["mib_freed"] == 0 for row in report["hosts"])


def test_a_powered_off_host_is_reported_unreachable_and_the_others_complete(fleet, crashed_fleet, tmp_path):
    fleet.pull_plug("node3")  # power lost: a clean poweroff waits out the crashed holders
    proc, report = _playbook(fleet, tmp_path)
    assert proc.returncode == 4, proc.stdout[-6000:]  # 4: some hosts were unreachable
    rows = rows_by_host(report)
    assert rows["node3"]["status"] == "unreachable" and not rows["node3"]["ok"]
    for name in ("node1", "node2"):
        assert rows[name]["status"] == "ok", rows[name]
        assert all(not _alive(fleet, name, pid) for pid in _targets(crashed_fleet[name]))


def test_the_host_side_sweep_kills_one_containers_holders_and_spares_the_others(fleet, crashed_fleet, tmp_path):
    """node2's sshd is down, so Ansible cannot reach it; its Proxmox node (this machine) stops
    the holders in node2's cgroup only."""
    pve = tmp_path / "pve.yml"
    pve.write_text(yaml.safe_dump({"all": {"hosts": {"pve": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    node2 = fleet.hosts["node2"]
    host_vars = fleet.inventory.parent / "host_vars" / "node2.yml"
    node2_vars = yaml.safe_load(host_vars.read_text())
    node2_vars.update({"node_reset_pve_host": "pve", "node_reset_pve_vmid": node2.vmid,
                       "node_reset_pve_cgroup": node2.cgroup.match, "node_reset_pve_connect_timeout": 3})
    host_vars.write_text(yaml.safe_dump(node2_vars))
    fleet.run("node2", ["systemctl", "stop", "ssh.service", "ssh.socket"])
    # Sessions outlive the service (Ansible's ControlPersist masters from earlier tests):
    # end them too, inside node2's own PID namespace only.
    fleet.run("node2", ["pkill", "-KILL", "-x", "sshd"], check=False)

    proc, report = _playbook(fleet, tmp_path, limit="node2", extra_inventory=pve)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    row = report["hosts"][0]
    assert row["host"] == "node2" and row["status"] == "swept-unreachable", row
    assert all(not _alive(fleet, "node2", pid) for pid in _targets(crashed_fleet["node2"]))
    assert all(_alive(fleet, "node2", pid) for pid in _pids(crashed_fleet["node2"], "bystander", "persistenced"))
    for other in ("node1", "node3"):
        assert all(_alive(fleet, other, pid) for pid in _targets(crashed_fleet[other])), other


def test_limit_slices_run_side_by_side_and_their_reports_merge_into_one(fleet, crashed_fleet, tmp_path):
    """Two --limit slices of one fleet, run at once by two ansible-playbook processes (each with
    its own main process, which is what bounds one run), each writing its own report; then
    playbooks/merge_reports.yml makes one fleet report of the two."""
    slices = {"slice1": "node1", "slice2": "node2:node3"}
    procs = {name: subprocess.Popen([ANSIBLE_PLAYBOOK, "playbooks/reset.yml", "-i", str(fleet.inventory), "-l", limit,
                                     "-e", f"fleet_report_path={tmp_path / name}"],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, limit in slices.items()}
    outputs = {name: proc.communicate(timeout=540)[0] for name, proc in procs.items()}
    assert {name: proc.returncode for name, proc in procs.items()} == {"slice1": 0, "slice2": 0}, outputs
    for name, hosts in (("slice1", ["node1"]), ("slice2", ["node2", "node3"])):
        (report,) = (tmp_path / name).glob("reset-*.json")
        assert [row["host"] for row in json.loads(report.read_text())["hosts"]] == hosts

    merged = tmp_path / "merged"
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/merge_reports.yml", "-i", str(fleet.inventory),
                           "-e", f"fleet_report_merge={tmp_path}/slice*/reset-*.json", "-e", f"fleet_report_path={merged}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (report_file,) = merged.glob("reset-*.json")
    document = json.loads(report_file.read_text())
    assert document["merged_from"] == sorted(str(path) for path in tmp_path.glob("slice*/reset-*.json"))
    rows = rows_by_host(document)
    assert sorted(rows) == list(HOSTS)
    for name, row in rows.items():
        assert row["status"] == "ok" and row["killed"] == len(_targets(crashed_fleet[name])), row
        assert all(not _alive(fleet, name, pid) for pid in _targets(crashed_fleet[name])), name
    assert "| node3 | ok |" in proc.stdout and "3 hosts, 0 not ok." in proc.stdout
