"""The readiness gate's decisions that need systemd to happen for real (the fleet tests run them
there): whose answer counts on the port, when the unit is no longer the one that became ready,
and which journal lines belong to the invocation that was gated."""
from __future__ import annotations

import pytest

from ansible_collections.cleanslate.gpu.plugins.modules.inference_ready import journal_argv, port_problem, unstable

UNIT = "vllm.service"
UNIT_CGROUP = "/system.slice/vllm.service"
INVOCATION = "4b3c0f0e2b8a4c1d9f7e6a5b4c3d2e1f"


def held(*holders, unreadable=()):
    return {"sockets": {1000 + index: [holder] for index, holder in enumerate(holders)},
            "unreadable": list(unreadable)}


def proc(pid, cgroup, name="python3 -m vllm.entrypoints.openai.api_server"):
    return {"pid": pid, "name": name, "cgroup": cgroup}


def test_the_units_processes_and_its_sub_cgroups_count_as_the_unit():
    found = held(proc(42, UNIT_CGROUP), proc(43, UNIT_CGROUP + "/workers"))
    assert port_problem(8000, UNIT, UNIT_CGROUP, found) == (None, None, False)


@pytest.mark.parametrize("cgroup", ["/user.slice/user-1000.slice/session-3.scope", "/system.slice/vllm.service-old",
                                    "/system.slice", "/", ""])
def test_a_process_outside_the_units_cgroup_on_the_port_is_named(cgroup):
    foreign = proc(123, cgroup, name="python3 foreign.py")
    sentence, holder, unproven = port_problem(8000, UNIT, UNIT_CGROUP, held(proc(42, UNIT_CGROUP), foreign))
    assert sentence == ("port 8000 is held by pid 123 (python3 foreign.py), which is not a process of unit "
                        "vllm.service (its control group is %s, the unit's is %s): another server answers in its "
                        "place" % (cgroup or "unknown", UNIT_CGROUP))
    assert holder == foreign and unproven is False


def test_a_proven_foreign_holder_is_foreign_even_beside_unreadable_processes():
    """Unreadable descriptors elsewhere leave a holder seen outside the unit foreign, not unproven."""
    foreign = proc(123, "/user.slice", name="python3 foreign.py")
    found = {"sockets": {1000: [foreign], 1001: []}, "unreadable": [7]}
    sentence, holder, unproven = port_problem(8000, UNIT, UNIT_CGROUP, found)
    assert holder == foreign and unproven is False and sentence.startswith("port 8000 is held by pid 123")


UNREADABLE_HINT = ("(do the modules run without CAP_SYS_PTRACE, in a container that drops it?); give the modules' root "
                   "CAP_SYS_PTRACE, or see who holds the port with `ss -ltnp 'sport = :8000'` as a root that has it")


@pytest.mark.parametrize("found, unit_cgroup, why, unproven", [
    (held(), UNIT_CGROUP, "no process is seen listening on it", False),
    ({"sockets": {1000: []}, "unreadable": [7, 9]}, UNIT_CGROUP,
     "the descriptors of 2 processes (pid 7, 9) cannot be read, and no other process is seen holding its socket " + UNREADABLE_HINT,
     True),
    ({"sockets": {1000: []}, "unreadable": list(range(2, 22))}, UNIT_CGROUP,
     "the descriptors of 20 processes (pid 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13 and 8 more) cannot be read, and no "
     "other process is seen holding its socket " + UNREADABLE_HINT, True),
    ({"sockets": {1000: []}, "unreadable": []}, UNIT_CGROUP, "no process is seen holding its socket", False),
    (held(proc(42, UNIT_CGROUP)), "", "systemd gives the unit no control group", False),
])
def test_a_holder_that_cannot_be_proven_does_not_count_as_ready(found, unit_cgroup, why, unproven):
    """Only a holder that may be hidden by unreadable descriptors is unproven (not to be reset for):
    no listener at all, or no control group to compare with, stays a problem of the unit."""
    sentence, holder, seen_unproven = port_problem(8000, UNIT, unit_cgroup, found)
    assert sentence == "cannot prove that unit vllm.service answers on port 8000: %s" % why
    assert holder is None and seen_unproven is unproven


def state(**changes):
    base = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
            "MainPID": "4242", "NRestarts": "0", "InvocationID": INVOCATION, "ExecMainStatus": "0"}
    base.update(changes)
    return base


BASELINE = {"invocation_id": INVOCATION, "n_restarts": 0}


@pytest.mark.parametrize("changes, why", [
    ({}, None),
    ({"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainStatus": "1"},
     "died (failed, failed, result exit-code, exit status 1)"),
    ({"ActiveState": "activating", "SubState": "auto-restart"}, "died (activating, auto-restart, result success, "
                                                                "exit status 0)"),
    ({"InvocationID": "0" * 32, "MainPID": "5151"}, "restarted (a new invocation, main pid 5151)"),
    ({"NRestarts": "1"}, "restarted (NRestarts 1)"),
    ({"ActiveState": "reloading", "SubState": "reload"}, "is reloading (reload), not active"),
    ({"ActiveState": "activating", "SubState": "start"}, "is activating (start), not active"),
])
def test_after_readiness_the_unit_must_still_be_the_same_active_invocation(changes, why):
    assert unstable(state(**changes), BASELINE) == why


def test_the_journal_of_the_gated_invocation_only_with_the_unit_as_fallback():
    assert journal_argv(UNIT, INVOCATION, 20) == [
        "journalctl", "--no-pager", "--output", "cat", "--lines", "20",
        "_SYSTEMD_INVOCATION_ID=" + INVOCATION, "+", "INVOCATION_ID=" + INVOCATION]
    fallback = ["journalctl", "--no-pager", "--output", "cat", "--lines", "5", "--unit", UNIT]
    assert journal_argv(UNIT, "", 5) == fallback
    assert journal_argv(UNIT, "--since=yesterday", 5) == fallback  # not an invocation id: never an argument


def test_the_unit_on_one_address_does_not_vouch_for_an_unseen_holder_on_another():
    # vLLM on 0.0.0.0:8000 and another user's server on [::]:8000 (its descriptors not readable):
    # two listening sockets, and a client on ::1 reaches the one nobody can prove is the unit's.
    found = {"sockets": {1000: [proc(42, UNIT_CGROUP)], 1001: []}, "unreadable": [7]}
    sentence, holder, unproven = port_problem(8000, UNIT, UNIT_CGROUP, found)
    assert sentence == ("cannot prove that unit vllm.service answers on port 8000: the descriptors of 1 process (pid 7) "
                        "cannot be read, and no other process is seen holding its socket " + UNREADABLE_HINT)
    assert holder is None and unproven is True
