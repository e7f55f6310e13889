"""gpu_reset when a target exits, or its pid is taken by an unrelated process, at a moment the
test chooses: in the pass over /proc, before the target is described, before its signal, and,
without pidfds, between the signals of two targets.

The moment is made exact with a seccomp gate (tests/syscall_gate.py) installed in front of the
module's interpreter: the module is held inside the system call that marks the moment while the
test acts, then goes on. Nothing of the module is patched. Everything runs in a private PID
namespace (tests/functional/pidns.py), where a freed pid can be handed to a new process on purpose
(/proc/sys/kernel/ns_last_pid) and a module gone wrong can only reach what the test started.
"""
from __future__ import annotations

import pytest

from tests.functional import pidns
from tests.functional.gpu_reset_ns import cuda, dev_files, globs

SCENARIO = "tests.functional.gpu_reset_ns:raced_run"

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))


@pytest.fixture
def dev(tmp_path):
    return dev_files(tmp_path / "dev")


def race(dev, moment, reuse, holders=None, target="holder", other=None):
    out = pidns.run_in_pidns(SCENARIO, holders=holders or [cuda(dev, [0], key="holder", name="server")],
                             device_paths=globs(dev), target=target, moment=moment, reuse=reuse, other=other)
    assert len(out["acted"]) == 1, "the module never reached the chosen moment: %s" % out["result"]
    if reuse:
        assert out["newcomer"]["pid"] == out["holders"][target]["pid"], "the namespace gave the pid to another"
        assert out["newcomer"]["starttime"] != out["holders"][target]["starttime"]
    return out


@pytest.mark.parametrize("reuse", [False, True], ids=["exits", "pid-reused"])
def test_a_target_gone_before_its_signal_is_not_signalled_and_changes_nothing(dev, reuse):
    """Planned, then gone when the module opens its pidfd: nothing was signalled, so nothing is
    reported killed and changed is false; a process that took its pid is left alone."""
    out = race(dev, "before_signal", reuse)
    result = out["result"]
    assert result["rc"] == 0, result.get("msg")
    assert [t["pid"] for t in result["targets"]] == [out["holders"]["holder"]["pid"]]
    assert result["killed"] == [] and result["survivors"] == []
    assert result["changed"] is False
    if reuse:
        assert out["newcomer_alive"], "the process that took over the target's pid was signalled"


@pytest.mark.parametrize("moment", ["mid_pass", "before_description"])
def test_a_pid_reused_after_its_evidence_was_read_is_no_target(dev, moment):
    """The holder's mappings were read, then it exited and its pid went to a new process: that
    process holds nothing, so it is no target. Gone before the pass read its identity again, the
    holder's files are not the pass's either (the diff's before lists no holder); gone after the
    pass, it was a holder when read."""
    out = race(dev, moment, reuse=True)
    result = out["result"]
    assert result["rc"] == 0, result.get("msg")
    assert result["targets"] == [] and result["killed"] == []
    assert result["changed"] is False
    holder = out["holders"]["holder"]["pid"]
    listed = [int(line.split()[0]) for line in result["diff"]["before"].splitlines()]
    assert listed == ([] if moment == "mid_pass" else [holder])
    assert result["diff"]["after"] == ""
    assert out["newcomer_alive"]


def test_without_pidfd_a_pid_reused_before_its_kill_is_not_signalled(dev):
    """pidfd_open fails (ENOSYS, a kernel before 5.3): the module signals by pid with kill(), and
    must read the target's start time again right before each kill. The second target's pid is
    reused while the module signals the first one."""
    holders = [cuda(dev, [0], key="first", name="first"), cuda(dev, [1], key="holder", name="second")]
    out = race(dev, "before_kill_without_pidfd", reuse=True, holders=holders, other="first")
    result = out["result"]
    assert result["rc"] == 0, result.get("msg")
    assert out["holders"]["first"]["pid"] < out["holders"]["holder"]["pid"]  # signalled in pid order
    assert [t["pid"] for t in result["targets"]] == [out["holders"]["first"]["pid"], out["holders"]["holder"]["pid"]]
    assert [(k["pid"], k["signal"]) for k in result["killed"]] == [(out["holders"]["first"]["pid"], "SIGTERM")]
    assert result["changed"] is True
    assert out["newcomer_alive"], "the process that took over the second target's pid was signalled"
    assert out["alive"] == {"first": False, "holder": False}
