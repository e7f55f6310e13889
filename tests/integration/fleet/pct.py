"""A stand-in for Proxmox VE's `pct` (exec and status), installed as /usr/sbin/pct on the test node.

The real `pct exec VMID -- CMD` (pve-container, PVE/CLI/pct.pm) loads /etc/pve/lxc/VMID.conf,
dies with "container 'VMID' not running!" unless the container's lxc monitor answers, drops
SSL_CERT_FILE and SSL_CERT_DIR from the environment and execs `lxc-attach -n VMID --keep-env
-- CMD`. lxc-attach enters every namespace of the container's init, joins the container's
cgroup (a `.lxc` leaf beside the container's own cgroups), sets container=lxc, and passes
stdin, stdout and stderr through as they are, unless one of them is a terminal: then it gives
the command a new pseudo-terminal inside and relays to it. Its exit status is the command's.

This stand-in does the same to the fleet's hosts (systemd-nspawn containers) with nsenter:
  - /etc/pve/lxc/VMID.conf names the container's cgroup (`lxc.cgroup.dir.container`, and the
    container's own root below it in `lxc.cgroup.dir.container.inner`), as LXC's config does;
  - the container runs while its init (the process of that cgroup that is PID 1 of its own
    PID namespace) still has its monitor (lxc-start, or systemd-nspawn here) as parent; when
    the monitor dies the container's processes live on, and pct says "not running", as on
    a Proxmox node whose lxc monitor died;
  - exec joins the cgroup, then execs nsenter into the init's mount, UTS, IPC, network, PID
    and cgroup namespaces (no user namespace: the fleet's containers are privileged).

Standard library only, no import from this repository: it runs on the node's own Python.
Errors end as pct's do: one line on stderr and exit status 255 (Perl's die).
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import struct
import sys
import termios
import tty

CONF_DIR = "/etc/pve/lxc"
CGROUP_FS = "/sys/fs/cgroup"
# PVE::CLIHandler::run_cli_handler sets PATH before any command runs; --keep-env passes it on.
CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
# lxc-attach --clear-env leaves only these.
CLEAR_ENV_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MONITORS = ("lxc-start", "systemd-nspawn")
USAGE = "USAGE: pct exec <vmid> [--keep-env <boolean>] -- <command> [<args>...]\n       pct status <vmid>"
# <asm-generic/ioctls.h>: unlock a pty master; open its slave from the master (Linux 4.13+).
TIOCSPTLCK = 0x40045431
TIOCGPTPEER = 0x5441
BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


class PctError(Exception):
    """pct's die: the message goes to stderr and pct exits 255."""


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def parse_vmid(text):
    if not text.isdigit() or not 100 <= int(text) <= 999999999:
        raise PctError("400 Parameter verification failed.\nvmid: value must be an integer from 100 to 999999999"
                       "\n" + USAGE)
    return int(text)


def parse_exec_args(args):
    """([--keep-env BOOL] -- CMD ...) -> (keep_env, command)."""
    keep_env = True
    while args:
        token = args.pop(0)
        if token == "--":
            break
        if token in ("--keep-env", "-keep-env"):
            if not args or args[0].lower() not in BOOLEANS:
                raise PctError("400 Parameter verification failed.\nkeep-env: type check ('boolean') failed\n" + USAGE)
            keep_env = BOOLEANS[args.pop(0).lower()]
        elif token.startswith("-"):
            raise PctError(f"400 Parameter verification failed.\n{token.lstrip('-')}: property is not defined in schema "
                           "and the schema does not allow additional properties\n" + USAGE)
        else:
            args.insert(0, token)
            break
    return keep_env, args


def load_config(vmid):
    path = f"{CONF_DIR}/{vmid}.conf"
    try:
        text = _read(path)
    except FileNotFoundError:
        raise PctError(f"Configuration file 'nodes/{os.uname().nodename}/lxc/{vmid}.conf' does not exist") from None
    conf = {}
    for line in text.splitlines():
        if line.startswith("["):
            break  # a snapshot section: the current config ends here
        if ":" in line and not line.lstrip().startswith("#"):
            key, value = line.split(":", 1)
            conf[key.strip()] = value.strip()
    return conf


class Container:
    def __init__(self, vmid, conf):
        self.vmid = vmid
        try:
            self.cgroup = conf["lxc.cgroup.dir.container"].strip("/")
        except KeyError:
            raise PctError(f"container {vmid}: lxc.cgroup.dir.container is not set in {CONF_DIR}/{vmid}.conf") from None
        inner = conf.get("lxc.cgroup.dir.container.inner", "").strip("/")
        self.attach_cgroup = "/".join(part for part in (self.cgroup, inner, ".lxc") if part)

    @staticmethod
    def hierarchies():
        """Where cgroups are: the v2 tree first, then the named v1 'systemd' one of a hybrid host."""
        if os.path.exists(f"{CGROUP_FS}/cgroup.controllers"):
            return [CGROUP_FS]
        return [root for root in (f"{CGROUP_FS}/unified", f"{CGROUP_FS}/systemd")
                if os.path.exists(f"{root}/cgroup.procs")]

    def pids(self):
        roots = self.hierarchies()
        found = []
        for dirpath, _dirs, files in os.walk(f"{roots[0]}/{self.cgroup}" if roots else "/nonexistent"):
            if "cgroup.procs" in files:
                try:
                    found.extend(int(pid) for pid in _read(f"{dirpath}/cgroup.procs").split())
                except OSError:
                    continue
        return found

    def init_pid(self):
        """The container's init: the process of its cgroup that is PID 1 of its own PID namespace."""
        for pid in self.pids():
            try:
                status = _read(f"/proc/{pid}/status")
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    if len(fields) > 1 and fields[-1] == "1":
                        return pid
        return None

    def running_init(self):
        """The init's pid while its monitor is its parent (pct's check_running), else None."""
        pid = self.init_pid()
        if pid is None:
            return None
        try:
            parent = int(_read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[1])
            monitor = _read(f"/proc/{parent}/comm").strip()
        except (OSError, IndexError, ValueError):
            return None
        return pid if monitor in MONITORS else None

    def join_cgroup(self):
        """Move this process into the container's `.lxc` leaf in every hierarchy that has it."""
        for root in self.hierarchies():
            if not os.path.isdir(f"{root}/{self.cgroup}"):
                continue
            leaf = f"{root}/{self.attach_cgroup}"
            try:
                os.makedirs(leaf, exist_ok=True)
                with open(f"{leaf}/cgroup.procs", "w", encoding="ascii") as handle:
                    handle.write(str(os.getpid()))
            except OSError as exc:
                raise PctError(f"lxc-attach: {self.vmid}: failed to attach to cgroup {leaf}: {exc.strerror}") from None


def attach_environment(keep_env):
    if not keep_env:
        return {"PATH": CLEAR_ENV_PATH, "container": "lxc"}
    env = dict(os.environ)
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        env.pop(name, None)
    env["container"] = "lxc"
    return env


def enter_and_exec(container, init, command, env):
    """Join the cgroup, then become nsenter: the command's status is ours."""
    container.join_cgroup()
    argv = ["nsenter", f"--target={init}", "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--", *command]
    try:
        os.execvpe("nsenter", argv, env)
    except OSError as exc:
        raise PctError(f"lxc-attach: {container.vmid}: cannot run nsenter: {exc.strerror}") from None


def _exit_code(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def container_pty(init):
    """(master, slave) of a new pseudo-terminal of the container's own devpts, as lxc-attach
    allocates it: inside, ttyname() then names it (/dev/pts/N of the container)."""
    master = os.open(f"/proc/{init}/root/dev/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))  # unlockpt
    slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY)  # no path lookup on the node
    return master, slave


def relay_through_pty(container, init, command, env):
    """One of our stdio is a terminal: run the command on a new pseudo-terminal of the
    container and copy between it and ours (the outer terminal raw meanwhile), as
    lxc-attach does."""
    try:
        master, slave = container_pty(init)
    except OSError as exc:
        raise PctError(f"lxc-attach: {container.vmid}: failed to allocate a pseudo-terminal: {exc.strerror}") from None
    pid = os.fork()
    if pid == 0:
        try:
            os.close(master)
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            os.close(slave)
            enter_and_exec(container, init, command, env)
        except (PctError, OSError) as exc:
            os.write(2, f"{exc}\n".encode())
        os._exit(255)
    os.close(slave)
    saved = None
    if os.isatty(0):
        saved = termios.tcgetattr(0)
        try:  # the same modes and window size inside
            termios.tcsetattr(master, termios.TCSANOW, saved)
            fcntl.ioctl(master, termios.TIOCSWINSZ, fcntl.ioctl(0, termios.TIOCGWINSZ, bytes(8)))
        except (termios.error, OSError):
            pass
        tty.setraw(0)
    inputs = [master, 0]
    try:
        while True:
            try:
                ready, _w, _x = select.select(inputs, [], [])
            except InterruptedError:
                continue
            if master in ready:
                try:
                    data = os.read(master, 65536)
                except OSError as exc:
                    if exc.errno != errno.EIO:  # EIO: the command and everything on its terminal ended
                        raise
                    data = b""
                if not data:
                    break
                os.write(1, data)
            if 0 in ready:
                data = os.read(0, 65536)
                if data:
                    os.write(master, data)
                else:
                    inputs.remove(0)
    finally:
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
    _pid, status = os.waitpid(pid, 0)
    return _exit_code(status)


def pct_exec(vmid, args):
    keep_env, command = parse_exec_args(list(args))
    container = Container(vmid, load_config(vmid))
    init = container.running_init()
    if init is None:
        raise PctError(f"container '{vmid}' not running!")
    if not command:
        raise PctError("missing command")
    env = attach_environment(keep_env)
    if any(os.isatty(fd) for fd in (0, 1, 2)):
        return relay_through_pty(container, init, command, env)
    enter_and_exec(container, init, command, env)
    return 255  # not reached: exec replaced this process


def pct_status(vmid):
    container = Container(vmid, load_config(vmid))
    print("status: " + ("running" if container.running_init() else "stopped"))
    return 0


def main(argv):
    os.environ["PATH"] = CLI_PATH
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        if len(argv) < 2 or argv[0] not in ("exec", "status"):
            raise PctError(USAGE)
        if os.geteuid() != 0:
            raise PctError("please run as root")
        vmid = parse_vmid(argv[1])
        if argv[0] == "status":
            return pct_status(vmid)
        return pct_exec(vmid, argv[2:])
    except PctError as exc:
        sys.stderr.write(f"{exc}\n")
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
