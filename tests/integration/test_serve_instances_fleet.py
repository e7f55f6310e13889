"""Several servers on one host (issue 26, inference_service_instances), on one real systemd host
with the stand-in engine on four simulated GPUs: two instances, `a` on GPUs 0,1 and `b` on 2,3.

Asserted from outside the playbook: systemd's MainPID of each unit, /health over the bridge, the
report's rows. The four-instance fleet test with a client loop is tests/integration/fleet's
(issue 26's fleet part); this one proves the serve layer's own promises on the smallest host."""
from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import HOST_NVML_LIB, HOST_TESTS, REPO
from tests.integration.fleet import Fleet, engines
from tests.integration.fleet.reports import play

pytestmark = pytest.mark.fleet

NAME = "node1"
UNITS = {"a": "vllm-a.service", "b": "vllm-b.service"}
PORTS = {"a": 8001, "b": 8002}
METRICS = "/run/cleanslate-metrics"


def host_vars() -> dict:
    env = {"FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "1", "STANDIN_SHM_DIR": "/dev/shm"}
    return {
        "inference_service_model": "sim/Llama-3.1-8B-Instruct",
        "inference_service_tensor_parallel_size": 2,
        "inference_service_ready_timeout": 120,
        "inference_service_poll_interval": 0.2,
        "inference_service_progress_interval": 5,
        "inference_service_drain_timeout": 2,
        # systemd would restart a killed server by itself within a second: the run must find it dead.
        "inference_service_restart_sec": 600,
        "inference_service_metrics_dir": METRICS,
        "inference_service_instances": [
            {"unit": UNITS["a"], "port": PORTS["a"], "served_name": "a",
             "environment": dict(env, CUDA_VISIBLE_DEVICES="0,1")},
            {"unit": UNITS["b"], "port": PORTS["b"], "served_name": "b",
             "environment": dict(env, CUDA_VISIBLE_DEVICES="2,3")},
        ],
        "node_reset_environment": {"LD_LIBRARY_PATH": HOST_NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE},
        "node_reset_nvml_verify_expected_count": engines.GPUS,
        "node_reset_nvml_verify_timeout": 20,
        "node_reset_gpu_reset_grace_period": 3,
    }


class Host:
    def __init__(self, fleet, workdir: Path):
        self.fleet, self.workdir = fleet, workdir
        self.vars = host_vars()

    def play(self, check=False):
        (self.fleet.inventory.parent / "host_vars").mkdir(exist_ok=True)
        (self.fleet.inventory.parent / "host_vars" / f"{NAME}.yml").write_text(yaml.safe_dump(self.vars))
        return play(self.fleet, self.workdir / "reports", NAME, check=check)

    def main_pid(self, unit) -> int:
        return int(self.fleet.run(NAME, ["systemctl", "show", "--property=MainPID", "--value", unit]).stdout)

    def health(self, key) -> int:
        url = f"http://{self.fleet.hosts[NAME].address}:{PORTS[key]}/health"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status
        except (urllib.error.URLError, OSError):
            return 0


@pytest.fixture(scope="module")
def host(tmp_path_factory, fake_nvml_lib):
    from tests.integration.conftest import _fleet_prerequisites  # pylint: disable=import-outside-toplevel
    _fleet_prerequisites()
    fleet = Fleet(tmp_path_factory.mktemp("instances"), hosts=1,
                  copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: fake_nvml_lib})
    try:
        fleet.up()
        engines.install(fleet.hosts[NAME].root)
        fleet.run(NAME, ["mkdir", "-p", METRICS])
        state = Host(fleet, tmp_path_factory.mktemp("serve"))
        state.first = state.play()
        yield state
    finally:
        fleet.down()


def test_two_instances_are_served_each_on_its_own_unit_port_and_gpus(host):
    proc, report = host.first
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    row = report["hosts"][0]
    assert [(item["unit"], item["gpus"], item["service_status"]) for item in row["instances"]] == [
        (UNITS["a"], [0, 1], "ready"), (UNITS["b"], [2, 3], "ready")], row["instances"]
    assert {host.health(key) for key in UNITS} == {200}
    # Each server's ranks hold the GPUs of its own CUDA_VISIBLE_DEVICES, read in PCI order.
    for key in UNITS:
        env = host.fleet.run(NAME, ["systemctl", "show", "--property=Environment", "--value", UNITS[key]]).stdout
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env, env
    assert "| unit | GPUs |" in proc.stdout, proc.stdout[-4000:]


def test_check_diff_says_per_instance_what_would_be_reset_and_changes_nothing(host):
    pid_a, pid_b = host.main_pid(UNITS["a"]), host.main_pid(UNITS["b"])
    host.fleet.run(NAME, ["systemctl", "kill", "--signal=SIGKILL", "--kill-whom=main", UNITS["b"]])
    proc, report = host.play(check=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    rows = {item["unit"]: item for item in report["instances"]}
    assert (rows[UNITS["a"]]["stopped"], rows[UNITS["b"]]["stopped"]) == (False, True), rows
    assert rows[UNITS["b"]]["service"]["reason"] == "check mode: would stop the unit, reset its GPUs and start it", rows
    assert rows[UNITS["a"]]["service"]["reason"] == "check mode: would leave the server running", rows
    assert "| host | unit | GPUs | service | would reset |" in proc.stdout
    assert f"| {NAME} | {UNITS['b']} | 2,3 | check | yes |" in proc.stdout, proc.stdout[-4000:]
    # Nothing changed: a still runs as it did, b is still dead.
    assert host.main_pid(UNITS["a"]) == pid_a and host.health("a") == 200
    assert host.main_pid(UNITS["b"]) == 0 and host.health("b") == 0
    host.first_broken = pid_b


def test_only_the_broken_instance_is_reset_and_restarted(host):
    pid_a, pid_b = host.main_pid(UNITS["a"]), getattr(host, "first_broken", None) or host.main_pid(UNITS["b"])
    assert pid_a and pid_b
    host.fleet.run(NAME, ["systemctl", "kill", "--signal=SIGKILL", "--kill-whom=main", UNITS["b"]], check=False)
    proc, report = host.play()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    # The healthy neighbour kept its server: same MainPID, still answering.
    assert host.main_pid(UNITS["a"]) == pid_a
    assert host.health("a") == 200 and host.health("b") == 200
    new_b = host.main_pid(UNITS["b"])
    assert new_b not in (0, pid_b)
    row = report["hosts"][0]
    rows = {item["unit"]: item for item in row["instances"]}
    assert rows[UNITS["a"]]["restarted"] is False and rows[UNITS["a"]]["main_pid"] == pid_a, rows
    assert rows[UNITS["b"]]["restarted"] is True and rows[UNITS["b"]]["reset"] is True, rows
    assert rows[UNITS["a"]]["reset"] is False, rows
    assert row["status"] == "ok" and row["service_status"] == "ready", row
    # Two rows in the report's instance list, one per server.
    assert [(item["host"], item["unit"]) for item in report["instances"]] == [(NAME, UNITS["a"]), (NAME, UNITS["b"])]
    # One metrics file per instance, each with its own unit label (a shared name would keep only the last).
    for key, unit in UNITS.items():
        text = host.fleet.run(NAME, ["cat", f"{METRICS}/cleanslate_gpu_inference_service_vllm-{key}.prom"]).stdout
        assert f'unit="{unit}"' in text and 'status="ready"' in text, text


def test_a_second_run_changes_nothing(host):
    pids = {key: host.main_pid(unit) for key, unit in UNITS.items()}
    proc, report = host.play()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "changed=0" in proc.stdout.split("PLAY RECAP", 1)[1], proc.stdout[-3000:]
    assert {key: host.main_pid(unit) for key, unit in UNITS.items()} == pids
    assert report["hosts"][0]["killed"] == 0
    # Each instance's settings are checked once (the validation play), not again by its later steps;
    # the one-server check that validate.yml skips for a host of several servers is listed, not run.
    assert re.findall(r"Build the server's command line and check it against the engine version's flags\] \**\n(\w+):",
                      proc.stdout).count("ok") == 2, proc.stdout[-6000:]


def test_instances_sharing_a_gpu_are_refused_by_name_and_nothing_is_touched(host):
    pids = {key: host.main_pid(unit) for key, unit in UNITS.items()}
    host.vars["inference_service_instances"][1]["environment"]["CUDA_VISIBLE_DEVICES"] = "1,2"
    try:
        proc, report = host.play()
    finally:
        host.vars = host_vars()
    assert proc.returncode == 2, proc.stdout[-6000:]
    row = report["hosts"][0]
    assert row["status"] == "invalid", row
    assert any("inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] (vllm-b.service) "
               "share the GPU 1" in problem for problem in row["problems"]), row["problems"]
    assert {key: host.main_pid(unit) for key, unit in UNITS.items()} == pids
