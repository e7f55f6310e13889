"""What the evidence module keeps before a reset signals a failed server, run as Ansible runs it
against a real Python process inside a private PID namespace: its stack by the real py-spy (from
requirements-test.txt, or the wheel `pip download py-spy -d build/py-spy` left), its secrets
masked, the directory root's 0700, and the bounds (a py-spy that hangs is cut at its time limit; a
py-spy others can write is refused; a huge journal is cut at file_max)."""
from __future__ import annotations

import glob
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from tests.functional import pidns
from tests.functional.fake_systemd import INVOCATION, FakeSystemd, unit

REPO = Path(__file__).resolve().parents[2]
SCENARIO = "tests.functional.evidence_ns:hung_server_then_evidence"
SECRET = "sk-evidence-0123456789"

pytestmark = [pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available())),
              pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def py_spy(tmp_path_factory):
    """The real py-spy, copied to a root-owned directory (the module runs only such a one)."""
    where = tmp_path_factory.mktemp("py-spy-bin")
    installed = os.path.join(os.path.dirname(sys.executable), "py-spy")
    target = where / "py-spy"
    if os.path.exists(installed):
        shutil.copyfile(installed, target)
    else:
        wheels = sorted(glob.glob(str(REPO / "build" / "py-spy" / "py_spy-*.whl")))
        if not wheels:
            message = "py-spy is not installed (requirements-test.txt) nor downloaded to build/py-spy"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
        with zipfile.ZipFile(wheels[-1]) as wheel:
            name = next(entry for entry in wheel.namelist() if entry.endswith("/scripts/py-spy"))
            target.write_bytes(wheel.read(name))
    target.chmod(0o755)
    return str(target)


def collect(tmp_path, journal=(), stopped=False, name="VLLM::EngineCor", **params):
    systemd = FakeSystemd(tmp_path / "systemd", [unit()], journal=journal)
    (tmp_path / "kern.log").write_bytes(b"")
    params = dict({"path": str(tmp_path / "evidence"), "units": ["vllm.service"], "stacks": True,
                   "xid_log_path": str(tmp_path / "kern.log")}, **params)
    return pidns.run_in_pidns(SCENARIO, params=params, env=systemd.env, secret=SECRET, stopped=stopped, name=name)


def test_a_hung_servers_stack_is_kept_masked_in_a_private_directory(tmp_path, py_spy):
    out = collect(tmp_path, journal=["engine started with --api-key %s" % SECRET], py_spy=py_spy)
    result, kept = out["result"], out["kept"]
    assert result["rc"] == 0 and result["changed"], result
    assert result["mode"] == 0o700 and os.path.dirname(result["directory"]) == str(tmp_path / "evidence")
    stack = kept["stack-%d.txt" % out["pid"]]
    # The holder waits in signal.pause() inside become(): py-spy read its real Python frames.
    assert "become" in stack and "Thread" in stack
    assert "--api-key ********" in kept["processes.txt"]
    assert kept["journal-vllm.service.txt"].strip() == "engine started with --api-key ********"
    assert not [name for name, text in kept.items() if SECRET in text]
    assert SECRET not in str(result)


def test_a_stopped_processs_stack_is_kept_too(tmp_path, py_spy):
    """A process stopped by SIGSTOP (how the tests hang an engine; a debugger or a frozen cgroup
    does the same): py-spy cannot pause it to read its threads, so it reads without pausing."""
    out = collect(tmp_path, py_spy=py_spy, stopped=True)
    stack = out["kept"].get("stack-%d.txt" % out["pid"], "")
    assert "become" in stack and "Thread" in stack, out["result"]["notes"]


def test_a_protected_process_a_pattern_matches_is_not_kept(tmp_path):
    """gpu_reset never signals a GPU monitor (its default protected names, and protect_names): on
    metal, a second reset kept the protected monitor's command line and reported changed."""
    for name, params in (("nv-hostengine", {}), ("gpu-watch", {"protect_names": ["gpu-watch"]})):
        out = collect(tmp_path / name, name=name, **params)
        assert out["result"]["directory"] is None and out["result"]["pids"] == [], out["result"]


def fake_py_spy(tmp_path, script: str) -> str:
    """A py-spy of the test's (a shell script), root's, where the module may run it."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "py-spy"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    return str(fake)


def test_a_py_spy_that_hangs_is_cut_at_its_time_limit_and_the_rest_is_kept(tmp_path):
    out = collect(tmp_path, py_spy=fake_py_spy(tmp_path, "exec sleep 600\n"), item_timeout=1, deadline=20)
    result = out["result"]
    assert result["rc"] == 0, result
    assert "py-spy dump of pid %d was stopped after 1.0 s (its time limit)" % out["pid"] in result["notes"]
    assert "stack-%d.txt" % out["pid"] not in out["kept"] and "summary.json" in out["kept"]


def test_a_py_spy_that_fails_after_its_header_is_said_and_what_it_printed_is_kept(tmp_path):
    out = collect(tmp_path, py_spy=fake_py_spy(
        tmp_path, "echo 'Process 2: python'\necho 'Error: Failed to get stack traces' >&2\nexit 1\n"))
    assert out["kept"]["stack-%d.txt" % out["pid"]] == "Process 2: python\n"
    assert ("py-spy dump of pid %d failed (exit status 1): Error: Failed to get stack traces" % out["pid"]
            in out["result"]["notes"]), out["result"]["notes"]


def test_a_py_spy_others_can_write_is_refused_not_run(tmp_path, py_spy):
    writable = tmp_path / "bin"
    writable.mkdir()
    shutil.copyfile(py_spy, writable / "py-spy")
    (writable / "py-spy").chmod(0o757)
    out = collect(tmp_path, py_spy=str(writable / "py-spy"))
    notes = out["result"]["notes"]
    assert [note for note in notes if note.startswith("py-spy at %s is refused" % (writable / "py-spy"))
            and "may be written by others (mode 0757)" in note], notes
    assert not [name for name in out["kept"] if name.startswith("stack-")]


def test_a_missing_py_spy_is_a_line_not_a_failure(tmp_path):
    out = collect(tmp_path, py_spy=str(tmp_path / "nowhere" / "py-spy"))
    assert out["result"]["rc"] == 0 and "processes.txt" in out["kept"]
    assert any(note.startswith("py-spy is not installed at") for note in out["result"]["notes"])


def test_a_huge_journal_is_cut_at_file_max(tmp_path):
    lines = ["line %06d %s" % (number, "x" * 80) for number in range(20000)]
    out = collect(tmp_path, journal=lines, stacks=False, file_max=65536)
    entry = next(item for item in out["result"]["files"] if item["name"] == "journal-vllm.service.txt")
    assert entry["cut"] and entry["bytes"] <= 65536
    assert len(out["kept"]["journal-vllm.service.txt"].encode()) == entry["bytes"]
    assert out["kept"]["journal-vllm.service.txt"].endswith("(cut at 65536 bytes)\n")


def test_the_journal_read_is_the_current_invocations(tmp_path):
    systemd = FakeSystemd(tmp_path / "systemd", [unit()], journal=["x"])
    (tmp_path / "kern.log").write_bytes(b"")
    pidns.run_in_pidns(SCENARIO, params={"path": str(tmp_path / "evidence"), "units": ["vllm.service"],
                                         "xid_log_path": str(tmp_path / "kern.log")}, env=systemd.env, secret=SECRET)
    argv = systemd.calls("journalctl")[0]["argv"]
    assert "_SYSTEMD_INVOCATION_ID=" + INVOCATION in argv and "--unit" not in argv


def test_check_mode_keeps_nothing_and_says_what_it_would(tmp_path):
    out = collect(tmp_path, py_spy="/nowhere")
    assert out["result"]["rc"] == 0
    checked = pidns.run_in_pidns("tests.functional.evidence_ns:check_mode", params={
        "path": str(tmp_path / "checked"), "units": ["vllm.service"], "stacks": True})
    assert checked["result"]["directory"] is None and not checked["result"]["changed"]
    assert "stack-%d.txt" % checked["pid"] in checked["result"]["would_keep"]
    assert not (tmp_path / "checked").exists()
