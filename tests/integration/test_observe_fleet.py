"""The metrics and alert rules with the real parts (issue 27): Debian's prometheus-node-exporter
on a fleet host (real systemd) with its textfile collector on the roles' directory, a reset and
a start by ansible-playbook, and a real Prometheus (Debian's package, run here with its own
configuration and one-second intervals) scraping that node_exporter and the stand-in engine's
/metrics and evaluating the shipped rules (files/prometheus/cleanslate_gpu.rules.yml).

The rules' `for:` durations are as shipped: this test waits for an alert to become active
(pending or firing); tests/prometheus/ proves the `for:` timing with promtool."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.fake_nvml import FakeNvml
from tests.integration.conftest import REPO
from tests.integration.fleet import engines
from tests.integration.test_inference_service_fleet import FAULT_FILE, UNIT, base_vars

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
RULES = REPO / "files" / "prometheus" / "cleanslate_gpu.rules.yml"
HOST = "node1"
EXPORTER = "prometheus-node-exporter.service"
METRICS_DIR = "/var/lib/prometheus/node-exporter"


def get(url: str, timeout=10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8")


def wait_for(what, probe, timeout=90, interval=0.5):
    """probe() until it returns something true; its last answer in the failure."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # refused while a server starts
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    pytest.fail("%s: not within %d s (last: %r)" % (what, timeout, last))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Observed:
    """node1 served by the stand-in, node_exporter on it, and a Prometheus here scraping both."""

    def __init__(self, fleet, workdir: Path):
        self.fleet, self.workdir = fleet, workdir
        self.address = fleet.hosts[HOST].address
        self.host_vars = fleet.inventory.parent / "host_vars" / f"{HOST}.yml"
        self.prometheus = None
        self.port = free_port()

    def play(self, playbook, *extra):
        cmd = [ANSIBLE_PLAYBOOK, playbook, "-i", str(self.fleet.inventory), "-l", HOST,
               "-e", f"fleet_report_path={self.workdir / 'reports'}", *extra]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        return proc

    def exporter_metrics(self) -> dict:
        """node_exporter's /metrics, parsed: {name: [(labels, value)]}."""
        text = get(f"http://{self.address}:9100/metrics")
        return {fam.name: [(sample.labels, sample.value) for sample in fam.samples]
                for fam in text_string_to_metric_families(text)}

    def start_prometheus(self) -> None:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "node", "static_configs": [{"targets": [f"{self.address}:9100"]}]},
                {"job_name": "cleanslate_gpu_engine",
                 "static_configs": [{"targets": [f"{self.address}:8000"], "labels": {"host": HOST}}]},
            ],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = open(self.workdir / "prometheus.log", "wb")  # noqa: SIM115  # closed in stop()
        self.prometheus = subprocess.Popen(  # pylint: disable=consider-using-with
            [shutil.which("prometheus"), f"--config.file={path}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("Prometheus ready", lambda: "Ready" in get(f"http://127.0.0.1:{self.port}/-/ready"), timeout=60)

    def stop(self) -> None:
        if self.prometheus:
            self.prometheus.terminate()
            self.prometheus.wait(timeout=30)
            self.log.close()

    def query(self, expr: str) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        return json.loads(get(url))["data"]["result"]

    def alerts(self, name: str) -> list:
        """The active alerts (pending or firing) of that name."""
        found = json.loads(get(f"http://127.0.0.1:{self.port}/api/v1/alerts"))["data"]["alerts"]
        return [alert for alert in found if alert["labels"]["alertname"] == name]

    def completions(self, count: int, max_tokens: int) -> None:
        base = f"http://{self.address}:8000"
        model = json.loads(get(base + "/v1/models"))["data"][0]["id"]
        for dummy in range(count):
            body = json.dumps({"model": model, "prompt": "Say something", "max_tokens": max_tokens}).encode()
            request = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()


@pytest.fixture(scope="module")
def observed(fleet_session, tmp_path_factory):
    fleet = fleet_session
    host = fleet.hosts[HOST]
    if not host.running():
        fleet.boot(HOST)
    engines.install(host.root)
    state = Observed(fleet, tmp_path_factory.mktemp("observe"))
    # Debian's package, enabled as an operator would, with the systemd collector on; the textfile
    # collector reads Debian's default directory, where the roles write by default.
    (host.root / "etc/default/prometheus-node-exporter").write_text(
        'ARGS="--collector.systemd --collector.systemd.enable-restarts-metrics"\n')
    fleet.run(HOST, ["systemctl", "enable", "--now", EXPORTER])
    # Only this module's runs in the directory (another test's verify.yml leaves its file there).
    fleet.run(HOST, ["sh", "-c", f"rm -f {METRICS_DIR}/cleanslate_gpu_*"])
    state.host_vars.parent.mkdir(exist_ok=True)
    # node3's settings of the serve tests: vLLM, ngram speculation, no secret.
    state.host_vars.write_text(yaml.safe_dump(base_vars("node3")))
    try:
        yield state
    finally:
        state.stop()
        state.host_vars.unlink(missing_ok=True)
        if host.running():
            fleet.run(HOST, ["systemctl", "disable", "--now", EXPORTER, UNIT], check=False, timeout=120)
            fleet.run(HOST, ["sh", "-c", f"rm -rf /etc/systemd/system/{UNIT} /etc/cleanslate {FAULT_FILE} "
                                         f"{METRICS_DIR}/cleanslate_gpu_* /dev/shm/nccl-standin-*; "
                                         f"systemctl daemon-reload; systemctl reset-failed {UNIT}"], check=False)
        engines.uninstall(host.root)


def test_after_a_reset_and_a_start_node_exporter_serves_our_series(observed):
    observed.play("playbooks/reset_and_serve.yml", "-e", "fleet_force_reset=true")
    listing = observed.fleet.run(HOST, ["ls", "-l", METRICS_DIR]).stdout
    assert "cleanslate_gpu_node_reset.prom" in listing and "cleanslate_gpu_inference_service_inference-server.prom" in listing
    metrics = wait_for("node_exporter answering", observed.exporter_metrics, timeout=30)
    assert metrics["node_textfile_scrape_error"] == [({}, 0.0)]
    ok = {labels["role"]: value for labels, value in metrics["cleanslate_gpu_run_ok"]}
    assert ok == {"node_reset": 1.0, "inference_service": 1.0}
    assert {labels["host"] for labels, dummy in metrics["cleanslate_gpu_run_ok"]} == {HOST}
    (info, one), = metrics["cleanslate_gpu_service_info"]
    assert one == 1.0 and info["engine"] == "vllm" and info["unit"] == UNIT and info["speculative_method"] == "ngram"
    assert [value for dummy, value in metrics["cleanslate_gpu_reset_gpus_clean"]] == [engines.GPUS]
    (dummy, rate), = metrics["cleanslate_gpu_service_speculative_acceptance_rate"]
    assert abs(rate - 0.7) < 0.05  # the stand-in's acceptance, read at the gate
    assert [value for dummy, value in metrics["cleanslate_gpu_service_min_acceptance_rate"]] == [0.3]
    assert metrics["cleanslate_gpu_service_start_to_first_completion_seconds"][0][1] > 0
    now = time.time()
    for labels, stamp in metrics["cleanslate_gpu_last_success_timestamp_seconds"]:
        assert now - 600 < stamp <= now + 5, labels
    # The collector names our files; no file of ours failed.
    files = {labels["file"] for labels, dummy in metrics["node_textfile_mtime_seconds"]}
    assert any(name.endswith("cleanslate_gpu_node_reset.prom") for name in files), files


def by_role(metrics: dict, name: str) -> dict:
    return {labels["role"]: value for labels, value in metrics.get(name, [])}


def test_a_healthy_host_and_a_refused_one_show_their_last_run(observed):
    """reset_and_serve.yml on the healthy host: no reset ran, so node_reset's file is left as the
    last reset wrote it; the assessment and gate are a run of the service, whose file says so.
    Then a configuration refused in the first play: the service's file says `invalid` with the
    failure's start and the last success kept; nothing else is touched."""
    reset_file = observed.fleet.hosts[HOST].root / METRICS_DIR.lstrip("/") / "cleanslate_gpu_node_reset.prom"
    if not reset_file.exists():  # run alone (tools/mutate.py picks tests): the reset the test before ran
        observed.play("playbooks/reset_and_serve.yml", "-e", "fleet_force_reset=true")
    before = observed.exporter_metrics()
    reset_text = reset_file.read_text()
    observed.play("playbooks/reset_and_serve.yml")
    healthy = observed.exporter_metrics()
    assert reset_file.read_text() == reset_text  # node_reset did not run
    last_run = by_role(healthy, "cleanslate_gpu_last_run_timestamp_seconds")
    assert last_run["inference_service"] > by_role(before, "cleanslate_gpu_last_run_timestamp_seconds")["inference_service"]
    assert by_role(healthy, "cleanslate_gpu_run_ok") == {"node_reset": 1.0, "inference_service": 1.0}
    # The server was left running: no start time, and the gate's speculation read again.
    assert "cleanslate_gpu_service_start_to_ready_seconds" not in healthy
    assert by_role(healthy, "cleanslate_gpu_service_speculative_acceptance_rate")

    observed.host_vars.write_text(yaml.safe_dump(dict(base_vars("node3"), inference_service_port=-1)))
    try:
        cmd = [ANSIBLE_PLAYBOOK, "playbooks/reset_and_serve.yml", "-i", str(observed.fleet.inventory), "-l", HOST,
               "-e", f"fleet_report_path={observed.workdir / 'reports'}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode != 0 and "invalid" in proc.stdout, proc.stdout[-3000:]
    finally:
        observed.host_vars.write_text(yaml.safe_dump(base_vars("node3")))
    refused = observed.exporter_metrics()
    assert reset_file.read_text() == reset_text
    status = {labels["role"]: labels["status"] for labels, dummy in refused["cleanslate_gpu_run_status"]}
    assert status == {"node_reset": "ok", "inference_service": "invalid"}, status
    assert by_role(refused, "cleanslate_gpu_failing_since_timestamp_seconds").keys() == {"inference_service"}
    success = by_role(refused, "cleanslate_gpu_last_success_timestamp_seconds")
    assert success["inference_service"] == by_role(healthy, "cleanslate_gpu_last_success_timestamp_seconds")["inference_service"]
    assert refused["node_textfile_scrape_error"] == [({}, 0.0)]


def test_a_failed_run_keeps_the_last_success_on_the_host(observed):
    before = {labels["role"]: value for labels, value in observed.exporter_metrics()["cleanslate_gpu_last_success_timestamp_seconds"]}
    # A start that never gets ready: the serve fails (the reset itself succeeds).
    observed.fleet.hosts[HOST].root.joinpath(FAULT_FILE.lstrip("/")).write_text(json.dumps({"fault": "never_ready"}))
    values = dict(base_vars("node3"), inference_service_ready_timeout=8)
    observed.host_vars.write_text(yaml.safe_dump(values))
    try:
        cmd = [ANSIBLE_PLAYBOOK, "playbooks/reset_and_serve.yml", "-i", str(observed.fleet.inventory), "-l", HOST,
               "-e", f"fleet_report_path={observed.workdir / 'reports'}", "-e", "fleet_force_reset=true"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode != 0, proc.stdout[-3000:]
        metrics = observed.exporter_metrics()
        status = {labels["role"]: labels["status"] for labels, dummy in metrics["cleanslate_gpu_run_status"]}
        assert status == {"node_reset": "ok", "inference_service": "failed"}, status
        after = {labels["role"]: value for labels, value in metrics["cleanslate_gpu_last_success_timestamp_seconds"]}
        assert after["inference_service"] == before["inference_service"]  # kept from the previous file
        assert after["node_reset"] > before["node_reset"]  # the reset itself succeeded again
        failing = {labels["role"] for labels, dummy in metrics.get("cleanslate_gpu_failing_since_timestamp_seconds", [])}
        assert failing == {"inference_service"}
    finally:
        observed.fleet.hosts[HOST].root.joinpath(FAULT_FILE.lstrip("/")).unlink(missing_ok=True)
        observed.host_vars.write_text(yaml.safe_dump(base_vars("node3")))
    observed.play("playbooks/reset_and_serve.yml", "-e", "fleet_force_reset=true")
    metrics = observed.exporter_metrics()
    assert "cleanslate_gpu_failing_since_timestamp_seconds" not in metrics  # a success ends the failure


def test_prometheus_evaluates_the_rules_on_the_real_series(observed):
    observed.start_prometheus()
    wait_for("our series scraped", lambda: observed.query('cleanslate_gpu_run_ok{host="%s"}' % HOST))
    wait_for("the engine scraped", lambda: observed.query('up{job="cleanslate_gpu_engine"} == 1'))
    # A healthy served host with a good acceptance: enough drafted tokens to judge, and no alert.
    observed.completions(4, 100)
    wait_for("the counters' rate", lambda: observed.query(
        'sum(increase(vllm:spec_decode_num_draft_tokens_total[15m])) >= 500'), timeout=30)
    time.sleep(3)
    for name in ("CleanslateGpuAcceptanceLow", "CleanslateGpuEngineDown", "CleanslateGpuServerDown",
                 "CleanslateGpuResetFailed", "CleanslateGpuServeFailed", "CleanslateGpuHostDirty",
                 "CleanslateGpuMetricsUnreadable"):
        assert observed.alerts(name) == [], name

    # Lower the stand-in's acceptance below the floor (0.3): it restarts with 10%, and serves.
    root = observed.fleet.hosts[HOST].root
    root.joinpath(FAULT_FILE.lstrip("/")).write_text(json.dumps({"acceptance": 0.1}))
    # (reset-failed: the runs before started the unit more often than its start limit allows)
    observed.fleet.run(HOST, ["systemctl", "reset-failed", UNIT], check=False)
    observed.fleet.run(HOST, ["systemctl", "restart", UNIT])
    wait_for("the stand-in back", lambda: get(f"http://{observed.address}:8000/health") is not None)
    observed.completions(20, 100)
    low = wait_for("CleanslateGpuAcceptanceLow active", lambda: observed.alerts("CleanslateGpuAcceptanceLow"), timeout=60)
    assert low[0]["labels"]["host"] == HOST and low[0]["state"] in ("pending", "firing")
    assert float(low[0]["value"]) < 0.3

    # A crash loop systemd hides (issue 39, 3): the engine exits 0 once ready, leaving a segment.
    # Restart=always brings it back each time, the unit's pre-start cleanup removes the segment, and
    # node_exporter's restart count makes CleanslateGpuCrashLoop active at the second restart.
    observed.fleet.run(HOST, ["systemctl", "reset-failed", UNIT], check=False)
    root.joinpath(FAULT_FILE.lstrip("/")).write_text(json.dumps({"fault": "exit_zero_leaking", "load_s": 0.5}))
    observed.fleet.run(HOST, ["systemctl", "restart", UNIT])
    fault = time.time()
    loop = wait_for("CleanslateGpuCrashLoop active", lambda: observed.alerts("CleanslateGpuCrashLoop"), timeout=90)
    assert loop[0]["labels"]["host"] == HOST and loop[0]["labels"]["unit"] == UNIT, loop
    print("crash loop: CleanslateGpuCrashLoop active %.1f s after the first exit's start" % (time.time() - fault))

    # Crash the engine so that it stays down (each start crashes while loading, until systemd gives up).
    root.joinpath(FAULT_FILE.lstrip("/")).write_text(json.dumps({"fault": "crash_during_load"}))
    observed.fleet.run(HOST, ["systemctl", "kill", "--signal=SIGKILL", UNIT])
    down = wait_for("CleanslateGpuEngineDown active", lambda: observed.alerts("CleanslateGpuEngineDown"), timeout=60)
    assert down[0]["labels"]["host"] == HOST and down[0]["state"] in ("pending", "firing")
    unit = wait_for("CleanslateGpuServerDown active", lambda: observed.alerts("CleanslateGpuServerDown"), timeout=90)
    assert unit[0]["labels"]["host"] == HOST and unit[0]["labels"]["unit"] == UNIT
    # A broken GPU (issue 39, 2): the kernel log (fed through node_reset_nvml_verify_xid_log_path, as
    # a test host's kernel log cannot be written) says GPU 1 fell off the bus. The reset ends
    # needs_reboot, and its metric makes CleanslateGpuNeedsReboot fire (no `for:`) with the GPU and code.
    bus = FakeNvml(root / engines.NVML_STATE.lstrip("/")).gpus()[1]["pci_bus_id"].split(".")[0].lower()
    # Written from inside: the host's /tmp is a tmpfs of its own.
    observed.fleet.run(HOST, ["sh", "-c", "cat > /tmp/kern.log"], input="kernel: NVRM: Xid (PCI:%s): 79, "
                       "pid=<unknown>, name=<unknown>, GPU has fallen off the bus.\n" % bus)
    logged = time.time()
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "playbooks/reset.yml", "-i", str(observed.fleet.inventory), "-l", HOST,
                           "-e", f"fleet_report_path={observed.workdir / 'reports'}",
                           "-e", "node_reset_nvml_verify_xid_log_path=/tmp/kern.log"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 2 and "needs_reboot" in proc.stdout, proc.stdout[-4000:]
    broken = wait_for("CleanslateGpuNeedsReboot firing", lambda: [
        alert for alert in observed.alerts("CleanslateGpuNeedsReboot") if alert["state"] == "firing"], timeout=60)
    assert broken[0]["labels"]["host"] == HOST and broken[0]["labels"]["gpu"] == "1" and broken[0]["labels"]["code"] == "79"
    print("broken GPU: CleanslateGpuNeedsReboot firing %.1f s after the Xid was logged (the reset run included)"
          % (time.time() - logged))
    # The files stay readable all along.
    assert observed.query("node_textfile_scrape_error == 0")
