"""Debian's HAProxy in front of local HTTP servers, for the tests of cleanslate.gpu.lb_rotation: its
admin socket in the test's directory, read back by HAProxy's own `show stat` (a reader of its own,
not the module's)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

CONFIG = """\
global
  stats socket {socket} level admin
defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
frontend fe
  bind 127.0.0.1:{port}
  # The slow request goes to the first server, so that draining it has a session to wait for.
  use_backend vllm
backend vllm
  balance roundrobin
  use-server {first} if {{ path_beg /slow }}
{servers}
"""


def haproxy_binary() -> str:
    path = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if not path:
        message = "haproxy is not installed (Debian's haproxy: tools/install_os_deps.sh test)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must not go green without the real balancer
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Haproxy:
    """`haproxy -db` with backend `vllm` holding the servers {name: port}, the first one used for /slow."""

    def __init__(self, workdir: Path, servers: dict):
        self.socket = str(workdir / "admin.sock")
        self.port = free_port()
        config = workdir / "haproxy.cfg"
        config.write_text(CONFIG.format(socket=self.socket, port=self.port, first=next(iter(servers)),
                                        servers="\n".join("  server %s 127.0.0.1:%d" % item for item in servers.items())))
        self.proc = subprocess.Popen([haproxy_binary(), "-f", str(config), "-db"],  # pylint: disable=consider-using-with
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None, self.proc.stdout.read()
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail("haproxy made no admin socket within 30 s")
            time.sleep(0.05)

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(self.socket)
            conn.sendall(line.encode() + b"\n")
            return b"".join(iter(lambda: conn.recv(65536), b"")).decode()

    def stat(self) -> dict:
        """{svname: {field: value}} of every row of `show stat`: servers, FRONTEND and BACKEND."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        return {row["svname"] if row["pxname"] != "fe" else "fe": row
                for row in (dict(zip(header, line.split(","))) for line in lines[1:] if line)}

    def get(self, path: str) -> tuple:
        """(status, body) of a request through the balancer."""
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=120) as response:
            return response.status, response.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
