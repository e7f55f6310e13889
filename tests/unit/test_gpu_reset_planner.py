"""gpu_reset's Planner on real processes that map files named like device files, with an NVML
reading given as data (what _nvml.snapshot returns): the rules that need an exact moment,
which no functional test can stage. Nothing is signalled here."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.run_module import ensure_collection_link

sys.path.insert(0, str(ensure_collection_link()))
# pylint: disable=wrong-import-position
from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs  # noqa: E402
from ansible_collections.cleanslate.gpu.plugins.module_utils import _gpu_reset_module as gpu_reset  # noqa: E402

MAPPER = """
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    assert libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0) not in (None, ctypes.c_void_p(-1).value)
print('ready', flush=True)
time.sleep(600)
"""

PARAMS = dict(gpus=[], cmdline_patterns=[], cgroup=None, users=None, protect_names=[], spare_units=[], spare_gpus=[],
              include_children=True)


@pytest.fixture
def started():
    procs = []

    def start(*paths):
        proc = subprocess.Popen([sys.executable, "-c", MAPPER] + [str(p) for p in paths], stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def snapshot(listed):
    """An NVML reading of 4 GPUs listing {pid: (gpu, MiB)}, used memory = the listed shares."""
    gpus = [{"index": i, "uuid": "GPU-%d" % i, "memory_used_mib": 0, "processes": []} for i in range(4)]
    for pid, (gpu, mib) in listed.items():
        gpus[gpu]["processes"].append({"pid": pid, "used_mib": mib})
        gpus[gpu]["memory_used_mib"] += mib
    return {"count": 4, "gpus": gpus, "lost": []}


def test_a_process_that_started_after_the_reading_is_not_the_one_nvml_listed(tmp_path, started):
    """NVML lists pid P on GPU 0; P now belongs to a process that started after the reading
    (and maps GPU 0, as one with every GPU visible does). Taking the listing for its own would
    explain GPU 0's memory and hide the unlisted child that really holds it."""
    dev = tmp_path / "nvidia0"
    dev.touch()
    child = started(dev)
    reading = _procs.now_ticks()
    time.sleep(0.05)  # start times count clock ticks: the newcomer starts in a later one
    newcomer = started(dev)
    planner = gpu_reset.Planner(PARAMS, [], [str(dev)], snapshot({newcomer: (0, 5000)}), reading, (None, set()))
    assert not planner.believed(newcomer)
    assert planner.gpus_of(child) == {0}
    assert "gpu_memory_mib" not in gpu_reset.describe(planner, newcomer, "device", 1)

    believed = gpu_reset.Planner(PARAMS, [], [str(dev)], snapshot({newcomer: (0, 5000)}), _procs.now_ticks(), (None, set()))
    assert believed.believed(newcomer) and believed.gpus_of(child) == set()
    assert gpu_reset.describe(believed, newcomer, "device", 1)["gpu_memory_mib"] == 5000


def test_a_lost_gpu_is_left_to_the_mappings(tmp_path, started):
    """A GPU NVML could not read tells nothing about its processes: a mapper of it is its holder."""
    dev = tmp_path / "nvidia2"
    dev.touch()
    pid = started(dev)
    reading = dict(snapshot({}), lost=[{"index": 2, "error": "GPU is lost"}])
    planner = gpu_reset.Planner(PARAMS, [], [str(dev)], reading, _procs.now_ticks(), (None, set()))
    assert planner.gpus_of(pid) == {2}
