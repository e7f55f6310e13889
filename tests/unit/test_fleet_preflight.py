"""fleet_preflight's checks: which hosts a run targets, and which role variable names no role knows."""
from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.action.fleet_preflight import (known_variables, targeted,
                                                                               unknown_variables)

KNOWN = known_variables()


def test_the_known_names_are_the_roles_variables_and_the_facts_they_set():
    assert "node_reset_gpu_reset_grace_period" in KNOWN and "inference_service_engine" in KNOWN
    assert "node_reset_result" in KNOWN and "inference_service_result" in KNOWN
    assert not any(name.startswith("__") for name in KNOWN)


def test_a_misspelling_names_the_nearest_variable_and_other_names_pass():
    assert unknown_variables(["node_reset_grace_period", "fleet_serial", "ansible_host", "__node_reset_x",
                              "node_reset_gpu_reset_grace_period", "my_own"], KNOWN) == [
        "node_reset_grace_period is not a variable of the node_reset role, and is ignored: did you mean"
        " node_reset_gpu_reset_grace_period?"]


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
