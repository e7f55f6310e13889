"""fleet_preflight's checks: which hosts a run targets, and which role variable names no role knows."""
from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._fleet_targets import targeted
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._unknown_variables import (ALLOW, STOPPED, known_variables,
                                                                                        refusals, unknown_variables)

KNOWN = known_variables()


def test_the_known_names_are_the_roles_variables_and_the_facts_they_set():
    assert "node_reset_gpu_reset_grace_period" in KNOWN and "inference_service_engine" in KNOWN
    assert "node_reset_result" in KNOWN and "inference_service_result" in KNOWN
    assert not any(name.startswith("__") for name in KNOWN)


def test_a_misspelling_names_the_nearest_variable_and_other_names_pass():
    assert unknown_variables(["node_reset_grace_period", "fleet_serial", "ansible_host", "__node_reset_x",
                              "node_reset_gpu_reset_grace_period", "my_own"], KNOWN) == [
        "node_reset_grace_period is not a variable of the node_reset role: did you mean"
        " node_reset_gpu_reset_grace_period?"]


def test_an_unknown_name_stops_the_run_unless_unknown_names_are_allowed():
    # node_reset_gpu_reset_gpu for node_reset_gpu_reset_gpus: the default would reset every GPU.
    said = ["node_reset_gpu_reset_gpu is not a variable of the node_reset role: did you mean node_reset_gpu_reset_gpus?"]
    assert refusals(["node_reset_gpu_reset_gpu", "fleet_serial"]) == (said + [STOPPED], [])
    assert refusals(["node_reset_gpu_reset_gpu"], "false") == (said + [STOPPED], [])
    for yes in (True, "true", "yes", 1):
        assert refusals(["node_reset_gpu_reset_gpu"], yes) == ([], said)
    assert refusals(["node_reset_gpu_reset_gpus", "node_reset_result"]) == ([], [])


def test_a_value_of_the_allowing_variable_that_is_no_boolean_stops_the_run():
    assert refusals(["node_reset_gpu_reset_gpu"], "maybe") == (['%s is "maybe": it must be true or false.' % ALLOW], [])
    assert refusals([], ["x"])[0] == ['%s is ["x"]: it must be true or false.' % ALLOW]


def test_hostile_names_are_one_line_each_and_never_fail():
    names = ["node_reset_\nx", "node_reset_" + "\udcff", "node_reset_", "", 7, None, "node_reset_" + "a" * 10000]
    sentences = unknown_variables(names, KNOWN)
    assert len(sentences) == 4
    assert all("\n" not in sentence for sentence in sentences)
    assert sentences[0].startswith("'node_reset_\\nx' is not") or any(s.startswith("'node_reset_\\nx'") for s in sentences)
    assert unknown_variables([], KNOWN) == []


def test_the_targeted_hosts_keep_the_groups_order():
    assert targeted(["a", "b", "c"], ["c", "a", "pve"]) == ["a", "c"]
    assert targeted(None, ["a"]) == [] and targeted(["a"], None) == []
