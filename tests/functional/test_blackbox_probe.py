"""Issue 39, 1: the active probe as shipped. Debian's blackbox_exporter runs the collection's
files/prometheus/blackbox.yml (the served model name and the key file's path put in as
docs/observability.md tells) against the stand-in engine, which requires an API key: a server that
answers gives probe_success 1 (the key was sent from its file, the completion was real), a server
whose engine is hung (/health still 200) gives 0 within the probe's deadline."""
from __future__ import annotations

import re
import urllib.request

import pytest

from tests.blackbox import MODULE, Blackbox
from tests.functional.standin import engine, node  # noqa: F401  # pylint: disable=unused-import

KEY = "sk-blackbox-probe-4Rt8"


@pytest.fixture
def exporter(tmp_path):
    box = Blackbox(tmp_path, "llama", KEY)
    try:
        yield box.port
    finally:
        box.stop()


def probe(exporter_port, served) -> float:
    """One probe, as Prometheus sends it: the target (relabeled from the engine's host:port as
    docs/observability.md's scrape job does) and the scrape's timeout in the header, which caps the
    module's deadline (3 s here)."""
    target = "http://127.0.0.1:%d/v1/completions" % served.port
    request = urllib.request.Request("http://127.0.0.1:%d/probe?module=%s&target=%s" % (exporter_port, MODULE, target),
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
