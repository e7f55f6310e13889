"""node_reset's checks and result (cleanslate.gpu.node_reset_problems / node_reset_result), as
the role and the fleet report use them. The playbook tests run the same filters end to end."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import host_row
from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml_verify_module as nvml_verify
from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import (node_reset_problems, node_reset_result,
                                                                          variables)
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES

ROLE = Path(__file__).resolve().parents[2] / "roles" / "node_reset"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
# The modules' upper bounds, as the role's sentences state them (the ranges are _ranges.py's).
GRACE_MAX = RANGES["gpu_reset"]["grace_period"].maximum
POLL_MAX = RANGES["nvml_verify"]["poll_interval"].maximum


def values(**changed):
    base = {name: DEFAULTS[name] for name in variables()}
    base.update(changed)
    return base


def test_the_role_passes_every_variable_the_checks_read_and_not_its_result():
    # The role selects its variables by name (vars/main.yml): every variable of the spec, and not
    # node_reset_result, the role's answer, which a second run would otherwise check as a setting.
    pattern = re.search(r"varnames', '([^']+)'", ROLE_VARS["__node_reset_names"]).group(1)
    names = list(variables()) + ["node_reset_result", "__node_reset_args"]
    assert [name for name in names if re.match(pattern, name)] == list(variables())
    assert "__node_reset_names" in ROLE_VARS["__node_reset_checked"]


def test_the_defaults_pass():
    assert node_reset_problems(values()) == []


@pytest.mark.parametrize("name, value, shown", [
    ("node_reset_gpu_reset_grace_period", float("nan"), "NaN"),
    ("node_reset_gpu_reset_grace_period", "nan", '"nan"'),
    ("node_reset_gpu_reset_grace_period", float("inf"), "Infinity"),
    ("node_reset_gpu_reset_grace_period", -0.5, "-0.5"),
    ("node_reset_gpu_reset_grace_period", GRACE_MAX + 0.5, str(GRACE_MAX + 0.5)),
    ("node_reset_gpu_reset_grace_period", True, "true"),
    ("node_reset_gpu_reset_grace_period", None, "null"),
    ("node_reset_gpu_reset_grace_period", [3], "[3]"),
    ("node_reset_gpu_reset_grace_period", "", '""'),
    ("node_reset_gpu_reset_kill_timeout", -0.001, "-0.001"),
    ("node_reset_nvml_verify_poll_interval", POLL_MAX + 0.5, str(POLL_MAX + 0.5)),
    ("node_reset_nvml_verify_poll_interval", "0", '"0"'),
    ("node_reset_pve_sweep_after", -1, "-1"),
    ("node_reset_pve_sweep_after", "1e300", '"1e300"'),
    ("node_reset_pve_connect_timeout", 0, "0"),
])
def test_a_bad_number_gives_one_sentence_with_its_value_and_rule(name, value, shown):
    problems = node_reset_problems(values(**{name: value}))
    assert len(problems) == 1 and problems[0].startswith("%s is %s: it must be " % (name, shown)), problems
    assert problems[0].endswith(".")
    module_option = [rule for module, options in RANGES.items() for option, rule in options.items()
                     if name == "node_reset_%s_%s" % (module, option)]
    if module_option:  # the sentence states the module's own bound
        assert "at most %s" % module_option[0].maximum in problems[0] or "to %s." % module_option[0].maximum in problems[0]


@pytest.mark.parametrize("name, value", [
    ("node_reset_gpu_reset_grace_period", "0"), ("node_reset_gpu_reset_grace_period", " %s " % GRACE_MAX),
    ("node_reset_gpu_reset_kill_timeout", 0.001), ("node_reset_pve_sweep_after", 0),
    # The module's own ranges (issue 30): SIGKILL with no wait beyond a process on its way out, and
    # a poll interval longer than the timeout (one read).
    ("node_reset_gpu_reset_kill_timeout", 0), ("node_reset_nvml_verify_poll_interval", POLL_MAX),
    ("node_reset_pve_sweep_after", "86400"), ("node_reset_nvml_verify_expected_count", "8"),
])
def test_numbers_at_the_edges_and_numbers_given_as_strings_pass(name, value):
    assert node_reset_problems(values(**{name: value})) == []


def test_selectors_checks_and_scopes():
    problems = node_reset_problems(values(
        node_reset_gpu_reset_gpus="0,GPU-12345678-1234-1234-1234-123456789abc,x",
        node_reset_nvml_verify_gpus=["\u00b2", 1, True], node_reset_nvml_verify_checks="memory,temperature",
        node_reset_gpu_reset_cgroup=" ", node_reset_gpu_reset_users="root,"))
    assert problems == [
        'node_reset_gpu_reset_gpus has "x": a GPU is an index (a non-negative integer such as 0) or a UUID'
        " (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).",
        'node_reset_nvml_verify_gpus has "\\u00b2", "True": a GPU is an index (a non-negative integer such as 0) or'
        " a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).",
        'node_reset_nvml_verify_checks has "temperature": the checks are %s.' % ", ".join(nvml_verify.CHECKS),
        'node_reset_gpu_reset_cgroup is " ": an empty cgroup text would match every process; leave it unset (null)'
        " for no cgroup limit.",
        'node_reset_gpu_reset_users is "root,": an empty list or name would match no process; leave it unset (null)'
        " for any user."]
    assert node_reset_problems(values(node_reset_nvml_verify_checks=[]))[0].startswith(
        "node_reset_nvml_verify_checks is empty:")


def test_the_tmp_leftovers_options_are_checked_before_any_step():
    """Issue 37: a relative tmp_path, or a pattern that matches every name (a removal of /tmp's
    whole top level, stopped by the owner rule alone), refused in one sentence each before gpu_reset."""
    problems = node_reset_problems(values(node_reset_shm_clean_tmp_path="tmp",
                                          node_reset_shm_clean_tmp_patterns=["vllm_dist_.+", "["]))
    assert problems == [
        'node_reset_shm_clean_tmp_path is "tmp": a path must be absolute (start with /), on one line, or empty to'
        " skip it.",
        'node_reset_shm_clean_tmp_patterns has "[": not a regular expression (unterminated character set at'
        " position 0)."]
    assert node_reset_problems(values(node_reset_shm_clean_tmp_patterns=["vllm_dist_.+", ".*"])) == [
        'node_reset_shm_clean_tmp_patterns has ".*": it matches an empty name, . or ..; a pattern must name'
        " leftovers only."]
    assert node_reset_problems(values(node_reset_shm_clean_tmp_path="")) == []


def test_a_proxmox_node_needs_its_vmid_and_a_place_in_the_inventory():
    assert node_reset_problems(values(node_reset_pve_host="pve1", node_reset_pve_vmid=129)) == []
    assert node_reset_problems(values(node_reset_pve_host="pve1", node_reset_pve_vmid=129), pve_host_known=False) == [
        'node_reset_pve_host "pve1" is not a host of the inventory.']
    assert node_reset_problems(values(node_reset_pve_vmid="129")) == [
        'node_reset_pve_host ("") and node_reset_pve_vmid ("129") must be given together.']


def test_not_a_mapping_is_a_type_error():
    with pytest.raises(TypeError):
        node_reset_problems(["node_reset_gpu_reset_grace_period"])
    with pytest.raises(TypeError):
        node_reset_result(None, "node1")


# ----- the result -----

GPU_CLEAN = {"index": 0, "uuid": "GPU-a", "memory_used_mib": 0, "problems": []}
GPU_DIRTY = {"index": 0, "uuid": "GPU-a", "memory_used_mib": 9000, "problems": ["GPU 0 (GPU-a, 0:1): 9000 MiB used"]}
SKIPPED = {"skipped": True, "changed": False}


def steps(**changed):
    base = {"pve_reach": {}, "deps": {}, "nvml_before": {}, "unit": {},
            "gpu_reset": {"changed": True, "killed": [{"pid": 7}, {"pid": 8}], "targets": [{"pid": 7}, {"pid": 8}],
                          "memory_before": [dict(GPU_CLEAN, memory_used_mib=80000)], "elapsed_s": 3.2},
            "shm_clean": {"changed": True, "removed": [{"path": "/dev/shm/nccl-1"}], "bytes_freed": 4096},
            "pycache_purge": SKIPPED,
            "nvml_verify": {"ok": True, "gpus": [GPU_CLEAN], "count": 1, "problems": [], "waited_s": 0.4},
            "pve_sweep": {}}
    base.update(changed)
    return base


def test_a_reset_that_cleaned_the_node_and_its_report_row():
    result = node_reset_result(steps(), "node1", started=100.0, now=104.256)
    assert {key: result[key] for key in ("host", "kind", "status", "ok", "changed", "failed_step", "error",
                                         "killed_count", "shm_bytes_freed", "shm_removed", "bytecode_removed",
                                         "problems", "unit", "seconds_total")} == {
        "host": "node1", "kind": "reset", "status": "ok", "ok": True, "changed": True, "failed_step": None,
        "error": None, "killed_count": 2, "shm_bytes_freed": 4096, "shm_removed": 1, "bytecode_removed": 0,
        "problems": [], "unit": {}, "seconds_total": 4.26}
    assert sorted(result["steps"]) == ["evidence", "gpu_reset", "nvml_before", "nvml_verify", "pve_sweep", "pycache_purge",
                                       "shm_before", "shm_clean", "unit"]
    row = host_row("node1", result)
    assert row["mib_freed"] == 80000 and row["killed"] == 2 and row["seconds"] == 3.6  # its steps, not seconds_total
    assert row["seconds_per_step"] == {"gpu_reset": 3.2, "nvml_verify": 0.4}


def test_evidence_that_could_not_be_kept_is_said_in_the_row_and_the_reset_is_still_ok():
    """The evidence never holds a reset back, and is never lost silently: a module that failed (here
    an unwritable base) says why in `not_kept`; one that kept its files names the directory."""
    failed = {"failed": True, "changed": False, "msg": "the evidence could not be kept in /x: Permission denied"}
    result = node_reset_result(steps(evidence=failed), "node1")
    assert result["ok"] and result["status"] == "ok" and result["failed_step"] is None
    assert host_row("node1", result)["evidence"] == {"directory": None, "not_kept": [failed["msg"]]}
    kept = {"changed": True, "directory": "/e/20260105T100000Z-vllm.service", "elapsed_s": 0.5,
            "notes": ["py-spy is not installed at /usr/local/bin/py-spy: no stack was kept"]}
    row = host_row("node1", node_reset_result(steps(evidence=kept), "node1"))
    assert row["evidence"] == {"directory": kept["directory"], "not_kept": kept["notes"]}
    assert row["seconds_per_step"]["evidence"] == 0.5


def test_gpus_that_stay_dirty_say_why():
    result = node_reset_result(steps(nvml_verify={"ok": False, "gpus": [GPU_DIRTY], "problems": ["count 1, not 2"]}),
                               "node1")
    assert result["status"] == "dirty" and not result["ok"]
    assert result["problems"] == ["count 1, not 2", "GPU 0 (GPU-a, 0:1): 9000 MiB used"]


def test_nvml_that_failed_outright_is_named_by_its_message():
    result = node_reset_result(steps(nvml_verify={"failed": True, "msg": "NVML: driver not loaded"}), "node1")
    assert result["status"] == "dirty" and result["problems"] == ["NVML: driver not loaded"]


def test_a_refused_variable_reports_only_why_whatever_an_earlier_run_left():
    result = node_reset_result(steps(), "node1", failed_step="validate", invalid=["x is -1: it must be ..."],
                               failed_result={"msg": "node_reset: x is -1"})
    assert result["status"] == "invalid" and result["problems"] == ["x is -1: it must be ..."]
    assert not result["changed"] and result["killed"] == [] and result["error"] is None
    assert all(step == {} for step in result["steps"].values())


def test_a_failed_step_keeps_what_was_done_before_it():
    result = node_reset_result(steps(shm_clean={"failed": True, "msg": "EROFS"}, nvml_verify={}), "node1",
                               failed_step="shm_clean", failed_result={"msg": "EROFS"})
    assert result["status"] == "failed at shm_clean" and result["error"] == "EROFS"
    assert result["changed"] and result["killed_count"] == 2 and not result["ok"]


def test_a_host_that_stopped_answering_is_unreachable_with_the_first_message():
    unreachable = {"unreachable": True, "msg": "ssh: connect to host 10.0.0.3 port 22: No route to host"}
    result = node_reset_result(steps(gpu_reset=unreachable, shm_clean=SKIPPED, nvml_verify=SKIPPED), "node3")
    assert result["status"] == "unreachable" and result["failed_step"] == "unreachable"
    assert result["problems"] == ["unreachable: ssh: connect to host 10.0.0.3 port 22: No route to host"]
    assert result["error"] is None and not result["ok"]


def test_a_swept_container_is_ok_only_when_the_sweep_left_nobody():
    reach = {"unreachable": True, "msg": "timed out"}
    swept = steps(pve_reach=reach, gpu_reset={}, shm_clean={}, nvml_verify={},
                  pve_sweep={"changed": True, "killed": [{"pid": 70}], "survivors": []})
    result = node_reset_result(swept, "ct129")
    assert result["status"] == "swept-unreachable" and result["ok"] and result["killed_count"] == 1
    assert result["problems"] == ["unreachable: timed out"]
    swept["pve_sweep"] = {"changed": True, "killed": [], "survivors": [{"pid": 71}]}
    assert not node_reset_result(swept, "ct129")["ok"]
    swept["pve_sweep"] = {"failed": True, "msg": "no python on the node"}
    assert not node_reset_result(swept, "ct129")["ok"]


def test_a_verify_run_is_clean_only_when_a_reset_would_do_nothing():
    would = steps(gpu_reset={"changed": False, "targets": [{"pid": 7}], "killed": []},
                  shm_clean={"changed": False, "removed": [{"path": "x"}], "bytes_freed": 4096},
                  pycache_purge={"changed": False, "removed": [{"path": "y.pyc"}]})
    result = node_reset_result(would, "node1", kind="verify", read_only=True)
    assert result["status"] == "dirty" and result["killed_count"] == 1 and not result["changed"]
    # In the reset's order (the steps' registry).
    assert result["problems"] == ["a reset would remove 1 bytecode file",
                                  "a reset would stop 1 process",
                                  "a reset would remove 1 leftover file, 4.0 KiB"]
    clean = steps(gpu_reset={"targets": []}, shm_clean={"removed": []})
    assert node_reset_result(clean, "node1", kind="verify", read_only=True)["status"] == "clean"


def test_the_unit_found_and_stopped_or_missing():
    stopped = node_reset_result(steps(unit={"changed": True, "status": {"ActiveState": "active"}}), "n",
                                unit="vllm.service")
    assert stopped["unit"] == {"name": "vllm.service", "found": True, "was": "active", "stopped": True, "note": ""}
    assert stopped["steps"]["unit"] == stopped["unit"] and stopped["changed"]
    missing = node_reset_result(steps(unit={"failed": False, "failed_when_result": False,
                                            "msg": "Could not find the requested service vllm.service: host"},
                                      gpu_reset={"changed": False}, shm_clean={"changed": False}), "n",
                                unit="vllm.service")
    assert missing["unit"] == {"name": "vllm.service", "found": False, "was": "inactive", "stopped": False,
                               "note": "unit vllm.service does not exist: skipped"}
    assert not missing["changed"]


def test_a_refusal_of_pycache_purge_run_first_is_invalid_and_a_failed_removal_is_a_failure():
    """pycache_purge is the first module step: failing before it removed anything (no `errors`),
    with no unit stopped before it, nothing was touched: `invalid`, as a host check's refusal."""
    refused = {"failed": True, "msg": "module 'vlm' not found", "_ansible_parsed": True}
    result = node_reset_result(steps(pycache_purge=refused), "n", failed_step="pycache_purge", failed_result=refused)
    assert result["status"] == "invalid" and result["problems"][0].startswith("module 'vlm' not found ("), result
    removal = {"failed": True, "msg": "could not remove 1 stale bytecode file(s): /x.pyc: Permission denied",
               "removed": [], "errors": [{"path": "/x.pyc", "error": "Permission denied"}]}
    result = node_reset_result(steps(pycache_purge=removal), "n", failed_step="pycache_purge", failed_result=removal)
    assert result["status"] == "failed at pycache_purge" and "Permission denied" in result["error"], result
    stopped = {"changed": True, "status": {"ActiveState": "active"}}
    result = node_reset_result(steps(unit=stopped, pycache_purge=refused), "n", unit="vllm.service",
                               failed_step="pycache_purge", failed_result=refused)
    assert result["status"] == "failed at pycache_purge", result
    crashed = {"failed": True, "msg": "MODULE FAILURE", "module_stderr": "Traceback"}
    result = node_reset_result(steps(pycache_purge=crashed), "n", failed_step="pycache_purge", failed_result=crashed)
    assert result["status"] == "failed at pycache_purge", result


def test_a_failed_sweep_from_the_proxmox_node_is_the_failed_step():
    """The sweep runs in the role's rescue with its failure ignored (a failure there would end the
    host without its result): the result says it failed there, with its message."""
    sweep = {"failed": True, "msg": "1 target(s) not stopped:\n4242 python3", "killed": [], "survivors": [{"pid": 4242}]}
    dirty = {"ok": False, "gpus": [], "problems": ["GPU 0: 80000 MiB used"], "msg": "GPU 0: 80000 MiB used"}
    result = node_reset_result(steps(pve_sweep=sweep, nvml_verify=dirty), "ct", failed_step=None)
    assert result["status"] == "failed at pve_sweep" and result["failed_step"] == "pve_sweep", result
    assert "not stopped" in result["error"] and not result["ok"]
    swept = {"changed": True, "killed": [{"pid": 4242}], "survivors": []}
    result = node_reset_result(steps(pve_sweep=swept), "ct", failed_step=None)
    assert result["status"] == "ok" and len(result["killed"]) == 3, result


def test_a_start_time_that_is_no_number_gives_zero_seconds():
    assert node_reset_result(steps(), "n", started="soon", now=5.0)["seconds_total"] == 0.0
    assert node_reset_result(steps(), "n", started=math.nan, now=5.0)["seconds_total"] == 0.0


def test_a_host_check_that_refused_an_input_is_invalid_and_one_that_could_not_run_is_failed():
    refused = {"failed": True, "msg": "module 'vlm' not found", "exception": "(traceback unavailable)",
               "_ansible_parsed": True}
    result = node_reset_result(steps(), "n", failed_step="pycache_check", failed_result=refused)
    assert result["status"] == "invalid" and result["problems"][0].startswith("module 'vlm' not found ("), result
    assert result["error"] is None
    broken = {"failed": True, "msg": "The module interpreter '/x' was not found.", "module_stderr": "not found",
              "rc": 127}
    result = node_reset_result(steps(), "n", failed_step="pycache_check", failed_result=broken)
    assert result["status"] == "failed at pycache_check" and result["error"].startswith("The module interpreter")
    selection = {"failed": True, "msg": "unknown GPU '9': this host has GPU indices 0-3"}
    assert node_reset_result(steps(), "n", failed_step="nvml_before", failed_result=selection)["status"] == "invalid"


# ----- issue 24: each reason a host is not clean, alone; the statuses that count ok -----

@pytest.mark.parametrize("would, problem", [
    ({"gpu_reset": {"changed": False, "targets": [{"pid": 7}], "killed": []}}, "a reset would stop 1 process"),
    ({"shm_clean": {"changed": False, "removed": [{"path": "x"}], "bytes_freed": 4096}},
     "a reset would remove 1 leftover file, 4.0 KiB"),
    ({"pycache_purge": {"changed": False, "removed": [{"path": "y.pyc"}]}}, "a reset would remove 1 bytecode file"),
])
def test_a_verify_run_with_one_thing_left_for_a_reset_is_dirty_and_not_ok(would, problem):
    """GPUs that NVML reads clean are not enough: one process, segment or bytecode file that a
    reset would remove makes the host dirty, and the report says which."""
    quiet = {"gpu_reset": {"changed": False, "targets": [], "killed": []},
             "shm_clean": {"changed": False, "removed": []}, "pycache_purge": SKIPPED}
    result = node_reset_result(steps(**dict(quiet, **would)), "node1", kind="verify", read_only=True)
    assert result["status"] == "dirty" and not result["ok"]
    assert result["problems"] == [problem]
    assert host_row("node1", result, read_only=True)["ok"] is False


def test_a_clean_verify_is_ok_and_its_row_too():
    clean = steps(gpu_reset={"changed": False, "targets": [], "killed": []},
                  shm_clean={"changed": False, "removed": []})
    result = node_reset_result(clean, "node1", kind="verify", read_only=True)
    assert result["status"] == "clean" and result["ok"] and result["problems"] == []
    assert host_row("node1", result, read_only=True)["ok"] is True


def test_a_host_that_stops_answering_during_the_final_check_is_unreachable_not_dirty():
    lost = {"unreachable": True, "msg": "ssh: connect to host 10.0.0.3 port 22: Connection timed out"}
    result = node_reset_result(steps(nvml_verify=lost), "node3")
    assert result["status"] == "unreachable" and not result["ok"]
    assert result["problems"] == ["unreachable: ssh: connect to host 10.0.0.3 port 22: Connection timed out"]


def test_a_sweep_from_the_proxmox_node_that_killed_a_process_is_a_change():
    swept = {"changed": True, "killed": [{"pid": 4242}], "survivors": []}
    quiet = steps(gpu_reset={"changed": False, "killed": [], "targets": []}, shm_clean={"changed": False},
                  pve_sweep=swept)
    result = node_reset_result(quiet, "ct129")
    assert result["changed"] and result["killed_count"] == 1 and result["ok"]


def test_a_skipped_unit_stop_reports_no_unit_state():
    """A check-mode run skips the stop: the result says nothing about the unit rather than that it
    was found inactive."""
    result = node_reset_result(steps(unit={"skipped": True, "changed": False}), "n", unit="vllm.service")
    assert result["unit"] == {} and result["steps"]["unit"] == {}


@pytest.mark.parametrize("name, value", [
    ("node_reset_gpu_reset_gpus", ["0 1"]),
    ("node_reset_gpu_reset_gpus", ["1-3"]),
    ("node_reset_nvml_verify_gpus", ["0x1"]),
    ("node_reset_nvml_verify_gpus", ["GPU-12345678-1234-1234-1234-123456789abcd"]),
])
def test_a_gpu_selector_with_something_after_a_valid_start_is_refused(name, value):
    problems = node_reset_problems(values(**{name: value}))
    assert len(problems) == 1 and problems[0].startswith("%s has " % name), problems


def test_an_empty_user_list_is_refused_since_it_would_match_no_process():
    assert node_reset_problems(values(node_reset_gpu_reset_users=[])) == [
        "node_reset_gpu_reset_users is []: an empty list or name would match no process; leave it unset (null)"
        " for any user."]


def test_a_module_not_found_names_the_fix_for_a_server_in_a_venv_of_its_own():
    """The example inventory's node_reset_pycache_purge_modules: [vllm] refuses every host whose
    vLLM lives in a venv: the problem says which variable fixes it (issue 29). Other refusals
    (a missing path) are said as the host said them."""
    missing = {"failed": True, "msg": "module 'vllm' not found: no 'vllm' in the sys.path of /usr/bin/python3",
               "_ansible_parsed": True}
    for step in ("pycache_check", "pycache_purge"):
        result = node_reset_result(steps(pycache_purge=missing) if step == "pycache_purge" else steps(), "n",
                                   kind="verify", read_only=True, failed_step=step, failed_result=missing)
        assert result["status"] == "invalid", result
        assert "set node_reset_pycache_purge_python to that venv's python" in result["problems"][0], result
    path = {"failed": True, "msg": "path '/opt/x' does not exist", "_ansible_parsed": True}
    result = node_reset_result(steps(), "n", failed_step="pycache_check", failed_result=path)
    assert result["problems"] == ["path '/opt/x' does not exist"], result


# --- several servers on one node: node_reset_units and the spared units and GPUs ----------------

def test_the_other_units_each_say_what_happened_and_units_stopped_names_them():
    """node_reset_units runs as a loop: each item's systemd_service result becomes a unit entry,
    a missing unit is a note and not stopped, and units_stopped names every unit the run stopped."""
    loop = {"changed": True, "results": [
        {"item": "vllm-a.service", "changed": True, "status": {"ActiveState": "active"}},
        {"item": "vllm-c.service", "changed": False, "failed": False,
         "msg": "Could not find the requested service vllm-c.service: host"},
        {"item": "vllm-d.service", "changed": False, "status": {"ActiveState": "inactive"}}]}
    result = node_reset_result(steps(unit={"changed": True, "status": {"ActiveState": "failed"}}, units=loop), "n",
                               unit="vllm.service", units=["vllm-a.service", "vllm-c.service", "vllm-d.service"])
    assert result["units"] == [
        {"name": "vllm-a.service", "found": True, "was": "active", "stopped": True, "note": ""},
        {"name": "vllm-c.service", "found": False, "was": "inactive", "stopped": False,
         "note": "unit vllm-c.service does not exist: skipped"},
        {"name": "vllm-d.service", "found": True, "was": "inactive", "stopped": False, "note": ""}]
    assert result["units_stopped"] == ["vllm.service", "vllm-a.service"]
    alone = node_reset_result(steps(units=loop, gpu_reset={"changed": False}), "n", units=["vllm-a.service"])
    assert alone["changed"] and alone["units_stopped"] == ["vllm-a.service"] and alone["unit"] == {}
    # A unit stopped before pycache_purge refused its input: something was touched, so not `invalid`.
    refused = {"failed": True, "msg": "module 'vlm' not found", "_ansible_parsed": True}
    result = node_reset_result(steps(units=loop, pycache_purge=refused), "n", units=["vllm-a.service"],
                               failed_step="pycache_purge", failed_result=refused)
    assert result["status"] == "failed at pycache_purge", result


def test_no_other_units_and_a_host_that_stopped_answering_in_their_loop():
    none = node_reset_result(steps(units={"skipped": True, "results": []}), "n", units=[])
    assert none["units"] == [] and none["units_stopped"] == []
    gone = node_reset_result(steps(units={"unreachable": True, "msg": "ssh: timed out"}), "n", units=["vllm-a.service"])
    assert gone["status"] == "unreachable" and gone["problems"] == ["unreachable: ssh: timed out"], gone


@pytest.mark.parametrize("changed, sentence", [
    ({"node_reset_units": ["", "a/b", "vllm-a.service\n", "$(reboot)", 5, None, {"a": 1}, ".service", "x" * 256]},
     'node_reset_units has "", "a/b", "vllm-a.service\\n", "$(reboot)", 5, null, {"a": 1}, ".service", "%s": a unit is a'
     " systemd unit name such as vllm-a.service, on one line." % ("x" * 256)),
    ({"node_reset_gpu_reset_spare_units": ["vllm-b", "/", "vllm-b.timer", "vllm b.service", "@/%$", "\udcff.service"]},
     'node_reset_gpu_reset_spare_units has "vllm-b", "/", "vllm-b.timer", "vllm b.service", "@/%$", "\\udcff.service": a'
     " unit is a systemd unit name with the suffix of a unit that holds processes (.service, .scope, .slice), such as"
     " vllm-b.service."),
    ({"node_reset_units": ["vllm-a"], "node_reset_gpu_reset_spare_units": ["vllm-a.service", "vllm-b.service"]},
     'node_reset_gpu_reset_spare_units has "vllm-a.service", which node_reset_unit or node_reset_units stops: a unit'
     " cannot be stopped and spared at once."),
    ({"node_reset_unit": "vllm-b.service", "node_reset_gpu_reset_spare_units": ["vllm-b.service"]},
     'node_reset_gpu_reset_spare_units has "vllm-b.service", which node_reset_unit or node_reset_units stops'),
    ({"node_reset_gpu_reset_gpus": ["0", "1", "GPU-5F0C8A1E-0000-4000-8000-000000000000"],
      "node_reset_gpu_reset_spare_gpus": ["1", "2", "GPU-5f0c8a1e-0000-4000-8000-000000000000"]},
     'node_reset_gpu_reset_spare_gpus has "1", "GPU-5F0C8A1E-0000-4000-8000-000000000000", which node_reset_gpu_reset_gpus or node_reset_nvml_verify_gpus'
     " also names: a GPU cannot be reset and spared at once."),
    ({"node_reset_nvml_verify_gpus": ["3"], "node_reset_gpu_reset_spare_gpus": ["3"]},
     'node_reset_gpu_reset_spare_gpus has "3", which node_reset_gpu_reset_gpus or node_reset_nvml_verify_gpus'),
    ({"node_reset_gpu_reset_spare_gpus": ["-1", "nan", "inf", "1e9", "\u00b2", ""]},
     'node_reset_gpu_reset_spare_gpus has "-1", "nan", "inf", "1e9", "\\u00b2", "": a GPU is an index'),
])
def test_units_and_spared_gpus_are_checked_one_sentence_each(changed, sentence):
    problems = node_reset_problems(values(**changed))
    assert len(problems) == 1 and problems[0].startswith(sentence), problems


def test_units_and_spared_gpus_that_are_fine_pass():
    assert node_reset_problems(values(
        node_reset_units=["vllm-a.service", "vllm@c.service", "vllm-e"], node_reset_gpu_reset_gpus=["0", "1"],
        node_reset_gpu_reset_spare_units=["vllm-b.service", "vllm@d.service", "serving.slice", "run-x.scope"],
        node_reset_gpu_reset_spare_gpus=["2", "GPU-5f0c8a1e-0000-4000-8000-000000000000"])) == []
    # -e gives a string: a comma-separated list, as Ansible reads it.
    assert node_reset_problems(values(node_reset_units="vllm-a.service,vllm-c.service",
                                      node_reset_gpu_reset_spare_units="vllm-b.service")) == []
