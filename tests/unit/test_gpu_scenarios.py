"""The GPU scenarios (tests/gpu) run only on a machine with NVIDIA GPUs; what keeps them from
signalling anything they did not start is checked here, on the CPU, with the fake NVML."""
from __future__ import annotations

import pytest

from tests.fixtures.fake_nvml import FakeNvml
from tests.gpu import holders, scenarios


def targets(*pids):
    return [{"pid": pid} for pid in pids]


def test_guard_lets_a_step_signal_exactly_the_expected_processes_of_its_own():
    owns = {10, 11, 12}.__contains__
    assert scenarios.guard(targets(10, 11), [11, 10], owns) is None


@pytest.mark.parametrize("found, expected, words", [
    ([10, 99], [10, 99], "did not start: [99]"),        # someone else's process: never, even if expected
    ([10, 11], [10], "[10, 11] where [10] were expected"),  # one of ours, but not this step's
    ([], [10], "[] where [10] were expected"),           # the evidence missed the holder: stop, look
])
def test_guard_stops_a_step_whose_targets_are_not_the_expected_ones(found, expected, words):
    owns = {10, 11, 12}.__contains__
    assert words in scenarios.guard(targets(*found), expected, owns)


@pytest.fixture
def nvml_gpus(tmp_path, fake_nvml_lib, monkeypatch):
    """Make nvml_read and the module see a fake NVML with the given number of GPUs."""
    def create(count):
        fake = FakeNvml(tmp_path / "nvml", lib_dir=fake_nvml_lib)
        fake.create(gpu_count=count)
        for name, value in fake.env().items():
            monkeypatch.setenv(name, value)
    return create


def test_a_two_gpu_scenario_is_skipped_on_one_gpu(tmp_path, nvml_gpus):
    nvml_gpus(1)
    result = scenarios.two_gpu_scenario("x", tmp_path, lambda started, workdir: pytest.fail("no setup on one GPU"))
    assert result["skipped"] == "needs 2 GPUs, this machine has 1" and result["passed"] is True


def test_a_step_whose_check_mode_targets_differ_signals_nothing(tmp_path, nvml_gpus):
    """Here no process maps /dev/nvidia*, so check mode finds no target where the step expects
    one: the scenario stops before its real run and says so."""
    nvml_gpus(2)
    ran = []

    def setup(started, workdir):
        return [scenarios.step({"gpus": ["1"]}, [4242], {"never": lambda result, after: ran.append(1)})]

    result = scenarios.two_gpu_scenario("x", tmp_path, setup)
    assert result["error"] == ("step 1: check mode found targets [] where [4242] were expected; "
                               "nothing was signalled")
    assert [list(step) for step in result["steps"]] == [["params", "preflight_targets", "clients"]]
    assert ran == [] and "passed" not in result


def test_every_scenario_is_wired_to_a_holder_role():
    names = [name for name, _setup in scenarios.SCENARIOS + scenarios.TWO_GPU_SCENARIOS]
    assert len(names) == len(set(names))
    assert {"gpu-monitor", "cuda-init", "hold", "fork-child"} <= set(holders.ROLES)
