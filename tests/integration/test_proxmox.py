"""Proxmox containers reached only through `pct exec`, with the real community.proxmox connection.

The fleet's two hosts are the containers and this machine is their node (fleet/pve.py: sshd,
sudo and the pct stand-in, fleet/pct.py). Ansible logs in to the node over real SSH with
community.proxmox.proxmox_pct_remote (paramiko) and runs `/usr/sbin/pct exec <vmid> -- ...`;
the host-side sweep runs on the node (over OpenSSH), scoped to the container's cgroup. The
inventory is inventory/pve_remote.example.yml with only what differs here filled in (address,
port, key, vmids). Host keys are checked: the controller's known_hosts holds the node's key.
Everything is asserted from outside: this machine's /proc and cgroups, the fleet report, the recap.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import HOST_NVML_LIB, HOST_PARENT, HOST_TESTS, REPO, _fleet_prerequisites
from tests.integration.fleet import Fleet, engines
from tests.integration.fleet.pve import USER, PveNode, spawn_attached
from tests.integration.fleet.reports import newest_report, rows_by_host
from tests.integration.test_fleet_reset import _crash, _pids, _recap, _targets, _uncrash
from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars

VENV_BIN = Path(sys.executable).parent
EXAMPLE = REPO / "inventory" / "pve_remote.example.yml"
PROXMOX = REPO / ".ansible" / "collections" / "ansible_collections" / "community" / "proxmox"
HOSTS = ("node1", "node2")
SPARED = ("bystander", "persistenced", "shm_mapper", "monitor")
HIDDEN_MIB = 30000

# A GPU holder on the node, charged to a container's cgroup (spawn_attached): it opens the
# device files and maps each one (one page, MAP_PRIVATE, as a CUDA context maps /dev/nvidiaN:
# gpu_reset takes a process that only has them open for a client), then tells its context
# inside the container (through a FIFO) its node pid.
HOLDER = """
import ctypes, mmap, os, signal, sys
fifo, paths = sys.argv[1], sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
held = [os.open(path, os.O_RDONLY) for path in paths]
for fd, path in zip(held, paths):
    if libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0) in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of %s failed" % path)
print("holding", flush=True)
if fifo != "-":
    peer = open(fifo, "w")  # blocks until the context opens the other end
    peer.write("%d\\n" % os.getpid())
    peer.flush()
while True:
    signal.pause()
"""
# Its GPU context as the container's NVML sees it: the fake NVML counts memory while a process
# visible to the reader lives, so this process registers the memory under the holder's node
# pid (as the real driver lists host pids inside a container) and ends when the holder does
# (end of file on the FIFO), as the driver frees a context when its process exits.
CONTEXT = """
import os, sys
from tests.fixtures.fake_nvml import FakeNvml
fifo, state, gpu, mib = sys.argv[1:]
with open(fifo) as peer:
    holder = int(peer.readline())
    FakeNvml(state).register(os.getpid(), int(gpu), int(mib), reported_pid=holder)
    open(fifo + ".registered", "w").close()
    peer.read()
"""


# --- the module's fleet, node and controller ---------------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory, fake_nvml_lib):
    """This module's own fleet (not the session's): two containers, shared by its scenarios."""
    _fleet_prerequisites()
    if not (PROXMOX / "plugins" / "connection" / "proxmox_pct_remote.py").is_file():
        pytest.fail(f"community.proxmox is not installed in {PROXMOX.parent.parent} (make setup installs it)")
    fleet = Fleet(tmp_path_factory.mktemp("pve-fleet"), hosts=len(HOSTS),
                  copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: fake_nvml_lib})
    try:
        fleet.up()
        yield fleet
    finally:
        fleet.down()


@pytest.fixture(scope="module")
def node(fleet, tmp_path_factory):
    node = PveNode(fleet, tmp_path_factory.mktemp("pve-node"))
    try:
        node.up()
        yield node
    finally:
        node.down()


@pytest.fixture(scope="module")
def controller(node, tmp_path_factory):
    """HOME of the Ansible runs (paramiko reads ~/.ssh/known_hosts from it) and the inventory dir."""
    home = tmp_path_factory.mktemp("controller")
    (home / ".ssh").mkdir(mode=0o700)
    shutil.copy(node.known_hosts, home / ".ssh" / "known_hosts")
    (home / "inventory" / "host_vars").mkdir(parents=True)
    return home


def _inventory(fleet, node, controller, user="root") -> Path:
    """inventory/pve_remote.example.yml with this run's node address, port, key and vmids."""
    example = yaml.safe_load(EXAMPLE.read_text())
    containers = example["all"]["children"]["gpu_nodes"]
    containers["hosts"] = {name: {"proxmox_vmid": host.vmid, "node_reset_pve_vmid": host.vmid}
                           for name, host in fleet.hosts.items()}
    containers["vars"].update(ansible_host="127.0.0.1", ansible_port=node.port, ansible_user=user,
                              ansible_ssh_private_key_file=str(node.key))
    pve = example["all"]["children"]["proxmox_nodes"]["hosts"][containers["vars"]["node_reset_pve_host"]]
    pve.update(ansible_host="127.0.0.1", ansible_port=node.port, ansible_ssh_private_key_file=str(node.key),
               ansible_ssh_common_args=f"-o UserKnownHostsFile={node.known_hosts}")
    path = controller / "inventory" / "pve.yml"
    path.write_text(yaml.safe_dump(example, sort_keys=False))
    return path


def _ansible(controller, argv, pipelining=False, timeout=540) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(controller), ANSIBLE_PIPELINING=str(pipelining))
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _playbook(controller, inventory, playbook, pipelining=False):
    """(process, report, seconds) of one run of playbooks/<playbook>."""
    reports = controller / "reports"
    started = time.monotonic()
    proc = _ansible(controller, [str(VENV_BIN / "ansible-playbook"), f"playbooks/{playbook}", "-i", str(inventory),
                                 "-l", "gpu_nodes", "-e", f"fleet_report_path={reports}"], pipelining)
    seconds = time.monotonic() - started
    report = newest_report(reports, playbook[:-4])
    shutil.rmtree(reports, ignore_errors=True)
    print(f"{playbook} pipelining={pipelining}: {seconds:.1f} s")
    return proc, report, seconds


# --- processes seen from the node --------------------------------------------------------------

def _outer(host, inner_pid):
    """(node pid, start ticks) of the container's process `inner_pid`."""
    for pid in host.cgroup.pids():
        try:
            nspid = Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0].split()
        except (OSError, IndexError):
            continue
        if len(nspid) > 1 and nspid[-1] == str(inner_pid):
            return pid, procinfo.start_ticks(pid)
    raise AssertionError(f"{host.name} has no process {inner_pid}")


def _alive(outer) -> bool:
    """The node's process is alive and still the one recorded (pid reuse safe)."""
    pid, ticks = outer
    return procinfo.alive(pid) and procinfo.start_ticks(pid) == ticks


class Crashed:
    """A container crashed by the simulator, its processes as the node sees them."""

    def __init__(self, fleet, name):
        self.name = name
        self.host = fleet.hosts[name]
        self.manifest = _crash(fleet, name)
        self.targets = [_outer(self.host, pid) for pid in _targets(self.manifest)]
        self.spared = [_outer(self.host, pid) for pid in _pids(self.manifest, *SPARED)]
        # CUDA initialised without a context: the container's own reset, which reads NVML, leaves
        # it alone (it holds no memory); the node's sweep has no NVML here (the fake one lives in
        # the container), and without NVML mappings alone decide, so the sweep stops it.
        self.swept_without_nvml = [_outer(self.host, pid) for pid in _pids(self.manifest, "init_only")]
        self.device_files = self.manifest["device_files"]
        self.hidden = None  # (node pid, start ticks) of its hidden holder, when it has one
        self.sharing_neighbour = None  # of a process in another container holding its device files


def _hidden_holder(fleet, crashed, gpu, tag):
    """A holder of `crashed`'s GPU `gpu` that the container cannot see, with its NVML context
    inside the container; returns (the holder's Popen, (node pid, start ticks))."""
    shared = crashed.host.shared
    fifo = shared / f"context-{tag}.fifo"
    os.mkfifo(fifo)
    fleet.run(crashed.name, ["systemd-run", f"--unit=nvml-context-{tag}", "--quiet", "--collect",
                             f"--setenv=PYTHONPATH={HOST_PARENT}", "--", "python3", "-c", CONTEXT, str(fifo),
                             crashed.manifest["nvml"]["state_dir"], str(gpu), str(HIDDEN_MIB)])
    dev = Path(crashed.manifest["dev_dir"])
    holder = spawn_attached(crashed.host, [sys.executable, "-c", HOLDER, str(fifo), str(dev / f"nvidia{gpu}"),
                                           str(dev / "nvidiactl"), str(dev / "nvidia-uvm")],
                            stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "holding\n"
    deadline = time.monotonic() + 60
    while not Path(f"{fifo}.registered").exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the hidden holder's context did not start"
        time.sleep(0.05)
    # Invisible inside: in the node's PID namespace only, yet charged to the container.
    init = crashed.host.init_pid()
    assert os.readlink(f"/proc/{holder.pid}/ns/pid") != os.readlink(f"/proc/{init}/ns/pid")
    assert crashed.host.cgroup.match in Path(f"/proc/{holder.pid}/cgroup").read_text()
    return holder, (holder.pid, procinfo.start_ticks(holder.pid))


def _holder_in(host_or_none, paths):
    """A process holding `paths` that no NVML knows: charged to the container `host`, or the
    node's own when None."""
    argv = [sys.executable, "-c", HOLDER, "-", *paths]
    if host_or_none is None:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    else:
        proc = spawn_attached(host_or_none, argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "holding\n"
    return proc, (proc.pid, procinfo.start_ticks(proc.pid))


def _end(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def crashed_pair(fleet, node, controller):
    """Both containers crashed. In each, a holder hidden from it (NVML inside shows its memory);
    beside them, holders that the sweeps must spare: one in each container's cgroup that holds
    only the *other* container's device files (one GPU passed through to two containers), and
    one of the node's own holding node1's."""
    started, scene = [], {}
    host_vars = controller / "inventory" / "host_vars"
    try:
        for name in HOSTS:
            scene[name] = Crashed(fleet, name)
            (host_vars / f"{name}.yml").write_text(yaml.safe_dump(node_reset_vars(
                scene[name].manifest, node_reset_nvml_verify_timeout=10)))
        for index, name in enumerate(HOSTS):
            holder, outer = _hidden_holder(fleet, scene[name], gpu=2, tag=f"{name}-{time.monotonic_ns()}")
            started.append(holder)
            scene[name].hidden = outer
            other = scene[HOSTS[1 - index]]
            proc, outer = _holder_in(scene[name].host, other.device_files)
            started.append(proc)
            other.sharing_neighbour = outer
        proc, scene["node"] = _holder_in(None, scene["node1"].device_files)
        started.append(proc)
        yield scene
    finally:
        _end(started)
        for name in HOSTS:
            (host_vars / f"{name}.yml").unlink(missing_ok=True)
            fleet.run(name, ["sh", "-c", "systemctl stop 'nvml-context-*' ; true"], check=False)
            _uncrash(fleet, name)
            for leftover in fleet.hosts[name].shared.glob("context-*"):
                leftover.unlink()


def _assert_reset_through_pct(proc, report, scene):
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    rows = rows_by_host(report)
    assert sorted(rows) == list(HOSTS)
    for name in HOSTS:
        crashed, row = scene[name], rows[name]
        # The container's own reset (inside, through pct) stopped what it sees, the node's sweep
        # (scoped to the container's cgroup) the holder it does not see: nothing else.
        assert row["status"] == "ok" and row["ok"], row
        assert row["killed"] == len(crashed.targets) + 1 + len(crashed.swept_without_nvml), row
        assert row["mib_freed"] > 0 and row["shm_bytes_freed"] > 0 and row["bytecode_removed"] >= 1, row
        assert not any(_alive(outer) for outer in crashed.targets), name
        assert not _alive(crashed.hidden), name
        assert not any(_alive(outer) for outer in crashed.swept_without_nvml), name
        assert all(_alive(outer) for outer in crashed.spared), name
        # Held this container's device files from the other container's cgroup: spared.
        assert _alive(crashed.sharing_neighbour), name
    assert _alive(scene["node"])  # the node's own process holding node1's device files


# --- pct itself --------------------------------------------------------------------------------

def test_pct_exec_enters_the_container_and_passes_stdio_and_status_through(fleet, node):
    host = fleet.hosts["node1"]
    init = host.init_pid()
    proc = node.ssh("root", f"pct exec {host.vmid} -- sh -c "
                    "'hostname; for ns in mnt pid net ipc uts cgroup; do readlink /proc/self/ns/$ns; done; "
                    "cat /proc/self/cgroup; test -t 0 || echo no-tty; echo to-stderr >&2; exit 7'")
    assert proc.returncode == 7, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == "node1"
    assert lines[1:7] == [os.readlink(f"/proc/{init}/ns/{ns}") for ns in ("mnt", "pid", "net", "ipc", "uts", "cgroup")]
    assert lines[-2] == "0::/.lxc"  # the container's own cgroup root, seen from inside
    assert lines[-1] == "no-tty"
    assert proc.stderr == b"to-stderr\n"

    payload = bytes(range(256)) * 4096 + os.urandom(65536)  # every byte value, 1 MiB and more
    proc = node.ssh("root", f"pct exec {host.vmid} -- cat", input=payload)
    assert proc.returncode == 0 and proc.stdout == payload

    # Seen from the node, a process started through pct is one of the container's.
    proc = node.ssh("root", f"pct exec {host.vmid} -- sh -c 'sleep 300 >/dev/null 2>&1 & echo $!'")
    outer = _outer(host, int(proc.stdout))
    try:
        assert f"{host.cgroup.match}payload/.lxc" in Path(f"/proc/{outer[0]}/cgroup").read_text()
    finally:
        os.kill(outer[0], 9)

    # On a terminal, a terminal of the container's own (lxc-attach allocates one there).
    proc = node.ssh("root", f"pct exec {host.vmid} -- tty", tty=True)
    assert proc.returncode == 0 and re.fullmatch(rb"/dev/pts/\d+\r\n", proc.stdout), proc.stdout

    # The environment goes in (--keep-env, the default) but for pct's PATH and the SSL variables.
    proc = node.ssh("root", f"SSL_CERT_FILE=/x CLEANSLATE_PROBE=1 pct exec {host.vmid} -- env")
    env = dict(line.split("=", 1) for line in proc.stdout.decode().splitlines())
    assert env["CLEANSLATE_PROBE"] == "1" and env["container"] == "lxc" and "SSL_CERT_FILE" not in env
    assert env["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"
    proc = node.ssh("root", f"CLEANSLATE_PROBE=1 pct exec {host.vmid} --keep-env 0 -- env")
    assert sorted(proc.stdout.decode().split()) == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                                    "container=lxc"]


def test_pct_refuses_what_the_real_one_refuses(fleet, node):
    vmid = fleet.hosts["node2"].vmid
    expected = {
        "pct exec 999 -- true": f"Configuration file 'nodes/{os.uname().nodename}/lxc/999.conf' does not exist\n",
        "pct exec 12 -- true": "400 Parameter verification failed.\nvmid:",
        f"pct exec {vmid}": "missing command\n",
        f"pct exec {vmid} --bogus 1 -- true": "400 Parameter verification failed.\nbogus:",
        f"pct status {vmid}": None,
    }
    for command, message in expected.items():
        proc = node.ssh("root", command)
        if message is None:
            assert proc.returncode == 0 and proc.stdout == b"status: running\n", proc
        else:
            assert proc.returncode == 255 and proc.stderr.decode().startswith(message), (command, proc)

    # A container that is powered off: not running, as pct says it.
    fleet.poweroff("node2")
    try:
        proc = node.ssh("root", f"pct exec {vmid} -- true")
        assert proc.returncode == 255 and proc.stderr == f"container '{vmid}' not running!\n".encode()
        assert node.ssh("root", f"pct status {vmid}").stdout == b"status: stopped\n"
    finally:
        fleet.boot("node2")


def test_a_user_with_sudo_for_pct_exec_only_reaches_the_containers_and_nothing_else(fleet, node):
    """pctuser's sudoers line (fleet/pve.py, docs/proxmox.md) allows `pct exec` of the fleet's
    containers, without a password, and nothing else."""
    vmid = fleet.hosts["node1"].vmid
    proc = node.ssh(USER, f"sudo /usr/sbin/pct exec {vmid} -- id -u")
    assert proc.returncode == 0 and proc.stdout == b"0\n", proc
    proc = node.ssh(USER, f"/usr/sbin/pct exec {vmid} -- true")
    assert proc.returncode == 255 and proc.stderr == b"please run as root\n"
    for refused in (f"sudo -n /usr/sbin/pct status {vmid}", "sudo -n /usr/sbin/pct exec 999 -- true",
                    "sudo -n /bin/sh -c true"):
        proc = node.ssh(USER, refused)
        assert proc.returncode == 1 and b"a password is required" in proc.stderr, (refused, proc)


def test_pipelining_on_still_copies_the_module_the_connection_cannot_pipeline(fleet, node, controller):
    """community.proxmox 1.4.0's connection does not declare pipelining: Ansible copies every
    module into the container (PUT, `cat >` through pct) whatever the setting says."""
    inventory = _inventory(fleet, node, controller)
    for pipelining in (False, True):
        proc = _ansible(controller, [str(VENV_BIN / "ansible"), "node1", "-i", str(inventory), "-m",
                                     "ansible.builtin.ping", "-vvv"], pipelining)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert re.search(r"PUT .*AnsiballZ_ping\.py", proc.stdout), pipelining
        assert f"EXEC /usr/sbin/pct exec {fleet.hosts['node1'].vmid} -- /bin/sh -c" in proc.stdout


# --- the playbooks through pct -----------------------------------------------------------------

def test_crashed_containers_reset_side_by_side_through_pct_and_hidden_holders_are_swept_from_the_node(
        fleet, node, controller, crashed_pair):
    inventory = _inventory(fleet, node, controller)
    proc, report, _seconds = _playbook(controller, inventory, "reset.yml")
    _assert_reset_through_pct(proc, report, crashed_pair)

    proc, report, _seconds = _playbook(controller, inventory, "reset.yml")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert {name: _recap(proc.stdout)[name]["changed"] for name in HOSTS} == {name: 0 for name in HOSTS}
    assert all(row["killed"] == 0 and row["mib_freed"] == 0 for row in report["hosts"])

    proc, report, _seconds = _playbook(controller, inventory, "verify.yml")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert {name: row["status"] for name, row in rows_by_host(report).items()} == {name: "clean" for name in HOSTS}


def test_a_non_root_user_with_sudo_for_pct_resets_with_pipelining_on(fleet, node, controller, crashed_pair):
    inventory = _inventory(fleet, node, controller, user=USER)
    proc, report, _seconds = _playbook(controller, inventory, "reset.yml", pipelining=True)
    _assert_reset_through_pct(proc, report, crashed_pair)
    proc, report, _seconds = _playbook(controller, inventory, "verify.yml", pipelining=True)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert {name: row["status"] for name, row in rows_by_host(report).items()} == {name: "clean" for name in HOSTS}


def test_the_first_check_of_a_container_waits_pve_sweep_after_and_the_check_after_the_sweep_the_timeout(
        fleet, node, controller, crashed_pair):
    """Each container's hidden holder keeps its GPU dirty for as long as it lives, so the first
    check could only end at its timeout. With node_reset_nvml_verify_timeout at an hour, the
    run ends (well inside the run's own limit) only because the first check waits
    node_reset_pve_sweep_after (0: one read) before the node sweeps; the check after the sweep
    finds the GPUs clean as soon as they are."""
    for name in HOSTS:
        path = controller / "inventory" / "host_vars" / f"{name}.yml"
        values = dict(yaml.safe_load(path.read_text()), node_reset_nvml_verify_timeout=3600, node_reset_pve_sweep_after=0)
        path.write_text(yaml.safe_dump(values))
    proc, report, _seconds = _playbook(controller, _inventory(fleet, node, controller), "reset.yml")
    _assert_reset_through_pct(proc, report, crashed_pair)


def test_a_container_whose_monitor_died_is_unreachable_through_pct_and_swept_from_its_node(fleet, node, controller):
    """node2's monitor is killed: pct says it is not running, while its processes live on and
    hold its GPUs. Ansible cannot reach it; its node stops the holders in its cgroup only."""
    host_vars = controller / "inventory" / "host_vars"
    scene = {}
    try:
        for name in HOSTS:
            scene[name] = Crashed(fleet, name)
            (host_vars / f"{name}.yml").write_text(yaml.safe_dump(node_reset_vars(
                scene[name].manifest, node_reset_nvml_verify_timeout=10)))
        fleet.hosts["node2"].kill_monitor()
        vmid = fleet.hosts["node2"].vmid
        assert node.ssh("root", f"pct status {vmid}").stdout == b"status: stopped\n"
        assert all(_alive(outer) for outer in scene["node2"].targets + scene["node2"].spared)

        proc, report, _seconds = _playbook(controller, _inventory(fleet, node, controller), "reset.yml")
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        rows = rows_by_host(report)
        assert rows["node1"]["status"] == "ok", rows["node1"]
        assert rows["node2"]["status"] == "swept-unreachable" and rows["node2"]["ok"], rows["node2"]
        assert rows["node2"]["problems"][0].startswith("unreachable: "), rows["node2"]
        assert rows["node2"]["killed"] == len(scene["node2"].targets + scene["node2"].swept_without_nvml), rows["node2"]
        assert not any(_alive(outer) for outer in scene["node2"].swept_without_nvml)
        for name in HOSTS:
            assert not any(_alive(outer) for outer in scene[name].targets), name
            assert all(_alive(outer) for outer in scene[name].spared), name
    finally:
        for name in HOSTS:
            (host_vars / f"{name}.yml").unlink(missing_ok=True)
        fleet.hosts["node2"].stop()  # the orphaned container: its cgroup is killed
        for name in HOSTS:
            _uncrash(fleet, name)
        fleet.boot("node2")


SERVE_UNIT = "cleanslate-inference.service"


def _serve_vars(manifest) -> dict:
    """The inference_service variables that serve the stand-in engine (tests/sim/engine,
    installed in the container as /usr/local/bin/vllm by fleet/engines.py) on the GPUs of the
    container's simulated node: its device files and its fake NVML, which node_reset has just
    cleaned, so the engine's workers hold what the reset freed."""
    return {
        "inference_service_engine": "vllm",
        "inference_service_model": "sim/Llama-3.1-8B-Instruct",
        "inference_service_unit": SERVE_UNIT,
        "inference_service_tensor_parallel_size": 2,
        "inference_service_speculative": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4},
        "inference_service_environment": {"FAKE_NVML_STATE": manifest["nvml"]["state_dir"],
                                          "STANDIN_DEV_DIR": manifest["dev_dir"], "STANDIN_LOAD_S": "1",
                                          "STANDIN_SHM_DIR": manifest["shm_dir"]},
        "inference_service_ready_timeout": 120,
        "inference_service_poll_interval": 0.2,
        "inference_service_progress_interval": 5,
        "inference_service_drain_timeout": 2,
        "inference_service_restart_sec": 1,
    }


def test_reset_and_serve_through_pct_serves_again_inside_each_container(fleet, node, controller):
    """reset_and_serve.yml through pct on two crashed containers: each is reset (its GPU holders
    stopped, its bystanders spared), then the unit runs inside the container (its processes in
    the container's cgroup as the node sees them, its workers mapping the GPUs the reset freed)
    and answers; the report says each host serves."""
    host_vars = controller / "inventory" / "host_vars"
    scene = {}
    try:
        for name in HOSTS:
            engines.install(fleet.hosts[name].root)
            scene[name] = Crashed(fleet, name)
            (host_vars / f"{name}.yml").write_text(yaml.safe_dump({
                **node_reset_vars(scene[name].manifest, node_reset_nvml_verify_timeout=10),
                **_serve_vars(scene[name].manifest)}))
        proc, report, _seconds = _playbook(controller, _inventory(fleet, node, controller), "reset_and_serve.yml")
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        rows = rows_by_host(report)
        assert sorted(rows) == list(HOSTS)
        for name in HOSTS:
            row, crashed, host = rows[name], scene[name], fleet.hosts[name]
            assert row["status"] == "ok" and row["ok"] and row["service"]["status"] == "ready", row
            assert row["service_engine"] == "vllm 0.33.0" and row["service"]["completion"].strip(), row
            assert not any(_alive(outer) for outer in crashed.targets), name
            assert all(_alive(outer) for outer in crashed.spared), name
            main = int(fleet.run(name, ["systemctl", "show", "-P", "MainPID", SERVE_UNIT]).stdout)
            assert f"{host.cgroup.match}payload/" in Path(f"/proc/{_outer(host, main)[0]}/cgroup").read_text()
            # Its workers hold the simulated GPUs 0 and 1 as a CUDA context does.
            pattern = crashed.manifest["dev_dir"] + "/nvidia[01]$"
            workers = fleet.run(name, ["sh", "-c", f"cat /proc/*/maps | grep -c '{pattern}'"], check=False).stdout
            assert int(workers) >= 2, workers
            with urllib.request.urlopen(f"http://{host.address}:8000/health", timeout=10) as response:
                assert response.status == 200
        assert "| engine | ready s | first completion ms | acceptance | service |" in proc.stdout
    finally:
        for name in HOSTS:
            (host_vars / f"{name}.yml").unlink(missing_ok=True)
            fleet.run(name, ["sh", "-c", f"systemctl disable --now {SERVE_UNIT}; "
                                         f"rm -rf /etc/systemd/system/{SERVE_UNIT} /etc/cleanslate; "
                                         f"systemctl daemon-reload; systemctl reset-failed {SERVE_UNIT}; true"],
                      check=False, timeout=120)
            _uncrash(fleet, name)
            engines.uninstall(fleet.hosts[name].root)


def test_the_node_changed_nothing_on_this_machine_and_leaves_nothing_behind(node):
    """Last in this module: it takes the node down. Its files, pct included, and its mounts were
    only ever in its own mount namespace; after down() no process, cgroup or listener is left."""
    machine_pct = Path("/usr/sbin/pct")
    assert not machine_pct.exists() or "stand-in" not in machine_pct.read_text(errors="replace")
    assert not any(Path(f"/etc/pve/lxc/{host.vmid}.conf").exists() for host in node.fleet.hosts.values())
    namespace = os.readlink(f"/proc/{node.sshd_pid}/ns/mnt")
    assert namespace != os.readlink("/proc/self/ns/mnt")
    assert str(node.root) not in Path("/proc/self/mountinfo").read_text()
    cgroup_dirs = [path for path, _is_v2 in node.cgroup.dirs]
    assert all(path.is_dir() for path in cgroup_dirs)
    node.down()
    assert not any(path.exists() for path in cgroup_dirs)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                assert os.readlink(entry / "ns" / "mnt") != namespace, f"pid {entry.name} is still in the node"
            except OSError:
                continue
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", node.port), timeout=5).close()
