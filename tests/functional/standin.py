"""Run the stand-in engine (tests/sim/engine) on this machine for a test: a node of four GPU
device files (plain files) and a fake NVML, and a context manager that starts the engine as a
child process and kills, on the way out, it and any worker it left behind (by pid and start
time)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.sim import procinfo

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def node(tmp_path, fake_nvml):
    """Four GPU device files (plain files) and a fake NVML with four H200s."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    fake_nvml.create(gpu_count=4)
    return {"dev": dev, "nvml": fake_nvml, "shm": tmp_path / "shm", "state": tmp_path / "state.json",
            "tmp": tmp_path}


class Engine:
    def __init__(self, proc, port, state_file):
        self.proc = proc
        self.port = port
        self.state_file = state_file

    @property
    def state(self) -> dict:
        return json.loads(self.state_file.read_text())

    def get(self, path, key=None):
        request = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path))
        if key:
            request.add_header("Authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post(self, path, body, key=None):
        request = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        if key:
            request.add_header("Authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def refused(self) -> bool:
        """True once nothing listens on the port. A reset is not yet a refusal: a connection
        that reached the backlog of a listener closing at that moment is reset, not refused."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
            return False
        except ConnectionResetError:
            return False
        except ConnectionRefusedError:
            return True

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while not self.state_file.exists():
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "the stand-in did not get ready"
            time.sleep(0.05)
        return self.state


@contextmanager
def engine(node, engine_name, args, **env):
    port = free_port()
    if engine_name == "vllm":
        argv = ["serve", "sim/Llama-3.1-8B", "--port", str(port)] + args
    else:
        argv = ["serve", "--model-path", "sim/Llama-3.1-8B", "--port", str(port)] + args
    run_env = dict(os.environ, STANDIN_DEV_DIR=str(node["dev"]), STANDIN_STATE_FILE=str(node["state"]),
                   FAKE_NVML_STATE=str(node["nvml"].state_dir), STANDIN_LOAD_S="0.3", PYTHONPATH=str(REPO))
    run_env.update({key: str(value) for key, value in env.items()})
    proc = subprocess.Popen([sys.executable, "-m", "tests.sim.engine", engine_name] + argv, env=run_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield Engine(proc, port, node["state"])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if node["state"].exists():  # workers left behind (the orphan fault): by pid and start time
            procinfo.kill_all(json.loads(node["state"].read_text()).get("workers", []))
