"""Issue 39, 1: the active probe as shipped. Debian's blackbox_exporter runs the collection's
files/prometheus/blackbox.yml (the served model name and the key file's path put in as
docs/observability.md tells) against the stand-in engine, which requires an API key: a server that
answers gives probe_success 1 (the key was sent from its file, the completion was real), a server
whose engine is hung (/health still 200) gives 0 within the probe's deadline."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.functional.standin import REPO, engine, free_port, node  # noqa: F401  # pylint: disable=unused-import

SHIPPED = REPO / "files" / "prometheus" / "blackbox.yml"
KEY = "sk-blackbox-probe-4Rt8"


def blackbox_binary() -> str:
    path = shutil.which("prometheus-blackbox-exporter") or shutil.which("blackbox_exporter")
    if not path:
        message = "blackbox_exporter is not installed (Debian's prometheus-blackbox-exporter: tools/install_os_deps.sh test)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must not go green without the real exporter
        pytest.skip(message)
    return path


@pytest.fixture
def exporter(tmp_path):
    binary = blackbox_binary()
    key_file = tmp_path / "api_key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    config = tmp_path / "blackbox.yml"
    config.write_text(SHIPPED.read_text().replace("SERVED_MODEL_NAME", "llama")
                      .replace("/etc/prometheus/cleanslate_gpu_api_key", str(key_file)))
    port = free_port()
    proc = subprocess.Popen([binary, "--config.file=%s" % config, "--web.listen-address=127.0.0.1:%d" % port],  # pylint: disable=consider-using-with
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/-/healthy" % port, timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "blackbox_exporter did not answer"
                time.sleep(0.1)
        yield port
    finally:
        proc.kill()
        proc.wait()


def probe(exporter_port, served) -> float:
    """One probe, as Prometheus sends it: the target (relabeled from the engine's host:port as
    docs/observability.md's scrape job does) and the scrape's timeout in the header, which caps the
    module's deadline (3 s here)."""
    target = "http://127.0.0.1:%d/v1/completions" % served.port
    request = urllib.request.Request("http://127.0.0.1:%d/probe?module=cleanslate_completion&target=%s" % (exporter_port, target),
                                     headers={"X-Prometheus-Scrape-Timeout-Seconds": "3"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return float(re.search(r"^probe_success (\S+)$", text, re.M).group(1))


def test_the_shipped_module_passes_on_a_serving_engine_and_fails_on_a_hung_one(node, exporter):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"], VLLM_API_KEY=KEY) as served:
        served.wait_ready()
        assert probe(exporter, served) == 1
    node["state"].unlink()
    with engine(node, "vllm", ["--served-model-name", "llama"], VLLM_API_KEY=KEY, STANDIN_FAULT="hung_engine") as served:
        served.wait_ready()
        assert served.get("/health")[0] == 200
        assert probe(exporter, served) == 0
