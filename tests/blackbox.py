"""Debian's blackbox_exporter running the collection's files/prometheus/blackbox.yml, the served
model name and the key file's path put in as docs/observability.md tells users to."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.required import missing

SHIPPED = Path(__file__).resolve().parents[1] / "files" / "prometheus" / "blackbox.yml"
MODULE = "cleanslate_completion"


def blackbox_binary() -> str:
    path = shutil.which("prometheus-blackbox-exporter") or shutil.which("blackbox_exporter")
    if not path:
        message = "blackbox_exporter is not installed (Debian's prometheus-blackbox-exporter: tools/install_os_deps.sh test)"
        missing(message)
    return path


class Blackbox:
    """The exporter on a free local port, its config and key file in `workdir`."""

    def __init__(self, workdir: Path, served_name: str, key: str):
        binary = blackbox_binary()
        key_file = workdir / "api_key"
        key_file.write_text(key)
        key_file.chmod(0o600)
        config = workdir / "blackbox.yml"
        config.write_text(SHIPPED.read_text().replace("SERVED_MODEL_NAME", served_name)
                          .replace("/etc/prometheus/cleanslate_gpu_api_key", str(key_file)))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [binary, "--config.file=%s" % config, "--web.listen-address=127.0.0.1:%d" % self.port],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.proc.stdout.read()
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/-/healthy" % self.port, timeout=2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail("blackbox_exporter did not answer within 30 s")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
