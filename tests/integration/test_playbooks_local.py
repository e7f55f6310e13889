"""verify.yml and reset.yml on the local simulated crashed node, as an operator runs them:
verify changes nothing and fails a dirty node, reset cleans it, verify then passes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.fake_nvml import FakeNvml
from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars

REPO = Path(__file__).resolve().parents[2]


_alive = procinfo.alive


def _playbook(name: str, manifest: dict, tmp_path: Path, **role_vars) -> tuple:
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"), **role_vars)))
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

    collector = tmp_path / "collector"
    collector.mkdir()
    proc, row = _playbook("verify", manifest, tmp_path, node_reset_metrics_dir=str(collector))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row["status"] == "dirty"
    assert row["killed"] >= len(manifest["processes"]["worker"])  # what a reset would stop
    # Its metrics say dirty too (CleanslateGpuHostDirty), not a failed final check.
    metrics = (collector / "cleanslate_gpu_node_verify.prom").read_text()
    assert re.search(r'^cleanslate_gpu_run_status\{host="simulated-node",role="node_verify",status="dirty"\} 1$', metrics,
                     re.M), metrics
    assert "changed=0" in proc.stdout.split("PLAY RECAP")[-1]
    assert all(_alive(pid) for pid in every_pid), "verify must not signal anything"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()

    # The crash left an application's Xid 13 on GPU 1 in the kernel log: a reset clears it.
    log = tmp_path / "kern.log"
    log.write_bytes(_xid_line(manifest, 1, 13, b"pid=4242, name=python3, Graphics SM Warp Exception") + b"\n")
    proc, row = _playbook("reset", manifest, tmp_path, node_reset_nvml_verify_xid_log_path=str(log))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert row["status"] == "ok" and row["killed"] > 0 and row["shm_bytes_freed"] > 0 and not row["problems"], row
    # The fleet report is printed once: not the role's own-play summary beside it.
    assert "Say what the role did" not in proc.stdout

    proc, row = _playbook("verify", manifest, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert row["status"] == "clean"
    for role in ("bystander", "persistenced"):
        assert all(_alive(entry["pid"]) for entry in manifest["processes"][role])


def test_a_bad_fleet_serial_ends_the_run_with_one_sentence_before_anything_is_touched(crashed_node, tmp_path):
    """`-e fleet_serial=abc` ended in ansible-core's traceback (exit 250) when the reset play's `serial`
    was read; the first play now refuses it, naming the variable and what it accepts, and the node
    (every process, every leftover) is untouched, no report written."""
    manifest = crashed_node
    every_pid = [entry["pid"] for entries in manifest["processes"].values() for entry in entries]
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"))))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset.yml",
                           "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}",
                           "-e", "fleet_serial=abc"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output and "Unexpected Exception" not in output, output[-3000:]
    assert "fleet_serial is 'abc': it must be a whole number of hosts" in proc.stdout, output[-3000:]
    assert "PLAY [Reset GPU nodes]" not in proc.stdout
    assert all(_alive(pid) for pid in every_pid), "a refused run must not signal anything"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()
    assert not list((tmp_path / "reports").glob("*"))


def test_a_fleet_serial_in_the_inventory_stops_the_run_and_one_in_an_import_s_vars_batches(crashed_node, tmp_path):
    """A play's `serial` reads extra vars and play vars, not the inventory: fleet_serial: 1 in
    gpu_nodes' group vars ran every host in one batch without a word. The first play refuses it,
    nothing touched; given as an import_playbook's vars (a play var), it is read and batches."""
    manifest = crashed_node
    every_pid = [entry["pid"] for entries in manifest["processes"].values() for entry in entries]
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"))))
    group_vars = tmp_path / "serial.yml"
    group_vars.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"vars": {"fleet_serial": 1}}}}}))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    proc = subprocess.run([playbook, "playbooks/reset.yml", "-i", "inventory/simulated.yml", "-i", str(group_vars),
                           "-l", "gpu_nodes", "-e", f"@{extra}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert "fleet_serial is 1 in the inventory, where a play's keyword cannot read it" in proc.stdout, proc.stdout[-3000:]
    assert "PLAY [Reset GPU nodes]" not in proc.stdout
    assert all(_alive(pid) for pid in every_pid), "a refused run must not signal anything"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    # The same value as the vars of an import: verify.yml (read-only) runs in batches of one.
    wrapper = tmp_path / "wrapper.yml"
    wrapper.write_text(json.dumps([{"import_playbook": str(REPO / "playbooks" / "verify.yml"),
                                    "vars": {"fleet_serial": 1}}]))
    proc = subprocess.run([playbook, str(wrapper), "-i", "inventory/simulated.yml", "-l", "gpu_nodes",
                           "-e", f"@{extra}"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                          env=env)
    assert "in the inventory, where a play's keyword" not in proc.stdout, proc.stdout[-3000:]
    assert "PLAY [Check what the run targets]" in proc.stdout and "PLAY RECAP" in proc.stdout, proc.stdout[-3000:]
    assert all(_alive(pid) for pid in every_pid), "verify must not signal anything"


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
        # Its first module run, in both: pycache_purge, the first of the module steps (node_reset_vars
        # gives bytecode paths), before anything is stopped.
        assert rows["broken-node"]["status"] == "failed at pycache_purge", rows["broken-node"]
        assert any("/nonexistent/python3" in problem for problem in rows["broken-node"]["problems"])
    assert rows["dead-ct"]["status"] == "swept-unreachable", rows["dead-ct"]


def test_a_metrics_file_that_cannot_be_written_leaves_the_reset_ok_and_says_why_once(crashed_node, tmp_path):
    """Issue 42: the task that records node_reset_result writes the metrics too. A write that fails
    (the previous file cannot be read: a directory in its place) leaves the reset ok and counted as
    it was: nothing fails or is ignored, and one warning says why."""
    collector = tmp_path / "collector"
    (collector / "cleanslate_gpu_node_reset.prom").mkdir(parents=True)
    proc, row = _playbook("reset", crashed_node, tmp_path, node_reset_metrics_dir=str(collector))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert row["status"] == "ok" and row["killed"] > 0, row
    recap = proc.stdout.split("PLAY RECAP")[-1]
    assert "failed=0" in recap and "ignored=0" in recap, recap
    said = re.findall(r"the metrics file for node_exporter was not written \((.+?)\); the reset's result stands",
                      re.sub(r"\s+", " ", proc.stdout + proc.stderr))
    assert len(said) == 1 and "cannot read the previous" in said[0], (said, proc.stdout[-3000:])


def test_reset_in_check_mode_touches_nothing_exits_0_and_does_not_wait_for_the_gpus(crashed_node, tmp_path):
    """`reset.yml --check` on a dirty node: nothing signalled or removed, exit 0, and NVML is read
    once instead of polled for node_reset_nvml_verify_timeout (nothing was stopped, nothing drains)."""
    manifest = crashed_node
    every_pid = [entry["pid"] for entries in manifest["processes"].values() for entry in entries]
    # A ZeroMQ IPC socket a crashed vLLM left (issue 37), where the simulator's tmp_path points.
    socket_path = Path(manifest["shm_dir"]) / "0d9e8f7a-6b5c-4d3e-a2f1-fedcba987654"
    # Bound by its name from inside the directory: a CI's tmp path makes the absolute one longer than
    # sun_path's 108 bytes (CI failed on it), and the module handles the path by name either way.
    subprocess.run([sys.executable, "-c", "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])",
                    socket_path.name], cwd=socket_path.parent, check=True)
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"),
                                                node_reset_nvml_verify_timeout=120)))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    start = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset.yml", "--check",
                           "--diff", "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert elapsed < 60, f"--check took {elapsed:.0f} s: it polled NVML for the whole timeout"
    assert all(_alive(pid) for pid in every_pid), "--check must not signal anything"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()
    # The report is written, named apart from a real reset's, and lists what a reset would stop.
    assert not list((tmp_path / "reports").glob("reset-2*"))
    reports = list((tmp_path / "reports").glob("reset-check-*.json"))
    assert len(reports) == 1, proc.stdout[-3000:]
    document = json.loads(reports[0].read_text())
    assert document["check_mode"] is True
    would_stop = {entry["pid"]: entry for entry in document["hosts"][0]["would_stop"]}
    api = manifest["processes"]["api_server"][0]["pid"]
    workers = [entry["pid"] for entry in manifest["processes"]["worker"]]
    assert set(workers) | {api} <= set(would_stop), would_stop
    assert "command line matches" in would_stop[api]["reason"] and would_stop[api]["cmdline"], would_stop[api]
    assert all(entry["name"] and entry["cmdline"] and entry["reason"] for entry in would_stop.values())
    markdown = reports[0].with_suffix(".md").read_text()
    assert "| host | status | would stop | MiB used | shm would remove | bytecode would remove | seconds |" in markdown
    assert "  - pid %d " % api in markdown
    # Each segment kept in use, with its holder's pid and name (issue 37); the dead socket would go.
    row = document["hosts"][0]
    held = {item["path"]: [holder["pid"] for holder in item["holders"]] for item in row["shm_in_use"]}
    assert {entry["path"]: [entry["pid"]] for entry in manifest["shm"]["in_use"]}.items() <= held.items(), held
    assert all(holder["name"] not in ("", "?") for item in row["shm_in_use"] for holder in item["holders"]), row
    mapper = manifest["shm"]["in_use"][0]
    assert "held by pid %d (" % mapper["pid"] in markdown and os.path.basename(mapper["path"]) in markdown
    assert row["tmp_leftovers"] == [{"path": str(socket_path), "done": "would remove",
                                     "why": "no live process held it (nor bound it)"}], row["tmp_leftovers"]
    # The segment a worker holds open is kept now, and the report says that the reset removes it (the
    # reset removes one more segment than its check said).
    worker_fd = manifest["shm"]["in_use"][1]
    kept = {entry["path"]: entry for entry in row["shm_leftovers"]}[worker_fd["path"]]
    assert kept["done"] == "kept" and kept["why"].startswith("in use: pid %d (" % worker_fd["pid"]), kept
    assert kept["why"].endswith(", which a reset stops: the reset removes it"), kept
    assert "  - kept %s: %s" % (worker_fd["path"], kept["why"]) in markdown
    assert "- simulated-node: 1 would be removed, 0 kept" in markdown and socket_path.is_socket()
    # The printed table counts what a reset would stop, not 0, with sizes people read.
    row = next(line for line in proc.stdout.splitlines() if "| simulated-node |" in line)
    assert int(row.split("|")[3]) >= len(manifest["processes"]["worker"]), row
    assert row.split("|")[5].strip().endswith(("Bytes", "KiB", "MiB", "GiB")), row
    # --diff shows every target, the API server (found by its command line, no device file) too.
    assert any(line.lstrip("-").startswith("%d " % api) and "stop, cmdline" in line for line in proc.stdout.splitlines())


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


# ----- issue 11, item 13: the report is always written, and says what happened -----

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# Answers, but every module fails: its interpreter does not exist.
BROKEN = {"ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"}
# Nothing listens on the discard port: ssh is refused at once.
DEAD = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9}
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def _run(name: str, hosts: dict, role_vars: dict, tmp_path: Path, *args) -> tuple:
    """ansible-playbook NAME on an inventory of `hosts` in gpu_nodes; returns (process, rows by host)."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(dict(role_vars, fleet_report_path=str(tmp_path / "reports"))))
    before = set((tmp_path / "reports").glob(f"{name}-*.json"))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, f"playbooks/{name}.yml", "-i", str(inventory), "-l", "gpu_nodes",
                           "-e", f"@{extra}", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    reports = sorted(set((tmp_path / "reports").glob(f"{name}-*.json")) - before)
    assert len(reports) == 1, "no report: " + proc.stdout[-3000:]
    return proc, {row["host"]: row for row in json.loads(reports[0].read_text())["hosts"]}


@pytest.mark.parametrize("playbook", ["reset", "verify"])
@pytest.mark.parametrize("host, status, returncode", [
    (BROKEN, "failed at gpu_reset", 2),
    (DEAD, "unreachable", 4),
])
def test_the_report_is_written_when_every_host_fails_and_the_run_still_fails(
        tmp_path, playbook, host, status, returncode):
    """With every host failed (a step error) or unreachable, Ansible used to end the run before
    the report play. The report lists the host, and the exit status still says what happened."""
    proc, rows = _run(playbook, {"only-node": host}, {}, tmp_path)
    assert proc.returncode == returncode, proc.stdout[-3000:]
    assert rows["only-node"]["status"] == status and not rows["only-node"]["ok"], rows
    assert rows["only-node"]["problems"], rows
    assert "| only-node | %s |" % status in proc.stdout
    if status == "unreachable":
        # One sentence says why (the verdict); the metrics are not tried on a host that did not answer.
        assert "the metrics file for node_exporter was not written" not in proc.stdout + proc.stderr, proc.stdout[-3000:]


def test_a_stopped_rollout_reports_the_hosts_it_did_not_reach(tmp_path):
    """fleet_serial 1 and fleet_max_fail_percentage 0: the first host fails, the rollout stops
    there, and the report (still written) lists the second host as not run, with why."""
    proc, rows = _run("reset", {"first": BROKEN, "second": BROKEN}, {}, tmp_path,
                      "-e", "fleet_serial=1", "-e", "fleet_max_fail_percentage=0")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert rows["first"]["status"] == "failed at gpu_reset", rows
    assert rows["second"]["status"] == "not run", rows
    assert "fleet_max_fail_percentage" in rows["second"]["problems"][0], rows
    assert "TASK [cleanslate.gpu.node_reset" not in proc.stdout.split("[second]")[0].split("PLAY [Fleet report]")[-1]


def test_gpus_that_stay_dirty_are_reported_dirty_with_the_reset_it_did(crashed_node, tmp_path):
    """Memory that stays used with no process after the reset: the host is `dirty` (not
    `failed`), keeps what was stopped and freed, and the run fails after the report."""
    manifest = crashed_node
    FakeNvml(manifest["nvml"]["state_dir"]).inject("stuck_memory", gpu=1, mib=500)
    collector = tmp_path / "collector"
    collector.mkdir()
    proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
        manifest, node_reset_nvml_verify_timeout=1, node_reset_metrics_dir=str(collector)), tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    row = rows["simulated-node"]
    assert row["status"] == "dirty" and not row["ok"] and row["changed"], row
    assert row["killed"] >= len(manifest["processes"]["worker"]) and row["shm_bytes_freed"] > 0, row
    assert any("500 MiB" in problem for problem in row["problems"]), row["problems"]
    assert "simulated-node is dirty" in proc.stdout
    # The metrics say what the report says (the steps task writes them: issue 42), not a failed step.
    metrics = (collector / "cleanslate_gpu_node_reset.prom").read_text()
    assert re.search(r'^cleanslate_gpu_run_status\{host="simulated-node",role="node_reset",status="dirty"\} 1$', metrics,
                     re.M), metrics


def test_a_step_that_fails_after_processes_were_stopped_is_reported_changed(crashed_node, tmp_path):
    """gpu_reset stops the holders, then shm_clean refuses its path (a symlink): the row says
    which step failed and why, `changed` is true and the stopped processes are counted."""
    manifest = crashed_node
    link = tmp_path / "shm-link"
    link.symlink_to(manifest["shm_dir"])
    proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
        manifest, node_reset_shm_clean_path=str(link)), tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    row = rows["simulated-node"]
    assert row["status"] == "failed at shm_clean" and row["failed_step"] == "shm_clean", row
    assert row["changed"] and not row["ok"], row
    assert row["killed"] >= len(manifest["processes"]["worker"]), row
    assert any(str(link) in problem for problem in row["problems"]), row["problems"]
    assert all(not _alive(entry["pid"]) for entry in manifest["processes"]["worker"])


LOSE_GPU_0 = """
import os, signal, sys, time
from tests.fixtures.fake_nvml import FakeNvml
def fall_off_the_bus(signum, frame):
    FakeNvml(sys.argv[1]).inject(sys.argv[3], gpu=0)
    os._exit(0)
signal.signal(signal.SIGTERM, fall_off_the_bus)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("fault", ["gpu_lost", "gpu_removed"])
def test_a_gpu_lost_during_the_reset_is_reported_lost_with_nvmls_sentence(crashed_node, tmp_path, fault):
    """GPU 0 falls off the bus while the reset runs (here: when a process the reset stops gets
    its SIGTERM), either still counted by NVML but unreadable (gpu_lost) or gone from the
    enumeration with the others renumbered (gpu_removed). The report says once that GPU 0 is lost,
    and counts the MiB freed on the GPUs it could still read, instead of failing on a template
    error."""
    manifest = crashed_node
    marker = "cleanslate-test-lose-gpu-0-%d" % os.getpid()
    loser = subprocess.Popen([sys.executable, "-c", LOSE_GPU_0, manifest["nvml"]["state_dir"], marker, fault],
                             cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)
    try:
        assert loser.stdout.readline() == "ready\n"
        proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
            manifest, node_reset_nvml_verify_timeout=1,
            node_reset_gpu_reset_cmdline_patterns=[manifest["api_server_pattern"], re.escape(marker)]), tmp_path)
        assert loser.wait(timeout=60) == 0  # it was signalled, and GPU 0 is gone
    finally:
        if loser.poll() is None:
            loser.kill()  # our own unreaped child: its pid cannot have been reused
            loser.wait()
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "unsupported operand" not in proc.stdout
    row = rows["simulated-node"]
    lost_uuid = FakeNvml(manifest["nvml"]["state_dir"]).gpus()[0]["uuid"]
    assert row["status"] == "dirty" and not row["ok"], row
    assert [gpu["index"] for gpu in row["gpus_lost"]] == [0], row
    assert all(gpu["uuid"] in (lost_uuid, None) for gpu in row["gpus_lost"]), row
    about_gpu0 = [problem for problem in row["problems"] if problem.startswith("GPU 0 ")]
    assert len(about_gpu0) == 1 and "lost" in about_gpu0[0], row["problems"]
    if fault == "gpu_lost":
        # nvml_verify selected it and says so in NVML's words.
        assert "NVML: GPU is lost" in about_gpu0[0], row["problems"]
    else:
        # NVML no longer lists it: the report names it from the reading before the reset.
        assert lost_uuid in about_gpu0[0], row["problems"]
    # MiB freed only where a GPU was read after the reset, each against its own reading.
    assert sorted(row["mib_freed_per_gpu"]) == ["1", "2", "3"], row
    assert row["mib_freed"] == sum(row["mib_freed_per_gpu"].values()) > 0, row


def test_verify_does_not_call_a_host_clean_when_a_reset_would_remove_bytecode(crashed_node, tmp_path):
    """After a reset that did not purge bytecode, verify (which does look at it) finds the stale
    .pyc: the host is dirty, its row counts the file, and the run fails."""
    manifest = crashed_node
    proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
        manifest, node_reset_pycache_purge_paths=[]), tmp_path)
    assert proc.returncode == 0 and rows["simulated-node"]["status"] == "ok", proc.stdout[-3000:]
    assert Path(manifest["site_packages"]["pyc"]).exists()

    proc, rows = _run("verify", {"simulated-node": LOCAL}, node_reset_vars(manifest), tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    row = rows["simulated-node"]
    assert row["status"] == "dirty" and row["bytecode_removed"] == 1 and row["killed"] == 0, row
    assert row["problems"] == ["a reset would remove 1 bytecode file"], row
    assert Path(manifest["site_packages"]["pyc"]).exists()


@pytest.mark.parametrize("host, returncode, message", [
    (BROKEN, 2, "failed at gpu_reset: "),
    (DEAD, 4, "UNREACHABLE!"),
])
def test_the_role_on_its_own_still_fails_the_host(tmp_path, host, returncode, message):
    """Outside the playbooks, node_reset_fail_host keeps its default (true): a failed step fails
    the host (after node_reset_result is set) and an unreachable host is unreachable."""
    playbook = tmp_path / "own.yml"
    playbook.write_text(json.dumps([{
        "name": "My own play", "hosts": "gpu_nodes", "gather_facts": False,
        "roles": [{"role": "cleanslate.gpu.node_reset"}],
        "post_tasks": [{"name": "Never reached", "ansible.builtin.debug": {"msg": "went on"}}]}]))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"only-node": host}}}}}))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", str(inventory)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == returncode, proc.stdout[-3000:]
    assert message in proc.stdout and "went on" not in proc.stdout, proc.stdout[-3000:]


def test_a_spared_gpu_keeps_its_holders_through_reset_yml_and_only_the_others_are_reset(crashed_node, tmp_path):
    """Several servers on one node: reset.yml with node_reset_gpu_reset_spare_gpus reaches
    gpu_reset. Every holder of GPU 3 lives on, the tensor-parallel worker whose parent (the API
    server) is a target included; every other holder is stopped; GPUs 0-2 are verified clean."""
    manifest = crashed_node
    proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
        manifest, node_reset_gpu_reset_spare_gpus=["3"], node_reset_nvml_verify_gpus=["0", "1", "2"]), tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    row = rows["simulated-node"]
    assert row["status"] == "ok", row
    holders = [entry for entries in manifest["processes"].values() for entry in entries if entry["gpus"]]
    spared = [entry for entry in holders if 3 in entry["gpus"]]
    assert spared and any(entry in manifest["processes"]["worker"] for entry in spared)
    assert all(_alive(entry["pid"]) for entry in spared), spared
    assert not any(_alive(entry["pid"]) for entry in holders if 3 not in entry["gpus"])
    assert row["killed"] == len(holders) - len(spared) + len(manifest["processes"]["api_server"]), row


def test_other_units_that_cannot_be_stopped_fail_the_host_at_unit_before_any_signal(crashed_node, tmp_path):
    """node_reset_units on a host whose systemctl cannot answer (no systemd as PID 1 here; the fleet
    tests stop real units): each unit is tried, the host is `failed at unit` with each unit's own
    message (not Ansible's "One or more items failed"), and nothing of the node was touched. Where
    systemd runs, the units are not installed: each is a note and the reset goes on."""
    manifest = crashed_node
    proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
        manifest, node_reset_units=["vllm-x.service", "vllm-y.service"]), tmp_path)
    row = rows["simulated-node"]
    if Path("/run/systemd/system").is_dir():
        assert proc.returncode == 0 and row["status"] == "ok", proc.stdout[-3000:]
        assert "unit vllm-x.service does not exist: skipped" in proc.stderr  # warnings
        assert "unit vllm-y.service does not exist: skipped" in proc.stderr
        return
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row["status"] == "failed at unit" and row["killed"] == 0 and not row["changed"], row
    # systemctl's own word: not booted with systemd here; on a controller root without systemd's
    # package (tools/versions.py controllers), that systemctl is missing.
    assert re.search(r"vllm-x\.service: (System has not been booted with systemd|systemctl is not on this "
                     r"host's PATH: the unit cannot be stopped here)", row["problems"][0]), row
    assert "vllm-y.service: " in row["problems"][0], row
    assert all(_alive(entry["pid"]) for entries in manifest["processes"].values() for entry in entries)


def test_a_real_resets_report_names_each_process_it_stopped_and_each_leftover_with_why_no_secret(
        crashed_node, tmp_path):
    """reset.yml's report (JSON and Markdown) after a real reset: each process stopped with its pid,
    name, command line, GPUs, the signal that ended it and why it was chosen; each leftover removed or
    kept with why, the segment a worker held open removed because the reset stopped that worker (a
    check keeps it). A secret on a stopped process's command line reaches no file and no output, -vvv
    included."""
    manifest = crashed_node
    canary_key, canary_token = "sk-canary-%d" % os.getpid(), "hf_canary%d" % time.time_ns()
    server = str(tmp_path / "canary-server")
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", server, "--api-key", canary_key,
                               "--hf-token=" + canary_token], stdin=subprocess.DEVNULL)
    try:
        proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
            manifest, node_reset_gpu_reset_cmdline_patterns=[manifest["api_server_pattern"], re.escape(server)]),
            tmp_path, "-vvv")
    finally:
        canary.kill()
        canary.wait()
    assert proc.returncode == 0, proc.stdout[-3000:]
    row = rows["simulated-node"]
    stopped = {entry["pid"]: entry for entry in row["stopped"]}
    for rank, worker in enumerate(manifest["processes"]["worker"]):
        entry = stopped[worker["pid"]]
        assert entry["name"] == worker["name"] and entry["gpus"] == [rank] and entry["signal"] == "SIGTERM", entry
        assert "GPU %d" % rank in entry["reason"] and entry["cmdline"], entry
    ignorer = manifest["processes"]["term_ignorer"][0]
    assert stopped[ignorer["pid"]]["signal"] == "SIGKILL", stopped[ignorer["pid"]]
    api = stopped[manifest["processes"]["api_server"][0]["pid"]]
    assert "command line matches" in api["reason"] and " serve " in api["cmdline"] and api["gpus"] == [], api
    masked = stopped[canary.pid]["cmdline"]
    assert masked.endswith("%s --api-key ******** --hf-token=********" % server), masked
    assert row["stopped_left_out"] == 0 and len(stopped) == row["killed"], row
    # Each leftover with why: the torch segment worker 0 held open went because the reset stopped it.
    leftovers = {entry["path"]: entry for entry in row["shm_leftovers"]}
    mapper, worker_fd = manifest["shm"]["in_use"]
    comm = manifest["processes"]["worker"][0]["name"][:15]  # shm_clean names a holder by its comm
    assert leftovers[worker_fd["path"]] == {"path": worker_fd["path"], "done": "removed", "why": "held only by pid %d (%s), "
                                            "which the reset stopped" % (worker_fd["pid"], comm)}, leftovers
    assert leftovers[mapper["path"]]["done"] == "kept" and "pid %d (" % mapper["pid"] in leftovers[mapper["path"]]["why"]
    assert all(leftovers[path] == {"path": path, "done": "removed", "why": "no live process held it"}
               for path in manifest["shm"]["leftovers"]), leftovers
    reports = sorted((tmp_path / "reports").glob("reset-*"))
    markdown = next(path for path in reports if path.suffix == ".md").read_text()
    assert "\nStopped:\n- simulated-node:\n" in markdown
    worker0 = stopped[manifest["processes"]["worker"][0]["pid"]]
    assert "  - pid %d %s (SIGTERM, GPU 0; %s): " % (worker0["pid"], worker0["name"], worker0["reason"]) in markdown
    assert "  - removed %s: held only by pid %d " % (worker_fd["path"], worker_fd["pid"]) in markdown
    for text in [path.read_text() for path in reports] + [proc.stdout, proc.stderr]:
        assert canary_key not in text and canary_token not in text


def _xid_line(manifest, index, code, text):
    """A kernel log line of Xid `code` on GPU `index` of the simulated node, as the driver writes it."""
    domain, bus, device = FakeNvml(manifest["nvml"]["state_dir"]).gpus()[index]["pci_bus_id"].split(".")[0].split(":")
    return b"2026-12-05T10:00:00+0000 node kernel: NVRM: Xid (PCI:%s:%s:%s): %d, %s" % (
        domain[-4:].lower().encode(), bus.lower().encode(), device.lower().encode(), code, text)


def test_a_gpu_whose_xid_needs_a_reboot_or_service_is_reported_with_its_line_and_fails_the_host(crashed_node, tmp_path):
    """The kernel log (fed through node_reset_nvml_verify_xid_log_path) says GPU 0 fell off the bus
    (79) and GPU 1's row remapper failed (64); GPU 2's 13 is an application's. The reset runs, and the
    host is needs_service (the worst), fails (serving is skipped for a host its reset fails), and each
    GPU's problem names its Xid and quotes its line as the log wrote it: a template, bytes that are not
    UTF-8 and a 100 000-character line come through untemplated, escaped and cut."""
    manifest = crashed_node
    ran = tmp_path / "template-ran"
    hostile = b"{{ lookup('pipe', 'touch %s') }}" % str(ran).encode()
    log = tmp_path / "kern.log"
    log.write_bytes(b"\n".join([
        _xid_line(manifest, 2, 13, b"pid=4242, name=python3, Graphics SM Warp Exception " + hostile),
        _xid_line(manifest, 0, 79, b"pid='<unknown>', name=<unknown>, GPU has fallen off the bus. " + hostile + b"A" * 100000),
        _xid_line(manifest, 1, 64, b"pid='<unknown>', name=<unknown>, Row Remapper Error \xff\xfe{% raw %}"),
    ]) + b"\n")
    proc, rows = _run("reset", {"simulated-node": LOCAL}, node_reset_vars(
        manifest, node_reset_nvml_verify_xid_log_path=str(log)), tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    row = rows["simulated-node"]
    assert row["status"] == "needs_service" and not row["ok"] and row["killed"] > 0, row
    assert "| simulated-node | needs_service |" in proc.stdout
    (gpu0,) = [problem for problem in row["problems"] if problem.startswith("GPU 0 (")]
    (gpu1,) = [problem for problem in row["problems"] if problem.startswith("GPU 1 (")]
    assert not [problem for problem in row["problems"] if problem.startswith("GPU 2 (")], row["problems"]
    assert "needs_reboot: Xid 79" in gpu0 and hostile.decode() in gpu0 and "AAAA..." in gpu0 and len(gpu0) < 1000, gpu0
    assert "needs_service: Xid 64" in gpu1 and "\\\\xff\\\\xfe{% raw %}" in gpu1, gpu1
    assert all("this collection does neither" in problem for problem in (gpu0, gpu1))
    assert not ran.exists()


def test_reset_and_serve_resets_and_starts_nothing_on_a_host_whose_gpu_xid_needs_a_reboot(crashed_node, tmp_path):
    """reset_and_serve.yml's look reads the kernel log before it decides (issue 39): GPU 0 fell off the
    bus (79) and the driver's 154 asks for a GPU reset. The crashed server would be reset, but a reset
    cannot help: no process is signalled, no leftover removed, no unit written; the row is needs_reboot
    with GPU 0's Xid line and the host fails, as when node_reset's own final check finds it."""
    manifest = crashed_node
    every_pid = [entry["pid"] for entries in manifest["processes"].values() for entry in entries]
    config_dir = tmp_path / "etc"
    # A process name is anyone's to choose: the line goes through the look's facts (the probe read it) untemplated.
    ran = tmp_path / "template-ran"
    hostile = b"{{ lookup('pipe', 'touch %s') }}" % str(ran).encode()
    log = tmp_path / "kern.log"
    log.write_bytes(b"\n".join([
        _xid_line(manifest, 1, 13, b"pid=4242, name=python3, Graphics SM Warp Exception"),
        _xid_line(manifest, 0, 79, b"pid='<unknown>', name=<unknown>, GPU has fallen off the bus. " + hostile),
        _xid_line(manifest, 0, 154, b"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
    ]) + b"\n")
    (tmp_path / "metrics").mkdir()
    # The engine is never started: an executable that would fail if it were.
    executable = tmp_path / "vllm"
    executable.write_text("#!/bin/sh\nexit 1\n")
    executable.chmod(0o755)
    proc, rows = _run("reset_and_serve", {"simulated-node": LOCAL}, node_reset_vars(
        manifest, node_reset_nvml_verify_xid_log_path=str(log), inference_service_model="m",
        inference_service_executable=str(executable),
        inference_service_engine_version="0.33.0", inference_service_unit="cleanslate-xid-test.service",
        inference_service_config_dir=str(config_dir), node_reset_metrics_dir=str(tmp_path / "metrics")), tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    # One server: its probe read the kernel log in its own host contact; no task of its own did (issue 42).
    assert re.search(r"TASK \[Read the kernel log's Xid records of the servers' GPUs\] \**\nskipping: \[simulated-node\]",
                     proc.stdout), proc.stdout[-3000:]
    # The metric CleanslateGpuNeedsReboot fires on (code: the newest of the worst class), written though nothing was reset.
    metrics = (tmp_path / "metrics" / "cleanslate_gpu_node_reset.prom").read_text()
    assert re.search(r'^cleanslate_gpu_reset_gpu_xid_action\{[^}]*action="needs_reboot"[^}]*code="154"[^}]*\} 1$',
                     metrics, re.M), metrics
    row = rows["simulated-node"]
    assert row["status"] == "needs_reboot" and row["killed"] == 0, (row["status"], row["problems"])
    gpu0 = [problem for problem in row["problems"] if problem.startswith("GPU 0 (")]
    assert any("needs_reboot: Xid 79" in problem and "fallen off the bus. " + hostile.decode() in problem
               for problem in gpu0), gpu0
    assert not ran.exists()
    assert any("needs_reboot: Xid 154" in problem and "GPU Reset Required" in problem for problem in gpu0), gpu0
    assert not [problem for problem in row["problems"] if problem.startswith("GPU 1 (")], row["problems"]
    assert all(procinfo.alive(pid) for pid in every_pid), "a reset cannot help: nothing is signalled"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()
    assert not config_dir.exists()


def test_a_real_reset_keeps_the_evidence_named_in_its_report_and_a_clean_host_or_a_check_keeps_none(
        crashed_node, tmp_path):
    """Before the first signal, a real reset keeps the processes it is about to stop (masked), the Xid
    records and the rest in a 0700 directory of its own, named in the host's row and the output; a
    check of the dirty node, and a second reset of the now clean node, keep none."""
    manifest = crashed_node
    evidence = Path(manifest["root"]) / "evidence"
    canary_key = "sk-evidence-%d" % os.getpid()
    server = str(tmp_path / "hung-server")
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", server, "--api-key", canary_key],
                              stdin=subprocess.DEVNULL)
    role_vars = node_reset_vars(manifest, node_reset_gpu_reset_cmdline_patterns=[manifest["api_server_pattern"], re.escape(server)])
    try:
        proc, rows = _run("reset", {"simulated-node": LOCAL}, role_vars, tmp_path, "--check")
        assert proc.returncode == 0 and not list(evidence.glob("*")), proc.stdout[-3000:]
        assert rows["simulated-node"]["evidence"]["directory"] is None
        proc, rows = _run("reset", {"simulated-node": LOCAL}, role_vars, tmp_path)
    finally:
        canary.kill()
        canary.wait()
    assert proc.returncode == 0, proc.stdout[-3000:]
    kept = rows["simulated-node"]["evidence"]
    directory = Path(kept["directory"])
    assert directory.parent == evidence and list(evidence.iterdir()) == [directory], kept
    assert directory.stat().st_mode & 0o777 == 0o700
    # The printed report (one YAML string per line) names it too.
    assert "Evidence kept on the host before the reset:" in proc.stdout and "- simulated-node: %s" % directory in proc.stdout
    processes = (directory / "processes.txt").read_text()
    assert "%d %s %s --api-key ********\n" % (canary.pid, sys.executable, server) in processes.replace(
        "-c import time; time.sleep(600) ", ""), processes
    api = manifest["processes"]["api_server"][0]["pid"]
    assert "\n%d " % api in "\n" + processes, processes
    assert (directory / "xid.txt").read_text() and (directory / "summary.json").exists()
    assert all(canary_key not in path.read_text() for path in directory.iterdir())
    assert canary_key not in proc.stdout + proc.stderr

    proc, rows = _run("reset", {"simulated-node": LOCAL}, role_vars, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert rows["simulated-node"]["evidence"]["directory"] is None and list(evidence.iterdir()) == [directory]
    markdown = next(path for path in sorted((tmp_path / "reports").glob("reset-2*.md"))).read_text()
    assert "Evidence kept on the host before the reset:\n- simulated-node: %s\n" % directory in markdown
