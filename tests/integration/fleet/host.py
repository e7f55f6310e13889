"""One test host: an overlay of the cached root file system, booted by systemd-nspawn.

systemd is PID 1 inside, sshd listens on the host's own address, /dev/shm and the PID and
network namespaces are its own, and fake GPU device nodes are bound into its /dev.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import zipfile
from pathlib import Path

from .cgroups import Cgroup

# nspawn's exit status when the container asked for a reboot: the launcher starts it again.
REBOOT_STATUS = 133
# Fake GPU device nodes: char 1:5 (the zero device) opens, holds and maps like a device file,
# which a real major-195 node cannot do without the NVIDIA driver. Mapped MAP_PRIVATE, as a
# CUDA context maps /dev/nvidiaN, it shows in /proc/PID/maps under its own path, which is what
# gpu_reset takes for a GPU holder (1:3, /dev/null, cannot be mapped at all: its holders would
# be clients, never stopped). nspawn's default device policy allows 1:5 like 1:3.
GPUS = 4  # a host's GPUs unless its fleet asks for more (a node with several servers: 8)


def device_names(gpus: int = GPUS) -> tuple:
    """The device files of a host with `gpus` GPUs: /dev/nvidia0.. and the two every CUDA process maps."""
    return tuple(f"nvidia{index}" for index in range(gpus)) + ("nvidiactl", "nvidia-uvm")


DEVICE_NAMES = device_names()
INNER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HostError(RuntimeError):
    pass


class Host:
    def __init__(self, name, index, vmid, address, prefixlen, gateway, workdir: Path, cgroup: Cgroup,
                 machine=None, gpus=GPUS, binds=()):
        self.name = name
        # nspawn's name for it, unique on this machine: the outer veth end is vb-<machine>.
        self.machine = machine or name
        self.index = index
        self.vmid = vmid
        self.address = address
        self.prefixlen = prefixlen
        self.gateway = gateway
        self.dir = workdir / name
        self.cgroup = cgroup
        self.root = self.dir / "root"
        self.gpus = gpus
        self.device_names = device_names(gpus)
        self.console_log = self.dir / "console.log"
        # Bound at the same path inside: a file made there by the host has the same name on
        # this machine, as a Proxmox node's /dev/nvidia* are the container's (host-side sweep).
        self.shared = self.dir / "shared"
        self.binds = tuple(binds)
        self._proc = None
        self._watcher = None
        self._stopping = False
        self.boots = 0
        self.exit_status = None

    # --- file system -------------------------------------------------------------------

    def mount(self, lower: Path) -> None:
        for sub in ("upper", "work", "root", "dev", "shared"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={lower},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}"
        proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(self.root)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise HostError(f"{self.name}: overlay mount failed: {proc.stderr.strip()}")

    def mounted(self) -> bool:
        return os.path.ismount(self.root)

    def unmount(self) -> None:
        if self.mounted():
            subprocess.run(["umount", str(self.root)], capture_output=True, check=False)
        if self.mounted():
            # Something still has it open: detach it, the kernel frees it when the last user goes.
            subprocess.run(["umount", "--lazy", str(self.root)], capture_output=True, check=False)

    def configure(self, public_key: str, wheel: Path, copy_in: dict) -> None:
        """Write what makes this copy of the image this host: name, address, key, payload."""
        root = self.root
        (root / "etc/hostname").write_text(self.name + "\n")
        with open(root / "etc/hosts", "a", encoding="ascii") as hosts:
            hosts.write(f"{self.address} {self.name}\n")
        network = root / "etc/systemd/network"
        network.mkdir(parents=True, exist_ok=True)
        # Sorts before the image's 80-container-host0.network (DHCP), so it wins.
        (network / "10-host0.network").write_text(
            f"[Match]\nName=host0\n\n[Network]\nAddress={self.address}/{self.prefixlen}\nLinkLocalAddressing=no\n"
        )
        auth = root / "root/.ssh/authorized_keys"
        auth.parent.mkdir(mode=0o700, exist_ok=True)
        auth.write_text(public_key)
        auth.chmod(0o600)
        # nvidia-ml-py is pure Python: unpacking the wheel into site-packages installs it.
        python = os.readlink(root / "usr/bin/python3")  # e.g. python3.11
        site = root / f"usr/local/lib/{python}/dist-packages"
        site.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        for inner, source in copy_in.items():
            target = root / inner.lstrip("/")
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(source, target, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "output", ".pytest_cache"))
        for name in self.device_names:
            node = self.dir / "dev" / name
            if not node.exists():
                os.mknod(node, 0o666 | 0o020000, os.makedev(1, 5))

    # --- boot and power --------------------------------------------------------------------

    def _nspawn_argv(self, bridge: str):
        argv = ["systemd-nspawn", "--register=no", "--keep-unit", "--boot", "--quiet",
                f"--directory={self.root}", f"--machine={self.machine}", f"--network-bridge={bridge}",
                "--console=read-only"]
        argv += [f"--bind={self.dir / 'dev' / name}:/dev/{name}" for name in self.device_names]
        argv.append(f"--bind={self.shared}")
        argv += [f"--bind-ro={path}" for path in self.binds]
        return argv

    def _launch(self, bridge: str):
        # The shell joins the host's cgroup first, then becomes nspawn (see cgroups.py).
        script = "; ".join(self.cgroup.enter_shell_lines() + ['exec "$@"'])
        env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1")
        with open(self.console_log, "ab") as log:
            self._proc = subprocess.Popen(["sh", "-c", script, "launcher", *self._nspawn_argv(bridge)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        self.boots += 1

    def start(self, bridge: str) -> None:
        if self.running():
            return
        self.cgroup.create()
        self._stopping = False
        self.exit_status = None
        self._launch(bridge)
        self._watcher = threading.Thread(target=self._watch, args=(bridge,), name=f"fleet-{self.name}", daemon=True)
        self._watcher.start()

    def _watch(self, bridge: str) -> None:
        """Wait for nspawn; a reboot (status 133) starts the container again."""
        while True:
            status = self._proc.wait()
            if status == REBOOT_STATUS and not self._stopping:
                self._launch(bridge)
                continue
            self.exit_status = status
            return

    def running(self) -> bool:
        return self._watcher is not None and self._watcher.is_alive()

    def wait_stopped(self, timeout: float) -> bool:
        if self._watcher is not None:
            self._watcher.join(timeout)
        return not self.running()

    def request_stop(self) -> None:
        """SIGTERM to nspawn, which powers the container off cleanly; stop() waits for it."""
        self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_monitor(self) -> None:
        """SIGKILL systemd-nspawn only. The container lives on without it (its init is
        re-parented to this machine's), as a Proxmox container does when its lxc monitor dies:
        pct then says it is not running. stop() ends it."""
        self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        self.wait_stopped(10)

    def pull_plug(self) -> None:
        """Every process of the container killed at once (its cgroup), as a power loss; nspawn
        exits when its container's init is gone."""
        self._stopping = True
        self.cgroup.kill()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.wait(timeout=10)
        self.wait_stopped(10)

    def stop(self, timeout: float = 30) -> None:
        """Clean poweroff via SIGTERM to nspawn; cgroup.kill for whatever is left after."""
        self._stopping = True
        if self.running() and self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.wait_stopped(timeout)
        self.cgroup.kill()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.wait(timeout=10)
        self.wait_stopped(10)

    # --- inside the host ---------------------------------------------------------------------

    def init_pid(self):
        """The host PID of the container's systemd: the process of this cgroup that is PID 1
        of its own PID namespace. None while the host is not up."""
        for pid in self.cgroup.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    if len(fields) > 1 and fields[-1] == "1":
                        return pid
        return None

    def run(self, argv, check=True, timeout=120, input=None, env=None):
        """Run argv inside the host's namespaces with a clean environment (nsenter, no machined).

        The command itself stays in this machine's cgroup: start what must live on inside the
        host's cgroup with systemd-run (see Fleet.spawn)."""
        pid = self.init_pid()
        # While it boots, the container's systemd moves itself into a cgroup below the host's
        # (init.scope): a walk of the cgroup that lists the directories before the move and reads
        # the processes after it misses PID 1 once. Only a container whose nspawn ended is not running.
        deadline = time.monotonic() + 2
        while pid is None and self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
            pid = self.init_pid()
        if pid is None:
            raise HostError(f"{self.name} is not running" + (
                "" if self.running() else f" (nspawn exited {self.exit_status}; see {self.console_log})"))
        inner_env = {"PATH": INNER_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        inner_env.update(env or {})
        command = ["nsenter", f"--target={pid}", "--all", "--", "/usr/bin/env", "-i",
                   *[f"{key}={value}" for key, value in inner_env.items()], *[str(a) for a in argv]]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, input=input, check=False)
        if check and proc.returncode != 0:
            raise HostError(f"{self.name}: {' '.join(map(str, argv))} exited {proc.returncode}\n"
                            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
        return proc

    def wait_booted(self, timeout: float) -> None:
        """Until systemd inside reports the boot finished and sshd accepts connections."""
        deadline = time.monotonic() + timeout
        while self.init_pid() is None:
            if not self.running():
                raise HostError(f"{self.name}: nspawn exited {self.exit_status}; see {self.console_log}")
            if time.monotonic() > deadline:
                raise HostError(f"{self.name}: no systemd after {timeout:.0f} s; see {self.console_log}")
            time.sleep(0.1)
        while True:
            # 'offline' until systemd has made /run/systemd/system, then no answer ('Failed to
            # connect to bus') until its private socket is up; --wait covers the rest of the boot.
            left = max(1.0, deadline - time.monotonic())
            proc = self.run(["systemctl", "is-system-running", "--wait"], check=False, timeout=left)
            state = proc.stdout.strip()
            if state in ("running", "degraded"):
                break
            if state not in ("offline", "") or time.monotonic() > deadline:
                raise HostError(f"{self.name}: systemd says {state or proc.stderr.strip()!r} after boot; "
                                f"see {self.console_log}")
            time.sleep(0.1)
        while self.run(["systemctl", "is-active", "ssh.service"], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise HostError(f"{self.name}: sshd did not start; see {self.console_log}")
            time.sleep(0.2)
