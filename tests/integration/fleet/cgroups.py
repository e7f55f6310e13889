"""One cgroup per test host, in every cgroup hierarchy this machine mounts.

Each host's launcher is moved into its own cgroup before systemd-nspawn starts: with
--keep-unit and no systemd on this machine, nspawn otherwise runs every container in the
test's own cgroup, and the containers would share one. The path is the one the host-side
sweep of gpu_reset matches on, like a Proxmox node's /lxc/<vmid>/.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


def hierarchies():
    """Mounted hierarchies the launcher must join: [(path, is_v2)].

    A hybrid host (this machine type) has the named v1 'systemd' hierarchy, which the
    container's systemd checks, and the v2 'unified' one, which it uses; a pure v2 host
    has only /sys/fs/cgroup.
    """
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [(CGROUP_FS, True)]
    found = []
    if (CGROUP_FS / "unified" / "cgroup.controllers").exists():
        found.append((CGROUP_FS / "unified", True))
    if (CGROUP_FS / "systemd" / "cgroup.procs").exists():
        found.append((CGROUP_FS / "systemd", False))
    if not any(v2 for _path, v2 in found):
        raise RuntimeError("no cgroup v2 hierarchy is mounted: /sys/fs/cgroup/unified or /sys/fs/cgroup")
    return found


class Cgroup:
    """The same relative path (e.g. 'cleanslate-fleet/lxc/101') in every hierarchy."""

    def __init__(self, relpath: str):
        self.relpath = relpath.strip("/")
        self.dirs = [(root / self.relpath, v2) for root, v2 in hierarchies()]

    @property
    def match(self) -> str:
        """The substring of /proc/PID/cgroup that every process of this host carries."""
        return f"/{self.relpath}/"

    def create(self) -> None:
        for path, _is_v2 in self.dirs:
            path.mkdir(parents=True, exist_ok=True)

    def enter_shell_lines(self):
        """Shell commands that move the running shell ($$) into this cgroup."""
        return [f"echo $$ > {path}/cgroup.procs" for path, _is_v2 in self.dirs]

    @property
    def v2_path(self) -> Path:
        """Its directory in the cgroup v2 hierarchy, where cpu.stat is kept."""
        return next(path for path, v2 in self.dirs if v2)

    def pids(self):
        """Every process in this cgroup or below it."""
        found = []
        for dirpath, _dirs, files in os.walk(self.v2_path):
            if "cgroup.procs" in files:
                try:
                    found.extend(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
                except OSError:
                    continue
        return found

    def cpu_usec(self) -> int:
        """CPU time used in this cgroup and below it since it was made (cgroup v2 cpu.stat,
        which the kernel keeps without the cpu controller); 0 when it does not exist."""
        try:
            text = (self.v2_path / "cpu.stat").read_text()
        except FileNotFoundError:
            return 0
        return int(dict(line.split() for line in text.splitlines())["usage_usec"])

    def join_function(self):
        """A subprocess preexec_fn that moves the child into this cgroup before it execs."""
        procs = [str(path / "cgroup.procs") for path, _is_v2 in self.dirs]

        def join():
            for path in procs:
                with open(path, "w", encoding="ascii") as handle:
                    handle.write(str(os.getpid()))
        return join

    def kill(self, timeout: float = 20) -> bool:
        """SIGKILL everything below; True once it is empty. cgroup.kill (Linux 5.14+) is atomic;
        older kernels get a signal per process, repeated until nothing is left."""
        base = self.v2_path
        if not base.exists():
            return True
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            if (base / "cgroup.kill").exists():
                try:
                    (base / "cgroup.kill").write_text("1")
                except OSError:
                    pass
            else:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.1)

    def remove(self, timeout: float = 10) -> None:
        """rmdir the tree bottom-up in every hierarchy (a cgroup is removed only when empty)."""
        deadline = time.monotonic() + timeout
        for path, _is_v2 in self.dirs:
            if not path.exists():
                continue
            subdirs = sorted((Path(d) for d, _dirs, _files in os.walk(path)), key=lambda p: len(p.parts), reverse=True)
            for sub in subdirs:
                while True:
                    try:
                        sub.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)


def remove_empty_parents(relpath: str, stop_at: str) -> None:
    """rmdir the parents of relpath up to and including stop_at, where they are empty."""
    parts = Path(relpath.strip("/")).parts
    top = len(Path(stop_at.strip("/")).parts)
    for root, _is_v2 in hierarchies():
        for depth in range(len(parts) - 1, top - 1, -1):
            try:
                (root / Path(*parts[:depth])).rmdir()
            except OSError:
                break
