"""Out of rotation while it is reset (issue 40): Debian's HAProxy on this machine in front of two
fleet hosts' servers (real systemd, the stand-in vLLM whose completions take 3 s, as a real
engine's streams do), a client loop sending completions through HAProxy for the whole run, and
reset_and_serve.yml resetting one host (fleet_force_reset: a planned reset of a server that takes
traffic). HAProxy's own runtime API is read all along: what it did to the server, and when.

The servers drain for 1 s on SIGTERM (inference_service_drain_timeout), shorter than a request:
without rotation the requests in flight on the host are cut when its unit stops; with it, HAProxy
stops sending it requests and the run waits until its sessions end before anything is stopped.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from tests.haproxy import BACKEND, HAProxy
from tests.integration.conftest import HOST_NVML_LIB
from tests.integration.fleet import engines
from tests.integration.fleet.reports import play, rows_by_host
from tests.integration.test_inference_service_fleet import recap

pytestmark = pytest.mark.fleet

HOSTS = ("node1", "node2")
RESET = "node2"
UNIT = "inference-server.service"  # the role's default
MODEL = "sim/Llama-3.1-8B-Instruct"
FAULT_FILE = "/etc/cleanslate-standin.json"
TOKENS = 30
DECODE_S = 0.1  # a completion of TOKENS is in flight for 3 s
CLIENTS = 4


def host_vars(rotation: dict) -> dict:
    return {
        "inference_service_model": MODEL,
        "inference_service_tensor_parallel_size": 2,
        "inference_service_environment": {
            "FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "1", "STANDIN_FAULT_FILE": FAULT_FILE,
            "STANDIN_SHM_DIR": "/dev/shm", "CUDA_VISIBLE_DEVICES": "0,1", "STANDIN_DECODE_S": str(DECODE_S)},
        "inference_service_speculative": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4},
        "inference_service_ready_timeout": 60,
        "inference_service_poll_interval": 0.2,
        "inference_service_progress_interval": 5,
        "inference_service_stable_s": 2,
        "inference_service_smoke_completions": 1,
        "inference_service_smoke_max_tokens": 4,
        "inference_service_drain_timeout": 1,
        "inference_service_restart_sec": 1,
        "inference_service_rotation": rotation,
        "node_reset_environment": {"LD_LIBRARY_PATH": HOST_NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE},
        "node_reset_nvml_verify_expected_count": engines.GPUS,
        "node_reset_nvml_verify_timeout": 20,
        "node_reset_gpu_reset_grace_period": 3,
    }


class Balanced:
    """The two hosts served behind HAProxy, the balancer's inventory host (`lb`: this machine)."""

    def __init__(self, fleet, workdir):
        self.fleet, self.workdir = fleet, workdir
        self.haproxy = HAProxy(workdir, {name: "%s:8000" % fleet.hosts[name].address for name in HOSTS})
        self.lb_inventory = workdir / "lb.yml"
        self.lb_inventory.write_text(yaml.safe_dump({"all": {"hosts": {"lb": {
            "ansible_connection": "local", "ansible_python_interpreter": __import__("sys").executable}}}}))
        self.rotation = {"balancer": "haproxy", "host": "lb", "backend": BACKEND, "socket": self.haproxy.socket,
                         "drain_timeout_s": 30, "marker_dir": str(workdir / "markers")}

    def write_vars(self, rotation=True, force=(), changes=None):
        host_vars_dir = self.fleet.inventory.parent / "host_vars"
        host_vars_dir.mkdir(exist_ok=True)
        for name in HOSTS:
            values = host_vars(self.rotation if rotation else {})
            if name in force:
                values["fleet_force_reset"] = True
            values.update((changes or {}).get(name, {}))
            (host_vars_dir / f"{name}.yml").write_text(yaml.safe_dump(values))

    def play(self, limit=",".join(HOSTS), rotation=True, force=(), check=False, extra=(), playbook="reset_and_serve.yml",
             changes=None):
        self.write_vars(rotation, force, changes)
        proc, report = play(self.fleet, self.workdir / "reports", limit, ["-i", str(self.lb_inventory), *extra], check,
                            playbook)
        (self.workdir / "last-run.log").write_text(proc.stdout + proc.stderr)
        return proc, report

    def fault(self, name, **settings) -> None:
        engines.set_fault(self.fleet.hosts[name].root, FAULT_FILE, **settings)


def unit_times(balanced) -> tuple:
    """When the unit last left `active` (its stop began) and last entered it (its start
    completed), in seconds since the epoch: the host's clock is this machine's."""
    out = balanced.fleet.run(RESET, ["systemctl", "show", "--timestamp=unix", "--property=ActiveExitTimestamp",
                                     "--property=ActiveEnterTimestamp", UNIT]).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return float(values["ActiveExitTimestamp"].lstrip("@")), float(values["ActiveEnterTimestamp"].lstrip("@"))


def wait_up(balanced) -> None:
    """Until HAProxy's own health check has RESET up again (it was put back in rotation)."""
    deadline = time.monotonic() + 30
    while balanced.haproxy.status(RESET) != "UP":
        assert time.monotonic() < deadline, balanced.haproxy.stat()[RESET]
        time.sleep(0.2)


class Traffic:
    """CLIENTS loops sending completions through HAProxy until stopped, every answer that is not a
    200 with text a failure (kept with its time); and HAProxy's state of RESET sampled meanwhile,
    each change with its time."""

    def __init__(self, balanced: Balanced):
        self.haproxy = balanced.haproxy
        self.ok, self.failed, self.states = 0, [], []
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for dummy in range(CLIENTS)]
        self._threads.append(threading.Thread(target=self._sample, daemon=True))

    def _client(self) -> None:
        body = json.dumps({"model": MODEL, "prompt": "The capital of France is", "max_tokens": TOKENS}).encode()
        while not self._stop.is_set():
            request = urllib.request.Request(self.haproxy.url + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    text = json.loads(response.read())["choices"][0]["text"]
                outcome = None if response.status == 200 and text.strip() else "status %d" % response.status
            except urllib.error.HTTPError as exc:
                outcome = "status %d" % exc.code
            except (OSError, ValueError, KeyError, IndexError) as exc:  # reset, refused, timed out, bad JSON
                outcome = repr(exc)
            with self._lock:
                if outcome is None:
                    self.ok += 1
                else:
                    self.failed.append((time.time(), outcome))

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            status = self.haproxy.status(RESET).split(" ")[0]
            if not self.states or self.states[-1][1] != status:
                self.states.append((time.time(), status))

    def sequence(self) -> list:
        return [status for dummy, status in self.states]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        time.sleep(DECODE_S * TOKENS)  # requests in flight on both servers before the run
        return self

    def __exit__(self, *exc):
        time.sleep(DECODE_S * TOKENS)  # and after it, on both again
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@pytest.fixture(scope="module")
def balanced(fleet_session, tmp_path_factory):
    fleet = fleet_session
    for name in HOSTS:
        if not fleet.hosts[name].running():
            fleet.boot(name)
        engines.install(fleet.hosts[name].root)
    state = Balanced(fleet, tmp_path_factory.mktemp("rotation"))
    try:
        proc, dummy = state.play()
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        deadline = time.monotonic() + 30
        while {state.haproxy.status(name) for name in HOSTS} != {"UP"}:
            assert time.monotonic() < deadline, state.haproxy.stat()
            time.sleep(0.2)
        yield state
    finally:
        state.haproxy.stop()
        for name in HOSTS:
            state.fault(name)
            (fleet.inventory.parent / "host_vars" / f"{name}.yml").unlink(missing_ok=True)
            fleet.run(name, ["sh", "-c", f"systemctl disable --now {UNIT}; rm -f /etc/systemd/system/{UNIT}; "
                                         f"systemctl daemon-reload; systemctl reset-failed {UNIT}"], check=False)
            engines.uninstall(fleet.hosts[name].root)


def test_check_mode_says_it_would_take_the_server_out_and_touches_nothing(balanced):
    with Traffic(balanced) as traffic:
        proc, report = balanced.play(limit=RESET, force=[RESET], check=True)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert traffic.sequence() == ["UP"] and traffic.failed == [], (traffic.states, traffic.failed)
    assert f"changed: [{RESET} -> lb] => (item={RESET})" in proc.stdout, proc.stdout[-6000:]
    assert not (balanced.workdir / "markers").exists() or not any((balanced.workdir / "markers").iterdir())


def test_a_reset_under_traffic_fails_no_request_and_haproxy_shows_drain_maint_and_back_after_the_gate(balanced):
    before = int(balanced.haproxy.stat()[RESET]["stot"])
    with Traffic(balanced) as traffic:
        started = time.time()
        proc, report = balanced.play(limit=RESET, force=[RESET])
        ended = time.time()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    print("with rotation: %d requests, %d failed" % (traffic.ok + len(traffic.failed), len(traffic.failed)))
    assert traffic.failed == [], traffic.failed
    # HAProxy drained it first, held it in maintenance, then it was back.
    sequence = traffic.sequence()
    assert sequence[:3] == ["UP", "DRAIN", "MAINT"] and sequence[-1] == "UP", traffic.states
    assert sequence.count("MAINT") == 1, traffic.states
    service = rows_by_host(report)[RESET]["service"]
    assert service["restarted"] and service["status"] == "ready", service
    rotation = service["rotation"]
    assert rotation["server"] == RESET and rotation["host"] == "lb" and not rotation["left_out"], rotation
    assert rotation["out"]["state_after"] == "maint" and rotation["out"]["sessions_at_maint"] == 0, rotation
    # Back only after the gate: in maintenance from before the unit stopped until after the new
    # server answered its smoke completion and its stability window (the gate's ready_s counts
    # from the start to its first answer; stable_s more came after it).
    maint_at = next(at for at, status in traffic.states if status == "MAINT")
    back_at = next(at for at, status in traffic.states if at > maint_at and status != "MAINT")
    stopping, started_again = unit_times(balanced)
    assert started < maint_at < stopping < started_again < back_at < ended, (traffic.states, stopping, started_again)
    assert back_at - started_again > 2, (traffic.states, started_again)  # the gate's stability window
    # ... and took requests again after it.
    assert int(balanced.haproxy.stat()[RESET]["stot"]) > before


def test_a_second_run_changes_nothing_and_leaves_the_balancer_alone(balanced):
    with Traffic(balanced) as traffic:
        proc, report = balanced.play()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert {name: recap(proc.stdout)[name]["changed"] for name in HOSTS} == {name: 0 for name in HOSTS}
    assert traffic.sequence() == ["UP"] and traffic.failed == [], (traffic.states, traffic.failed)


def test_without_rotation_the_same_reset_fails_requests(balanced):
    """The side by side figure of the closing note: the same reset and traffic, no balancer told."""
    with Traffic(balanced) as traffic:
        proc, report = balanced.play(limit=RESET, force=[RESET], rotation=False)
    assert proc.returncode == 0, proc.stdout[-6000:]
    print("without rotation: %d requests, %d failed: %s" % (traffic.ok + len(traffic.failed), len(traffic.failed),
                                                            sorted({why for dummy, why in traffic.failed})))
    # The requests in flight on the host when its unit stopped (it drains for 1 s, they take 3 s).
    assert traffic.failed, traffic.ok


def test_a_reset_that_fails_leaves_the_server_in_maintenance_and_the_next_run_puts_it_back(balanced):
    balanced.fault(RESET, fault="crash_during_load")
    try:
        proc, report = balanced.play(limit=RESET, force=[RESET])
        assert proc.returncode != 0, proc.stdout[-6000:]
        assert balanced.haproxy.status(RESET) == "MAINT", balanced.haproxy.stat()[RESET]
        service = rows_by_host(report)[RESET]["service"]
        assert service["status"] == "failed" and service["rotation"]["left_out"], service
        assert "left out of rotation: node2 on lb is maint" in service["reason"], service["reason"]
    finally:
        balanced.fault(RESET)
    # The next run (no force: the server is down) resets it, serves it, and puts it back.
    proc, report = balanced.play(limit=RESET)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert rows_by_host(report)[RESET]["service"]["rotation"]["restored"]["changed"], report
    wait_up(balanced)


def test_a_balancer_that_cannot_be_told_leaves_the_host_as_it_is(balanced):
    pid = int(balanced.fleet.run(RESET, ["systemctl", "show", "--property=MainPID", "--value", UNIT]).stdout)
    balanced.rotation["backend"] = "nosuch"
    try:
        proc, report = balanced.play(limit=RESET, force=[RESET])
    finally:
        balanced.rotation["backend"] = BACKEND
    assert proc.returncode != 0, proc.stdout[-6000:]
    row = rows_by_host(report)[RESET]
    assert row["status"] == "failed at rotation" and row["killed"] == 0, row
    problems = "\n".join(row["problems"])
    assert "not reset, the server still takes traffic" in problems and "nosuch" in problems, problems
    # Nothing stopped: the same server, in rotation, answering.
    assert int(balanced.fleet.run(RESET, ["systemctl", "show", "--property=MainPID", "--value", UNIT]).stdout) == pid
    assert balanced.haproxy.status(RESET) == "UP"


def test_reset_yml_takes_the_server_out_and_leaves_it_out_for_reset_and_serve(balanced):
    proc, report = balanced.play(limit=RESET, playbook="reset.yml")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert balanced.haproxy.status(RESET) == "MAINT"  # reset.yml starts nothing: out it stays
    proc, report = balanced.play(limit=RESET)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert rows_by_host(report)[RESET]["service"]["rotation"]["restored"]["changed"], report
    wait_up(balanced)


def test_a_restart_for_a_changed_setting_takes_the_running_server_out_first(balanced):
    """The role's own serve (any play, no reset): a healthy server whose command line changed is
    restarted, and leaves rotation before, as for a reset. Last: the hosts keep the new setting."""
    with Traffic(balanced) as traffic:
        proc, report = balanced.play(limit=RESET, changes={RESET: {"inference_service_max_model_len": 2048}})
    assert proc.returncode == 0, proc.stdout[-6000:]
    print("restart with rotation: %d requests, %d failed" % (traffic.ok + len(traffic.failed), len(traffic.failed)))
    assert traffic.failed == [], traffic.failed
    service = rows_by_host(report)[RESET]["service"]
    assert service["restarted"] and "--max-model-len" in service["argv"], service
    assert traffic.sequence()[:3] == ["UP", "DRAIN", "MAINT"] and traffic.sequence()[-1] == "UP", traffic.states
    assert service["rotation"]["restored"]["changed"] and not service["rotation"]["left_out"], service["rotation"]
