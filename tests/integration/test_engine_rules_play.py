"""reset_and_serve.yml with a speculative configuration the engine would refuse at start (issue 25):
the host is `invalid` with vLLM's own reason, and nothing on the crashed node is touched, not even
with fleet_force_reset: no process signalled, no leftover removed, no unit written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("speculative, reason", [
    ({"method": "mtp"},
     "inference_service_speculative.num_speculative_tokens is required with method mtp: vLLM 0.33.0 refuses it"),
    ({"method": "ngram", "num_speculative_tokens": 3, "draft_lm_head_quantization": "fp8"},
     "(draft_lm_head_quantization is not supported for method 'ngram')"),
    ({"method": "eagle3", "model": "d", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[2, 64, 3]]},
     "must have a range that starts at batch size 1, got its lowest at 2"),
])
def test_a_configuration_vllm_refuses_at_start_stops_the_host_before_anything_is_touched(
        crashed_node, tmp_path, speculative, reason):
    manifest = crashed_node
    every_pid = [entry["pid"] for entries in manifest["processes"].values() for entry in entries]
    config_dir = tmp_path / "etc"
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(
        manifest, fleet_report_path=str(tmp_path / "reports"), fleet_force_reset=True,
        inference_service_model="m", inference_service_engine_version="0.33.0",
        inference_service_unit="cleanslate-rules-test.service", inference_service_config_dir=str(config_dir),
        inference_service_speculative=speculative)))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset_and_serve.yml",
                           "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert proc.returncode == 2, proc.stdout[-3000:]
    reports = sorted((tmp_path / "reports").glob("reset_and_serve-*.json"))
    row = json.loads(reports[-1].read_text())["hosts"][0]
    assert row["status"] == "invalid", row
    assert any(reason in problem for problem in row["problems"]), row["problems"]
    assert all(procinfo.alive(pid) for pid in every_pid), "a refused host must not be reset"
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()
    assert not config_dir.exists()
