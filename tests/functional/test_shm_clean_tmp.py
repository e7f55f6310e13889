"""shm_clean's pass over tmp_path (issue 37 point 6): what a real vLLM leaves directly in /tmp at every
start and never removes after a crash, its ZeroMQ IPC sockets /tmp/<uuid4> and its vllm_dist_* files,
against real unix sockets bound by live processes, real files held open, and the entries that only
look like leftovers. And the hint a reset that freed nothing needs: which segment a live process
keeps, its size, and who holds it (pid and name).

Each scenario runs as PID 1 of a private PID namespace (tests/functional/pidns.py) in a directory of
its own standing for /tmp and /dev/shm; the real /tmp is never passed to the module."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.functional import pidns

pytestmark = pytest.mark.skipif(pidns.available() is not None, reason=str(pidns.available()))

NOBODY = 65534
OLD = 3600
LIVE = "3f0c5d7e-9a1b-4c2d-8e3f-0123456789ab"        # a socket a live engine has bound
DEAD = "0d9e8f7a-6b5c-4d3e-a2f1-fedcba987654"        # its binder died (killed, as a crash does)
THEIRS = "5a6b7c8d-9e0f-4a1b-9c2d-3e4f5a6b7c8d"      # a dead socket of another user's
LINK = "7e6d5c4b-3a29-4180-bf7e-6d5c4b3a2918"        # a link named like a socket, to a file elsewhere
LOOKALIKES = [
    "3f0c5d7e-9a1b-1c2d-8e3f-0123456789ab",          # version 1, not uuid4
    "3F0C5D7E-9A1B-4C2D-8E3F-0123456789AB",          # upper case: str(uuid4()) is never
    "3f0c5d7e-9a1b-4c2d-8e3f-0123456789ab.bak",      # a longer name
    "x3f0c5d7e-9a1b-4c2d-8e3f-0123456789ab",
]

# Binds a unix socket at argv[1] and listens, as ZeroMQ's ipc:// does; says its pid, then waits.
BIND = r"""
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(1)
print(os.getpid(), flush=True)
if len(sys.argv) > 2:
    os._exit(0)  # dies holding it: the file stays, no process binds it any more
time.sleep(600)
"""
HOLD_OPEN = r"""
import os, sys, time
handle = open(sys.argv[1], "rb")
print(os.getpid(), flush=True)
time.sleep(600)
"""


def _start(ns, code, *args):
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    ns.procs.append(proc)
    pid = int(proc.stdout.readline())
    if len(args) > 1:
        proc.wait()
    return pid


def _aged(path):
    os.utime(path, (time.time() - OLD, time.time() - OLD), follow_symlinks=False)


def _dead_socket(ns, path):
    _start(ns, BIND, str(path), "die")
    assert path.is_socket()


def tmp_leftovers(ns, check=False, remove_in_use=False) -> dict:
    """A /tmp as a crashed vLLM leaves it, beside a live engine's sockets and files; shm_clean once."""
    tmp, shm, elsewhere = ns.scratch / "tmp", ns.scratch / "shm", ns.scratch / "elsewhere"
    for directory in (tmp, shm, elsewhere):
        directory.mkdir()
    tmp.chmod(0o1777)
    live_pid = _start(ns, BIND, str(tmp / LIVE))
    _dead_socket(ns, tmp / DEAD)
    _dead_socket(ns, tmp / THEIRS)
    os.lchown(tmp / THEIRS, NOBODY, NOBODY)
    for name in LOOKALIKES:
        _dead_socket(ns, tmp / name)
    (tmp / "vllm_dist_held").write_bytes(b"x" * 4096)
    (tmp / "vllm_dist_free").write_bytes(b"y" * 4096)
    held_pid = _start(ns, HOLD_OPEN, str(tmp / "vllm_dist_held"))
    (elsewhere / "victim").write_bytes(b"keep me")
    (tmp / LINK).symlink_to(elsewhere / "victim")
    for entry in tmp.iterdir():
        _aged(entry)
    result = ns.module("shm_clean", {"path": str(shm), "patterns": ["psm_*"], "tmp_path": str(tmp),
                                     "remove_in_use": remove_in_use}, check=check)
    return {"result": result, "live_pid": live_pid, "held_pid": held_pid, "tmp": str(tmp),
            "left": sorted(entry.name for entry in tmp.iterdir()),
            "victim": (elsewhere / "victim").read_bytes().decode(),
            "live_connects": _connects(tmp / LIVE)}


def _connects(path) -> bool:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        client.close()


@pytest.fixture(scope="module")
def cleaned():
    return pidns.run_in_pidns("tests.functional.test_shm_clean_tmp:tmp_leftovers")


def names(items, key=None):
    return {os.path.basename(item["path"]): (item[key] if key else item) for item in items}


def test_a_socket_whose_binder_died_and_an_unheld_vllm_dist_file_are_removed(cleaned):
    """Bug caught: /tmp never cleaned (59 sockets after 9 starts), or a dead socket taken for live."""
    result = cleaned["result"]
    assert result["rc"] == 0 and result["changed"], result
    assert set(names(result["removed"])) == {DEAD, "vllm_dist_free"}, result["removed"]
    assert all(item["area"] == "tmp" for item in result["removed"])
    assert DEAD not in cleaned["left"] and "vllm_dist_free" not in cleaned["left"]


def test_a_socket_a_live_process_binds_is_kept_with_its_pid_and_still_answers(cleaned):
    """Bug caught: a socket file is never open as a file (the process holds socket:[N], another inode):
    a check by the file's inode alone finds no user and removes a live engine's IPC socket."""
    in_use = names(cleaned["result"]["in_use"])
    assert in_use[LIVE]["pids"] == [cleaned["live_pid"]], in_use
    assert [holder["pid"] for holder in in_use[LIVE]["holders"]] == [cleaned["live_pid"]]
    assert LIVE in cleaned["left"] and cleaned["live_connects"]


def test_a_vllm_dist_file_held_open_is_kept_with_its_holder(cleaned):
    in_use = names(cleaned["result"]["in_use"])
    assert in_use["vllm_dist_held"]["pids"] == [cleaned["held_pid"]] and in_use["vllm_dist_held"]["size"] == 4096
    assert "vllm_dist_held" in cleaned["left"]


def test_names_that_only_look_like_a_uuid4_are_not_touched_nor_listed(cleaned):
    """Bug caught: a loose pattern ('*-*-*-*-*', a UUID of any version or case) removes other programs' files."""
    result = cleaned["result"]
    listed = set(names(result["removed"])) | set(names(result["in_use"])) | set(names(result["kept"]))
    assert not listed & set(LOOKALIKES), listed
    assert set(LOOKALIKES) <= set(cleaned["left"])


def test_a_link_named_like_a_socket_is_kept_and_never_followed(cleaned):
    """Bug caught: following the link removes or inspects a file outside tmp_path."""
    kept = names(cleaned["result"]["kept"], "why")
    assert kept[LINK] == "a symbolic link; in tmp_path links are neither followed nor removed", kept
    assert LINK in cleaned["left"] and cleaned["victim"] == "keep me"


def test_a_leftover_of_another_user_is_kept_and_says_whose(cleaned):
    """Bug caught: root removes any user's /tmp/<uuid> (a sticky /tmp lets only its owner do so)."""
    kept = names(cleaned["result"]["kept"], "why")
    assert kept[THEIRS].startswith("owned by uid %d (" % NOBODY) and kept[THEIRS].endswith(
        "), neither root nor a user of tmp_owners"), kept
    assert THEIRS in cleaned["left"]


def test_check_mode_removes_nothing_and_says_what_would_go():
    out = pidns.run_in_pidns("tests.functional.test_shm_clean_tmp:tmp_leftovers", check=True)
    result = out["result"]
    assert result["rc"] == 0 and result["changed"], result
    assert set(names(result["removed"])) == {DEAD, "vllm_dist_free"}
    assert {DEAD, "vllm_dist_free", LIVE, THEIRS, LINK} <= set(out["left"])


def test_remove_in_use_never_removes_a_live_socket():
    """remove_in_use is for segments, whose space returns when their holders exit; a live server's
    socket or file in tmp_path frees nothing and breaks it."""
    out = pidns.run_in_pidns("tests.functional.test_shm_clean_tmp:tmp_leftovers", remove_in_use=True)
    assert set(names(out["result"]["removed"])) == {DEAD, "vllm_dist_free"}
    assert {LIVE, "vllm_dist_held"} <= set(out["left"]) and out["live_connects"]


def bound_in_another_network_namespace(ns) -> dict:
    """An engine in a network namespace of its own (a container sharing the host's /tmp) binds a socket
    there: the module's own /proc/net/unix does not list it."""
    tmp = ns.scratch / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(["unshare", "--net", sys.executable, "-c", BIND, str(tmp / LIVE)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    ns.procs.append(proc)
    pid = int(proc.stdout.readline())
    _aged(tmp / LIVE)
    with open("/proc/net/unix", "rb") as handle:
        # Its whole path: another test of this file binds a socket of the same name in this namespace
        # (run side by side, -n 4, that one made this check fail).
        listed_here = os.fsencode(str(tmp / LIVE)) in handle.read()
    result = ns.module("shm_clean", {"path": str(ns.scratch), "patterns": ["psm_*"], "tmp_path": str(tmp)})
    return {"result": result, "pid": pid, "listed_here": listed_here, "left": sorted(os.listdir(tmp))}


def test_a_socket_bound_in_another_network_namespace_is_kept():
    """Bug caught: reading only the module's own /proc/net/unix (one network namespace) takes a
    containerised engine's live socket for a leftover."""
    out = pidns.run_in_pidns("tests.functional.test_shm_clean_tmp:bound_in_another_network_namespace")
    assert not out["listed_here"]
    assert names(out["result"]["in_use"], "pids") == {LIVE: [out["pid"]]}, out["result"]
    assert out["left"] == [LIVE]


def held_segment(ns) -> dict:
    """A 1 MiB psm_ segment mapped by an orphaned engine core (its name is what a `vllm serve` pattern
    cannot match), a dead one beside it; shm_clean on that directory."""
    shm = ns.scratch / "shm"
    shm.mkdir()
    (shm / "psm_held").write_bytes(os.urandom(1 << 20))
    (shm / "psm_dead").write_bytes(os.urandom(4096))
    for entry in shm.iterdir():
        _aged(entry)
    holder = ns.start(key="core", name="VLLM::EngineCore", map=[str(shm / "psm_held")], close_mapped=True)["core"]
    result = ns.module("shm_clean", {"path": str(shm)})
    return {"result": result, "pid": holder["pid"]}


def test_a_kept_segment_names_its_size_and_its_holders_pid_and_name():
    """Bug caught: a reset that "freed 0 bytes" next to a segment an orphan keeps, without saying who."""
    out = pidns.run_in_pidns("tests.functional.test_shm_clean_tmp:held_segment")
    result = out["result"]
    assert result["rc"] == 0, result
    (item,) = result["in_use"]
    assert item["path"].endswith("/psm_held") and item["area"] == "shm"
    assert item["size"] == 1 << 20 and item["bytes"] >= 1 << 20
    # The kernel keeps 15 bytes of a process name.
    assert item["holders"] == [{"pid": out["pid"], "name": "VLLM::EngineCor"}] and item["pids"] == [out["pid"]]
    assert names(result["removed"]).keys() == {"psm_dead"}
