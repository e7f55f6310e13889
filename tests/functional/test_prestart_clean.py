"""Issue 39, 3: the inference_service unit's cleanup before each start (roles/inference_service/files/
prestart_clean.py), run as the unit runs it: root, the system's /usr/bin/python3 -I, from a copy laid
out as the role installs it (the script beside the module_utils it imports). A crash loop that
systemd's restart cannot leave (a leaked segment) ends here; what a live process holds, and what the
unit's user does not own, stays.

Its processes are the test's own holders, killed at teardown; it signals nothing itself."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _serve_command

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(_serve_command.PRESTART_PYTHON),
                                reason="runs as the unit does: root, with the system's python3")

HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); print('held', flush=True); time.sleep(600)"
BIND = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); "
        "print('held', flush=True); time.sleep(600)")


@pytest.fixture(name="installed")
def fixture_installed(tmp_path: Path) -> Path:
    """The script and its module_utils, as the role installs them under PRESTART_DIR."""
    utils = tmp_path / "lib/ansible_collections/cleanslate/gpu/plugins/module_utils"
    utils.mkdir(parents=True)
    for name in _serve_command.PRESTART_MODULE_UTILS:
        shutil.copy(REPO / "plugins/module_utils" / name, utils / name)
    shutil.copy(REPO / "roles/inference_service/files/prestart_clean.py", tmp_path / "lib/prestart_clean.py")
    return tmp_path / "lib/prestart_clean.py"


@pytest.fixture(name="areas")
def fixture_areas():
    shm = Path(tempfile.mkdtemp(prefix="cleanslate-test-", dir="/dev/shm"))
    tmp = Path(tempfile.mkdtemp(prefix="cleanslate-test-"))
    holders = []
    yield shm, tmp, holders
    for proc in holders:
        proc.kill()
        proc.wait()
    shutil.rmtree(shm)
    shutil.rmtree(tmp)


def leftover(path: Path, uid: int = NOBODY) -> Path:
    path.write_bytes(b"x" * 8192)
    os.chown(path, uid, -1)
    return path


def hold(holders: list, code: str, path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    holders.append(proc)
    assert proc.stdout.readline().strip() == "held"


def test_before_a_start_the_users_unheld_leftovers_go_and_everything_else_stays(installed, areas):
    shm, tmp, holders = areas
    leaked = leftover(shm / "psm_leaked")                 # the crash's segment: the loop's cause
    held = leftover(shm / "psm_live")                     # another server of the user still maps it
    hold(holders, HOLD, held)
    roots = leftover(shm / "nccl-root", uid=0)            # not the unit's user's
    mine = leftover(shm / "notes.txt")                    # the user's, but no engine's name
    zmq = leftover(tmp / str(uuid.uuid4()))               # vLLM's dead IPC socket file
    bound = tmp / str(uuid.uuid4())                       # a live server's bound socket
    hold(holders, BIND, bound)
    os.chown(bound, NOBODY, -1)
    proc = subprocess.run([_serve_command.PRESTART_PYTHON, "-I", str(installed), "--user", str(NOBODY),
                           "--shm", str(shm), "--tmp", str(tmp)], capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": "/nonexistent", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and not proc.stderr, proc
    assert not leaked.exists() and not zmq.exists(), proc.stdout
    assert held.exists() and roots.exists() and mine.exists() and bound.exists(), proc.stdout
    assert "pre-start cleanup: removed %s (8192 bytes, file): no live process holds it" % leaked in proc.stdout
    assert "pre-start cleanup: kept %s: held by pid %d" % (held, holders[0].pid) in proc.stdout


def test_a_bad_user_or_directory_is_one_line_and_the_start_goes_on(installed, areas):
    shm, tmp = areas[:2]
    leaked = leftover(shm / "psm_leaked")
    run = [_serve_command.PRESTART_PYTHON, "-I", str(installed)]
    proc = subprocess.run(run + ["--user", "no-such-user-x", "--shm", str(shm), "--tmp", str(tmp)],
                          capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stderr) == (0, ""), proc
    assert proc.stdout == "pre-start cleanup: user 'no-such-user-x' is no user of this host; nothing removed\n"
    assert leaked.exists()
    link = tmp / "link"
    link.symlink_to(shm)
    proc = subprocess.run(run + ["--user", str(NOBODY), "--shm", str(link), "--tmp", str(tmp / "missing")],
                          capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stderr) == (0, ""), proc
    assert leaked.exists()
    assert proc.stdout.count("\n") == 2 and "is a symbolic link" in proc.stdout and "does not exist" in proc.stdout, proc.stdout
