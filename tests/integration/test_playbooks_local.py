"""verify.yml and reset.yml on the local simulated crashed node, as an operator runs them:
verify changes nothing and fails a dirty node, reset cleans it, verify then passes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars

REPO = Path(__file__).resolve().parents[2]


_alive = procinfo.alive


def _playbook(name: str, manifest: dict, tmp_path: Path) -> tuple:
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"))))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    before = set((tmp_path / "reports").glob("*.json"))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), f"playbooks/{name}.yml",
                           "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    reports = sorted(set((tmp_path / "reports").glob("*.json")) - before)
    assert len(reports) == 1, proc.stdout[-3000:]
    return proc, json.loads(reports[0].read_text())["hosts"][0]


def test_verify_reports_a_dirty_node_and_touches_nothing_then_passes_after_reset(crashed_node, tmp_path):
    manifest = crashed_node
    (tmp_path / "reports").mkdir()  # so that the recap counts only what happens on the node
    every_pid = [entry["pid"] for entries in manifest["processes"].values() for entry in entries]

    proc, row = _playbook("verify", manifest, tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row["status"] == "dirty"
    assert row["killed"] >= len(manifest["processes"]["worker"])  # what a reset would stop
    assert "changed=0" in proc.stdout.split("PLAY RECAP")[-1]
    assert all(_alive(pid) for pid in every_pid), "verify must not signal anything"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()

    proc, row = _playbook("reset", manifest, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert row["status"] == "ok" and row["killed"] > 0 and row["shm_bytes_freed"] > 0

    proc, row = _playbook("verify", manifest, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert row["status"] == "clean"
    for role in ("bystander", "persistenced"):
        assert all(_alive(entry["pid"]) for entry in manifest["processes"][role])


def test_report_tells_an_unreachable_host_from_a_failed_one(crashed_node, tmp_path):
    """A host that never answers is `unreachable` (also without a unit, where the first task that
    reaches the node is gpu_reset); one whose step fails is `failed` with the error, in both playbooks."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {
        "simulated-node": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        # Nothing listens on the discard port: ssh is refused at once.
        "dead-node": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9},
        # Answers, but every module fails: its interpreter does not exist.
        "broken-node": {"ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"},
        # A Proxmox container that does not answer, with node_reset_install_deps: swept from its node
        # (here this machine), which pip on the container must not prevent.
        "dead-ct": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9,
                    "node_reset_pve_host": "simulated-node", "node_reset_pve_vmid": 129,
                    "node_reset_install_deps": True},
    }}}}}))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(crashed_node, fleet_report_path=str(tmp_path / "reports"))))
    for name in ("verify", "reset"):
        proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), f"playbooks/{name}.yml",
                               "-i", str(inventory), "-l", "gpu_nodes", "-e", f"@{extra}"],
                              cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 4, proc.stdout[-3000:]  # 4: a host was unreachable
        report = sorted((tmp_path / "reports").glob(f"{name}-*.json"))[-1]
        rows = {row["host"]: row for row in json.loads(report.read_text())["hosts"]}
        assert rows["dead-node"]["status"] == "unreachable", rows["dead-node"]
        assert rows["broken-node"]["status"] == "failed", rows["broken-node"]
        assert any("/nonexistent/python3" in problem for problem in rows["broken-node"]["problems"])
    assert rows["dead-ct"]["status"] == "swept-unreachable", rows["dead-ct"]


def test_reset_in_check_mode_touches_nothing_exits_0_and_does_not_wait_for_the_gpus(crashed_node, tmp_path):
    """`reset.yml --check` on a dirty node: nothing signalled or removed, exit 0, and NVML is read
    once instead of polled for node_reset_nvml_verify_timeout (nothing was stopped, nothing drains)."""
    manifest = crashed_node
    every_pid = [entry["pid"] for entries in manifest["processes"].values() for entry in entries]
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"),
                                                node_reset_nvml_verify_timeout=120)))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    start = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset.yml", "--check",
                           "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert elapsed < 60, f"--check took {elapsed:.0f} s: it polled NVML for the whole timeout"
    assert all(_alive(pid) for pid in every_pid), "--check must not signal anything"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()
    assert not list((tmp_path / "reports").glob("*"))  # the report is not written in check mode
    # The printed table counts what a reset would stop, not 0.
    row = next(line for line in proc.stdout.splitlines() if "| simulated-node |" in line)
    assert int(row.split("|")[3]) >= len(manifest["processes"]["worker"]), row


def test_a_container_that_still_shows_memory_after_its_own_reset_is_swept_from_its_node(crashed_node, tmp_path):
    """The container's own reset cannot reach its holders (here: scoped to a user that owns
    none, as a reset inside a container can miss what it cannot see), so NVML still shows their
    memory; the role then runs gpu_reset on the Proxmox node, scoped to the container's cgroup,
    and checks again. Processes outside that cgroup are spared."""
    base = Path("/sys/fs/cgroup/systemd")
    if not (base / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("needs root and the name=systemd cgroup hierarchy")
    top = base / ("cleanslate-sweep-%d" % os.getpid())
    container = top / "lxc" / "129" / "ns"
    container.mkdir(parents=True)
    holders = [entry["pid"] for entries in crashed_node["processes"].values() for entry in entries if entry["gpus"]]
    try:
        for pid in holders:
            (container / "cgroup.procs").write_text(str(pid))
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(json.dumps({"all": {
            "hosts": {"pve": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
            "children": {"gpu_nodes": {"hosts": {"ct129": {
                "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
        extra = tmp_path / "vars.json"
        extra.write_text(json.dumps(node_reset_vars(
            crashed_node, node_reset_gpu_reset_users=["nobody"], node_reset_nvml_verify_timeout=2,
            node_reset_pve_host="pve", node_reset_pve_vmid=129, node_reset_pve_cgroup="/%s/lxc/129/" % top.name,
            node_reset_pve_environment=crashed_node["nvml"]["env"], fleet_report_path=str(tmp_path / "reports"))))
        proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset.yml",
                               "-i", str(inventory), "-l", "gpu_nodes", "-e", f"@{extra}"],
                              cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:]
        row = json.loads(next((tmp_path / "reports").glob("reset-*.json")).read_text())["hosts"][0]
        assert row["status"] == "ok", row
        # The container's own reset could stop nothing (users: nobody): only the sweep killed these.
        assert row["killed"] == len(holders), row
        assert not any(_alive(pid) for pid in holders)
        for role in ("bystander", "persistenced", "api_server"):
            assert all(_alive(entry["pid"]) for entry in crashed_node["processes"][role]), role
    finally:
        for group in (container, container.parent, container.parent.parent, top):
            for pid in (group / "cgroup.procs").read_text().split() if group.exists() else []:
                (base / "cgroup.procs").write_text(pid)  # back to the root before rmdir
            if group.exists():
                group.rmdir()
