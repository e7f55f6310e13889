"""The stand-in engine (tests/sim/engine) behaves like vllm serve and sglang serve where the role
and node_reset can tell: its command line, its silence while loading, its endpoints and metrics,
the GPU memory it holds, SIGTERM, and each fault. Every process it starts is this test's child or
the child's worker, killed by pid and start time."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.functional.standin import engine, node  # noqa: F401  # pylint: disable=unused-import
from tests.run_module import run_module
from tests.sim import procinfo


def open_files(pid: int) -> set:
    found = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            found.add(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
        except OSError:
            continue
    return found


def mapped_files(pid: int) -> set:
    """The files a process maps, from /proc/PID/maps (what gpu_reset reads as GPU evidence)."""
    with open("/proc/%d/maps" % pid, encoding="utf-8", errors="surrogateescape") as handle:
        return {line.split(None, 5)[5].strip() for line in handle if len(line.split(None, 5)) == 6}


def metric(text: bytes, name: str) -> float:
    for line in text.decode().splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    raise AssertionError("no %s in /metrics" % name)


def test_an_unknown_flag_exits_2_like_the_engine(node):
    with engine(node, "vllm", ["--bogus-flag"]) as served:
        assert served.proc.wait(timeout=60) == 2
        assert "vllm serve: error: unrecognized arguments: --bogus-flag" in served.proc.stderr.read()
    with engine(node, "sglang", ["--cuda-graph-max-bs", "8"]) as served:
        assert served.proc.wait(timeout=60) == 2
        assert "ambiguous option: --cuda-graph-max-bs could match" in served.proc.stderr.read()


def test_an_unknown_speculative_key_is_refused_like_pydantic(node):
    with engine(node, "vllm", ["--speculative-config", '{"method": "ngram", "num_tokens": 3}']) as served:
        assert served.proc.wait(timeout=60) == 1
        assert "Extra inputs are not permitted" in served.proc.stderr.read()


def test_vllm_loads_refusing_connections_then_serves_holds_gpus_and_stops_on_sigterm(node):
    spec = {"method": "eagle3", "model": "sim/eagle3 draft", "num_speculative_tokens": 4}
    args = ["--served-model-name", "llama", "--tensor-parallel-size", "2", "--speculative-config", json.dumps(spec)]
    hold = node["tmp"] / "loading"
    hold.touch()
    with engine(node, "vllm", args, STANDIN_LOAD_S=0, STANDIN_HOLD_FILE=hold, STANDIN_ACCEPTANCE=0.5,
                STANDIN_SHM_DIR=node["tmp"]) as served:
        deadline = time.monotonic() + 60
        while _children(served.proc.pid).count("VLLM::Worker_TP") < 2:  # its workers hold the GPUs...
            assert time.monotonic() < deadline and served.proc.poll() is None
            time.sleep(0.05)
        assert served.refused()  # ...while the port refuses connections: it is loading
        hold.unlink()
        state = served.wait_ready()
        assert state["speculative"] == spec and state["gpus"] == [0, 1]
        assert served.get("/health")[0] == 200
        status, body = served.get("/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["llama"]
        status, answer = served.post("/v1/completions", {"model": "llama", "prompt": "The capital of France is",
                                                         "max_tokens": 40})
        assert status == 200 and answer["choices"][0]["text"].strip()
        assert served.post("/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
        metrics = served.get("/metrics")[1]
        drafted = metric(metrics, "vllm:spec_decode_num_draft_tokens_total")
        assert drafted == 160 and metric(metrics, "vllm:spec_decode_num_accepted_tokens_total") == 80
        assert metric(metrics, "vllm:spec_decode_num_drafts_total") == 40

        workers = state["workers"]
        for rank, worker in enumerate(workers):
            # Open and mapped, as a CUDA context holds them: its own GPU, nvidiactl, nvidia-uvm.
            devices = {str(node["dev"] / name) for name in ("nvidia%d" % rank, "nvidiactl", "nvidia-uvm")}
            assert devices <= open_files(worker["pid"])
            assert devices <= mapped_files(worker["pid"])
            assert str(node["dev"] / ("nvidia%d" % (1 - rank))) not in mapped_files(worker["pid"])
            assert procinfo.comm(worker["pid"]) == "VLLM::Worker_TP"
        used = {r["gpu"]: r["mib"] for r in node["nvml"].registrations()}
        assert used == {0: int(143771 * 0.92), 1: int(143771 * 0.92)}
        # node_reset's gpu_reset sees exactly the workers as the holders of these devices.
        plan = run_module("gpu_reset", {"device_paths": [str(node["dev"] / "nvidia*")]}, check=True,
                          env=node["nvml"].env())
        assert sorted(t["pid"] for t in plan["targets"]) == sorted(w["pid"] for w in workers), plan
        assert plan["clients"] == [], plan  # the API server holds no device file

        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=60) == 0
        assert procinfo.wait_gone(workers, 30) == []
        assert not list(node["tmp"].glob("nccl-standin-*"))  # a clean stop leaves no segment


def test_sglang_guards_its_api_with_the_key_from_its_config_file_and_needs_enable_metrics(node):
    config = node["tmp"] / "secrets.yaml"
    config.write_text('# 0600\napi-key: "k$y \\"quoted\\""\n')
    args = ["--served-model-name", "ds", "--config", str(config), "--speculative-algorithm", "EAGLE3",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    with engine(node, "sglang", args) as served:
        served.wait_ready()
        key = 'k$y "quoted"'
        assert served.get("/health")[0] == 200 and served.get("/ready")[0] == 200  # open without the key
        assert served.get("/v1/models")[0] == 401
        assert served.get("/v1/models", key)[0] == 200
        assert served.post("/v1/completions", {"model": "ds", "prompt": "x", "max_tokens": 8}, key)[0] == 200
        assert served.get("/metrics")[0] == 404  # no --enable-metrics, no /metrics
        assert "k$y" not in " ".join(procinfo.cmdline(served.proc.pid))


def test_sglang_metrics_report_the_acceptance_gauges(node):
    args = ["--enable-metrics", "--speculative-algorithm", "NGRAM"]
    with engine(node, "sglang", args, STANDIN_FAULT="low_acceptance") as served:
        served.wait_ready()
        served.post("/v1/completions", {"model": "sim/Llama-3.1-8B", "prompt": "x", "max_tokens": 100})
        metrics = served.get("/metrics")[1]
        assert abs(metric(metrics, "sglang:spec_accept_rate") - 0.15) < 0.01
        assert abs(metric(metrics, "sglang:spec_accept_length") - (1 + 0.15 * 3)) < 0.05


def test_a_server_that_ignores_sigterm_keeps_serving(node):
    with engine(node, "sglang", [], STANDIN_FAULT="ignore_sigterm") as served:
        served.wait_ready()
        served.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            served.proc.wait(timeout=2)  # without the fault it exits 0 at once
        assert served.get("/health")[0] == 200


def test_a_crash_during_load_exits_1_with_the_cuda_error(node):
    with engine(node, "vllm", [], STANDIN_LOAD_S=0.5, STANDIN_FAULT="crash_during_load") as served:
        assert served.proc.wait(timeout=60) == 1
        assert "CUDA error: an illegal memory access" in served.proc.stderr.read()
    assert node["nvml"].registrations() == [] or all(
        not procinfo.alive(r["pid"]) for r in node["nvml"].registrations())


def test_never_ready_keeps_loading_until_stopped(node):
    """With no load time a normal start listens as soon as its workers run; never_ready is still
    loading when SIGTERM comes, and says so."""
    with engine(node, "vllm", [], STANDIN_LOAD_S=0, STANDIN_FAULT="never_ready") as served:
        deadline = time.monotonic() + 30
        while "VLLM::Worker_TP" not in _children(served.proc.pid):
            assert time.monotonic() < deadline and served.proc.poll() is None
            time.sleep(0.05)
        assert served.refused()
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=60) == 0
        assert "stopped while loading" in served.proc.stdout.read()
        assert not node["state"].exists()


def _children(pid: int) -> list:
    """The names of pid's children."""
    names = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and procinfo.ppid(int(entry)) == pid:
            try:
                names.append(procinfo.comm(int(entry)))
            except OSError:
                pass  # gone meanwhile
    return names


def test_orphan_workers_keep_the_gpus_after_the_api_server_dies(node):
    with engine(node, "vllm", ["--tensor-parallel-size", "2"], STANDIN_FAULT="orphan_workers",
                STANDIN_SHM_DIR=node["tmp"]) as served:
        assert served.proc.wait(timeout=60) == -signal.SIGKILL
        workers = served.state["workers"]
        assert all(procinfo.same_process(w["pid"], w["create_time"]) for w in workers)
        assert len(list(node["tmp"].glob("nccl-standin-*"))) == 2
        assert {r["pid"] for r in node["nvml"].registrations()} == {w["pid"] for w in workers}
        # gpu_reset stops them with SIGTERM, as it stops a real worker: no wait for the grace period.
        result = run_module("gpu_reset", {"device_paths": [str(node["dev"] / "nvidia*")], "grace_period": 30},
                            env=node["nvml"].env())
        assert sorted((k["pid"], k["signal"]) for k in result["killed"]) == sorted(
            (w["pid"], "SIGTERM") for w in workers), result


def test_a_dead_api_closes_the_port_and_keeps_the_process_and_its_gpus(node):
    """dead_api: ready once, then nothing answers while the server and its workers live on and
    hold their GPUs (the unit stays active); SIGTERM still stops all of them."""
    with engine(node, "vllm", ["--tensor-parallel-size", "2"], STANDIN_FAULT="dead_api",
                STANDIN_SHM_DIR=node["tmp"]) as served:
        workers = served.wait_ready()["workers"]
        deadline = time.monotonic() + 30
        while not served.refused():
            assert time.monotonic() < deadline, "the port still answers"
            time.sleep(0.05)
        assert served.proc.poll() is None
        assert all(procinfo.same_process(w["pid"], w["create_time"]) for w in workers)
        assert {r["pid"] for r in node["nvml"].registrations()} == {w["pid"] for w in workers}
        assert len(list(node["tmp"].glob("nccl-standin-*"))) == 2
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=60) == 0
        assert procinfo.wait_gone(workers, 30) == []


def test_a_device_file_that_cannot_be_mapped_stops_the_engine_like_cuda(node):
    """A node the worker cannot map (here a FIFO; on the fleet hosts it was /dev/null, 1:3) would
    leave a holder that gpu_reset takes for a client: the engine fails instead of serving."""
    (node["dev"] / "nvidia-uvm").unlink()
    os.mkfifo(node["dev"] / "nvidia-uvm")
    with engine(node, "vllm", []) as served:
        assert served.proc.wait(timeout=60) == 1
        stderr = served.proc.stderr.read()
        assert "cannot map %s" % (node["dev"] / "nvidia-uvm") in stderr, stderr
        assert "worker for GPU 0 did not start" in stderr
    assert all(not procinfo.alive(r["pid"]) for r in node["nvml"].registrations())


def test_another_holder_leaves_too_little_memory_and_the_engine_fails_like_vllm(node):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        node["nvml"].register(holder.pid, 0, 100000)
        with engine(node, "vllm", []) as served:
            assert served.proc.wait(timeout=60) == 1
            assert "Free memory on device cuda:0" in served.proc.stderr.read()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("env, message", [
    ({"STANDIN_FAULT": "explode"}, "fault must be one of"),
    ({"STANDIN_LOAD_S": "nan"}, "load_s must be from 0 to 86400"),
    ({"STANDIN_ACCEPTANCE": "1.5"}, "acceptance must be from 0 to 1"),
])
def test_bad_settings_are_refused_before_anything_starts(node, env, message):
    with engine(node, "vllm", [], **env) as served:
        assert served.proc.wait(timeout=60) == 2
        assert message in served.proc.stderr.read()
    assert node["nvml"].registrations() == []


def test_sglang_gauges_read_zero_until_a_window_of_decode_steps_is_logged(node):
    """As SGLang's metrics reporter: nothing is logged before --decode-log-interval (40) decode steps,
    then each window alone sets the gauges."""
    args = ["--enable-metrics", "--speculative-algorithm", "NGRAM"]
    with engine(node, "sglang", args, STANDIN_ACCEPTANCE=0.5) as served:
        served.wait_ready()
        # 3 drafts at 50%: 1.5 accepted a step, 2.5 tokens a step; 80 tokens are 32 steps.
        served.post("/v1/completions", {"model": "sim/Llama-3.1-8B", "prompt": "x", "max_tokens": 80})
        metrics = served.get("/metrics")[1]
        assert metric(metrics, "sglang:spec_accept_rate") == 0.0
        assert metric(metrics, "sglang:spec_accept_length") == 0.0
        served.post("/v1/completions", {"model": "sim/Llama-3.1-8B", "prompt": "x", "max_tokens": 40})
        metrics = served.get("/metrics")[1]
        assert abs(metric(metrics, "sglang:spec_accept_rate") - 0.5) < 0.01
        assert abs(metric(metrics, "sglang:spec_accept_length") - 2.5) < 0.05
