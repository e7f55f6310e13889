"""The fleet's Proxmox node: this machine, reached over real SSH, with `pct` on it.

    node = PveNode(fleet, workdir)
    node.up()                  # sshd on 127.0.0.1:<port>; /etc/pve/lxc/<vmid>.conf per fleet host
    node.ssh("root", "pct exec 101 -- hostname")
    node.down()

The fleet's hosts are containers whose processes live under <fleet cgroup>/lxc/<vmid>/ of
this machine, so this machine is their node. What a Proxmox node adds, sshd, sudo and
/usr/sbin/pct, comes from the fleet image: sshd runs chrooted into an overlay of that image
(with this machine's /proc, /sys and /dev, and the fleet's directory at its own path, so
that paths read from /proc mean the same there), in a private mount namespace, in this
machine's PID and network namespaces. /usr/sbin/pct there is the stand-in (pct.py).
Nothing on this machine changes: the node's mounts exist only in its own mount namespace and
go with its last process; its processes live in the cgroup <fleet cgroup>/pve-node, which
down() kills (and the next node in the slot, after a run that was killed before down()).

Users: root (key login) and pctuser, who may run only `pct exec <vmid> -- ...` of the fleet's
containers through sudo, without a password (SUDOERS_LINE).
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import zipfile
from pathlib import Path

from .cgroups import Cgroup
from .image import ensure_nvml_wheel, ensure_rootfs

PCT_SOURCE = Path(__file__).with_name("pct.py")
USER, UID = "pctuser", 1100
# The container's own cgroup below lxc/<vmid>, where systemd-nspawn puts it (LXC's is "ns").
NSPAWN_PAYLOAD = "payload"


def sudoers_line(user, vmids) -> str:
    """sudo for `pct exec` of these containers only: not pct's other commands, not other vmids."""
    return f"{user} ALL = (root) NOPASSWD: " + ", ".join(f"/usr/sbin/pct exec {vmid} -- *" for vmid in vmids)


def spawn_attached(host, argv, **popen) -> subprocess.Popen:
    """Start argv on this machine charged to the container's cgroup (the `.lxc` leaf where pct
    exec puts processes) but in none of its namespaces: the node sees it among the
    container's processes, the container cannot see it at all (as after an `lxc-attach -s`
    that leaves out the PID namespace). A thread reaps it when it ends."""
    leaf = Cgroup(f"{host.cgroup.relpath}/{NSPAWN_PAYLOAD}/.lxc")
    leaf.create()

    def join():  # in the child, before exec
        for path, _is_v2 in leaf.dirs:
            (path / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen(argv, preexec_fn=join, start_new_session=True, **popen)  # pylint: disable=subprocess-popen-preexec-fn
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PveNodeError(RuntimeError):
    pass


class PveNode:
    def __init__(self, fleet, workdir, build_dir=None, timeout=30):
        self.fleet = fleet
        self.dir = Path(workdir).resolve()
        self.build_dir = Path(build_dir) if build_dir else fleet.build_dir
        self.timeout = timeout
        self.upper = self.dir / "upper"
        self.root = self.dir / "root"
        self.log = self.dir / "sshd.log"
        self.known_hosts = self.dir / "known_hosts"
        self.key = fleet.key
        self.port = None
        self.cgroup = None
        self._proc = None

    # --- lifecycle ---------------------------------------------------------------------------

    def up(self) -> None:
        rootfs = ensure_rootfs(self.build_dir)
        wheel = ensure_nvml_wheel(self.build_dir)
        self.cgroup = Cgroup(f"{self.fleet.cgroup_top}/pve-node")
        self.cgroup.kill()  # a node left by a killed run in this slot (the fleet holds the slot's lock)
        self.cgroup.create()
        for sub in ("upper", "work", "root"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self._configure(rootfs, wheel)
        self._start(rootfs)
        try:
            self._wait_ready()
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        if self.cgroup is None:
            return
        self.cgroup.kill()
        if self._proc is not None:
            self._proc.wait(timeout=10)
        self.cgroup.remove()
        self.cgroup = None

    @property
    def sshd_pid(self):
        """The node's listening sshd, or None while it is not running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    # --- reaching it -------------------------------------------------------------------------

    def ssh_options(self):
        return ["-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5"]

    def ssh(self, user, command, input=None, tty=False, timeout=60) -> subprocess.CompletedProcess:
        """Run a shell command line on the node over SSH (bytes in, bytes out)."""
        argv = ["ssh", *self.ssh_options(), *(["-tt"] if tty else []), f"{user}@127.0.0.1", command]
        return subprocess.run(argv, input=input, capture_output=True, timeout=timeout, check=False)

    # --- internals ---------------------------------------------------------------------------

    @staticmethod
    def _lower(rootfs, relative, default="") -> str:
        """A file of the image, or `default` where the image has none."""
        path = Path(rootfs) / relative
        return path.read_text() if path.exists() else default

    def _put(self, relative, text, mode=0o644, uid=0):
        path = self.upper / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        os.chown(path, uid, uid)
        return path

    def _configure(self, rootfs, wheel) -> None:
        """Write into the overlay's upper layer (before it is mounted): it wins over the image."""
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pve-node", "-f",
                        str(self.dir / "host_key")], check=True, capture_output=True, input=b"y\n")
        self._put("etc/ssh/ssh_host_ed25519_key", (self.dir / "host_key").read_text(), 0o600)
        host_key = (self.dir / "host_key.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        # sshd_config includes sshd_config.d/*.conf first, and sshd keeps the first value it reads.
        self._put("etc/ssh/sshd_config.d/pve-node.conf", "\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", "HostKey /etc/ssh/ssh_host_ed25519_key",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            # No PAM in the chroot: no session modules, no loginuid; pctuser's '*' password is not a lock.
            "UsePAM no", "PidFile /run/sshd.pid", ""]))
        public_key = self.key.with_suffix(".pub").read_text()
        for home, uid in (("root", 0), (f"home/{USER}", UID)):
            (self.upper / home / ".ssh").mkdir(parents=True, exist_ok=True)
            for path, mode in ((self.upper / home, 0o700 if uid == 0 else 0o755), (self.upper / home / ".ssh", 0o700)):
                path.chmod(mode)
                os.chown(path, uid, uid)
            self._put(f"{home}/.ssh/authorized_keys", public_key, 0o600, uid)
        self._put("etc/passwd", self._lower(rootfs, "etc/passwd") + f"{USER}:x:{UID}:{UID}::/home/{USER}:/bin/sh\n")
        self._put("etc/group", self._lower(rootfs, "etc/group") + f"{USER}:x:{UID}:\n")
        self._put("etc/shadow", self._lower(rootfs, "etc/shadow") + f"{USER}:*:20000:0:99999:7:::\n", 0o640)
        # This machine's name (the UTS namespace is shared): sudo resolves it, pct's messages name it.
        self._put("etc/hosts", self._lower(rootfs, "etc/hosts", "127.0.0.1 localhost\n") + f"127.0.1.1 {os.uname().nodename}\n")
        vmids = [host.vmid for host in self.fleet.hosts.values()]
        self._put("etc/sudoers.d/pct", sudoers_line(USER, vmids) + "\n", 0o440)
        self._put("usr/sbin/pct", "#!/usr/bin/python3\n" + PCT_SOURCE.read_text(), 0o755)
        for host in self.fleet.hosts.values():
            self._put(f"etc/pve/lxc/{host.vmid}.conf", self._container_conf(host))
        # nvidia-ml-py for the modules that run on the node (the node-side sweep).
        python = os.readlink(Path(rootfs) / "usr/bin/python3")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(self.upper / f"usr/local/lib/{python}/dist-packages")

    def _container_conf(self, host) -> str:
        """A Proxmox container config for a fleet host: its name, its GPU device files (bound
        from the node, as GPU passthrough does) and where its processes live."""
        lines = [f"hostname: {host.name}", "arch: amd64", "ostype: debian",
                 f"net0: name=host0,bridge={self.fleet.bridge.name},ip={host.address}/{host.prefixlen}"]
        lines += [f"lxc.mount.entry: {host.dir / 'dev' / name} dev/{name} none bind,optional,create=file"
                  for name in sorted(os.listdir(host.dir / "dev"))]
        lines += [f"lxc.cgroup.dir.container: {host.cgroup.relpath}",
                  f"lxc.cgroup.dir.container.inner: {NSPAWN_PAYLOAD}"]
        return "\n".join(lines) + "\n"

    def _start(self, rootfs) -> None:
        root, fleet_dir = self.root, self.fleet.workdir
        script = "; ".join(self.cgroup.enter_shell_lines() + [
            "set -e",
            f"mount -t overlay overlay -o lowerdir={rootfs},upperdir={self.upper},workdir={self.dir / 'work'} {root}",
            *[f"mount --rbind /{name} {root}/{name}" for name in ("proc", "sys", "dev")],
            f"mount -t tmpfs -o mode=0755 tmpfs {root}/run",
            f"mkdir -m 0755 {root}/run/sshd",
            f"mkdir -p {root}{fleet_dir}",
            f"mount --bind {fleet_dir} {root}{fleet_dir}",
            f"exec chroot {root} /usr/sbin/sshd -D -e",
        ])
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            if self._proc.poll() is not None:
                raise PveNodeError(f"the node's sshd exited {self._proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
                    if conn.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise PveNodeError(f"no sshd on 127.0.0.1:{self.port} after {self.timeout} s: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
