"""The fleet harness itself: real systemd hosts, isolated from each other, reached over SSH,
and nothing left behind on this machine after down()."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.conftest import HOST_NVML_LIB, HOST_TESTS, REPO, _fleet_prerequisites
from tests.integration.fleet import DEVICE_NAMES, Fleet, HostError

VENV_BIN = Path(sys.executable).parent


def test_every_host_boots_systemd_and_answers_over_ssh(fleet):
    for name, host in fleet.hosts.items():
        out = fleet.ssh(name, "hostname; cat /proc/1/comm; systemctl is-system-running; "
                              "ip -4 -o addr show dev host0").stdout.split("\n")
        assert out[0] == name
        assert out[1] == "systemd"
        assert out[2] in ("running", "degraded")
        assert f"inet {host.address}/" in out[3]


def test_hosts_have_their_own_pid_namespace_and_dev_shm(fleet):
    fleet.run("node1", ["sh", "-c", "echo node1 > /dev/shm/cleanslate-harness-probe"])
    try:
        assert fleet.run("node1", ["cat", "/dev/shm/cleanslate-harness-probe"]).stdout == "node1\n"
        for other in ("node2", "node3"):
            assert fleet.run(other, ["test", "-e", "/dev/shm/cleanslate-harness-probe"], check=False).returncode == 1
        assert not Path("/dev/shm/cleanslate-harness-probe").exists()
        pids = {name: fleet.run(name, ["sh", "-c", "readlink /proc/1/ns/pid"]).stdout for name in fleet.hosts}
        assert len(set(pids.values())) == 3
        assert os.readlink("/proc/self/ns/pid") + "\n" not in pids.values()
    finally:
        fleet.run("node1", ["rm", "-f", "/dev/shm/cleanslate-harness-probe"])


# Maps each argument (one page, MAP_PRIVATE, as a CUDA context maps /dev/nvidiaN) and prints
# the paths of its own device mappings as /proc/self/maps lists them.
MAP_PROBE = """
import mmap, os, sys
held = [mmap.mmap(os.open(path, os.O_RDWR), mmap.PAGESIZE, mmap.MAP_PRIVATE, mmap.PROT_READ) for path in sys.argv[1:]]
print("\\n".join(line.split()[5] for line in open("/proc/self/maps") if line.rstrip().endswith(tuple(sys.argv[1:]))))
"""


def test_hosts_carry_fake_gpu_nodes_python_deps_and_the_simulator(fleet):
    for name in fleet.hosts:
        listing = fleet.run(name, ["stat", "-c", "%n %F %t:%T"] + [f"/dev/{d}" for d in DEVICE_NAMES]).stdout
        for device in DEVICE_NAMES:
            assert f"/dev/{device} character special file 1:5" in listing
        # Mappable like the real nodes, and shown under their own path (gpu_reset's evidence).
        mapped = fleet.run(name, ["python3", "-c", MAP_PROBE, "/dev/nvidia0", "/dev/nvidia-uvm"]).stdout
        assert sorted(mapped.split()) == ["/dev/nvidia-uvm", "/dev/nvidia0"], mapped
        probe = fleet.ssh(name, "/usr/bin/python3 -c 'import psutil, pynvml, sys; print(sys.version_info[:2] >= (3, 9))'")
        assert probe.stdout.strip() == "True"
        assert fleet.run(name, ["test", "-f", f"{HOST_NVML_LIB}/libnvidia-ml.so.1"], check=False).returncode == 0
        assert fleet.run(name, ["test", "-f", f"{HOST_TESTS}/sim/__init__.py"], check=False).returncode == 0


def test_a_spawned_process_lives_in_its_hosts_cgroup_as_seen_from_this_machine(fleet):
    fleet.spawn("node2", "harness-sleeper", ["sh", "-c", "sleep 600 &"])
    try:
        inner = int(fleet.run("node2", ["pgrep", "-x", "sleep"]).stdout.split()[0])
        # The same process from outside: the one in node2's cgroup whose innermost pid is `inner`.
        outer = [pid for pid in fleet.hosts["node2"].cgroup.pids()
                 if Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0].split()[-1] == str(inner)]
        assert len(outer) == 1
        cgroup = Path(f"/proc/{outer[0]}/cgroup").read_text()
        assert fleet.hosts["node2"].cgroup.match in cgroup
        assert "harness-sleeper.service" in cgroup
        for other in ("node1", "node3"):
            assert fleet.hosts[other].cgroup.match not in cgroup
    finally:
        fleet.run("node2", ["systemctl", "stop", "harness-sleeper.service"], check=False)


def test_ansible_reaches_every_host_over_ssh_with_the_inventory(fleet):
    proc = subprocess.run([str(VENV_BIN / "ansible"), "gpu_nodes", "-i", str(fleet.inventory), "-o",
                           "-m", "ansible.builtin.command", "-a", "cat /etc/hostname"],
                          capture_output=True, text=True, timeout=180, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in fleet.hosts:
        assert f"{name} | CHANGED | rc=0 | (stdout) {name}" in proc.stdout


def test_a_powered_off_host_is_unreachable_and_boots_again(fleet):
    fleet.poweroff("node3")
    assert not fleet.hosts["node3"].running()
    assert fleet.hosts["node3"].exit_status == 0
    assert fleet.ssh("node3", "true", check=False).returncode == 255
    assert fleet.ssh("node1", "true").returncode == 0
    with pytest.raises(HostError, match="not running"):
        fleet.run("node3", ["true"])
    fleet.boot("node3")
    assert fleet.ssh("node3", "hostname").stdout.strip() == "node3"


def test_a_reboot_inside_a_host_brings_it_back(fleet):
    host = fleet.hosts["node1"]
    boots = host.boots
    old_init = host.init_pid()
    fleet.run("node1", ["systemctl", "reboot", "--no-block"])
    # nspawn exits with 133 on a reboot; the launcher starts the same disk again.
    fleet.wait_rebooted("node1", boots)
    assert host.init_pid() != old_init
    assert fleet.ssh("node1", "hostname").stdout.strip() == "node1"


def test_down_removes_everything_even_after_the_owner_was_killed(tmp_path, fake_nvml_lib):
    """A fleet whose test process died with SIGKILL is cleaned by the next fleet in its slot;
    then down() leaves no process, cgroup, mount, bridge or file behind."""
    _fleet_prerequisites()
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.integration.fleet import Fleet
        fleet = Fleet({str(tmp_path / 'killed')!r}, hosts=1, slot=7)
        fleet.up()
        fleet.spawn("node1", "leftover", ["sh", "-c", "sleep 600 &"])
        print(fleet.hosts["node1"].init_pid(), flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline().strip()
        assert line.isdigit(), "the owner process did not bring its fleet up"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    orphan_init = int(line)
    orphan_start = _starttime(orphan_init)
    assert orphan_start is not None  # the killed owner's host is still running

    fleet = Fleet(tmp_path / "next", hosts=1, slot=7)
    fleet.up()
    assert _starttime(orphan_init) != orphan_start  # the orphaned host was stopped
    assert not (tmp_path / "killed" / "node1").exists()
    host = fleet.hosts["node1"]
    fleet.spawn("node1", "leftover", ["sh", "-c", "sleep 600 &"])
    cgroup_dirs = [root / host.cgroup.relpath for root, _is_v2 in _hierarchies()]
    assert all(d.exists() for d in cgroup_dirs)
    fleet.down()

    assert all(not d.exists() for d in cgroup_dirs)
    assert all(not (root / "cleanslate-fleet-7").exists() for root, _is_v2 in _hierarchies())
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
    assert subprocess.run(["ip", "link", "show", "dev", "csfleet7"], capture_output=True, check=False).returncode != 0
    assert not (tmp_path / "next" / "node1").exists()
    assert not Path("/run/cleanslate-fleet/slot7.json").exists()


def _starttime(pid):
    """The process's start time, or None when it is gone or a zombie (its parent, the killed
    owner's nspawn, is gone, so whoever inherits it may reap it late)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _hierarchies():
    from tests.integration.fleet.cgroups import hierarchies  # pylint: disable=import-outside-toplevel
    return hierarchies()


def test_the_inventory_names_each_host_with_address_key_and_interpreter(fleet):
    import yaml  # pylint: disable=import-outside-toplevel
    inventory = yaml.safe_load(fleet.inventory.read_text())
    group = inventory["all"]["children"]["gpu_nodes"]
    assert group["vars"]["ansible_python_interpreter"] == "/usr/bin/python3"
    assert group["vars"]["ansible_user"] == "root"
    assert Path(group["vars"]["ansible_ssh_private_key_file"]).is_file()
    assert {name: h["ansible_host"] for name, h in group["hosts"].items()} == \
        {name: h.address for name, h in fleet.hosts.items()}
    assert json.dumps(sorted(h["fleet_cgroup"] for h in group["hosts"].values())) == \
        json.dumps(sorted(h.cgroup.match for h in fleet.hosts.values()))
