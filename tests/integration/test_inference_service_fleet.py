"""reset_and_serve.yml on the fleet of real systemd hosts, with the stand-in engine installed as
/usr/local/bin/vllm and /usr/local/bin/sglang: every scenario of issue 12, each asserted from
outside the playbook (systemctl, /proc inside the host, HTTP from this machine, the report).

node1: vLLM, EAGLE-3 whose draft name holds spaces and quotes, an API key and a HF token.
node2: SGLang, EAGLE3 with all three step options, an API key (through --config).
node3: vLLM, ngram, no secret.
The tests share one served fleet and each leaves it healthy for the next.
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import HOST_NVML_LIB
from tests.integration.fleet import engines
from tests.integration.fleet.reports import play, rows_by_host

UNIT = "inference-server.service"
HOSTS = ("node1", "node2", "node3")
REPO = Path(__file__).resolve().parents[2]
# Every character the EnvironmentFile must escape, and a % that systemd would expand.
API_KEY = 'sk-te$t "q" \\b%x `y`'
HF_TOKEN = "hf_SeCrEtToKeN0123456789"
SGLANG_KEY = "sg key $HOME 'single'"
SECRETS = (API_KEY, HF_TOKEN, SGLANG_KEY, "sk-te$t", "SeCrEtToKeN", "sg key")
FAULT_FILE = "/etc/cleanslate-standin.json"
# The journal's message id of "Started <unit>" (a start job that completed), sd-messages.h.
STARTED = "39f53479d3a045ac8e11786248231fbf"
DRAFT = 'sim/EAGLE3 draft "v2"'
SPEC_VLLM = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3,
             "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 64, 1]]}
SPEC_SGLANG = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "sim/draft",
               "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


def base_vars(name: str) -> dict:
    env = {"FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "1", "STANDIN_FAULT_FILE": FAULT_FILE,
           "STANDIN_SHM_DIR": "/dev/shm", "CUDA_VISIBLE_DEVICES": "0,1"}
    values = {
        "inference_service_model": "sim/Llama-3.1-8B-Instruct",
        "inference_service_tensor_parallel_size": 2,
        "inference_service_environment": env,
        "inference_service_ready_timeout": 120,
        "inference_service_poll_interval": 0.2,
        "inference_service_progress_interval": 5,
        "inference_service_drain_timeout": 2,
        "inference_service_restart_sec": 1,
        "node_reset_environment": {"LD_LIBRARY_PATH": HOST_NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE},
        "node_reset_nvml_verify_expected_count": engines.GPUS,
        "node_reset_nvml_verify_timeout": 20,
        "node_reset_gpu_reset_grace_period": 3,
    }
    if name == "node1":
        values.update(inference_service_served_name="llama", inference_service_speculative=SPEC_VLLM,
                      inference_service_secrets={"api_key": API_KEY, "hf_token": HF_TOKEN})
    elif name == "node2":
        # SGLang's acceptance gauges are logged once every --decode-log-interval decode steps (40): the
        # gate's three completions of 16 tokens make about 16, so the window is 5 for the gate to read them.
        values.update(inference_service_engine="sglang", inference_service_port=30000,
                      inference_service_speculative=SPEC_SGLANG, inference_service_secrets={"api_key": SGLANG_KEY},
                      inference_service_extra_args=["--decode-log-interval", "5"])
    else:
        values.update(inference_service_speculative={"method": "ngram", "num_speculative_tokens": 2,
                                                     "prompt_lookup_max": 4})
    return values


class Served:
    """The fleet with the stand-in installed, its host_vars, and what the tests read from outside."""

    def __init__(self, fleet, workdir: Path):
        self.fleet = fleet
        self.workdir = workdir
        self.host_vars = fleet.inventory.parent / "host_vars"
        self.vars = {name: base_vars(name) for name in HOSTS}

    def write_vars(self) -> None:
        self.host_vars.mkdir(exist_ok=True)
        for name, values in self.vars.items():
            (self.host_vars / f"{name}.yml").write_text(yaml.safe_dump(values))

    def play(self, limit="gpu_nodes", extra=(), check=False, force=()):
        """ansible-playbook reset_and_serve.yml; (process, report or None). `force`: hosts reset
        even when healthy (fleet_force_reset as a host variable)."""
        for name in force:
            self.vars[name]["fleet_force_reset"] = True
        self.write_vars()
        for name in force:
            del self.vars[name]["fleet_force_reset"]
        return play(self.fleet, self.workdir / "reports", limit, extra, check)

    def show(self, name, *props) -> dict:
        out = self.fleet.run(name, ["systemctl", "show", *[f"--property={p}" for p in props], UNIT]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_pid(self, name) -> int:
        return int(self.show(name, "MainPID")["MainPID"])

    def cmdline(self, name, pid) -> list:
        return self.fleet.run(name, ["cat", f"/proc/{pid}/cmdline"]).stdout.split("\0")[:-1]

    def starts_since(self, name, since: float) -> int:
        """How many times systemd started the unit since `since` (seconds since the epoch)."""
        out = self.fleet.run(name, ["journalctl", "--unit", UNIT, "--since", f"@{since:.0f}", "--output", "cat",
                                    "--no-pager", f"MESSAGE_ID={STARTED}"]).stdout
        return len(out.splitlines())

    def url(self, name, path) -> str:
        port = self.vars[name].get("inference_service_port", 8000)
        return f"http://{self.fleet.hosts[name].address}:{port}{path}"

    def get(self, name, path, key=None):
        request = urllib.request.Request(self.url(name, path))
        if key:
            request.add_header("Authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    def wait_health(self, name, timeout=60) -> None:
        """Until the host's port answers /health 200 (from this machine), or fail after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.get(name, "/health")[0] == 200:
                    return
            except OSError:  # refused while it loads
                pass
            assert time.monotonic() < deadline, f"{name} did not answer /health within {timeout} s"
            time.sleep(0.2)

    def fault(self, name, **settings) -> None:
        engines.set_fault(self.fleet.hosts[name].root, FAULT_FILE, **settings)

    def heal(self, *names, force=True) -> None:
        """Back to the served state: no fault, the base variables, served again; reset too with
        `force` (a healthy host that only needs its configuration back restarts without one)."""
        for name in names:
            self.fault(name)
            self.vars[name] = base_vars(name)
        proc, dummy = self.play(limit=",".join(names), extra=["-e", f"fleet_force_reset={str(force).lower()}"])
        assert proc.returncode == 0, proc.stdout[-4000:]


def recap(output: str) -> dict:
    return {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+: (ok=.*)$", output, re.M)}


@pytest.fixture(scope="module")
def served(fleet_session, tmp_path_factory):
    """The session's fleet with the stand-in installed and every host served once."""
    fleet = fleet_session
    for name, host in fleet.hosts.items():
        if not host.running():
            fleet.boot(name)
        engines.install(host.root)
    state = Served(fleet, tmp_path_factory.mktemp("serve"))
    try:
        # Verbose, as the secrets test reads it: the run that writes the secret files and starts
        # every server with its keys.
        proc, report = state.play(extra=["-vv"])
        state.first = (proc, report)
        state.first_markdown = "".join(path.read_text() for path in (state.workdir / "reports").glob("*.md"))
        yield state
    finally:
        for name, host in fleet.hosts.items():
            (state.host_vars / f"{name}.yml").unlink(missing_ok=True)
            if host.running():
                fleet.run(name, ["systemctl", "disable", "--now", UNIT], check=False, timeout=120)
                fleet.run(name, ["systemctl", "stop", "hand-started-vllm.service"], check=False, timeout=120)
                fleet.run(name, ["sh", "-c", f"rm -rf /etc/systemd/system/{UNIT} /etc/cleanslate {FAULT_FILE} "
                                             "/dev/shm/nccl-standin-* /dev/shm/psm_standin_leaked; systemctl daemon-reload; "
                                             f"systemctl reset-failed {UNIT}"], check=False)
            engines.uninstall(host.root)


def test_reset_and_serve_brings_every_host_up_with_the_exact_command_line(served):
    proc, report = served.first
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    rows = rows_by_host(report)
    assert sorted(rows) == list(HOSTS)
    for name in HOSTS:
        service = rows[name]["service"]
        assert service["status"] == "ready", service
        # No inference_service_engine_version here: the version the host's installed engine reported.
        assert service["engine_version"] == engines.newest(service["engine"]), service
        assert service["ready_s"] is not None and service["first_completion_ms"] is not None
        assert service["completion"].strip()
        pid = served.main_pid(name)
        assert pid > 0 and served.show(name, "ActiveState")["ActiveState"] == "active"
        # What systemd executed, read back from /proc: the quoting carried every argument intact.
        argv = served.cmdline(name, pid)
        assert argv[0] == "/usr/bin/python3"
        assert argv[1:] == service["argv"], (argv, service["argv"])
    node1_argv = rows["node1"]["service"]["argv"]
    assert json.loads(node1_argv[node1_argv.index("--speculative-config") + 1]) == SPEC_VLLM
    assert rows["node1"]["service"]["engine"] == "vllm" and rows["node2"]["service"]["engine"] == "sglang"
    # From this machine, over the bridge, as a client would.
    assert served.get("node1", "/v1/models")[0] == 401
    status, body = served.get("node1", "/v1/models", API_KEY)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "llama"
    status, body = served.get("node2", "/v1/models", SGLANG_KEY)
    assert status == 200
    assert served.get("node3", "/health")[0] == 200
    for name in HOSTS:  # the acceptance rate read back from /metrics, as the stand-in was told (0.7)
        assert abs(rows[name]["service"]["acceptance_rate"] - 0.7) < 0.05, rows[name]["service"]
    assert "| engine | ready s | first completion ms | acceptance | service |" in proc.stdout


def test_a_second_run_changes_nothing_and_restarts_nothing(served):
    before = {name: served.main_pid(name) for name in HOSTS}
    proc, report = served.play()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert {name: recap(proc.stdout)[name]["changed"] for name in HOSTS} == {name: 0 for name in HOSTS}
    assert {name: served.main_pid(name) for name in HOSTS} == before
    # A running server whose unit is enabled costs no host contact to start (issue 42).
    start = re.search(r"Start the server\] \**\n(.*?)\n\n", proc.stdout, re.S)
    assert start and set(re.findall(r"^(\w+): ", start.group(1), re.M)) == {"skipping"}, proc.stdout[-6000:]
    for name, row in rows_by_host(report).items():
        assert row["service"]["status"] == "ready" and row["service"]["ready_s"] is None
        assert row["status"] == "ok" and row["killed"] == 0  # healthy: no reset


def test_a_changed_pre_start_program_is_written_again_without_a_restart(served):
    """The unit's pre-start cleanup serves the next start: a new one (a collection upgrade, or a hand
    edit on the host) is written back, and the running server keeps running."""
    program = served.fleet.hosts["node2"].root / "usr/local/libexec/cleanslate-gpu/prestart_clean.py"
    wanted = (REPO / "roles/inference_service/files/prestart_clean.py").read_bytes()
    assert program.read_bytes() == wanted
    program.write_bytes(wanted + b"# edited on the host\n")
    before = {name: served.main_pid(name) for name in HOSTS}
    proc, _report = served.play()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert program.read_bytes() == wanted
    assert {name: served.main_pid(name) for name in HOSTS} == before
    assert recap(proc.stdout)["node2"]["changed"] == 1 and recap(proc.stdout)["node1"]["changed"] == 0


def test_a_variable_change_restarts_each_host_exactly_once(served):
    before = {name: served.main_pid(name) for name in HOSTS}
    since = float(served.fleet.run("node1", ["date", "+%s"]).stdout) - 1
    for name in HOSTS:
        served.vars[name]["inference_service_max_model_len"] = 4096
    try:
        proc, report = served.play()
        assert proc.returncode == 0, proc.stdout[-6000:]
        for name in HOSTS:
            assert served.main_pid(name) not in (0, before[name])
            assert served.starts_since(name, since) == 1, name
            assert served.show(name, "NRestarts")["NRestarts"] == "0"
            assert rows_by_host(report)[name]["service"]["status"] == "ready"
            argv = served.cmdline(name, served.main_pid(name))
            flag = "--max-model-len" if name != "node2" else "--context-length"
            assert argv[argv.index(flag) + 1] == "4096"
    finally:
        for name in HOSTS:
            served.vars[name].pop("inference_service_max_model_len", None)
        served.heal(*HOSTS, force=False)


def test_a_bad_speculative_config_fails_before_the_running_server_is_touched(served):
    """node1 and node2: a bad speculative configuration. node3: its secrets' directory would be
    /tmp, which others may write (and the role changes no existing directory's mode)."""
    before = {name: served.main_pid(name) for name in HOSTS}
    tmp_mode = served.fleet.run("node3", ["stat", "-c", "%a %U", "/tmp"]).stdout
    served.vars["node1"]["inference_service_speculative"] = dict(SPEC_VLLM, tensor_parallel_size=2)
    served.vars["node2"]["inference_service_speculative"] = dict(SPEC_SGLANG)
    del served.vars["node2"]["inference_service_speculative"]["speculative_eagle_topk"]
    served.vars["node3"]["inference_service_config_dir"] = "/tmp"
    try:
        proc, report = served.play()
        assert proc.returncode == 2, proc.stdout[-6000:]
        assert "inference_service_speculative.tensor_parallel_size is refused" in proc.stdout
        assert "speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens are given together" in proc.stdout
        assert {name: served.main_pid(name) for name in HOSTS} == before
        assert served.get("node1", "/v1/models", API_KEY)[0] == 200
        assert "Stop the unit" not in proc.stdout  # node_reset never ran for them
        rows = rows_by_host(report)
        # Refused before any step: node_reset's `invalid`, with the key at fault, said once.
        assert rows["node1"]["status"] == "invalid" and rows["node1"]["service"]["status"] == "failed"
        assert rows["node1"]["killed"] == 0 and rows["node1"]["seconds_per_step"] == {}
        assert len(rows["node1"]["problems"]) == 1 and "tensor_parallel_size" in rows["node1"]["problems"][0]
        # The sentence once, in the report's list; the failure names the host and its status.
        assert ("  - inference_service: inference_service_speculative.tensor_parallel_size is refused"
                in proc.stdout), proc.stdout[-6000:]
        assert "node1 is invalid: its problems are listed in the fleet report above" in proc.stdout
        assert rows["node3"]["status"] == "invalid", rows["node3"]
        assert ("inference_service_config_dir /tmp is not a directory that root owns and only root may write"
                in rows["node3"]["problems"][0]), rows["node3"]
        assert served.fleet.run("node3", ["stat", "-c", "%a %U", "/tmp"]).stdout == tmp_mode == "1777 root\n"
        assert not served.fleet.run("node3", ["sh", "-c", "ls /tmp/inference-server.*"], check=False).stdout
    finally:
        # Never touched, their servers still run the base configuration: only the variables go
        # back, unless the test failed because a server was touched after all.
        for name in HOSTS:
            served.vars[name] = base_vars(name)
        if any(served.get(name, "/health")[0] != 200 for name in HOSTS):
            served.heal(*HOSTS)


def test_a_crash_during_load_fails_the_gate_at_once_with_the_journal(served):
    served.fault("node2", fault="crash_during_load")
    try:
        # The only host of the run fails, and the report is still written: no host fails before it.
        proc, report = served.play(limit="node2", force=["node2"])
        assert proc.returncode == 2, proc.stdout[-6000:]
        assert "CUDA error: an illegal memory access" in proc.stdout  # the journal line, in the failure
        service = rows_by_host(report)["node2"]["service"]
        assert service["status"] == "failed" and "died" in service["reason"]
        assert any("illegal memory access" in line for line in service["journal"])
    finally:
        served.heal("node2")


def test_an_engine_that_exits_0_leaking_a_segment_is_restarted_and_its_segment_cleared_first(served):
    """Issue 39, 3: the engine exits 0 once ready and leaves a segment behind, which kills any start
    that meets it. systemd restarts it all the same (Restart=always; on-failure left it dead), and the
    unit's cleanup before each restart removes the segment, so each restart gets ready again (without
    it: a crash loop into the start limit). Two rounds: the second proves the first restart served."""
    fleet = served.fleet
    since = fleet.run("node3", ["date", "+@%s"]).stdout.strip()
    served.fault("node3", fault="exit_zero_leaking", load_s=0.5)
    try:
        # A fresh start limit (StartLimitBurst 3): the earlier tests' starts of node3 do not count.
        fleet.run("node3", ["systemctl", "reset-failed", UNIT], check=False)
        fleet.run("node3", ["systemctl", "restart", UNIT])
        deadline = time.monotonic() + 60
        while True:
            journal = fleet.run("node3", ["journalctl", "-u", UNIT, "--no-pager", "-o", "cat", "--since", since],
                                check=False).stdout
            cleaned = journal.count("pre-start cleanup: removed /dev/shm/psm_standin_leaked (65536 bytes, file)")
            if cleaned >= 2:
                break
            assert time.monotonic() < deadline, journal[-4000:]
            time.sleep(0.5)
        assert journal.count("stand-in fault exit_zero_leaking") >= 2, journal[-4000:]
        assert journal.count("Application startup complete.") >= 2, journal[-4000:]
        assert "No space left on device" not in journal, journal[-4000:]
    finally:
        served.heal("node3", force=False)
    assert served.show("node3", "ActiveState")["ActiveState"] == "active"


def test_a_unit_held_by_its_start_limit_is_cleared_and_served_again(served):
    """A server that crash-looped into systemd's start limit (StartLimitBurst starts within
    StartLimitIntervalSec) is refused by every `systemctl start` until the limit is cleared: the
    run clears it, in the task that reads the unit's state, and serves again; --check clears nothing."""
    fleet = served.fleet
    served.fault("node2", fault="crash_during_load", load_s=1)
    try:
        # Each start crashes half way through its load and systemd restarts it (Restart=always,
        # 1 s): after StartLimitBurst (3) starts it gives up, and from then on refuses a start.
        fleet.run("node2", ["systemctl", "restart", UNIT], check=False)
        deadline = time.monotonic() + 60
        while served.show("node2", "ActiveState")["ActiveState"] != "failed":
            assert time.monotonic() < deadline, "the unit did not reach its start limit"
            time.sleep(0.5)
        served.fault("node2")
        refused = fleet.run("node2", ["systemctl", "start", UNIT], check=False)
        journal = fleet.run("node2", ["journalctl", "-u", UNIT, "-n", "20", "--no-pager"], check=False).stdout
        assert refused.returncode != 0 and served.show("node2", "ActiveState")["ActiveState"] == "failed", journal
        check, _report = served.play(limit="node2", check=True)
        assert check.returncode == 0, check.stdout[-6000:]
        assert served.show("node2", "ActiveState")["ActiveState"] == "failed"  # not cleared by --check
        proc, report = served.play(limit="node2")
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert re.search(r"clear a failed state and start limit\] \**\nchanged: \[node2\]", proc.stdout), proc.stdout[-6000:]
        assert rows_by_host(report)["node2"]["service"]["status"] == "ready"
        assert served.show("node2", "ActiveState")["ActiveState"] == "active"
        assert served.get("node2", "/health")[0] == 200
    finally:
        served.heal("node2")


def test_a_stopped_unit_is_started_with_its_new_file_by_the_files_task_and_one_to_enable_by_systemd(served):
    """Issue 42: the task that writes the unit's files starts a stopped unit in the same contact
    (service.yml's start is skipped), after a daemon-reload when its file changed, so that the new
    command line is what runs; a unit whose enablement must change first is left to systemd_service,
    which enables it and starts it."""
    fleet = served.fleet
    try:
        fleet.run("node1", ["systemctl", "stop", UNIT])
        served.vars["node1"]["inference_service_max_model_len"] = 2048
        proc, report = served.play(limit="node1")
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert re.search(r"Start the server\] \**\nskipping: \[node1\]", proc.stdout), proc.stdout[-6000:]
        assert rows_by_host(report)["node1"]["service"]["status"] == "ready"
        argv = served.cmdline("node1", served.main_pid("node1"))
        assert argv[argv.index("--max-model-len") + 1] == "2048", argv  # systemd had read the new file
        assert "changed on disk" not in fleet.run("node1", ["systemctl", "status", "--no-pager", UNIT], check=False).stdout

        # Running, made disabled by hand: systemd_service enables it again, and it keeps running.
        pid = served.main_pid("node1")
        fleet.run("node1", ["systemctl", "disable", UNIT])
        proc, report = served.play(limit="node1")
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert re.search(r"Start the server\] \**\nchanged: \[node1\]", proc.stdout), proc.stdout[-6000:]
        assert fleet.run("node1", ["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "enabled"
        assert served.main_pid("node1") == pid

        # Back to the base configuration, from a disabled and stopped unit: served as the module found it.
        served.vars["node1"] = base_vars("node1")
        fleet.run("node1", ["systemctl", "disable", "--now", UNIT])
        proc, report = served.play(limit="node1")
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert re.search(r"Start the server\] \**\nchanged: \[node1\]", proc.stdout), proc.stdout[-6000:]
        assert fleet.run("node1", ["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "enabled"
        assert served.show("node1", "ActiveState")["ActiveState"] == "active"
        assert rows_by_host(report)["node1"]["service"]["status"] == "ready"
    except BaseException:
        served.heal("node1")
        raise


def test_a_server_that_never_gets_ready_fails_at_the_deadline_with_progress_lines(served):
    served.fault("node3", fault="never_ready")
    served.vars["node3"].update(inference_service_ready_timeout=4, inference_service_progress_interval=1)
    try:
        proc, report = served.play(limit="node3", force=["node3"])
        assert proc.returncode == 2, proc.stdout[-6000:]
        assert "not ready after 4 s" in proc.stdout
        progress = re.findall(r"node3: waiting for http://127\.0\.0\.1:8000 \(unit inference-server\.service "
                              r"active/running.*last seen: connection refused", proc.stdout)
        assert len(progress) >= 2, proc.stdout[-4000:]
        assert rows_by_host(report)["node3"]["service"]["status"] == "failed"
    finally:
        served.heal("node3")


@pytest.fixture(scope="module")
def checked(served):
    """One `--check --diff -vv` run in which node1's arguments and API key would change:
    (process, report, the MainPIDs before it)."""
    before = {name: served.main_pid(name) for name in HOSTS}
    served.vars["node1"]["inference_service_extra_args"] = ["--max-num-seqs", "64"]
    served.vars["node1"]["inference_service_secrets"] = {"api_key": API_KEY + "2", "hf_token": HF_TOKEN}
    try:
        proc, report = served.play(check=True, extra=["-vv"])
    finally:
        served.vars["node1"] = base_vars("node1")
    return proc, report, before


def test_secrets_appear_nowhere(served, checked):
    """In the verbose run that wrote every secret file and started every server with its keys,
    and in a verbose check run where a key would change: not in Ansible's output, the report,
    the unit files, any command line of the hosts or the units' journals."""
    (proc, report), (check, _report, _before) = served.first, checked
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "| node1 |" in served.first_markdown  # the Markdown report of that run is read too
    texts = {"ansible output": proc.stdout + proc.stderr + check.stdout + check.stderr,
             "report": json.dumps(report) + served.first_markdown}
    for name in HOSTS:
        host = served.fleet.hosts[name]
        texts[f"{name} unit file"] = (host.root / "etc/systemd/system" / UNIT).read_text()
        cmdlines = served.fleet.run(name, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], check=False).stdout
        texts[f"{name} /proc/*/cmdline"] = cmdlines
        journal = served.fleet.run(name, ["journalctl", "--unit", UNIT, "--no-pager"]).stdout
        if name == "node2":
            # SGLang (and the stand-in, as it) logs its arguments with the key at each start; the
            # fleet's systemd 252 cannot drop that line (LogFilterPatterns= needs 253): the role
            # says so in the host's warnings, and the line is the only place the key is.
            logged = [line for line in journal.splitlines() if "server_args=ServerArgs(" in line]
            assert logged and all(repr(SGLANG_KEY) in line for line in logged), logged
            assert any("cannot drop that line (LogFilterPatterns= needs systemd 253)" in warning
                       for warning in rows_by_host(report)["node2"]["service"]["warnings"])
            journal = "\n".join(line for line in journal.splitlines() if line not in logged)
        texts[f"{name} journal"] = journal
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"a secret is in the {where}"
    env_file = served.fleet.hosts["node1"].root / "etc/cleanslate/inference/inference-server.env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert API_KEY.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") in env_file.read_text()
    secrets_yaml = served.fleet.hosts["node2"].root / "etc/cleanslate/inference/inference-server.secrets.yaml"
    assert oct(secrets_yaml.stat().st_mode & 0o777) == "0o600"
    # The keys reached both engines intact: the gates' completions passed with them, and so do these.
    assert served.get("node1", "/v1/models", API_KEY)[0] == 200
    assert served.get("node2", "/v1/models", SGLANG_KEY)[0] == 200


def test_check_mode_shows_the_diff_with_secrets_hidden_and_restarts_nothing(served, checked):
    proc, report, before = checked
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert '+    "--max-num-seqs" \\' in proc.stdout and '+    "64"' in proc.stdout
    assert "Would change: /etc/cleanslate/inference/inference-server.env (HF_TOKEN, VLLM_API_KEY); values hidden" in proc.stdout
    assert API_KEY not in proc.stdout and HF_TOKEN not in proc.stdout
    assert {name: served.main_pid(name) for name in HOSTS} == before
    assert "--max-num-seqs" not in served.cmdline("node1", before["node1"])
    # Check mode writes its report apart (reset_and_serve-check-*), marked as such, and prints the table.
    assert report["check_mode"] is True and rows_by_host(report)["node1"]["status"] == "ok", report
    assert re.search(r"^\s+\"\| node1 \| ok \|.* \| vllm 0\.33\.0 \| - \| - \| - \| check \|", proc.stdout, re.M)


def test_a_crashed_server_holding_the_gpus_is_reset_and_served_again(served):
    """A vLLM started by hand (as the seeds did) died and left its workers holding GPUs 0 and 1;
    the service is down. reset_and_serve kills the orphans through node_reset and serves again."""
    fleet = served.fleet
    fleet.run("node3", ["systemctl", "stop", UNIT])
    crash_env = {"FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "0", "STANDIN_FAULT": "orphan_workers",
                 "STANDIN_SHM_DIR": "/dev/shm", "STANDIN_STATE_FILE": "/run/hand-started.json"}
    # Through sh, which exits 0 once the server died: the unit stays active and keeps the orphans.
    fleet.spawn("node3", "hand-started-vllm", ["sh", "-c", "/usr/local/bin/vllm serve sim/model "
                                               "--tensor-parallel-size 2 --port 8011; exit 0"], env=crash_env)
    try:
        orphans = json.loads(fleet.run("node3", ["cat", "/run/hand-started.json"]).stdout)["workers"]
        assert len(orphans) == 2
        for rank, worker in enumerate(orphans):
            # Alive, and mapping their GPU's device files as a CUDA context does: gpu_reset's evidence
            # (a process that only had them open would be a client, left alone).
            maps = fleet.run("node3", ["cat", f"/proc/{worker['pid']}/maps"]).stdout
            assert {f"/dev/nvidia{rank}", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= {
                line.split()[-1] for line in maps.splitlines() if len(line.split()) == 6}, maps
        # --check first: nothing is stopped (the host stays dirty, which check mode does not fail)
        # and the role still says what serving it would do.
        check, _report = served.play(limit="node3", check=True)
        assert check.returncode == 0, check.stdout[-6000:]
        assert re.search(r"\| node3 \| dirty \| 2 \|.* \| check \|", check.stdout), check.stdout[-6000:]
        assert re.search(r"Start the server\] \**\nchanged: \[node3\]", check.stdout), check.stdout[-6000:]
        assert all(fleet.run("node3", ["kill", "-0", str(w["pid"])], check=False).returncode == 0 for w in orphans)
        assert served.show("node3", "ActiveState")["ActiveState"] != "active"
        proc, report = served.play(limit="node3")
        assert proc.returncode == 0, proc.stdout[-6000:]
        row = rows_by_host(report)["node3"]
        assert row["service"]["status"] == "ready"
        assert row["mib_freed"] > 0 and row["shm_bytes_freed"] > 0, row
        # gpu_reset stopped exactly the orphans: the unit node_reset stops was already down, and the
        # orphans' own unit is still active, so systemd never killed its cgroup.
        assert row["killed"] == len(orphans) and "gpu_reset" in row["seconds_per_step"], row
        assert fleet.run("node3", ["systemctl", "is-active", "hand-started-vllm.service"]).stdout.strip() == "active"
        assert all(fleet.run("node3", ["kill", "-0", str(w["pid"])], check=False).returncode != 0 for w in orphans)
        assert served.get("node3", "/health")[0] == 200
    finally:
        fleet.run("node3", ["systemctl", "stop", "hand-started-vllm.service"], check=False)


def test_a_server_whose_api_died_is_stopped_and_what_its_stop_freed_is_reported(served):
    """The API server's listener died (dead_api) while the unit stays active and its TP workers hold
    GPUs 0-1. node_reset reads the GPUs before it stops the unit (the assessment saw it active), so
    the report counts what the stop freed, though gpu_reset finds no holder left."""
    fleet = served.fleet
    served.fault("node3", fault="dead_api")
    try:
        since = time.time()
        fleet.run("node3", ["systemctl", "restart", UNIT])
        deadline = time.monotonic() + 60
        while "stand-in fault dead_api" not in fleet.run("node3", [
                "journalctl", "--unit", UNIT, "--since", f"@{since:.0f}", "--output", "cat", "--no-pager"]).stdout:
            assert time.monotonic() < deadline, "the stand-in's API never died"
            time.sleep(0.2)
    finally:
        served.fault("node3")
    crashed = served.main_pid("node3")
    assert crashed and served.show("node3", "ActiveState")["ActiveState"] == "active"
    proc, report = served.play(limit="node3")
    assert proc.returncode == 0, proc.stdout[-6000:]
    row = rows_by_host(report)["node3"]
    assert row["service"]["status"] == "ready" and served.main_pid("node3") not in (0, crashed), row
    assert row["killed"] == 0, row  # the unit's stop took its workers
    assert {gpu for gpu, mib in row["mib_freed_per_gpu"].items() if mib > 0} == {"0", "1"}, row


def test_a_run_where_no_host_answers_still_writes_its_report(served):
    """node3, the only host of the run, does not answer (SSH to a closed port): the validation's
    first connection fails, the host is recorded (not dropped), node_reset records it
    unreachable, the report is written, and the run ends with Ansible's status for an
    unreachable host. Its server was never touched."""
    before = served.main_pid("node3")
    served.vars["node3"]["ansible_port"] = 1
    try:
        proc, report = served.play(limit="node3")
        assert proc.returncode == 4, proc.stdout[-6000:]
        row = rows_by_host(report)["node3"]
        assert row["status"] == "unreachable" and not row["ok"], row
        assert row["service"]["status"] == "failed" and row["service"]["stage"] == "unreachable", row
        assert len(row["problems"]) == 1 and row["problems"][0].startswith("unreachable: "), row
        assert served.main_pid("node3") == before
    finally:
        served.vars["node3"] = base_vars("node3")


def test_low_acceptance_is_reported_degraded_and_fails_when_asked(served):
    served.fault("node1", fault="low_acceptance")
    try:
        proc, report = served.play(limit="node1", force=["node1"])
        assert proc.returncode == 0, proc.stdout[-6000:]
        service = rows_by_host(report)["node1"]["service"]
        assert service["status"] == "degraded" and abs(service["acceptance_rate"] - 0.15) < 0.05
        assert "below inference_service_min_acceptance_rate 30%" in service["reason"]
        assert "[WARNING]: speculative decoding accepts 15% of drafted tokens" in proc.stdout + proc.stderr
        assert '"- node1 (ok):",\n        "  - service degraded: speculative decoding accepts' in proc.stdout

        served.vars["node1"]["inference_service_fail_on_degraded"] = True
        proc, report = served.play(limit="node1")
        assert proc.returncode == 2, proc.stdout[-6000:]
        assert rows_by_host(report)["node1"]["service"]["status"] == "degraded"
        assert "node1: the server is degraded: speculative decoding accepts 15%" in proc.stdout
    finally:
        served.heal("node1")
