"""gpu_reset's options: every bad value fails the task with one sentence naming the option,
before anything is read or signalled; a pattern broad enough to match everything is refused;
adding a protected name keeps the defaults. Each test runs a holder that a wrong acceptance
would stop, in a private PID namespace, and checks it is alive after every run.
"""
from __future__ import annotations

import sys

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES
from tests.functional import pidns
from tests.functional.gpu_reset_ns import cuda, dev_files, globs

SCENARIO = "tests.functional.gpu_reset_ns:holders_then_runs"

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


@pytest.fixture
def dev(tmp_path):
    return dev_files(tmp_path / "dev")


def refused(dev, cases, nvml=None, lib_dir=None):
    """Run gpu_reset once per case against a holder of GPU 0 (and pid 2, the namespace's
    first process); return [(case, result)] after checking the holder survived each one."""
    holders = [cuda(dev, [0], key="holder", name="vllm-worker", argv_extra_hex=[b"vllm serve --port 8001".hex()])]
    runs = [{"params": dict({"device_paths": globs(dev)}, **case)} for case in cases]
    out = pidns.run_in_pidns(SCENARIO, holders=holders, runs=runs, nvml=nvml, lib_dir=lib_dir)
    for case, run in zip(cases, out["runs"]):
        assert run["alive"] == {"holder": True}, case
        assert run["result"]["rc"] != 0 and run["result"]["failed"] is True, case
        assert "Traceback" not in run["result"]["msg"], case
    return [(case, run["result"]) for case, run in zip(cases, out["runs"])]


# --- item 1: patterns that match everything ------------------------------------------------

def test_a_pattern_that_matches_the_empty_string_or_this_module_is_refused(dev):
    patterns = ("", "|", "x?", ".*", "^", "python3", "python", "gpu_reset", "plugins/modules")
    cases = [{"cmdline_patterns": [pattern]} for pattern in patterns]
    for case, result in refused(dev, cases):
        pattern = case["cmdline_patterns"][0]
        assert result["msg"].startswith("cmdline_patterns: %r matches " % pattern), case
        if pattern in ("", "|", "x?", ".*", "^"):
            assert "the empty string, so it matches every process" in result["msg"], case
        else:
            assert "this module's own command line" in result["msg"], case
        assert result.get("targets") is None  # failed before planning: nothing was even read


def test_a_pattern_that_cannot_be_compiled_is_one_sentence(dev):
    cases = [{"cmdline_patterns": [pattern]} for pattern in ("vllm serve (", "a{99999999999}", "(" * 1200 + ")" * 1200)]
    for case, result in refused(dev, cases):
        assert "is not a valid regular expression" in result["msg"], case
        assert result["msg"].count("\n") == 0, case


def test_a_pattern_that_names_the_server_stops_it(dev):
    """An API server whose workers died holds no device: a specific pattern still finds it."""
    api = {"key": "api", "argv_extra_hex": [b"vllm serve m --port 8001".hex()]}
    other = {"key": "other", "argv_extra_hex": [b"vllm serve m --port 8002".hex()]}
    out = pidns.run_in_pidns(SCENARIO, holders=[api, other], runs=[{"params": {
        "device_paths": globs(dev), "cmdline_patterns": ["vllm serve .* --port 8001"]}}])
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert [(t["pid"], t["reason"]) for t in result["targets"]] == [(out["holders"]["api"]["pid"], "cmdline")]
    assert out["runs"][0]["alive"] == {"api": False, "other": True}


# --- item 6: every number finite and sane, every GPU selector well formed --------------------

@pytest.mark.parametrize("option", ["grace_period", "kill_timeout"])
def test_seconds_must_be_finite_and_at_most_an_hour(dev, option):
    top = RANGES["gpu_reset"][option].maximum
    values = ["nan", "inf", "-inf", float("nan"), 1e10, top + 0.5, -1, "soon"]
    messages = dict((str(case[option]), result["msg"]) for case, result in refused(dev, [{option: v} for v in values]))
    assert all(option in message for message in messages.values()), messages
    for value in ("nan", "inf", "-inf"):
        assert messages[value] == "%s must be a finite number of seconds, got %s" % (option, value)
    assert messages["10000000000.0"] == "%s must be %s or less seconds, got 10000000000.0" % (option, top)
    assert messages[str(top + 0.5)] == "%s must be %s or less seconds, got %s" % (option, top, top + 0.5)
    assert messages["-1"] == "%s must be 0 or more seconds, got -1.0" % option


def test_gpu_selectors_must_be_ascii_indices_or_uuids(dev, fake_nvml_lib):
    selectors = ["\u00b2", "\u0663", "", " ", "1.5", "-1", "0x1", "GPU-", "all"]
    for case, result in refused(dev, [{"gpus": [s]} for s in selectors]):
        assert result["msg"] == "gpus: %r is neither a GPU index (0, 1, ...) nor a GPU UUID (GPU-...)" % case["gpus"][0]
    with_nvml = refused(dev, [{"gpus": ["\u00b2"]}, {"gpus": ["9"]}], nvml=4, lib_dir=str(fake_nvml_lib))
    assert "neither a GPU index" in with_nvml[0][1]["msg"]
    assert "unknown GPU '9'" in with_nvml[1][1]["msg"]


def test_scopes_that_match_everything_or_nothing_are_refused(dev):
    cases = [{"cgroup": ""}, {"cgroup": "\n"}, {"users": []}, {"users": [""]}, {"device_paths": ["dev/nvidia*"]}]
    results = refused(dev, cases)
    assert "cgroup: '' is in every process's cgroup" in results[0][1]["msg"]
    assert "cgroup: '\\n'" in results[1][1]["msg"]
    assert "users: an empty list matches no process" in results[2][1]["msg"]
    assert "users: '' is not a user name or uid" in results[3][1]["msg"]
    assert "device_paths: 'dev/nvidia*' is not an absolute path" in results[4][1]["msg"]


def test_every_problem_is_named_in_one_failure(dev):
    [(_case, result)] = refused(dev, [{"grace_period": "nan", "kill_timeout": -1, "cmdline_patterns": [""],
                                       "gpus": ["\u00b2"]}])
    for words in ("grace_period must be a finite number", "kill_timeout must be 0 or more", "cmdline_patterns: ''",
                  "gpus: '\u00b2'"):
        assert words in result["msg"]


# --- protect_names adds to the defaults -------------------------------------------------------

def test_adding_a_protected_name_keeps_the_default_ones(tmp_path, dev):
    """protect_names: [my-daemon] protects my-daemon and still nvidia-persistenced (a holder
    whose argv[0] and executable carry the daemon's name); the unnamed holder is stopped."""
    daemon = tmp_path / "nvidia-persistenced"
    daemon.symlink_to(sys.executable)
    holders = [cuda(dev, [0], key="persistenced", python=str(daemon)),
               cuda(dev, [1], key="mine", name="my-daemon"),
               cuda(dev, [2], key="victim", name="vllm-worker")]
    out = pidns.run_in_pidns(SCENARIO, holders=holders, runs=[{"params": {"device_paths": globs(dev),
                                                                          "protect_names": ["my-daemon"]}}])
    result = out["runs"][0]["result"]
    assert result["rc"] == 0, result.get("msg")
    assert out["runs"][0]["alive"] == {"persistenced": True, "mine": True, "victim": False}
    assert sorted((p["pid"], p["reason"]) for p in result["protected"]) == sorted(
        (out["holders"][key]["pid"], "protect_names") for key in ("persistenced", "mine"))


# --- spare_units and spare_gpus (several servers on one node) ---------------------------------

def test_spare_units_must_be_names_of_units_that_hold_processes(dev):
    units = ["", "/", "vllm-b.service\n", "vllm-b", "vllm b.service", "$(reboot).service", "@/%$", "a/b.service",
             "x" * 250 + ".service", "vllm-b.timer", ".service", "\udcff.service", "vllm-b.service'"]
    for case, result in refused(dev, [{"spare_units": ["vllm-a.service", unit]} for unit in units]):
        unit = case["spare_units"][1]
        assert result["msg"] == ("spare_units: %r is not a systemd unit name with the suffix of a unit that holds "
                                 "processes (.service, .scope, .slice), such as 'vllm-b.service'" % unit), case


def test_spare_units_of_the_wrong_type_are_refused_by_ansible(dev):
    [(_case, result)] = refused(dev, [{"spare_units": {"vllm-b.service": 1}}])
    assert "spare_units" in result["msg"]


def test_spare_gpus_must_be_gpus_of_this_host_and_not_also_reset(dev, fake_nvml_lib):
    from tests.fixtures.fake_nvml.state import _uuid  # pylint: disable=import-outside-toplevel
    selectors = ["", " ", "-1", "nan", "inf", "1e9", "\u00b2", "GPU-", "all", "0\n1", "0,1"]
    for case, result in refused(dev, [{"spare_gpus": [s]} for s in selectors]):
        assert result["msg"] == ("spare_gpus: %r is neither a GPU index (0, 1, ...) nor a GPU UUID (GPU-...)"
                                 % case["spare_gpus"][0]), case
    [(_case, same)] = refused(dev, [{"gpus": ["0", "1"], "spare_gpus": [" 1", "2"]}])
    assert same["msg"] == "gpus and spare_gpus both name GPU '1': a GPU cannot be reset and spared at once"
    # By UUID in one list and index in the other, and a GPU the host does not have: NVML tells.
    with_nvml = refused(dev, [{"gpus": ["0"], "spare_gpus": [_uuid("NVIDIA H200", 0)]}, {"spare_gpus": ["9"]}],
                        nvml=4, lib_dir=str(fake_nvml_lib))
    assert with_nvml[0][1]["msg"] == "gpus and spare_gpus both name GPU 0: a GPU cannot be reset and spared at once"
    assert with_nvml[1][1]["msg"].startswith("spare_gpus: unknown GPU '9': this host has GPU indices 0-3")
