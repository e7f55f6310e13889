"""The node_reset steps' registry (plugins/plugin_utils/_node_reset_steps.py) and what is built from
it: the modules' arguments from the role's variables, the ranges the role shares with the modules,
what fails a host, and the generated step list and ranges in the docs and the argument spec."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import host_row
from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import (node_reset_problems, node_reset_result,
                                                                          node_reset_step_args, node_reset_sweep_args,
                                                                          variables)
from ansible_collections.cleanslate.gpu.plugins.module_utils import _ranges
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _node_reset_steps as steps

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "node_reset"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
SPEC = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def module_options(module: str) -> dict:
    """A module's documented options (its DOCUMENTATION, which sanity checks against its argument spec)."""
    text = (REPO / "plugins" / "modules" / ("%s.py" % module)).read_text()
    return yaml.safe_load(text.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])["options"]


def values(**changed):
    base = {name: DEFAULTS[name] for name in variables()}
    base.update(changed)
    return base


@pytest.mark.parametrize("step", steps.MODULE_STEPS, ids=lambda step: step.module)
def test_each_step_passes_only_options_its_module_has_with_the_same_type(step):
    documented = module_options(step.module)
    assert set(step.options) <= set(documented)
    for option in step.options:
        role, module = SPEC[step.variable(option)], documented[option]
        assert role.get("type", "str") == module.get("type", "str"), option
        assert role.get("elements") == module.get("elements"), option
        assert role.get("choices") == module.get("choices"), option


def test_every_role_variable_named_after_a_module_option_reaches_its_module():
    named = [name for name in SPEC if any(name.startswith("node_reset_%s_" % module) for module in steps.MODULES)]
    assert sorted(named) == sorted(steps.role_variables())


def test_the_defaults_give_each_module_its_options_and_leave_out_what_is_unset():
    args = node_reset_step_args(values())
    assert list(args) == ["gpu_reset", "shm_clean", "nvml_verify"]  # no bytecode targets: no pycache_purge
    assert args["gpu_reset"] == {
        "device_paths": ["/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/nvidia-uvm*", "/dev/nvidia-caps/*"], "gpus": [],
        "cmdline_patterns": [], "protect_names": DEFAULTS["node_reset_gpu_reset_protect_names"], "spare_units": [],
        "spare_gpus": [], "include_children": True, "grace_period": 30, "kill_timeout": 10}  # cgroup and users null: no limit
    assert args["shm_clean"] == {"path": "/dev/shm", "patterns": DEFAULTS["node_reset_shm_clean_patterns"],
                                 "exclude": [], "min_age": 0, "remove_in_use": False, "tmp_path": "/tmp",
                                 "tmp_patterns": DEFAULTS["node_reset_shm_clean_tmp_patterns"], "tmp_owners": []}
    # tmp_path empty: no pass over it, and the module wants the option absent.
    assert "tmp_path" not in node_reset_step_args(values(node_reset_shm_clean_tmp_path=""))["shm_clean"]
    # expected_count 0 is the role's "no count check": the module wants it absent (it refuses 0).
    assert args["nvml_verify"] == {"gpus": [], "max_memory_used_mib": 16, "allow_processes": False, "timeout": 30,
                                   "poll_interval": 0.1, "checks": DEFAULTS["node_reset_nvml_verify_checks"],
                                   "xid_since": ""}  # xid_log_path unset: the host's own kernel log


def test_bytecode_targets_run_the_first_step_with_only_the_options_given():
    args = node_reset_step_args(values(node_reset_pycache_purge_paths=["/opt/vllm"]))
    assert list(args) == ["pycache_purge", "gpu_reset", "shm_clean", "nvml_verify"]
    assert args["pycache_purge"] == {"paths": ["/opt/vllm"], "mode": "stale"}
    args = node_reset_step_args(values(node_reset_pycache_purge_modules=["vllm"], node_reset_pycache_purge_python="/usr/bin/python3",
                                       node_reset_nvml_verify_expected_count="8", node_reset_gpu_reset_cgroup="/lxc/1/",
                                       node_reset_gpu_reset_users=["vllm"]))
    assert args["pycache_purge"] == {"modules": ["vllm"], "python": "/usr/bin/python3", "mode": "stale"}
    assert args["nvml_verify"]["expected_count"] == "8"
    assert args["gpu_reset"]["cgroup"] == "/lxc/1/" and args["gpu_reset"]["users"] == ["vllm"]


def test_the_xid_window_and_a_fed_kernel_log_reach_nvml_verify():
    # Without xid_since an Xid 79 cleared by a reboot earlier in the boot would still block the GPU.
    args = node_reset_step_args(values(node_reset_nvml_verify_xid_since="-2h",
                                       node_reset_nvml_verify_xid_log_path="/var/log/kern.log"))["nvml_verify"]
    assert args["xid_since"] == "-2h" and args["xid_log_path"] == "/var/log/kern.log"
    assert "xid_log_path" not in node_reset_step_args(values(node_reset_nvml_verify_xid_log_path=""))["nvml_verify"]


def test_a_check_reads_the_gpus_once_and_a_container_waits_at_most_sweep_after():
    assert node_reset_step_args(values(), read_only=True)["nvml_verify"]["timeout"] == 0
    assert node_reset_step_args(values(), pve=True)["nvml_verify"]["timeout"] == 5
    assert node_reset_step_args(values(node_reset_nvml_verify_timeout=2), pve=True)["nvml_verify"]["timeout"] == 2
    # A check of a container reads once too; bad numbers pass through untouched (the role refused them already).
    assert node_reset_step_args(values(), read_only=True, pve=True)["nvml_verify"]["timeout"] == 0
    bad = node_reset_step_args(values(node_reset_pve_sweep_after="nan"), pve=True)["nvml_verify"]["timeout"]
    assert bad == 30


def test_the_nodes_sweep_is_scoped_to_the_containers_cgroup_and_ignores_its_selection():
    sweep = node_reset_sweep_args(values(node_reset_pve_vmid=129, node_reset_gpu_reset_gpus=["0"],
                                         node_reset_gpu_reset_users=["vllm"], node_reset_gpu_reset_cgroup="/x/"))
    assert sweep["gpu_reset"]["cgroup"] == "/lxc/129/"
    assert "gpus" not in sweep["gpu_reset"] and "users" not in sweep["gpu_reset"]
    assert sweep["gpu_reset"]["grace_period"] == 30 and sweep["nvml_verify"]["timeout"] == 30
    sweep = node_reset_sweep_args(values(node_reset_pve_vmid=129, node_reset_pve_cgroup="/lxc.payload.129/"))
    assert sweep["gpu_reset"]["cgroup"] == "/lxc.payload.129/"


@pytest.mark.parametrize("variable", sorted(steps.number_rules()))
def test_the_role_and_its_module_refuse_and_accept_the_same_numbers(variable):
    module = next(step.module for step in steps.MODULE_STEPS if variable in map(step.variable, step.options))
    option = variable[len("node_reset_%s_" % module):]
    rule = _ranges.RANGES[module][option]
    low = rule.above if rule.above is not None else rule.minimum
    for value, good in ((rule.maximum, True), (rule.maximum + 1, False), (low - 1, False), (math.nan, False)):
        role = node_reset_problems(values(**{variable: value}))
        module_says = _ranges.problem(module, option, value)
        if variable == "node_reset_nvml_verify_expected_count" and value == 0:
            continue  # the role's "no check": the option is left out
        assert (role == []) == good == (module_says is None), (value, role, module_says)
    if rule.above is None:
        assert _ranges.problem(module, option, low) is None


@pytest.mark.parametrize("kind, read_only, status, fails", [
    ("reset", True, "dirty", False),   # check mode stopped nothing: what a reset would clean
    ("reset", False, "dirty", True),
    ("verify", True, "dirty", True),   # a check's verdict is the point of the check
    ("reset", True, "failed at gpu_reset", True),
    ("reset", False, "ok", False),
])
def test_one_rule_says_what_fails_a_host_and_the_report_row_carries_it(kind, read_only, status, fails):
    verify = {"ok": status == "ok", "gpus": [], "problems": [] if status == "ok" else ["GPU 0: in use"]}
    failed = status.startswith("failed")
    result = node_reset_result({"nvml_verify": verify, "gpu_reset": {"targets": []}}, "node1", kind=kind,
                               read_only=read_only, failed_step="gpu_reset" if failed else None,
                               failed_result={"msg": "boom"} if failed else None)
    assert result["status"] == status and result["fails_host"] is fails
    assert host_row("node1", result, read_only=read_only)["fails_host"] is fails


def test_a_host_that_needed_no_reset_is_ok_with_its_note_and_a_refused_one_invalid():
    healthy = node_reset_result({}, "node2", note="server slow (/health 200 in 12 s): no reset")
    assert (healthy["status"], healthy["ok"], healthy["fails_host"]) == ("ok", True, False)
    assert healthy["note"] == "server slow (/health 200 in 12 s): no reset" and healthy["killed_count"] == 0
    refused = node_reset_result({}, "node5", invalid=["inference_service_port is 0: ..."], note="ignored")
    assert (refused["status"], refused["ok"], refused["fails_host"]) == ("invalid", False, True)
    assert refused["problems"] == ["inference_service_port is 0: ..."]


def test_the_docs_and_the_argument_spec_say_the_registrys_order_and_ranges():
    """A step moved in the registry shows in both files (that they are current: tests/unit/test_generate.py)."""
    from tools import gen_node_reset_docs as gen  # pylint: disable=import-outside-toplevel

    class Moved:
        MODULE_STEPS = steps.MODULE_STEPS[1:] + steps.MODULE_STEPS[:1]
    doc = (REPO / "docs" / "node_reset.md").read_text()
    rules = gen.sources(REPO)[1]
    lines = gen.doc_text(doc, Moved, rules).split("\n")
    assert next(line for line in lines if line.startswith("2. ")).startswith("2. **gpu_reset**")
    spec = gen.spec_text((REPO / SPEC_PATH).read_text(), Moved, dict(rules, node_reset_pve_sweep_after="x"),
                         gen.from_modules(REPO, Moved))
    assert "in this order. gpu_reset, to stop" in " ".join(spec.split())
    assert "- The range is x." in spec


SPEC_PATH = Path("roles") / "node_reset" / "meta" / "argument_specs.yml"


def test_a_step_added_to_the_registry_that_acts_counts_in_changed_and_in_what_a_reset_would_do(monkeypatch):
    """A new acting step is one `Step`: node_reset_result's `changed` and a read-only run's sentences
    read every step that acts from the registry, none by name."""
    fence = steps.Step("gpu_fence", ("gpus",), "fence the GPUs' device files", found="fenced", would="fence",
                       found_words="device file", found_bytes="bytes_locked")
    assert fence.acts and not steps.BY_MODULE["nvml_verify"].acts
    monkeypatch.setattr(steps, "MODULE_STEPS", steps.MODULE_STEPS + (fence,))
    verify = {"ok": True, "gpus": []}
    done = node_reset_result({"gpu_fence": {"changed": True, "fenced": []}, "nvml_verify": verify}, "node1")
    assert done["status"] == "ok" and done["changed"] is True
    would = node_reset_result({"gpu_fence": {"changed": False, "fenced": ["/dev/nvidia0", "/dev/nvidia1"],
                                             "bytes_locked": 2048}, "nvml_verify": verify},
                              "node1", kind="verify", read_only=True)
    assert (would["status"], would["changed"]) == ("dirty", False)
    assert would["problems"] == ["a reset would fence 2 device files, 2.0 KiB"]


def test_a_step_that_lists_what_it_acts_on_must_say_it_in_words():
    with pytest.raises(ValueError, match="gpu_fence lists fenced"):
        steps.Step("gpu_fence", ("gpus",), "fence the GPUs", found="fenced")


def test_the_spared_units_and_gpus_reach_gpu_reset_and_the_units_the_proxmox_sweep():
    """A container's sweep runs on its node, where the container's GPU indices mean nothing but its
    units' names still end its processes' cgroup paths: spare_units goes along, spare_gpus not."""
    chosen = values(node_reset_gpu_reset_spare_units=["vllm-b.service"], node_reset_gpu_reset_spare_gpus=["2", "3"])
    args = node_reset_step_args(chosen)["gpu_reset"]
    assert args["spare_units"] == ["vllm-b.service"] and args["spare_gpus"] == ["2", "3"]
    sweep = node_reset_sweep_args(dict(chosen, node_reset_pve_vmid=129))["gpu_reset"]
    assert sweep["spare_units"] == ["vllm-b.service"] and "spare_gpus" not in sweep and sweep["cgroup"] == "/lxc/129/"
