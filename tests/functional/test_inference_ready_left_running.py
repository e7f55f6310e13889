"""A server this run did not start, which the look leaves running: slow, or healthy but not
attributable to its unit because the reader may not follow another user's descriptors (the
modules run as a root without CAP_SYS_PTRACE, as in a container that drops it). The look says
so (`unproven`, never `unhealthy`: no reset for it) and the gate reports it at once instead of
waiting for its deadline. Fake engines and systemctl stand-ins (tests/functional/fake_systemd.py);
the listener runs as `nobody`, the module under setpriv. Nothing is signalled."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from tests.functional import fake_engines
from tests.functional.fake_engines import fake_engine_process, serving
from tests.functional.fake_systemd import FakeSystemd, unit
from tests.readable_copy import readable_dir
from tests.run_module import run_module

UNIT = "gate-test.service"
# What takes CAP_SYS_PTRACE from a root: only it (a container's root lists another user's
# /proc/PID/fd but may not follow its links), or with the capabilities that list it too.
CONFINED = {"ptrace": "-sys_ptrace", "ptrace-and-dac": "-sys_ptrace,-dac_read_search,-dac_override"}


@contextmanager
def nobody_engine(routes):
    """A fake engine running as nobody, from a copy that user can read: yields (port, pid)."""
    top = readable_dir("cleanslate-nobody-engine-")
    try:
        shutil.copy(fake_engines.__file__, top / "fake_engines.py")
        (top / "fake_engines.py").chmod(0o644)
        proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                 str(top / "fake_engines.py"), json.dumps(routes)], cwd="/", stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            assert line.strip().isdigit(), "the fake engine did not start as nobody"
            yield int(line), proc.pid
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(top)


def confined_python(tmp_path, drop):
    """An interpreter for run_module: this one, started by a root without the capabilities in drop."""
    wrapper = tmp_path / ("python-" + drop.replace(",", "").replace("-", "_"))
    wrapper.write_text("#!/bin/sh\nexec setpriv --bounding-set=%s --inh-caps=%s -- %s \"$@\"\n"
                       % (drop, drop, sys.executable))
    wrapper.chmod(0o755)
    return str(wrapper)


def own_cgroup():
    with open("/proc/self/cgroup") as handle:  # the engine's too, which it inherits through setpriv
        return handle.read().strip().splitlines()[-1].split(":", 2)[2]


def run(systemd, port, python=None, **params):
    args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "unit": UNIT, "wait": 20,
            "poll_interval": 0.1, "completions": 1, "stable_s": 0.2}
    args.update(params)
    started = time.monotonic()
    result = run_module("inference_ready", args, env=systemd.env, python=python)
    return result, time.monotonic() - started


@pytest.mark.parametrize("confinement", sorted(CONFINED))
def test_a_healthy_server_the_reader_cannot_attribute_is_unproven_left_running_and_reported_at_once(tmp_path,
                                                                                                    confinement):
    """Issue 35, 8: SGLang running as its service user, the modules without CAP_SYS_PTRACE: the look
    called it unhealthy and node_reset stopped it. The unit's control group is the engine's own, so
    a reader that may follow its descriptors proves it (the control case); one that may not cannot
    tell, names the pid it cannot read, and says what to do."""
    systemd = FakeSystemd(tmp_path / "systemd", [unit(ControlGroup=own_cgroup())])
    confined = confined_python(tmp_path, CONFINED[confinement])
    with nobody_engine(serving()) as (port, dummy):
        proven, dummy = run(systemd, port, mode="probe")
        look, dummy = run(systemd, port, python=confined, mode="probe")
        left, left_s = run(systemd, port, python=confined)
        started, dummy = run(systemd, port, python=confined, started=True)
    assert proven["verdict"] == "healthy", proven  # root with the capability proves the unit's listener
    assert look["rc"] == 0 and look["verdict"] == "unproven" and "port_holder" not in look, look
    assert "healthy_monotonic" not in look  # no moment for a stability window from an unproven answer
    assert look["last_seen"].startswith("HTTP 200, but cannot prove that unit %s answers on port %d: the descriptors "
                                        "of " % (UNIT, port)), look
    assert "(do the modules run without CAP_SYS_PTRACE, in a container that drops it?)" in look["last_seen"], look
    # The gate of the server the run left running: unproven at the first poll, not failed after the deadline.
    assert left["rc"] == 0 and left["state"] == "unproven" and left["polls"] == 1 and left_s < 10, (left, left_s)
    assert left["reason"] == "%s; this run did not start unit %s and left it running" % (left["last_seen"], UNIT)
    assert "CAP_SYS_PTRACE" in left["reason"]
    # One this run started (after its reset) has no earlier answer to stand on: it is not proven to serve.
    assert started["rc"] == 1 and started["msg"].startswith("cannot prove that unit %s answers" % UNIT), started


def test_a_slow_server_left_running_is_reported_slow_at_once_and_one_this_run_started_is_waited_for(tmp_path):
    """Issue 35, 9: a server whose /health answers in 12 s was rightly left running, then the gate
    waited its whole deadline (an hour) and reported it failed. Left running (started false), the
    gate says `slow` at its first poll; one this run started may still come up, so it is waited for."""
    systemd = FakeSystemd(tmp_path / "systemd", [unit(ControlGroup="/")])
    with fake_engine_process(dict(serving(), **{"/health": {"delay": 3}})) as (port, dummy):
        left, left_s = run(systemd, port, health_timeout=0.5, wait=20)
        waited, waited_s = run(systemd, port, health_timeout=0.5, wait=3, started=True)
        no_unit, dummy = run(systemd, port, health_timeout=0.5, wait=1, unit="")
    assert left["rc"] == 0 and left["state"] == "slow" and left["polls"] == 1 and left_s < 5, (left, left_s)
    assert left["verdict"] == "slow" and left["reason"].startswith(
        "/health accepted the connection but gave no answer within 0.5 s: this run did not start unit %s, which still "
        "runs and accepts connections, and left it running; " % UNIT), left
    assert waited["rc"] == 0 and waited["state"] == "waiting" and waited["polls"] > 1 and waited_s >= 3, waited
    # No unit: nothing says the server was left running by a run; the gate waits as before.
    assert no_unit["rc"] == 0 and no_unit["state"] == "waiting", no_unit
