"""Pure logic of shm_clean: which names are selected, which patterns are refused, which torch
creator a name carries (whether it lives is _procs.alive's, tested in test_procs)."""
from __future__ import annotations

import os
import sys
import time

import pytest

from tests.run_module import ensure_collection_link

sys.path.insert(0, str(ensure_collection_link()))
from ansible_collections.cleanslate.gpu.plugins.module_utils import _shm_clean_module as shm_clean  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.cleanslate.gpu.plugins.module_utils import _file_users  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.cleanslate.gpu.plugins.module_utils import _leftovers  # noqa: E402  pylint: disable=wrong-import-position

MIN_AGE_MAX = RANGES["shm_clean"]["min_age"].maximum


def params(**overrides):
    base = {"path": "/dev/shm", "patterns": list(shm_clean.DEFAULT_PATTERNS), "exclude": [], "min_age": 0.0,
            "remove_in_use": False}
    base.update(overrides)
    return base


@pytest.mark.parametrize("name", [
    "nccl-c2a7f1", "psm_8d1e0b2a", "sem.mp-a1b2c3", "sem.loky-1234-abcd", "torch_4242_171717_0",
    "vllm-ipc-3", "sglang_vllm_buffer",
])
def test_default_patterns_select_crash_leftovers(name):
    assert _leftovers.selected(name, shm_clean.DEFAULT_PATTERNS, [])


@pytest.mark.parametrize("name", [
    "NCCL-upper", "pulse-shm-1234", "sem.other", "psm-dash", "torchvision", "my-job.lock", "Vllm",
])
def test_default_patterns_leave_other_segments(name):
    assert not _leftovers.selected(name, shm_clean.DEFAULT_PATTERNS, [])


def test_exclude_wins_over_patterns():
    assert not _leftovers.selected("nccl-keep-1", ["nccl-*"], ["nccl-keep-*"])
    assert _leftovers.selected("nccl-drop-1", ["nccl-*"], ["nccl-keep-*"])


@pytest.mark.parametrize("pattern, why", [
    ("", "empty"), ("/dev/shm/nccl-*", "'/'"), ("../*", "'/'"), ("..*", "'..'"), ("a\0b", "NUL"),
])
def test_unsafe_patterns_are_refused(pattern, why):
    assert why in shm_clean.pattern_problem(pattern)


@pytest.mark.parametrize("pattern", ["nccl-*", "*vllm*", "sem.[ml]*", ".nccl-?", "torch_[0-9]*"])
def test_ordinary_patterns_are_accepted(pattern):
    assert shm_clean.pattern_problem(pattern) is None


def test_every_problem_is_reported_at_once():
    problems = shm_clean.input_problems(params(path="shm", patterns=["a/b"], exclude=[".."], min_age=-5))
    assert len(problems) == 4
    assert any("absolute" in p for p in problems)
    assert any("patterns entry 'a/b'" in p for p in problems)
    assert any("exclude entry '..'" in p for p in problems)
    assert any("min_age" in p for p in problems)


def test_defaults_are_valid_input():
    assert shm_clean.input_problems(params()) == []


@pytest.mark.parametrize("name, pid", [
    ("torch_4242_171717_0", 4242), ("torch_1_2_3", 1), ("torch_0_2_3", None), ("torch_abc_1", None),
    ("torch_4242", None), ("xtorch_4242_1", None), ("torch_99999999999_1", None),
])
def test_torch_creator_pid_comes_from_the_name(name, pid):
    assert _leftovers.torch_creator(name) == pid


def test_freed_bytes_counts_allocated_space_of_the_last_name_only(tmp_path):
    data = tmp_path / "seg"
    data.write_bytes(os.urandom(10000))
    assert shm_clean.freed_bytes(os.lstat(data)) == os.lstat(data).st_blocks * 512 > 0
    (tmp_path / "other-name").hardlink_to(data)
    assert shm_clean.freed_bytes(os.lstat(data)) == 0
    (tmp_path / "link").symlink_to(data)
    assert shm_clean.freed_bytes(os.lstat(tmp_path / "link")) == 0


@pytest.mark.parametrize("value, why", [
    (float("nan"), "finite"), (float("inf"), "finite"), (float("-inf"), "finite"), (-0.5, "0 or more"),
    (1e300, "%s or less" % MIN_AGE_MAX),
])
def test_min_age_must_be_a_sane_number(value, why):
    problems = shm_clean.input_problems(params(min_age=value))
    assert len(problems) == 1 and problems[0].startswith("min_age must") and why in problems[0]


@pytest.mark.parametrize("value", [0.0, 0.25, 600.0, float(MIN_AGE_MAX)])
def test_sane_min_ages_are_accepted(value):
    assert shm_clean.input_problems(params(min_age=value)) == []


# --- module_utils/_file_users: the parsers, on the text formats of /proc -----------------------

from ansible_collections.cleanslate.gpu.plugins.module_utils import _file_users  # noqa: E402  pylint: disable=wrong-import-position


def test_mountinfo_gives_device_and_type_per_mount_id():
    text = (b"25 24 0:23 / /dev/shm rw,relatime shared:4 - tmpfs tmpfs rw,size=24684084k\n"
            b"31 25 0:300 / /dev/shm/with\\040space rw master:1 - overlay overlay rw\n"
            b"garbage\n")
    devices, types = _file_users.mount_devices(text)
    assert devices == {25: (0, 23), 31: (0, 300)}
    assert types == {25: b"tmpfs", 31: b"overlay"}


def test_fdinfo_gives_mount_and_inode_and_says_when_the_inode_is_missing():
    assert _file_users.fdinfo_fields(b"pos:\t0\nflags:\t0100002\nmnt_id:\t37\nino:\t1234\n") == (37, 1234)
    # Before Linux 5.14 there is no ino: line.
    assert _file_users.fdinfo_fields(b"pos:\t0\nflags:\t0100002\nmnt_id:\t37\n") == (37, None)


def test_a_descriptor_is_examined_only_when_its_link_ends_in_a_wanted_name():
    wanted = _file_users.Wanted({"nccl-a": 11, "x (deleted)": 12, "new\nline": 13}, (0, 27))
    assert wanted.name_matches("/elsewhere/view/nccl-a") == "nccl-a"
    assert wanted.name_matches("/dev/shm/nccl-a (deleted)") == "nccl-a"
    assert wanted.name_matches("/dev/shm/x (deleted)") == "x (deleted)"
    assert wanted.name_matches("/dev/shm/x (deleted) (deleted)") == "x (deleted)"
    assert wanted.name_matches("/dev/shm/new\nline") == "new\nline"
    assert wanted.name_matches("/dev/shm/nccl-ab") is None
    assert wanted.name_matches("socket:[1234]") is None


def test_a_file_is_the_same_only_with_device_and_inode_when_the_device_is_known():
    strict = _file_users.Wanted({"nccl-a": 11}, (0, 27))
    assert strict.name_of((0, 27), 11) == "nccl-a"
    assert strict.name_of((0, 28), 11) is None
    assert strict.name_of(None, 11) == "nccl-a"  # a mount that vanished: the inode alone keeps it
    loose = _file_users.Wanted({"nccl-a": 11}, None)
    assert loose.name_of((8, 1), 11) == "nccl-a"


def test_maps_lines_match_by_device_and_inode_whatever_the_path_says(tmp_path):
    wanted = _file_users.Wanted({"nccl-a": 11, "nccl-b": 12}, (0, 0x1b))
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "maps").write_bytes(
        b"7f0000000000-7f0000001000 rw-s 00000000 00:1b 11                         /other/view/renamed\r x\n"
        b"7f0000001000-7f0000002000 rw-s 00000000 00:1c 12                         /dev/shm/nccl-b\n"
        b"7f0000002000-7f0000003000 r--p 00000000 08:01 12                         /usr/lib/libc.so\n"
        b"7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n")
    assert _file_users._mapped(7, wanted, str(proc)) == {"nccl-a"}
    (proc / "7" / "maps").write_bytes(b"7f0000002000-7f0000003000 r--p 00000000 08:01 11   /usr/lib/x\n")
    assert _file_users._mapped(7, wanted, str(proc)) == set()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a /dev/shm tmpfs")
def test_on_tmpfs_the_directory_device_is_the_one_stat_and_maps_show():
    fd = os.open("/dev/shm", os.O_RDONLY | os.O_DIRECTORY)
    try:
        device = _file_users.directory_device(fd)
    finally:
        os.close(fd)
    st = os.stat("/dev/shm")
    assert device == (os.major(st.st_dev), os.minor(st.st_dev))


def fake_process(proc, pid, fds=None, fdinfo=None, maps=b"", mountinfo=b""):
    """A /proc/PID directory as the scan reads it: fd links, fdinfo texts, maps, mountinfo, ns/mnt."""
    base = proc / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "fdinfo").mkdir()
    (base / "ns").mkdir()
    (base / "ns" / "mnt").symlink_to("mnt:[4026531841]")
    for fd, target in (fds or {}).items():
        (base / "fd" / fd).symlink_to(target)
    for fd, text in (fdinfo or {}).items():
        (base / "fdinfo" / fd).write_bytes(text)
    (base / "maps").write_bytes(maps)
    (base / "mountinfo").write_bytes(mountinfo)
    return base


def test_users_by_descriptor_with_and_without_ino_in_fdinfo_and_unreadable_processes(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    held = shm / "nccl-held"
    held.write_bytes(b"x")
    same_name = tmp_path / "elsewhere"
    same_name.mkdir()
    (same_name / "nccl-held").write_bytes(b"another file with the same name")
    st = held.stat()
    device = (os.major(st.st_dev), os.minor(st.st_dev))
    mountinfo = b"37 1 %d:%d / / rw - ext4 /dev/x rw\n" % device
    proc = tmp_path / "proc"
    # Linux >= 5.14: fdinfo has ino; the mount id gives the device through mountinfo.
    fake_process(proc, 10, fds={"3": str(held)}, fdinfo={"3": b"pos:\t0\nmnt_id:\t37\nino:\t%d\n" % st.st_ino},
                 mountinfo=mountinfo)
    # Older kernels: no ino, so the descriptor (only one whose name matches) is stat'ed.
    fake_process(proc, 11, fds={"4": str(held)}, fdinfo={"4": b"pos:\t0\nmnt_id:\t37\n"},
                 mountinfo=mountinfo)
    # Same name, another file: not a user.
    fake_process(proc, 12, fds={"5": str(same_name / "nccl-held")}, fdinfo={"5": b"pos:\t0\nmnt_id:\t37\n"},
                 mountinfo=mountinfo)
    # Its descriptors cannot be listed: whether it uses the file is unknown.
    (proc / "13").mkdir()
    (proc / "13" / "fd").write_bytes(b"")
    # Gone between the listing of /proc and the read.
    (proc / "14").mkdir()

    found, unreadable = _file_users.users({"nccl-held": st.st_ino}, device, proc=str(proc))

    assert found == {"nccl-held": [10, 11]}
    assert unreadable == [13]


def test_the_processes_whose_files_cannot_be_read_are_named(tmp_path):
    """The warning about processes root could not read names each (issue 29: `pids 1` alone left
    the reader to guess it was the container's init). A name is one printable line whatever the
    process calls itself; a pid that is gone is `?`."""
    import subprocess  # pylint: disable=import-outside-toplevel
    odd = tmp_path / os.fsdecode(b"gpu\nholder\xe9")
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        # The kernel names the process at its exec: wait for it (bounded), not for a guess.
        for _attempt in range(500):
            with open("/proc/%d/comm" % proc.pid, "rb") as handle:
                if handle.read().startswith(b"gpu"):
                    break
            time.sleep(0.01)
        shown = shm_clean.shown_pids([os.getpid(), proc.pid, 2 ** 22 + 7])
    finally:
        proc.kill()
        proc.wait()
    mine = open("/proc/self/comm", encoding="utf-8").read().strip()
    assert shown == "%d (%s), %d (gpu\\nholder\\xe9), %d (?)" % (os.getpid(), mine, proc.pid, 2 ** 22 + 7), shown


def test_the_default_tmp_patterns_take_str_uuid4_and_vllm_dist_names_only():
    """Issue 37: vLLM's ZeroMQ IPC sockets are /tmp/<str(uuid.uuid4())>; a UUID of another version, in
    upper case, or with more around it is another program's name."""
    import uuid  # pylint: disable=import-outside-toplevel
    patterns = shm_clean.DEFAULT_TMP_PATTERNS
    for name in [str(uuid.uuid4()) for dummy in range(200)] + ["vllm_dist_x", "vllm_dist_abc123"]:
        assert shm_clean.tmp_selected(name, patterns, []), name
    for name in [str(uuid.uuid1()), str(uuid.uuid4()).upper(), str(uuid.uuid4()) + ".bak", "x" + str(uuid.uuid4()),
                 str(uuid.uuid4()).replace("-", ""), "vllm_dist_", "my_vllm_dist_x", "nccl-1"]:
        assert not shm_clean.tmp_selected(name, patterns, []), name
    assert not shm_clean.tmp_selected("vllm_dist_keep", patterns, ["vllm_dist_k*"])


@pytest.mark.parametrize("pattern, why", [
    ("", "is empty"), ("[", "is not a regular expression"), (".*", "matches ''"), ("\\.\\.?", "matches '.'")])
def test_a_tmp_pattern_that_is_no_expression_or_matches_dot_is_refused(pattern, why):
    assert why in shm_clean.tmp_pattern_problem(pattern)


def test_the_bound_sockets_table_gives_each_path_its_socket_inode():
    """/proc/net/unix: the header, a bound path, an unbound (connected) socket, an abstract name."""
    text = (b"Num       RefCount Protocol Flags    Type St Inode Path\n"
            b"0000000000000000: 00000002 00000000 00010000 0001 01 31337 /tmp/3f0c5d7e-9a1b-4c2d-8e3f-0123456789ab\n"
            b"0000000000000000: 00000003 00000000 00000000 0001 03 31338\n"
            b"0000000000000000: 00000002 00000000 00010000 0001 01 31339 @/tmp/abstract\n"
            b"0000000000000000: 00000002 00000000 00010000 0001 01 31340 /run/a b\n")
    assert _file_users.unix_socket_paths(text) == [(31337, b"/tmp/3f0c5d7e-9a1b-4c2d-8e3f-0123456789ab"),
                                                   (31340, b"/run/a b")]
