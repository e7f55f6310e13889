"""The crashed-node simulator builds what its manifest says, cleans only what it started,
and refuses bad input with one clear error and nothing touched."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import readable_copy, sim
from tests.fixtures.fake_nvml import FakeNvml
from tests.sim import procinfo
from tests.sim.processes import recorded

REPO = Path(__file__).resolve().parents[2]
HOLDERS = ("worker", "orphan_worker", "term_ignorer", "unpinned_worker", "forked_child")
SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def entries(manifest):
    return [(role, e) for role, items in manifest["processes"].items() for e in items]


def open_files(pid: int) -> set:
    """What /proc/PID/fd points at (readlink, as gpu_reset reads it)."""
    found = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            found.add(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
        except OSError:
            continue
    return found


def mapped_files(pid: int) -> set:
    with open("/proc/%d/maps" % pid, encoding="utf-8") as handle:
        return {line.split(None, 5)[5].strip() for line in handle if len(line.split(None, 5)) == 6}


def processes_mentioning(text: str) -> list:
    """Every live process on the host whose command line contains `text`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if text in " ".join(procinfo.cmdline(int(name))) and procinfo.state(int(name)) != "Z":
                    found.append(int(name))
            except OSError:
                continue
    return found


def start_sleeper(*extra_args) -> subprocess.Popen:
    """A process of the test's own, to prove clean leaves it alone."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *extra_args])


def run_cli(*args, user=None, python=sys.executable, unshare=False, code=REPO):
    """python -m tests.sim args, imported from code (the checkout, or a copy another user can
    read: the sim_copy fixture), as user or as root of a new user namespace."""
    prefix = []
    if user:
        prefix = ["setpriv", "--reuid=%s" % user, "--regid=nogroup", "--clear-groups"]
    if unshare:
        prefix = ["unshare", "--user", "--map-root-user"]
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(prefix + [python, "-m", "tests.sim", *args], cwd=code, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def sim_copy(fake_nvml_lib):
    """The simulator, and the fake library under fake_nvml/, where another user can read them: the
    checkout may be closed to it (a clone in root's home)."""
    top = readable_copy.simulator(fake_nvml_lib)
    yield top
    readable_copy.remove(top)


@pytest.fixture
def shared_tmp():
    """A world-writable scratch directory, for runs as an unprivileged user."""
    path = Path(tempfile.mkdtemp(prefix="sim-test-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ----- crash builds what the manifest says -----

def test_processes_alive_with_their_names_and_parents(crashed_node):
    m = crashed_node
    for _role, entry in entries(m):
        assert procinfo.same_process(entry["pid"], entry["create_time"])
        assert procinfo.comm(entry["pid"]) == entry["name"]
        assert procinfo.cmdline(entry["pid"]) == entry["cmdline"]
    api = m["processes"]["api_server"][0]
    workers = m["processes"]["worker"]
    assert len(workers) == 4
    assert {procinfo.ppid(w["pid"]) for w in workers} == {api["pid"]}
    assert [w["name"] for w in workers] == ["VLLM::Worker_TP"] * 4  # 16 chars cut to 15
    assert m["processes"]["orphan_worker"][0]["name"] == "VLLM::EngineCor"
    persistenced = m["processes"]["persistenced"][0]
    assert persistenced["name"] == "nvidia-persiste"
    assert persistenced["cmdline"][0] == "nvidia-persistenced"


def test_api_server_pattern_matches_only_this_nodes_api_server(crashed_node):
    m = crashed_node
    pattern = re.compile(m["api_server_pattern"])
    matching = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if pattern.search(" ".join(procinfo.cmdline(int(name)))):
                    matching.append(int(name))
            except OSError:
                continue
    assert matching == [m["processes"]["api_server"][0]["pid"]]
    assert "vllm serve" in " ".join(m["processes"]["api_server"][0]["cmdline"])


def test_device_files_are_opened_and_mapped_as_the_real_driver_shows_them(crashed_node):
    """Every process that touches the driver opens every device file; one with a CUDA context
    maps its visible GPUs' files plus nvidiactl and nvidia-uvm (measured on driver 580)."""
    m = crashed_node
    dev_dir = m["dev_dir"]
    every = set(m["device_files"])
    for role, entry in entries(m):
        held = {path for path in open_files(entry["pid"]) if path.startswith(dev_dir + "/")}
        maps = {path for path in mapped_files(entry["pid"]) if path.startswith(dev_dir + "/")}
        assert held == set(entry["devices"]), role
        assert maps == set(entry["maps"]), role
        if role in HOLDERS or role == "init_only":
            assert held == every, role
            gpus = {int(Path(p).name[len("nvidia"):]) for p in maps if Path(p).name[len("nvidia"):].isdigit()}
            shared = {dev_dir + "/nvidiactl"} | ({dev_dir + "/nvidia-uvm"} if role in HOLDERS[:4] else set())
            assert maps - {dev_dir + "/nvidia%d" % g for g in gpus} == shared, role
            assert set(entry["gpus"]) <= gpus, role
    for role in ("monitor", "persistenced"):
        assert set(m["processes"][role][0]["devices"]) == every and m["processes"][role][0]["maps"] == [], role
    unpinned = m["processes"]["unpinned_worker"][0]
    assert len(unpinned["gpus"]) == 1 and len(unpinned["maps"]) == m["gpu_count"] + 2
    assert len(m["processes"]["init_only"][0]["maps"]) == 2  # its GPU's file and nvidiactl
    forked = m["processes"]["forked_child"][0]
    assert forked["listed_pid"] == forked["parent_pid"] != forked["pid"]
    assert m["processes"]["api_server"][0]["devices"] == []
    assert m["processes"]["bystander"][0]["devices"] == []


def test_device_files_are_zero_character_devices_when_root(crashed_node):
    """1:5 (/dev/zero), which can be mapped privately under the node's own path, as the real
    device files are; 1:3 (/dev/null) cannot be mapped at all."""
    if os.geteuid() != 0:
        pytest.skip("char devices need root")
    m = crashed_node
    assert m["device_kind"] == "char"
    assert len(m["device_files"]) == m["gpu_count"] + 3
    for path in m["device_files"]:
        info = os.stat(path)
        assert stat.S_ISCHR(info.st_mode)
        assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (1, 5)


@pytest.mark.parametrize("role", ["orphan_worker", "forked_child"])
def test_orphan_is_reparented_and_its_parent_is_dead(crashed_node, role):
    orphan = crashed_node["processes"][role][0]
    parent = next(r for r in recorded(Path(crashed_node["root"])) if r["pid"] == orphan["parent_pid"])
    assert not procinfo.same_process(parent["pid"], parent["create_time"])
    assert procinfo.ppid(orphan["pid"]) == crashed_node["init"]["pid"] != orphan["parent_pid"]


def test_term_ignorer_ignores_sigterm_and_holds_a_gpu(crashed_node):
    ignorer = crashed_node["processes"]["term_ignorer"][0]
    with open("/proc/%d/status" % ignorer["pid"], encoding="utf-8") as handle:
        ignored = int(next(line for line in handle if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored & SIGTERM_BIT
    assert ignorer["gpus"] and ignorer["mib"] > 0
    worker = crashed_node["processes"]["worker"][0]
    with open("/proc/%d/status" % worker["pid"], encoding="utf-8") as handle:
        assert not int(next(line for line in handle if line.startswith("SigIgn:")).split()[1], 16) & SIGTERM_BIT


def test_shm_leftovers_in_use_and_mapped_only(crashed_node):
    m = crashed_node
    shm_dir = Path(m["shm_dir"])
    names = [Path(p).name for p in m["shm"]["leftovers"]]
    for prefix in ("nccl-", "psm_", "sem.mp-", "torch_", "vllm_offload_", "vllm_ec_", "sgl_shm_", "multi_tokenizer_args_",
                   "sglang_loads_", "sglang_host_pool_", "cuda.shm."):
        assert any(n.startswith(prefix) for n in names), prefix
    assert any(n.startswith("vllm_offload_") and n.endswith(".mmap") for n in names)
    pids = [e["pid"] for _r, e in entries(m)]
    used = set().union(*(open_files(p) | mapped_files(p) for p in pids))
    for path in m["shm"]["leftovers"]:
        assert Path(path).parent == shm_dir and os.path.getsize(path) > 0
        assert path not in used
    dead = next(n for n in names if n.startswith("torch_"))
    assert procinfo.create_time(int(dead.split("_")[1])) is None
    by_how = {u["how"]: u for u in m["shm"]["in_use"]}
    mapped = by_how["mapped"]
    assert mapped["pid"] == m["processes"]["shm_mapper"][0]["pid"]
    assert mapped["path"] in mapped_files(mapped["pid"])
    assert mapped["path"] not in open_files(mapped["pid"])
    held = by_how["fd"]
    assert Path(held["path"]).name.startswith("torch_%d_" % held["pid"])
    assert held["path"] in open_files(held["pid"])
    assert set(os.listdir(shm_dir)) == set(names) | {Path(u["path"]).name for u in m["shm"]["in_use"]}


def test_patched_module_still_loads_its_old_bytecode(crashed_node):
    site = crashed_node["site_packages"]
    source = Path(site["source"])
    assert site["new_marker"] in source.read_text() and site["old_marker"] not in source.read_text()
    code = "import %s as m; print(m.BEHAVIOUR)" % site["module"]
    env = dict(os.environ, PYTHONPATH=site["path"])
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == site["old_marker"]
    # the stale bytecode is the only reason: without it the patched source runs
    os.unlink(site["pyc"])
    ran = subprocess.run([sys.executable, "-B", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == site["new_marker"]


PYNVML_DUMP = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    out.append({"used": pynvml.nvmlDeviceGetMemoryInfo(h).used // 2**20,
                "procs": sorted([p.pid, p.usedGpuMemory // 2**20] for p in procs)})
print(json.dumps(out))
"""


def nvml_view(manifest) -> list:
    env = dict(os.environ, **manifest["nvml"]["env"])
    ran = subprocess.run([sys.executable, "-c", PYNVML_DUMP], env=env, capture_output=True, text=True, check=True)
    return json.loads(ran.stdout)


def test_fake_nvml_shows_the_registered_memory(crashed_node):
    m = crashed_node
    reserved = [g["reserved_mib"] for g in FakeNvml(m["nvml"]["state_dir"]).gpus()]
    expected = [[] for _gpu in range(m["gpu_count"])]
    for role, entry in entries(m):
        assert bool(entry["gpus"]) == (role in HOLDERS), role  # the monitor and persistenced hold no memory
        for gpu in entry["gpus"]:
            expected[gpu].append([entry.get("listed_pid", entry["pid"]), entry["mib"]])
    view = nvml_view(m)
    assert [g["procs"] for g in view] == [sorted(e) for e in expected]
    assert [g["used"] for g in view] == [sum(mib for _p, mib in e) + r for e, r in zip(expected, reserved)]
    assert all(w["mib"] == 70000 for w in m["processes"]["worker"])


# ----- clean -----

def test_clean_kills_only_its_own_processes_and_removes_root(tmp_path, fake_nvml_lib):
    root = tmp_path / "node"
    manifest = sim.crash(root, gpus=2, tp=2, lib_dir=fake_nvml_lib)
    # the test's own processes, one of them even naming the node's API server
    bystander = start_sleeper()
    lookalike = start_sleeper(str(root / "bin" / "vllm"), "serve")
    try:
        result = sim.clean(root)
        assert not root.exists() and result["removed"]
        ours = [e for _r, e in entries(manifest)] + [manifest["init"]]
        # the node's init exits by itself once its processes are gone; it is killed only if not
        assert {k["pid"] for k in result["killed"]} - {manifest["init"]["pid"]} == {e["pid"] for _r, e in entries(manifest)}
        assert not any(procinfo.same_process(e["pid"], e["create_time"]) for e in ours)
        assert bystander.poll() is None and lookalike.poll() is None
        assert sim.clean(root) == {"root": str(root), "killed": [], "removed": False}
    finally:
        for proc in (bystander, lookalike):
            proc.kill()
            proc.wait()


def test_clean_skips_a_pid_whose_start_time_differs(tmp_path, fake_nvml_lib):
    """A manifest pid that now belongs to another process (pid reuse) is not killed."""
    root = tmp_path / "node"
    manifest = sim.crash(root, gpus=1, tp=1, lib_dir=fake_nvml_lib)
    stranger = start_sleeper()
    try:
        manifest["processes"]["bystander"].append(
            {"pid": stranger.pid, "create_time": procinfo.create_time(stranger.pid) - 100.0})
        (root / "manifest.json").write_text(json.dumps(manifest))
        sim.clean(root)
        assert stranger.poll() is None
        assert not root.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_clean_on_a_half_built_root_finds_processes_by_their_records(tmp_path, fake_nvml_lib):
    root = tmp_path / "node"
    manifest = sim.crash(root, gpus=1, tp=1, lib_dir=fake_nvml_lib)
    (root / "manifest.json").unlink()  # as if crash had been interrupted before writing it
    sim.clean(root)
    assert not root.exists()
    assert not any(procinfo.same_process(e["pid"], e["create_time"]) for _r, e in entries(manifest))
    assert processes_mentioning(str(root)) == []


def test_clean_refuses_a_directory_it_did_not_build(tmp_path):
    root = tmp_path / "precious"
    root.mkdir()
    (root / "data").write_text("keep me")
    with pytest.raises(sim.SimError, match="not built by tests.sim"):
        sim.clean(root)
    assert (root / "data").read_text() == "keep me"


# ----- bad input: one clear error, nothing touched -----

def test_non_empty_root_is_refused_and_untouched(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    ran = run_cli("crash", "--root", str(root))
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and "not empty" in ran.stderr
    assert ran.stdout == ""
    assert os.listdir(root) == ["notes.txt"]
    assert processes_mentioning(str(root)) == []


@pytest.mark.parametrize("args, message", [
    (["--tp", "4", "--gpus", "2"], "cannot exceed gpus"),
    (["--gpus", "0"], "gpus must be an integer"),
    (["--device-kind", "block"], "invalid choice"),
    (["--lib-dir", "/nonexistent/lib"], "holds no libnvidia-ml.so.1"),
])
def test_bad_arguments_give_one_error_and_create_nothing(tmp_path, args, message):
    root = tmp_path / "node"
    ran = run_cli("crash", "--root", str(root), *args)
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and message in ran.stderr, ran.stderr
    assert not root.exists()


@pytest.mark.parametrize("how", ["nobody", "user-namespace root"])
def test_char_devices_without_permission_give_one_error_and_create_nothing(shared_tmp, sim_copy, how):
    root = shared_tmp / "node"
    ran = run_cli("crash", "--root", str(root), "--device-kind", "char", "--lib-dir", str(sim_copy / "fake_nvml"),
                  python="/usr/bin/python3", user="nobody" if how == "nobody" else None,
                  unshare=how != "nobody", code=sim_copy)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1 and "cannot create character devices" in ran.stderr
    assert os.listdir(shared_tmp) == []
    assert processes_mentioning(str(root)) == []


@pytest.mark.parametrize("mode, message", [(0o755, "no write permission"), (0o700, "cannot reach")])
def test_root_where_the_user_may_not_create_it_is_refused(shared_tmp, sim_copy, mode, message):
    closed = shared_tmp / "closed"
    closed.mkdir()
    closed.chmod(mode)  # root's: nobody may not write here (0755) or not even look in (0700)
    ran = run_cli("crash", "--root", str(closed / "node"), python="/usr/bin/python3", user="nobody", code=sim_copy)
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and message in ran.stderr, ran.stderr
    assert os.listdir(closed) == []


def test_unprivileged_user_gets_plain_device_files_with_system_python(shared_tmp, sim_copy):
    """auto falls back to plain files; the simulator needs only the standard library."""
    root = shared_tmp / "node"
    ran = run_cli("crash", "--root", str(root), "--gpus", "2", "--tp", "1", "--lib-dir", str(sim_copy / "fake_nvml"),
                  python="/usr/bin/python3", user="nobody", code=sim_copy)
    try:
        assert ran.returncode == 0, ran.stderr
        manifest = json.loads(ran.stdout)
        assert manifest["device_kind"] == "file"
        assert all(stat.S_ISREG(os.stat(p).st_mode) for p in manifest["device_files"])
        worker = manifest["processes"]["worker"][0]
        assert set(worker["devices"]) <= open_files(worker["pid"])
        assert os.stat("/proc/%d" % worker["pid"]).st_uid == 65534
    finally:
        cleaned = run_cli("clean", "--root", str(root), python="/usr/bin/python3", user="nobody", code=sim_copy)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not root.exists()


# ----- the command line -----

def test_cli_round_trip(tmp_path, fake_nvml_lib):
    root = tmp_path / "node"
    built = run_cli("crash", "--root", str(root), "--gpus", "2", "--tp", "2", "--device-kind", "file",
                    "--lib-dir", str(fake_nvml_lib))
    assert built.returncode == 0, built.stderr
    manifest = json.loads(built.stdout)
    try:
        assert manifest == json.loads((root / "manifest.json").read_text())
        assert manifest["device_kind"] == "file" and len(manifest["processes"]["worker"]) == 2
        # the crash command has exited; what it started lives on
        assert all(procinfo.same_process(e["pid"], e["create_time"]) for _r, e in entries(manifest))
    finally:
        cleaned = run_cli("clean", "--root", str(root))
    assert cleaned.returncode == 0, cleaned.stderr
    result = json.loads(cleaned.stdout)
    assert result["removed"] and not root.exists()
    assert not any(procinfo.same_process(e["pid"], e["create_time"]) for _r, e in entries(manifest))
