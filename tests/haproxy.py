"""Debian's HAProxy in front of test servers, as an operator runs it: one HTTP frontend, one
backend whose servers are health-checked on /health, redispatch and retries on a refused
connection, and the runtime API on a unix socket at level admin. Read back through that socket
(`show stat`), as an operator (or Prometheus's haproxy exporter) would."""
from __future__ import annotations

import csv
import io
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

BACKEND = "vllm"


def haproxy_binary() -> str:
    path = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if not path:
        message = "HAProxy is not installed (Debian's haproxy: tools/install_os_deps.sh test)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must not go green without the real balancer
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config(socket_path: Path, port: int, servers: dict, check_inter_ms: int = 500) -> str:
    """The configuration: `servers` maps each server's name to its address:port."""
    lines = ["global", "    stats socket %s mode 600 level admin" % socket_path, "    stats timeout 30s", "",
             "defaults", "    mode http", "    timeout connect 2s", "    timeout client 60s", "    timeout server 60s",
             # A refused connection is tried again, on another server: what a balancer hides by itself.
             "    retries 3", "    option redispatch", "",
             "frontend api", "    bind 127.0.0.1:%d" % port, "    default_backend %s" % BACKEND, "",
             "backend %s" % BACKEND, "    balance roundrobin", "    option httpchk GET /health",
             "    default-server check inter %dms fall 2 rise 2" % check_inter_ms]
    lines += ["    server %s %s" % (name, address) for name, address in servers.items()]
    return "\n".join(lines) + "\n"


class HAProxy:
    """HAProxy in the foreground, its configuration and admin socket in `workdir`."""

    def __init__(self, workdir: Path, servers: dict, check_inter_ms: int = 500):
        binary = haproxy_binary()
        self.socket = workdir / "admin.sock"
        self.port = free_port()
        self.config = workdir / "haproxy.cfg"
        self.config.write_text(config(self.socket, self.port, servers, check_inter_ms))
        self.log = (workdir / "haproxy.log").open("w")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(self.config)],  # pylint: disable=consider-using-with
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("HAProxy did not start: %s" % (workdir / "haproxy.log").read_text()[-2000:])
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def command(self, line: str) -> str:
        """One runtime API command's answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(self.socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return b"".join(chunks).decode()
                chunks.append(chunk)

    def stats(self) -> dict:
        """`show stat` of the backend's servers: {name: {status, scur, ...}}."""
        text = self.command("show stat").lstrip("# ")
        return {row["svname"]: row for row in csv.DictReader(io.StringIO(text))
                if row.get("pxname") == BACKEND and row.get("svname") not in ("FRONTEND", "BACKEND")}

    def status(self, server: str) -> str:
        """UP, DOWN, DRAIN, MAINT (HAProxy adds the check's state: `MAINT (via ...)`, `UP 1/2`)."""
        return self.stats()[server]["status"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
