"""A fleet of Debian hosts with systemd as PID 1 and sshd, reachable from here over real SSH.

    fleet = Fleet(workdir, hosts=3, copy_in={"/opt/cleanslate/tests": REPO / "tests"})
    # Fleet(..., gpus=8): each host gets /dev/nvidia0..7 (the default is 4)
    inventory = fleet.up()          # boots node1..node3, returns an Ansible inventory path
    fleet.run("node1", ["hostname"])
    fleet.poweroff("node2"); fleet.boot("node2")
    fleet.down()                    # SIGTERM to nspawn (clean poweroff), then cgroup.kill

Fleets on one machine use numbered slots, each with a lock under /run: slot N owns the bridge
csfleetN, the subnet 10.213.N.0/24, the cgroup cleanslate-fleet-N/ and the vmids N*100+101...
What a fleet made is recorded next to its lock, so a run that was killed before down() is
cleaned up by the next fleet that takes the slot.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from .cgroups import Cgroup, remove_empty_parents
from .host import GPUS, Host, HostError
from .image import ensure_nvml_wheel, ensure_rootfs
from .network import Bridge

REPO = Path(__file__).resolve().parents[3]
BUILD_DIR = REPO / "build" / "fleet"
RUN_DIR = Path("/run/cleanslate-fleet")
SLOTS = 8
# A private range for the test bridges only; nothing outside it is ever addressed.
SUBNET = "10.213.{slot}.0/24"
REQUIRED_TOOLS = ("mmdebstrap", "systemd-nspawn", "nsenter", "ip", "ssh", "ssh-keygen", "zstd", "tar", "mount")


class FleetError(RuntimeError):
    pass


# Every booted systemd (and its journald, logind, udev...) takes inotify instances, counted per
# user for the whole machine: at Debian's default of 128, a few fleets side by side (or one of
# two dozen hosts) make a host's PID 1 fail with "Failed to create control group inotify object:
# Too many open files". Raised, never lowered, for this boot of the test machine only.
INOTIFY_INSTANCES = 8192
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def _ensure_inotify_instances() -> None:
    if int(INOTIFY_LIMIT.read_text()) < INOTIFY_INSTANCES:
        INOTIFY_LIMIT.write_text(str(INOTIFY_INSTANCES))


def missing_tools():
    return [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]


class Fleet:
    def __init__(self, workdir, hosts=3, copy_in=None, build_dir=BUILD_DIR, boot_timeout=90, slot=None, gpus=GPUS,
                 binds=()):
        self.workdir = Path(workdir).resolve()
        # Directories of this machine every host sees read-only at the same path (the real vLLM's
        # venv and the tiny model: 3.5 GB that no host copies).
        self.binds = tuple(Path(path).resolve() for path in binds)
        self.count = hosts
        self.gpus = gpus  # each host's simulated GPUs (/dev/nvidia0..)
        self.copy_in = dict(copy_in or {})
        self.build_dir = Path(build_dir)
        self.boot_timeout = boot_timeout
        self.wanted_slot = slot
        self.slot = None
        self.key = self.workdir / "id_ed25519"
        self.inventory = self.workdir / "inventory.yml"
        self.bridge = None
        self.hosts = {}
        self._lock = None
        self.timings = {}

    def _layout(self, slot: int) -> None:
        """Names and addresses of slot `slot` (see the module doc)."""
        self.slot = slot
        self.bridge = Bridge(f"csfleet{slot}", SUBNET.format(slot=slot))
        self.cgroup_top = f"cleanslate-fleet-{slot}"
        self.hosts = {}
        for index in range(1, self.count + 1):
            vmid = slot * 100 + 100 + index
            name = f"node{index}"
            self.hosts[name] = Host(name, index, vmid, self.bridge.address(index), self.bridge.prefixlen,
                                    self.bridge.gateway, self.workdir, Cgroup(f"{self.cgroup_top}/lxc/{vmid}"),
                                    machine=f"f{slot}-{name}", gpus=self.gpus, binds=self.binds)

    # --- lifecycle ---------------------------------------------------------------------------

    def up(self) -> Path:
        """Boot every host and return the inventory path; everything is torn down on failure."""
        missing = missing_tools()
        if missing:
            raise FleetError(f"missing tools for the fleet: {', '.join(missing)}")
        _ensure_inotify_instances()
        started = time.monotonic()
        rootfs = ensure_rootfs(self.build_dir)
        wheel = ensure_nvml_wheel(self.build_dir)
        self.timings["image_s"] = time.monotonic() - started
        self._acquire()
        atexit.register(self.down)
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._record()
            self._keypair()
            self.bridge.create()
            started = time.monotonic()
            for host in self.hosts.values():
                host.mount(rootfs)
                host.configure(self.key.with_suffix(".pub").read_text(), wheel, self.copy_in)
            self.timings["prepare_s"] = time.monotonic() - started
            started = time.monotonic()
            for host in self.hosts.values():
                host.start(self.bridge.name)
            with ThreadPoolExecutor(len(self.hosts)) as pool:
                list(pool.map(self._wait_ready, self.hosts.values()))
            self.timings["boot_s"] = time.monotonic() - started
            self._write_inventory()
        except BaseException:
            self.down()
            raise
        return self.inventory

    def down(self) -> None:
        """Power every host off (SIGTERM to nspawn, cgroup.kill after), remove what up() made."""
        if self._lock is None:
            return
        # SIGTERM to every nspawn first, then wait for each: the hosts power off side by side.
        # (No thread pool: down() also runs from atexit, where new threads are refused.)
        for host in self.hosts.values():
            host.request_stop()
        for host in self.hosts.values():
            host.stop()
        for host in self.hosts.values():
            host.cgroup.remove()
            host.unmount()
        remove_empty_parents(f"{self.cgroup_top}/lxc/x", self.cgroup_top)
        self.bridge.delete()
        for host in self.hosts.values():
            if not host.mounted():
                shutil.rmtree(host.dir, ignore_errors=True)
        _state_file(self.slot).unlink(missing_ok=True)
        self._release()
        atexit.unregister(self.down)

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    # --- single hosts -------------------------------------------------------------------------

    def host(self, name) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise FleetError(f"no host {name!r} in this fleet ({', '.join(self.hosts)})") from None

    def run(self, name, argv, **kwargs) -> subprocess.CompletedProcess:
        """Run argv inside the host (its namespaces, a clean environment); raises on failure
        unless check=False."""
        return self.host(name).run(argv, **kwargs)

    def spawn(self, name, unit, argv, env=None, cwd=None, timeout=120) -> subprocess.CompletedProcess:
        """Start argv as a transient oneshot unit inside the host and wait for it to exit;
        what it leaves running stays in the unit's cgroup, inside the host, as a crashed
        server's workers do."""
        command = ["systemd-run", f"--unit={unit}", "--quiet", "--collect", "--property=Type=oneshot",
                   "--remain-after-exit"]
        if cwd:
            command.append(f"--working-directory={cwd}")
        command += [f"--setenv={key}={value}" for key, value in (env or {}).items()]
        return self.run(name, [*command, "--", *argv], timeout=timeout)

    def ssh(self, name, command, check=True, timeout=60) -> subprocess.CompletedProcess:
        """Run a shell command on the host over SSH, as Ansible reaches it."""
        host = self.host(name)
        proc = subprocess.run(["ssh", *self.ssh_options(), f"root@{host.address}", command],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise FleetError(f"ssh {name} {command!r} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def ssh_options(self):
        return ["-i", str(self.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5"]

    def poweroff(self, name, timeout=60) -> None:
        """Shut the host down from inside (systemctl poweroff) and wait until nspawn exits."""
        host = self.host(name)
        if not host.running():
            return
        host._stopping = True  # a poweroff must not be taken for a reboot
        host.run(["systemctl", "poweroff", "--no-block"], check=False)
        if not host.wait_stopped(timeout):
            host.stop()
        host.cgroup.kill()

    def pull_plug(self, name) -> None:
        """Power lost: every process of the host killed at once, nspawn gone; the disk stays. A host
        whose clean poweroff would wait for processes that ignore SIGTERM (a crashed server's, up to
        systemd's stop timeout) is gone in a second this way."""
        self.host(name).pull_plug()

    def boot(self, name) -> None:
        """Start a powered-off host again, with the same disk."""
        host = self.host(name)
        host.start(self.bridge.name)
        self._wait_ready(host)

    def wait_rebooted(self, name, boots_before, timeout=90) -> None:
        """After a reboot from inside: until nspawn was started again and the host is ready."""
        host = self.host(name)
        deadline = time.monotonic() + timeout
        while host.boots <= boots_before or host.init_pid() is None:
            if not host.running() or time.monotonic() > deadline:
                raise HostError(f"{name} did not come back from a reboot (nspawn exited {host.exit_status})")
            time.sleep(0.1)
        self._wait_ready(host)

    # --- internals ---------------------------------------------------------------------------

    def _wait_ready(self, host: Host) -> None:
        host.wait_booted(self.boot_timeout)
        deadline = time.monotonic() + self.boot_timeout
        while True:
            try:
                with socket.create_connection((host.address, 22), timeout=2) as conn:
                    if conn.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise HostError(f"{host.name}: no SSH on {host.address}:22 after {self.boot_timeout} s")
            time.sleep(0.2)

    def _keypair(self) -> None:
        if not self.key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cleanslate-fleet",
                            "-f", str(self.key)], check=True, capture_output=True)

    def _write_inventory(self) -> None:
        hosts = {}
        for host in self.hosts.values():
            hosts[host.name] = {
                "ansible_host": host.address,
                "fleet_vmid": host.vmid,
                "fleet_cgroup": host.cgroup.match,
            }
        inventory = {"all": {"children": {"gpu_nodes": {
            "hosts": hosts,
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.key),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=5",
                "ansible_python_interpreter": "/usr/bin/python3",
            },
        }}}}
        self.inventory.write_text("# Written by tests/integration/fleet for one test session.\n"
                                  + yaml.safe_dump(inventory, sort_keys=False))

    def _acquire(self) -> None:
        """Take the wanted slot (waiting for it) or the first free one (waiting for any)."""
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        slots = [self.wanted_slot] if self.wanted_slot is not None else list(range(SLOTS))
        deadline = time.monotonic() + 900
        while True:
            for slot in slots:
                handle = open(RUN_DIR / f"slot{slot}.lock", "w", encoding="ascii")  # pylint: disable=consider-using-with
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                self._lock = handle
                clean_stale(slot)
                self._layout(slot)
                return
            if time.monotonic() > deadline:
                raise FleetError(f"fleet slots {slots} stayed taken for 15 minutes (see {RUN_DIR})")
            time.sleep(1)

    def _release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def _record(self) -> None:
        state = {"workdir": str(self.workdir), "bridge": self.bridge.name, "cgroup_top": self.cgroup_top,
                 "hosts": [{"dir": str(h.dir), "cgroup": h.cgroup.relpath} for h in self.hosts.values()]}
        _state_file(self.slot).write_text(json.dumps(state))


def _state_file(slot: int) -> Path:
    return RUN_DIR / f"slot{slot}.json"


def clean_stale(slot: int) -> None:
    """Remove what a fleet that was killed before down() left in this slot (under its lock)."""
    state_file = _state_file(slot)
    if not state_file.exists():
        return
    state = json.loads(state_file.read_text())
    for entry in state.get("hosts", []):
        cgroup = Cgroup(entry["cgroup"])
        cgroup.kill()
        cgroup.remove()
        root = Path(entry["dir"]) / "root"
        subprocess.run(["umount", "--lazy", str(root)], capture_output=True, check=False)
        if not os.path.ismount(root):
            shutil.rmtree(entry["dir"], ignore_errors=True)
    # The slot's lock is ours: whatever else lives under its cgroup is stale too (the Proxmox
    # node of test_proxmox lives beside the hosts).
    top = Cgroup(state["cgroup_top"])
    top.kill()
    top.remove()
    Bridge(state["bridge"], SUBNET.format(slot=slot)).delete()
    state_file.unlink()
