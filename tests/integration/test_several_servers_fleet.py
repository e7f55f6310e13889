"""Several servers on one node (issue 26): reset_and_serve.yml on one systemd host with eight
simulated GPUs and four stand-in vLLM servers of tensor parallel 2, declared as the contract's
inventory example (inference_service_instances). Two are broken in different ways:

vllm-a (GPUs 0,1): its API server's listener died (the stand-in's dead_api fault): the unit is
    active, the server process and its two TP workers live on and hold GPUs 0 and 1, nothing
    answers on :8001.
vllm-c (GPUs 4,5): crash-loops: a server started by hand earlier on GPUs 4 and 5 (as the seeds
    did) died and left its workers holding most of their memory, so every start of vllm-c exits 1
    with vLLM's "Free memory on device" error until systemd's start limit marks it failed. Only a
    reset scoped to GPUs 4 and 5 fixes it: nothing in the unit or the inventory changes.
vllm-b (GPUs 2,3) and vllm-d (GPUs 6,7) are healthy: a client loop on this machine sends them
    completions for the whole run, and they must keep their MainPID, their workers, their shm
    segments and their GPU memory, and never refuse a request.

Every look is from outside the playbook: systemctl, /proc and /dev/shm inside the host, the real
pynvml against the fake NVML, HTTP over the bridge, the report.
"""
from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.haproxy import BACKEND, HAProxy
from tests.integration.conftest import HOST_NVML_LIB, HOST_TESTS, REPO, _fleet_prerequisites
from tests.integration.fleet import Fleet, engines
from tests.integration.fleet.reports import instance_rows, play
from tests.integration.test_inference_service_fleet import recap

pytestmark = pytest.mark.fleet

HOST = "node1"
GPUS = 8
MODEL = "sim/Llama-3.1-8B-Instruct"
# name: (port, CUDA_VISIBLE_DEVICES); the unit is vllm-<name>.service, the served name <name>.
INSTANCES = {"a": (8001, "0,1"), "b": (8002, "2,3"), "c": (8003, "4,5"), "d": (8004, "6,7")}
BROKEN = ("a", "c")
HEALTHY = ("b", "d")
LEFTOVER_UNIT = "hand-started-vllm.service"
LEFTOVER_STATE = "/run/hand-started.json"
# The real pynvml inside the host, against the fake library: what nvidia-smi would show per GPU.
NVML_READ = """
import json, pynvml
pynvml.nvmlInit()
out = {}
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    out[index] = {"used": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
                  "pids": sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))}
print(json.dumps(out))
"""


def unit(name: str) -> str:
    return f"vllm-{name}.service"


def gpus_of(name: str) -> list:
    return [int(gpu) for gpu in INSTANCES[name][1].split(",")]


def fault_file(name: str) -> str:
    return f"/etc/cleanslate-standin-{name}.json"


def instance(name: str) -> dict:
    """One item of inference_service_instances: the keys the contract's example sets, and each
    instance its own server behind the node's HAProxy (issue 40)."""
    port, devices = INSTANCES[name]
    return {"unit": unit(name), "port": port, "served_name": name, "rotation_server": name,
            "environment": {"FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "1", "STANDIN_SHM_DIR": "/dev/shm",
                            "CUDA_VISIBLE_DEVICES": devices, "STANDIN_FAULT_FILE": fault_file(name)}}


def host_vars(names=tuple(INSTANCES), rotation=None) -> dict:
    """The contract's inventory example: the shared settings once, one item per server. One name:
    the single-service variables instead (no inference_service_instances), today's one server."""
    values = {
        "inference_service_rotation": rotation or {},
        "inference_service_model": MODEL,
        "inference_service_tensor_parallel_size": 2,
        "inference_service_ready_timeout": 120,
        "inference_service_poll_interval": 0.2,
        "inference_service_progress_interval": 5,
        "inference_service_drain_timeout": 2,
        "inference_service_restart_sec": 1,
        "node_reset_environment": {"LD_LIBRARY_PATH": HOST_NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE},
        "node_reset_nvml_verify_expected_count": GPUS,
        "node_reset_nvml_verify_timeout": 20,
        "node_reset_gpu_reset_grace_period": 3,
        # What the manual ritual kills (pkill -f 'vllm serve'): it matches every server of the node,
        # the healthy neighbours' too, which only their spared units and GPUs keep alive.
        "node_reset_gpu_reset_cmdline_patterns": ["vllm serve"],
    }
    if len(names) == 1:
        values.update({"inference_service_" + key: value for key, value in instance(names[0]).items()})
    else:
        values["inference_service_instances"] = [instance(name) for name in names]
    return values


def break_api(node, name: str) -> None:
    """The instance's API server stops answering (dead_api) while its server process and its TP
    workers live on, holding its GPUs; the unit stays active. Its next start is healthy."""
    path = node.fleet.hosts[HOST].root / fault_file(name).lstrip("/")
    path.write_text(json.dumps({"fault": "dead_api"}))
    try:
        node.run(["systemctl", "restart", unit(name)])
        node.wait(lambda: len(node.procs(name)) == 3 and node.health(name) == 0, timeout=60)
    finally:
        path.unlink()


class Node:
    """The host, its inventory, and what the tests read from outside the playbook."""

    def __init__(self, fleet: Fleet, workdir: Path):
        self.fleet = fleet
        self.workdir = workdir
        self.address = fleet.hosts[HOST].address
        # HAProxy on this machine in front of the four servers, each its own server of one backend.
        self.haproxy = HAProxy(workdir, {name: "%s:%d" % (self.address, INSTANCES[name][0]) for name in INSTANCES})
        self.lb_inventory = workdir / "lb.yml"
        self.lb_inventory.write_text(yaml.safe_dump({"all": {"hosts": {"lb": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
        self.rotation = {"host": "lb", "backend": BACKEND, "socket": self.haproxy.socket, "drain_timeout_s": 10,
                         "marker_dir": str(workdir / "markers")}

    def balancer(self) -> dict:
        """HAProxy's status of each server (UP, DOWN, DRAIN, MAINT), its first word."""
        stat = self.haproxy.stat()
        return {name: stat[name]["status"].split(" ")[0] for name in INSTANCES}

    def run(self, argv, **kwargs):
        return self.fleet.run(HOST, argv, **kwargs)

    def play(self, check=False, extra=(), names=tuple(INSTANCES), repo=REPO, env=None):
        """ansible-playbook reset_and_serve.yml with the instances `names`; (process, report or None).
        `repo`, `env`: another checkout's playbook, the run's environment (bench/bench_instances.py)."""
        (self.fleet.inventory.parent / "host_vars").mkdir(exist_ok=True)
        (self.fleet.inventory.parent / "host_vars" / f"{HOST}.yml").write_text(
            yaml.safe_dump(host_vars(names, self.rotation)))
        reports = self.workdir / "reports"
        proc, report = play(self.fleet, reports, HOST, ["-i", str(self.lb_inventory), *extra], check, repo=repo, env=env)
        # Kept beside the fleet for whoever reads a failure: the output and the Markdown report.
        (self.workdir / ("last-check.log" if check else "last-run.log")).write_text(proc.stdout + proc.stderr)
        self.markdown = "".join(path.read_text() for path in reports.glob("*.md"))
        return proc, report

    def show(self, name: str, prop: str) -> str:
        return self.run(["systemctl", "show", f"--property={prop}", "--value", unit(name)]).stdout.strip()

    def main_pid(self, name: str) -> int:
        return int(self.show(name, "MainPID") or 0)

    def procs(self, name: str) -> list:
        """The pids of the unit's control group: the API server and its GPU workers."""
        group = self.show(name, "ControlGroup")
        if not group:
            return []
        out = self.run(["cat", f"/sys/fs/cgroup{group}/cgroup.procs"], check=False).stdout
        return sorted(int(pid) for pid in out.split())

    def shm(self, name: str) -> list:
        """The NCCL-like segments the instance's workers keep in /dev/shm (nccl-standin-<gpu>-*)."""
        out = self.run(["sh", "-c", "ls /dev/shm"]).stdout.split()
        return sorted(f for f in out if any(f.startswith(f"nccl-standin-{gpu}-") for gpu in gpus_of(name)))

    def nvml(self) -> dict:
        out = self.run(["python3", "-c", NVML_READ],
                       env={"LD_LIBRARY_PATH": HOST_NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE}).stdout
        return {int(gpu): value for gpu, value in json.loads(out).items()}

    def snapshot(self, name: str) -> dict:
        """What must not change for a healthy neighbour."""
        nvml = self.nvml()
        return {"main_pid": self.main_pid(name), "procs": self.procs(name), "shm": self.shm(name),
                "gpus": {gpu: nvml[gpu] for gpu in gpus_of(name)}}

    def alive(self, pid: int) -> bool:
        return self.run(["kill", "-0", str(pid)], check=False).returncode == 0

    def url(self, name: str, path: str) -> str:
        return f"http://{self.address}:{INSTANCES[name][0]}{path}"

    def health(self, name: str) -> int:
        try:
            with urllib.request.urlopen(self.url(name, "/health"), timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def wait(self, what, timeout=60, step=0.2) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline, f"not reached within {timeout} s: {what.__doc__ or what}"
            time.sleep(step)


class Clients:
    """A client loop per healthy instance: completions one after another over the bridge until
    stopped; every answer that is not a 200 with text is an error, kept with its time."""

    def __init__(self, node: Node, names):
        self.node = node
        self.ok = {name: 0 for name in names}
        self.errors = {name: [] for name in names}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(name,), daemon=True) for name in names]

    def _loop(self, name: str) -> None:
        body = json.dumps({"model": name, "prompt": "The capital of France is", "max_tokens": 8}).encode()
        while not self._stop.is_set():
            request = urllib.request.Request(self.node.url(name, "/v1/completions"), data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    answer = json.loads(response.read())
                if response.status == 200 and answer["choices"][0]["text"].strip():
                    self.ok[name] += 1
                else:
                    self.errors[name].append((time.time(), f"status {response.status}: {answer}"))
            except (OSError, ValueError, KeyError, IndexError) as exc:  # refused, reset, timed out, bad JSON
                self.errors[name].append((time.time(), repr(exc)))
            self._stop.wait(0.05)

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


@pytest.fixture(scope="module")
def node(tmp_path_factory, fake_nvml_lib):
    """One booted host with eight GPUs and the four instances served once, healthy."""
    _fleet_prerequisites()
    workdir = tmp_path_factory.mktemp("several")
    fleet = Fleet(workdir / "fleet", hosts=1, gpus=GPUS,
                  copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: fake_nvml_lib})
    state = None
    try:
        fleet.up()
        engines.install(fleet.hosts[HOST].root, gpus=GPUS)
        state = Node(fleet, workdir)
        proc, report = state.play()
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        for name in INSTANCES:
            assert state.health(name) == 200, name
        state.wait(lambda: set(state.balancer().values()) == {"UP"}, timeout=30)
        yield state
    finally:
        if state is not None:
            state.haproxy.stop()
        fleet.down()


@pytest.fixture(scope="module")
def broken(node):
    """vllm-a's API dead (workers holding GPUs 0,1, unit active), vllm-c crash-looping on GPUs 4,5
    held by a hand-started server's leftovers (unit failed). Returns what the broken state holds."""
    break_api(node, "a")
    # c: stopped, then GPUs 4 and 5 taken by a server started by hand whose API server died and
    # left its workers; vllm-c's every start then fails for lack of free memory.
    node.run(["systemctl", "stop", unit("c")])
    leftover_env = {"FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "0", "STANDIN_FAULT": "orphan_workers",
                    "STANDIN_SHM_DIR": "/dev/shm", "STANDIN_STATE_FILE": LEFTOVER_STATE,
                    "CUDA_VISIBLE_DEVICES": "4,5"}
    # Through sh, which exits 0 once the server died: the unit stays active and keeps the orphans.
    node.fleet.spawn(HOST, LEFTOVER_UNIT.removesuffix(".service"),
                     ["sh", "-c", f"/usr/local/bin/vllm serve {MODEL} --tensor-parallel-size 2 --port 8013; exit 0"],
                     env=leftover_env)
    leftovers = [w["pid"] for w in json.loads(node.run(["cat", LEFTOVER_STATE]).stdout)["workers"]]
    node.run(["systemctl", "reset-failed", unit("c")], check=False)
    node.run(["systemctl", "start", "--no-block", unit("c")])
    node.wait(lambda: node.show("c", "ActiveState") == "failed", timeout=90)
    held = node.nvml()
    state = {"a_pid": node.main_pid("a"), "a_procs": node.procs("a"), "leftovers": leftovers,
             "nvml": held, "c_restarts": int(node.show("c", "NRestarts"))}
    assert state["c_restarts"] >= 2, state  # a crash loop, not one failed start
    assert set(held[0]["pids"]) | set(held[1]["pids"]) <= set(state["a_procs"]), (held, state)
    assert held[4]["pids"] and set(held[4]["pids"]) | set(held[5]["pids"]) <= set(leftovers), (held, state)
    try:
        yield state
    finally:
        node.run(["systemctl", "stop", LEFTOVER_UNIT], check=False)


def test_check_diff_on_the_broken_node_says_per_instance_what_would_be_stopped_and_changes_nothing(node, broken):
    healthy = {name: node.snapshot(name) for name in HEALTHY}
    balancer = node.balancer()
    proc, report = node.play(check=True)
    assert node.balancer() == balancer  # no server drained or held in maintenance
    assert proc.returncode == 0, proc.stdout[-6000:]
    out = proc.stdout
    # Per instance: which units would be stopped (a's; c is already failed), which processes
    # would be stopped (a's, the leftovers on 4,5) and which are spared, by unit.
    # The units' diff (the reset's one task): a line each, its state before and after.
    assert re.search(rf"^-{re.escape(unit('a'))}: active\n\+{re.escape(unit('a'))}: inactive\n {re.escape(unit('c'))}: failed$",
                     out, re.M), out[-6000:]
    for pid in broken["a_procs"][1:] + broken["leftovers"]:
        assert re.search(rf"^-{pid} VLLM::Worker_TP: .* -- stop, device", out, re.M), out[-6000:]
    # a's API server too (it holds no GPU, and matches the pattern): it goes with its instance.
    stopped = {int(pid) for pid in re.findall(r"^-(\d+) ", out, re.M)}
    assert stopped == set(broken["a_procs"] + broken["leftovers"]), out[-6000:]
    # The diff's context lines show some of the neighbours' processes: each one spared, by its unit.
    shown = {int(pid): why for pid, why in re.findall(r"^ (\d+) [^\n]* -- ([^\n]*)$", out, re.M)}
    owner = {pid: name for name in HEALTHY for pid in healthy[name]["procs"]}
    assert shown and set(shown) <= set(owner), (shown, owner)
    assert all(why == f"spared, in unit {unit(owner[pid])}" for pid, why in shown.items()), shown
    rows = instance_rows(report, HOST)
    assert set(rows) == {unit(name) for name in INSTANCES}, rows
    for name in INSTANCES:
        assert rows[unit(name)]["reset"] == (name in BROKEN) and rows[unit(name)]["service_status"] == "check", rows
        assert re.search(rf"^\| {HOST} \| {re.escape(unit(name))} \| {INSTANCES[name][1]} \| check \| "
                         rf"{'yes' if name in BROKEN else 'no'} \|", node.markdown, re.M), node.markdown
    # Nothing changed: a's dead server and workers, the leftovers on GPUs 4,5, c still failed.
    assert node.main_pid("a") == broken["a_pid"] and node.procs("a") == broken["a_procs"]
    assert all(node.alive(pid) for pid in broken["leftovers"])
    assert node.show("c", "ActiveState") == "failed"
    assert {name: node.snapshot(name) for name in HEALTHY} == healthy


def test_only_the_broken_instances_are_reset_and_the_neighbours_keep_serving(node, broken):
    healthy = {name: node.snapshot(name) for name in HEALTHY}
    for name in HEALTHY:
        assert len(healthy[name]["procs"]) == 3 and len(healthy[name]["shm"]) == 2, healthy[name]
        assert all(gpu["used"] > 0 and gpu["pids"] for gpu in healthy[name]["gpus"].values()), healthy[name]
    seen = {name: [] for name in INSTANCES}  # HAProxy's status of each server, each change
    done = threading.Event()

    def sample():
        while not done.wait(0.1):
            for name, status in node.balancer().items():
                if not seen[name] or seen[name][-1] != status:
                    seen[name].append(status)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with Clients(node, HEALTHY) as clients:
        time.sleep(1)  # the loop is answered before the run starts
        proc, report = node.play()
        time.sleep(1)
    done.set()
    sampler.join(10)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    # The neighbours never refused a request, and were asked all along.
    assert clients.errors == {name: [] for name in HEALTHY}, clients.errors
    assert all(count >= 20 for count in clients.ok.values()), clients.ok
    # Behind HAProxy, per instance: the neighbours never left rotation; the two reset were held in
    # maintenance (a's dead API and c's crash loop had HAProxy's check mark them DOWN first), then
    # put back once their gate passed, and HAProxy's check finds them UP.
    assert all(seen[name] == ["UP"] for name in HEALTHY), seen
    assert all("MAINT" in seen[name] for name in BROKEN), seen
    # ... both in one call to the balancer (their drains side by side), not one call after the other.
    assert re.search(r"^changed: \[%s -> lb\] => \(item=a, c\)$" % HOST, proc.stdout, re.M), proc.stdout[-8000:]
    node.wait(lambda: set(node.balancer().values()) == {"UP"}, timeout=30)
    # ... and kept everything: server, workers, shm segments, GPU memory and its holders.
    assert {name: node.snapshot(name) for name in HEALTHY} == healthy
    # The broken ones: the old holders of their GPUs are gone, new servers hold them again.
    nvml = node.nvml()
    assert not node.alive(broken["a_pid"]) and not any(node.alive(pid) for pid in broken["a_procs"])
    assert not any(node.alive(pid) for pid in broken["leftovers"])
    for name in BROKEN:
        assert node.show(name, "ActiveState") == "active" and node.health(name) == 200, name
        pid, procs = node.main_pid(name), node.procs(name)
        assert pid not in (0, broken["a_pid"]) and len(procs) == 3, (name, pid, procs)
        for gpu in gpus_of(name):
            assert nvml[gpu]["pids"] and set(nvml[gpu]["pids"]) <= set(procs), (name, gpu, nvml[gpu], procs)
        assert len(node.shm(name)) == 2, node.shm(name)
    # The report: one row per instance, the two broken ones reset and restarted, with the MainPID
    # systemd has now; the host ok, and what it freed was on the broken instances' GPUs only.
    rows = instance_rows(report, HOST)
    assert list(rows) == [unit(name) for name in INSTANCES], rows  # in the instances' order, as declared
    # ... though c, reset, was served before b, its healthy neighbour declared before it: a broken server
    # does not wait for the neighbours' gates (b's gate judged it ready after c's window).
    assert rows[unit("c")]["service"]["ready_monotonic"] < rows[unit("b")]["service"]["ready_monotonic"], rows
    # Both broken servers were started before either was gated: c's unit started before a's gate saw a's
    # first answer, where one after another c waited for a's load and stability window.
    c_started = int(node.show("c", "ExecMainStartTimestampMonotonic")) / 1e6
    assert 0 < c_started < rows[unit("a")]["service"]["ready_monotonic"], (c_started, rows[unit("a")]["service"])
    for name in INSTANCES:
        row = rows[unit(name)]
        assert row["gpus"] == gpus_of(name) and row["service_status"] == "ready" and row["ok"], row
        assert row["reset"] == row["restarted"] == (name in BROKEN), row
        assert row["main_pid"] == node.main_pid(name), row
        assert (row["ready_s"] is not None) == (name in BROKEN), row
        # A neighbour left running is held no second stability window: the assessment saw it answer. Nor is
        # c: a's gate, started with it, watched it answer while it held a's window (their windows overlap).
        assert row["service"]["stable_since"] == ("first answer" if name == "a" else "earlier look"), row
        rotation = row["service"]["rotation"]
        assert rotation["server"] == name and not rotation["left_out"], rotation
        assert ("out" in rotation) == (name in BROKEN) and rotation["restored"]["changed"] == (name in BROKEN), rotation
    for name in HEALTHY:  # nothing stopped, killed or freed for a neighbour
        assert not rows[unit(name)]["stopped"] and rows[unit(name)]["killed"] == rows[unit(name)]["mib_freed"] == 0
    assert rows[unit("a")]["stopped"] and rows[unit("a")]["mib_freed"] > 0, rows[unit("a")]
    assert rows[unit("c")]["killed"] == len(broken["leftovers"]) and rows[unit("c")]["mib_freed"] > 0, rows[unit("c")]
    (host,) = [row for row in report["hosts"] if row["host"] == HOST]
    assert host["status"] == "ok" and host["service_status"] == "ready", host
    assert host["killed"] == len(broken["leftovers"]), host  # a's workers went with its unit's stop
    assert sorted(int(gpu) for gpu in host["mib_freed_per_gpu"]) == sorted(
        gpu for name in BROKEN for gpu in gpus_of(name)), host
    for name in INSTANCES:
        assert re.search(rf"^\| {HOST} \| {re.escape(unit(name))} \| {INSTANCES[name][1]} \| ready \| "
                         rf"{'yes' if name in BROKEN else 'no'} \|", node.markdown, re.M), node.markdown


def test_a_second_run_changes_nothing(node):
    before = {name: node.main_pid(name) for name in INSTANCES}
    proc, report = node.play()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert recap(proc.stdout)[HOST]["changed"] == 0, proc.stdout[-6000:]
    assert {name: node.main_pid(name) for name in INSTANCES} == before
    rows = instance_rows(report, HOST)
    assert all(not row["reset"] and not row["restarted"] and row["service_status"] == "ready"
               and row["service"]["stable_since"] == "earlier look" for row in rows.values()), rows
