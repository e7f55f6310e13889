"""Debian's HAProxy in front of test servers, as an operator runs it: one HTTP frontend, one
backend `vllm`, the runtime API on a unix socket at level admin; read back through that socket
(`show stat`), HAProxy's own account and not the module's reader. With `checks`, the servers are
health-checked on /health and a refused connection is tried again on another server (retries,
redispatch), as a production balancer hides a dead server by itself; with `slow_server`, requests
for /slow all go to that server (so that draining it has a session to wait for). Upstream is a
local server to put behind it whose /slow requests stay open until it lets them answer."""
from __future__ import annotations

import csv
import io
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.required import missing

BACKEND = "vllm"
FRONTEND = "api"


def haproxy_binary() -> str:
    path = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if not path:
        message = "HAProxy is not installed (Debian's haproxy: tools/install_os_deps.sh test)"
        missing(message)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config(socket_path: str, port: int, servers: dict, checks: bool, slow_server: str | None) -> str:
    """The configuration: `servers` maps each server's name to its address:port."""
    lines = ["global", "    stats socket %s mode 600 level admin" % socket_path, "    stats timeout 30s", "",
             "defaults", "    mode http", "    timeout connect 2s", "    timeout client 120s", "    timeout server 120s"]
    if checks:
        lines += ["    retries 3", "    option redispatch"]
    lines += ["", "frontend %s" % FRONTEND, "    bind 127.0.0.1:%d" % port, "    default_backend %s" % BACKEND, "",
              "backend %s" % BACKEND, "    balance roundrobin"]
    if checks:
        lines += ["    option httpchk GET /health", "    default-server check inter 500ms fall 2 rise 2"]
    if slow_server:
        lines += ["    use-server %s if { path_beg /slow }" % slow_server]
    lines += ["    server %s %s" % (name, address) for name, address in servers.items()]
    return "\n".join(lines) + "\n"


class HAProxy:
    """HAProxy in the foreground, its configuration, log and admin socket in `workdir`."""

    def __init__(self, workdir: Path, servers: dict, checks: bool = True, slow_server: str | None = None):
        binary = haproxy_binary()
        self.socket = str(workdir / "admin.sock")
        self.port = free_port()
        self.config = workdir / "haproxy.cfg"
        self.config.write_text(config(self.socket, self.port, servers, checks, slow_server))
        self.log_path = workdir / "haproxy.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(self.config)],  # pylint: disable=consider-using-with
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("HAProxy did not start: %s" % self.log_path.read_text()[-2000:])
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def command(self, line: str) -> str:
        """One runtime API command's answer, read to the end."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(self.socket)
            sock.sendall(line.encode() + b"\n")
            return b"".join(iter(lambda: sock.recv(65536), b"")).decode()

    def stat(self) -> dict:
        """`show stat`: {server name: its row} of the backend's servers, and the frontend's row as `fe`."""
        rows = csv.DictReader(io.StringIO(self.command("show stat").lstrip("# ")))
        return {("fe" if row["pxname"] == FRONTEND else row["svname"]): row for row in rows
                if row["pxname"] == FRONTEND or row["svname"] not in ("FRONTEND", "BACKEND")}

    def status(self, server: str) -> str:
        """UP, DOWN, DRAIN, MAINT (HAProxy may add the check's progress: `UP 1/2`, `MAINT (via ...)`)."""
        return self.stat()[server]["status"]

    def get(self, path: str) -> tuple:
        """(status, body) of a GET through the balancer."""
        with urllib.request.urlopen(self.url + path, timeout=120) as response:
            return response.status, response.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


SLOW_BODY = "slow answer " * 1000


class Upstream:
    """A local HTTP server that answers its own name; /slow waits until release() (one open session)."""

    def __init__(self, name: str):
        self.entered, self.released = threading.Event(), threading.Event()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802  # http.server's naming
                if self.path.startswith("/slow"):
                    upstream.entered.set()
                    upstream.released.wait(120)
                body = (SLOW_BODY if self.path.startswith("/slow") else name).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self):
        self.released.set()

    def stop(self):
        self.release()
        self.server.shutdown()
        self.server.server_close()
