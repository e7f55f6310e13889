"""The units a reset stops, in cleanslate.gpu.reset_steps's one host contact (issue 42): after the
checks that touch nothing (the bytecode targets, the GPUs read) and the evidence, before any step
that signals or removes; each as ansible.builtin.systemd_service stops it. systemctl is a stand-in
(tests/functional/fake_systemd.py: no systemd runs here) that logs every call; the fleet tests stop
real units under a real systemd (test_several_servers_fleet.py, test_playbooks_local.py)."""
from __future__ import annotations

import pytest

from tests.functional.fake_systemd import FakeSystemd, unit
from tests.run_module import run_module

pytestmark = pytest.mark.timeout(120)

MISSING = {"LoadState": "not-found", "ActiveState": "inactive"}


def systemd(tmp_path, stop_fails=None, **states):
    """The stand-in, vllm-a and vllm-b active unless `states` says otherwise (vllm_x= for vllm-x.service)."""
    by_unit = {"vllm-a.service": unit(), "vllm-b.service": unit()}
    by_unit.update({name.replace("_", "-") + ".service": state for name, state in states.items()})
    return FakeSystemd(tmp_path / "systemd", [unit()], stop_fails=stop_fails, by_unit=by_unit)


def stops(fake) -> list:
    return [call["argv"][-1] for call in fake.calls("systemctl") if call["argv"][1] == "stop"]


def steps_args(tmp_path, **extra) -> dict:
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    (tmp_path / "code").mkdir(exist_ok=True)
    args = {"pycache_purge": {"paths": [str(tmp_path / "code")]},
            "evidence": {"path": str(tmp_path / "evidence"), "units": ["vllm-a.service"], "cmdline_patterns": ["never-matches-4242"]},
            "shm_clean": {"path": str(shm)},
            "unit": "vllm-a.service", "units": ["vllm-b.service", "vllm-x.service"]}
    args.update(extra)
    return args


def test_the_units_stop_after_the_checks_and_the_evidence_and_before_the_steps_that_act(tmp_path, fake_nvml):
    fake = systemd(tmp_path, vllm_x=MISSING)
    result = run_module("reset_steps", steps_args(tmp_path, nvml_before={"timeout": 0, "checks": ["count"]},
                                                  nvml_verify={"timeout": 0}),
                        env=dict(fake_nvml.env(), **fake.env))
    assert result["rc"] == 0 and result["failed_step"] is None, result
    assert list(result["steps"]) == ["pycache_check", "nvml_before", "evidence", "unit", "units", "pycache_purge",
                                     "shm_clean", "nvml_verify"], list(result["steps"])
    # The evidence asked systemd for vllm-a's processes before anything was stopped.
    calls = [call["argv"][1:] for call in fake.calls("systemctl")]
    evidence_look = calls.index(["show", "--property=InvocationID,ControlGroup", "--", "vllm-a.service"])
    first_stop = next(index for index, argv in enumerate(calls) if argv[0] == "stop")
    assert evidence_look < first_stop, calls
    # Each running unit is stopped once; one systemd does not know is a warning, not a failure.
    assert stops(fake) == ["vllm-a.service", "vllm-b.service"]
    assert result["steps"]["unit"]["changed"] and result["steps"]["unit"]["status"]["ActiveState"] == "active"
    done = {row["item"]: row for row in result["steps"]["units"]["results"]}
    assert done["vllm-b.service"]["changed"] and not done["vllm-x.service"]["changed"]
    assert done["vllm-x.service"]["msg"] == "Could not find the requested service vllm-x.service: host"
    assert "unit vllm-x.service does not exist: skipped" in str(result.get("warnings")), result.get("warnings")
    # The check before the stop changes nothing; the purge after it is the one that would remove.
    assert result["steps"]["pycache_check"]["changed"] is False
    assert result["steps"]["nvml_before"]["gpus"] and result["changed"]


def test_stopped_and_failed_units_are_left_as_they_are(tmp_path):
    fake = systemd(tmp_path, vllm_a=unit(ActiveState="failed", SubState="failed"),
                   vllm_b=unit(ActiveState="inactive", SubState="dead"))
    result = run_module("reset_steps", steps_args(tmp_path, units=["vllm-b.service"]), env=fake.env)
    assert result["failed_step"] is None, result
    assert stops(fake) == [] and not result["steps"]["unit"]["changed"]
    assert result["steps"]["unit"]["status"]["ActiveState"] == "failed"


def test_a_unit_that_will_not_stop_ends_the_reset_before_the_other_units_and_any_signal(tmp_path):
    fake = systemd(tmp_path, stop_fails={"vllm-a.service": "Job for vllm-a.service canceled."})
    result = run_module("reset_steps", steps_args(tmp_path), env=fake.env)
    assert result["failed_step"] == "unit", result
    assert result["steps"]["unit"]["failed"] and result["steps"]["unit"]["msg"] == \
        "Unable to stop service vllm-a.service: Job for vllm-a.service canceled."
    assert stops(fake) == ["vllm-a.service"]
    assert "units" not in result["steps"] and "pycache_purge" not in result["steps"] and "shm_clean" not in result["steps"]


def test_every_other_unit_is_tried_and_each_failure_is_named_by_its_unit(tmp_path):
    fake = systemd(tmp_path, stop_fails={"vllm-b.service": "Access denied", "vllm-c.service": "Transaction is destructive."},
                   vllm_c=unit())
    result = run_module("reset_steps", steps_args(tmp_path, units=["vllm-b.service", "vllm-c.service", "vllm-d.service"],
                                                  **{"unit": None}),
                        env=fake.env)
    assert result["failed_step"] == "unit", result
    # vllm-d is stopped although b and c failed before it, as a loop over them would.
    assert stops(fake) == ["vllm-b.service", "vllm-c.service", "vllm-d.service"]
    units = result["steps"]["units"]
    assert units["failed"] and units["msg"] == ("vllm-b.service: Unable to stop service vllm-b.service: Access denied; "
                                                "vllm-c.service: Unable to stop service vllm-c.service: Transaction is destructive.")
    assert [row["changed"] for row in units["results"]] == [False, False, True]
    assert "shm_clean" not in result["steps"]


def test_check_mode_stops_nothing_and_the_diff_says_each_units_state_before_and_after(tmp_path):
    fake = systemd(tmp_path, vllm_x=MISSING)
    result = run_module("reset_steps", steps_args(tmp_path), env=fake.env, check=True, diff=True)
    assert result["failed_step"] is None, result
    assert stops(fake) == [] and result["steps"]["unit"]["changed"]
    diff = result["steps"]["units"]["diff"]
    assert diff["before"] == "vllm-a.service: active\nvllm-b.service: active\nvllm-x.service: inactive\n"
    assert diff["after"] == "vllm-a.service: inactive\nvllm-b.service: inactive\nvllm-x.service: inactive\n"


def test_a_gpu_the_host_lacks_refuses_the_reset_before_the_stop(tmp_path, fake_nvml):
    fake = systemd(tmp_path)
    result = run_module("reset_steps", steps_args(tmp_path, nvml_before={"gpus": ["9"], "timeout": 0, "checks": ["count"]}),
                        env=dict(fake_nvml.env(), **fake.env))
    assert result["failed_step"] == "nvml_before", result
    assert result["steps"]["nvml_before"]["msg"].startswith("unknown GPU '9'"), result["steps"]["nvml_before"]
    assert stops(fake) == [] and "evidence" not in result["steps"]


def test_a_driver_that_does_not_answer_still_gets_its_reset(tmp_path):
    """No NVML library here: the reading before fails, and the reset goes on (the final check says why)."""
    fake = systemd(tmp_path, vllm_x=MISSING)
    result = run_module("reset_steps", steps_args(tmp_path, nvml_before={"timeout": 0, "checks": ["count"]}),
                        env=dict(fake.env, LD_LIBRARY_PATH=str(tmp_path / "no-nvml-here")))
    assert result["steps"]["nvml_before"]["failed"], result["steps"]["nvml_before"]
    assert result["failed_step"] is None and stops(fake) == ["vllm-a.service", "vllm-b.service"], result


def test_a_bytecode_target_the_host_refuses_stops_nothing(tmp_path):
    fake = systemd(tmp_path)
    result = run_module("reset_steps", steps_args(tmp_path, pycache_purge={"paths": [str(tmp_path / "not-there")]}),
                        env=fake.env)
    assert result["failed_step"] == "pycache_check", result
    assert stops(fake) == [] and list(result["steps"]) == ["pycache_check"]


def test_without_systemctl_each_unit_fails_in_one_sentence(tmp_path):
    result = run_module("reset_steps", steps_args(tmp_path, unit=None), env={"PATH": str(tmp_path / "empty")})
    assert result["failed_step"] == "unit", result
    assert result["steps"]["units"]["msg"] == (
        "vllm-b.service: systemctl is not on this host's PATH: the unit cannot be stopped here; "
        "vllm-x.service: systemctl is not on this host's PATH: the unit cannot be stopped here")


def test_systemctl_runs_with_the_tasks_path_and_nothing_else_of_its_environment(tmp_path):
    """The reset's node_reset_environment (NVML's library path, here with a preload) is the GPU
    reads'; systemctl, run as root, gets the task's PATH and the C locale only."""
    fake = systemd(tmp_path, vllm_x=MISSING)
    result = run_module("reset_steps", steps_args(tmp_path), env=dict(
        fake.env, LD_LIBRARY_PATH=str(tmp_path / "nvml"), LD_PRELOAD=str(tmp_path / "nvml" / "hook.so")))
    assert result["failed_step"] is None, result
    calls = fake.calls("systemctl")
    stop_calls = [call for call in calls if call["argv"][1] == "stop"]
    assert stop_calls and all(set(call["env"]) <= {"PATH", "LC_ALL", "LANG", "SYSTEMD_PAGER", "LC_CTYPE", "PWD"}
                              for call in stop_calls + [calls[-1]]), [call["env"] for call in calls]
