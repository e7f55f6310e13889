"""node_reset's variables: meta/argument_specs.yml and defaults/main.yml stay in step, and bad
values are rejected before anything runs (the crashed node is left exactly as it was)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES, words
from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml_verify_module as nvml_verify
from tests import sim
from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "node_reset"
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
# A module option's rule as the role's sentences state it (the ranges are _ranges.py's).
GRACE = words(RANGES["gpu_reset"]["grace_period"])
POLL = words(RANGES["nvml_verify"]["poll_interval"])
PYTHON_TYPES = {"str": str, "path": str, "bool": bool, "int": int, "float": (int, float), "list": list, "dict": dict}


def test_every_variable_is_declared_with_a_type_and_the_same_default():
    options = SPECS["main"]["options"]
    assert sorted(options) == sorted(DEFAULTS), "declared in one file only: %s" % sorted(
        set(options).symmetric_difference(DEFAULTS))
    for name, spec in options.items():
        assert name.startswith("node_reset_"), name
        assert spec.get("description"), name
        # No default in the spec: "not given" (null), which the role tells from an empty value.
        assert spec.get("default") == DEFAULTS[name], name
        assert DEFAULTS[name] is None or isinstance(DEFAULTS[name], PYTHON_TYPES[spec["type"]]), name
        if "choices" in spec:
            values = DEFAULTS[name] if spec["type"] == "list" else [DEFAULTS[name]]
            assert set(values) <= set(spec["choices"]), name


def test_the_verify_entry_point_takes_the_same_variables():
    assert SPECS["verify"]["options"] == SPECS["main"]["options"]


def test_module_defaults_are_the_roles_defaults():
    """A role default that differs from its module's default would change behaviour silently."""
    sys.path.insert(0, str(REPO / ".ansible" / "collections"))
    for module, option, variable in [
        ("gpu_reset", "device_paths", "node_reset_gpu_reset_device_paths"),
        ("gpu_reset", "protect_names", "node_reset_gpu_reset_protect_names"),
        ("gpu_reset", "grace_period", "node_reset_gpu_reset_grace_period"),
        ("shm_clean", "patterns", "node_reset_shm_clean_patterns"),
        ("nvml_verify", "checks", "node_reset_nvml_verify_checks"),
        ("nvml_verify", "max_memory_used_mib", "node_reset_nvml_verify_max_memory_used_mib"),
    ]:
        doc = (REPO / "plugins" / "modules" / f"{module}.py").read_text()
        documentation = yaml.safe_load(doc.split('DOCUMENTATION = r"""')[1].split('"""')[0]
                                       if 'DOCUMENTATION = r"""' in doc else doc.split("DOCUMENTATION = r'''")[1].split("'''")[0])
        assert documentation["options"][option]["default"] == DEFAULTS[variable], (module, option)


@pytest.fixture(scope="module")
def module_node(tmp_path_factory, fake_nvml_lib):
    """One crashed node for the refusal tests: none of them may change it."""
    root = tmp_path_factory.mktemp("refusals") / "node"
    manifest = sim.crash(root, lib_dir=fake_nvml_lib)
    try:
        yield manifest
    finally:
        sim.clean(root)


def _alive(entry) -> bool:
    return procinfo.alive(entry["pid"])


def _reset(manifest, tmp_path, values=None, cli=None, playbook="reset"):
    """ansible-playbook on the simulated node: role variables from a JSON file, then `cli` as
    `-e name=value` (strings, as an operator types them). Returns (process, the report's row)."""
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(node_reset_vars(manifest, fleet_report_path=str(tmp_path / "reports"),
                                                node_reset_nvml_verify_timeout=10, **(values or {}))))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), f"playbooks/{playbook}.yml",
            "-i", "inventory/simulated.yml", "-l", "gpu_nodes", "-e", f"@{extra}"]
    for name, value in (cli or {}).items():
        argv += ["-e", f"{name}={value}"]
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    reports = sorted((tmp_path / "reports").glob(f"{playbook}-*.json"))
    row = json.loads(reports[-1].read_text())["hosts"][0] if reports else None
    return proc, row


def _not_stopped(stdout, task="Stop every process that holds a GPU") -> bool:
    """gpu_reset's task did not run: Ansible skipped it (or never reached it)."""
    return not re.search(re.escape(task) + r"\] \*+\n(ok|changed|fatal|failed)", stdout)


def _said(stdout, text) -> int:
    """How many times the output says `text`: as it is, or inside a printed JSON string (the
    report's lines, where quotes are escaped)."""
    escaped = json.dumps(text)[1:-1]
    return stdout.count(text) + (stdout.count(escaped) if escaped != text else 0)


def _untouched(manifest):
    for entries in manifest["processes"].values():
        assert all(_alive(entry) for entry in entries)
    assert all(Path(path).exists() for path in manifest["shm"]["leftovers"])
    assert Path(manifest["site_packages"]["pyc"]).exists()


@pytest.mark.parametrize("bad, message", [
    # Types and choices: the argument spec, before the role's first task.
    ({"node_reset_gpu_reset_grace_period": "soon"}, "node_reset_gpu_reset_grace_period"),
    ({"node_reset_gpu_reset_device_paths": {"not": "a list"}}, "node_reset_gpu_reset_device_paths"),
    ({"node_reset_pycache_purge_mode": "everything"}, "node_reset_pycache_purge_mode"),
    ({"node_reset_nvml_verify_checks": ["memory", "temperature"]}, "node_reset_nvml_verify_checks"),
    # Ranges: the role's first task.
    ({"node_reset_gpu_reset_grace_period": -1},
     "node_reset_gpu_reset_grace_period is -1: it must be %s." % GRACE),
    ({"node_reset_nvml_verify_poll_interval": 0},
     "node_reset_nvml_verify_poll_interval is 0: it must be %s." % POLL),
    ({"node_reset_pve_vmid": 7, "node_reset_pve_host": "pve"},
     "node_reset_pve_vmid is 7: it must be 0 (no container) or a vmid from 100 to 999999999."),
    ({"node_reset_pve_host": "no-such-node", "node_reset_pve_vmid": 129},
     'node_reset_pve_host "no-such-node" is not a host of the inventory.'),
    ({"node_reset_pve_host": "simulated-node"},
     'node_reset_pve_host ("simulated-node") and node_reset_pve_vmid (0) must be given together.'),
])
def test_a_bad_variable_is_rejected_before_anything_runs(module_node, tmp_path, bad, message):
    proc, _row = _reset(module_node, tmp_path, values=bad)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert _said(proc.stdout, message), proc.stdout[-3000:]
    assert _not_stopped(proc.stdout)
    _untouched(module_node)


@pytest.mark.parametrize("name, value, rule", [
    ("node_reset_gpu_reset_grace_period", "nan", GRACE),
    ("node_reset_gpu_reset_kill_timeout", "inf", words(RANGES["gpu_reset"]["kill_timeout"])),
    ("node_reset_shm_clean_min_age", "-inf", words(RANGES["shm_clean"]["min_age"])),
    ("node_reset_nvml_verify_timeout", "1e300", words(RANGES["nvml_verify"]["timeout"])),
    ("node_reset_nvml_verify_max_memory_used_mib", "99999999999999999999", words(RANGES["nvml_verify"]["max_memory_used_mib"])),
    ("node_reset_nvml_verify_expected_count", "100000", words(RANGES["nvml_verify"]["expected_count"]) + ", or 0 (no check)"),
    ("node_reset_pve_connect_timeout", "0", "a number of seconds from 1 to 3600"),
])
def test_a_number_typed_on_the_command_line_that_is_not_finite_or_too_large_is_refused_with_its_rule(
        module_node, tmp_path, name, value, rule):
    """`-e name=value` gives a string: it is converted before it is compared, NaN and the
    infinities fail every range, and the sentence names the variable, its value and its rule
    (not the rules of the nine others). The report says `invalid`."""
    proc, row = _reset(module_node, tmp_path, cli={name: value})
    assert proc.returncode == 2, proc.stdout[-3000:]
    sentence = f'{name} is "{value}": it must be {rule}.'
    assert _said(proc.stdout, sentence) == 1, proc.stdout[-3000:]  # once: in the report's list
    assert "not supported between" not in proc.stdout
    assert "poll_interval" not in sentence and _not_stopped(proc.stdout)
    assert row["status"] == "invalid" and row["problems"] == [sentence], row
    _untouched(module_node)


def test_two_bad_numbers_give_one_line_each(module_node, tmp_path):
    proc, row = _reset(module_node, tmp_path, cli={"node_reset_gpu_reset_grace_period": "nan",
                                                   "node_reset_nvml_verify_poll_interval": "-1"})
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row["problems"] == [
        'node_reset_gpu_reset_grace_period is "nan": it must be %s.' % GRACE,
        'node_reset_nvml_verify_poll_interval is "-1": it must be %s.' % POLL], row
    _untouched(module_node)


@pytest.mark.parametrize("bad, sentence", [
    ({"node_reset_nvml_verify_checks": []},
     "node_reset_nvml_verify_checks is empty: give at least one of %s (with none, any GPU would pass)."
     % ", ".join(nvml_verify.CHECKS)),
    # A superscript two is a digit to str.isdigit(), not an index; to_json shows it escaped.
    ({"node_reset_gpu_reset_gpus": ["0", "\u00b2", "-1"]},
     'node_reset_gpu_reset_gpus has "\\u00b2", "-1": a GPU is an index'),
    ({"node_reset_gpu_reset_gpus": ["0\n"]}, 'node_reset_gpu_reset_gpus has "0\\n": a GPU is an index'),
    ({"node_reset_nvml_verify_gpus": ["1.5", "GPU-zz", True]},
     'node_reset_nvml_verify_gpus has "1.5", "GPU-zz", "True": a GPU is an index'),
    ({"node_reset_gpu_reset_cgroup": ""},
     'node_reset_gpu_reset_cgroup is "": an empty cgroup text would match every process; leave it unset (null)'
     " for no cgroup limit."),
    ({"node_reset_gpu_reset_users": []},
     "node_reset_gpu_reset_users is []: an empty list or name would match no process; leave it unset (null)"
     " for any user."),
    ({"node_reset_gpu_reset_users": ["root", ""]}, 'node_reset_gpu_reset_users is ["root", ""]: an empty list'),
    # Several servers on one node: units to stop and to spare, GPUs to spare.
    ({"node_reset_units": ["vllm-a.service", "", "../x", "vllm-b.service\nExecStart=/bin/sh"]},
     'node_reset_units has "", "../x", "vllm-b.service\\nExecStart=/bin/sh": a unit is a systemd unit name'),
    ({"node_reset_units": ["vllm-a.service"], "node_reset_gpu_reset_spare_units": ["vllm-a.service"]},
     'node_reset_gpu_reset_spare_units has "vllm-a.service", which node_reset_unit or node_reset_units stops'),
    ({"node_reset_gpu_reset_gpus": ["0"], "node_reset_gpu_reset_spare_gpus": ["0", "1"]},
     'node_reset_gpu_reset_spare_gpus has "0", which node_reset_gpu_reset_gpus or node_reset_nvml_verify_gpus'),
])
def test_checks_selectors_and_empty_scopes_are_checked_with_the_other_inputs(module_node, tmp_path, bad, sentence):
    """An empty check list would pass any GPU, a selector that is neither an index nor a UUID
    would select nothing or the wrong card, an empty cgroup matches every process and an empty
    user list none: all refused before any step, with the other inputs."""
    proc, row = _reset(module_node, tmp_path, values=bad)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row["status"] == "invalid", row
    assert any(problem.startswith(sentence) for problem in row["problems"]), row["problems"]
    assert _not_stopped(proc.stdout) and _not_stopped(proc.stdout, "Stop the other inference units")
    _untouched(module_node)


def test_the_same_checks_guard_the_verify_playbook(module_node, tmp_path):
    proc, row = _reset(module_node, tmp_path, values={"node_reset_gpu_reset_cgroup": ""}, playbook="verify")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row["status"] == "invalid", row
    assert _not_stopped(proc.stdout, "List the processes a reset would stop")


@pytest.mark.parametrize("playbook", ["reset", "verify"])
@pytest.mark.parametrize("bad, sentence", [
    ({"node_reset_gpu_reset_grace_period": "soon"},
     'node_reset_gpu_reset_grace_period is "soon": it must be %s.' % GRACE),
    ({"node_reset_pycache_purge_mode": "everything"},
     'node_reset_pycache_purge_mode is "everything": it must be one of stale, all.'),
    ({"node_reset_gpu_reset_device_paths": {"not": "a list"}},
     'node_reset_gpu_reset_device_paths is {"not": "a list"}: it must be a list of texts.'),
    ({"node_reset_environment": ["LD_LIBRARY_PATH=/x"]},
     'node_reset_environment is ["LD_LIBRARY_PATH=/x"]: it must be a mapping of names to values.'),
    ({"node_reset_fail_host": "maybe"}, 'node_reset_fail_host is "maybe": it must be true or false.'),
])
def test_a_bad_type_or_choice_is_one_line_and_the_host_is_reported_invalid(module_node, tmp_path, playbook, bad,
                                                                           sentence):
    """Issue 17: ansible-core's validation task printed the whole argument spec (~6 KB) after the
    line that matters, and ended the host before the report (no row). Now: one sentence naming
    the variable, its value and its rule; the row says `invalid`; nothing touched."""
    proc, row = _reset(module_node, tmp_path, values=bad, playbook=playbook)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row is not None and row["status"] == "invalid" and row["problems"] == [sentence], row
    assert "argument_spec_data" not in proc.stdout and "Validating arguments against arg spec" not in proc.stdout
    assert len(proc.stdout) < 4500, len(proc.stdout)  # was about 9.3 KB with the spec
    assert _not_stopped(proc.stdout, "List the processes a reset would stop")
    assert _not_stopped(proc.stdout)
    _untouched(module_node)


def test_numbers_and_lists_typed_on_the_command_line_work(crashed_node, tmp_path):
    """Every numeric variable given as `-e name=value` (a string), and a GPU list as `0,1,2,3`:
    the checks pass and the reset cleans the node."""
    manifest = crashed_node
    proc, row = _reset(manifest, tmp_path, cli={
        "node_reset_gpu_reset_grace_period": "3", "node_reset_gpu_reset_kill_timeout": "10",
        "node_reset_shm_clean_min_age": "0", "node_reset_nvml_verify_expected_count": str(manifest["gpu_count"]),
        "node_reset_nvml_verify_max_memory_used_mib": "16", "node_reset_nvml_verify_timeout": "20",
        "node_reset_nvml_verify_poll_interval": "0.1", "node_reset_pve_vmid": "0",
        "node_reset_pve_connect_timeout": "10", "node_reset_nvml_verify_gpus": "0,1,2,3",
        "node_reset_install_deps": "false"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert row["status"] == "ok" and row["killed"] > 0, row


@pytest.mark.parametrize("bad, sentence", [
    # What only the host can tell, checked on the host before anything is stopped.
    ({"node_reset_pycache_purge_modules": ["vllm_misspelled"]}, "module 'vllm_misspelled' not found"),
    ({"node_reset_pycache_purge_paths": ["/nonexistent/site-packages"]}, "/nonexistent/site-packages"),
    ({"node_reset_nvml_verify_gpus": ["9"]}, "unknown GPU '9': this host has GPU indices 0-3"),
    # What the controller can tell: before any task reaches the host.
    ({"node_reset_pycache_purge_modules": ["vllm\n", "a b"]}, 'node_reset_pycache_purge_modules has "vllm\\n", "a b"'),
    ({"node_reset_pycache_purge_paths": ["site-packages"]}, 'node_reset_pycache_purge_paths has "site-packages": a path'),
    ({"node_reset_shm_clean_path": "dev/shm"}, 'node_reset_shm_clean_path has "dev/shm": a path must be absolute'),
    ({"node_reset_shm_clean_patterns": ["nccl-*", ""]}, "node_reset_shm_clean_patterns is [\"nccl-*\", \"\"]: an empty"),
    ({"node_reset_gpu_reset_cmdline_patterns": ["vllm(serve"]},
     'node_reset_gpu_reset_cmdline_patterns has "vllm(serve": not a regular expression'),
])
def test_every_input_is_checked_before_the_first_process_is_signalled(module_node, tmp_path, bad, sentence):
    """Issue 17: a misspelled module used to fail only after gpu_reset and shm_clean had run, and
    NVML's selection was never checked before. Now the host is `invalid`, with the sentence, and
    every process of the crashed node is still running (nothing signalled, nothing removed)."""
    proc, row = _reset(module_node, tmp_path, values=bad)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert row["status"] == "invalid", row
    assert any(sentence in problem for problem in row["problems"]), row["problems"]
    assert row["killed"] == 0 and not row["changed"], row
    assert _not_stopped(proc.stdout)
    _untouched(module_node)
