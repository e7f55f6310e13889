"""Pure logic of shm_clean: which names are selected, which patterns are refused, which torch
creator a name carries, and whether that creator counts as alive (checked against real processes)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.run_module import ensure_collection_link
from tests.sim import procinfo

sys.path.insert(0, str(ensure_collection_link()))
from ansible_collections.cleanslate.gpu.plugins.modules import shm_clean  # noqa: E402  pylint: disable=wrong-import-position


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
    assert shm_clean.selected(name, shm_clean.DEFAULT_PATTERNS, [])


@pytest.mark.parametrize("name", [
    "NCCL-upper", "pulse-shm-1234", "sem.other", "psm-dash", "torchvision", "my-job.lock", "Vllm",
])
def test_default_patterns_leave_other_segments(name):
    assert not shm_clean.selected(name, shm_clean.DEFAULT_PATTERNS, [])


def test_exclude_wins_over_patterns():
    assert not shm_clean.selected("nccl-keep-1", ["nccl-*"], ["nccl-keep-*"])
    assert shm_clean.selected("nccl-drop-1", ["nccl-*"], ["nccl-keep-*"])


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
    assert shm_clean.torch_creator(name) == pid


def test_a_running_process_is_alive_and_a_reaped_one_is_not():
    proc = subprocess.Popen(["sleep", "600"])
    try:
        assert shm_clean.pid_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not shm_clean.pid_alive(proc.pid)


def test_a_zombie_is_not_alive():
    proc = subprocess.Popen(["true"])
    try:
        for attempt in range(600):  # generous: the machine is shared
            if procinfo.state(proc.pid) == "Z":
                break
            time.sleep(0.05)
        else:
            pytest.fail("child never became a zombie")
        assert not shm_clean.pid_alive(proc.pid)
    finally:
        proc.wait()


def test_a_process_named_with_a_parenthesis_is_read_correctly(tmp_path):
    # comm may contain ') ' and a letter that looks like a state; the state after the last ')' counts.
    odd = tmp_path / "x) Z y"
    odd.symlink_to(shutil.which("sleep"))
    proc = subprocess.Popen([str(odd), "600"])
    try:
        for attempt in range(600):
            if "x) Z" in Path("/proc/%d/stat" % proc.pid).read_text():
                break
            time.sleep(0.05)
        else:
            pytest.fail("the odd process name never showed in /proc")
        assert shm_clean.pid_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_freed_bytes_counts_allocated_space_of_the_last_name_only(tmp_path):
    data = tmp_path / "seg"
    data.write_bytes(os.urandom(10000))
    assert shm_clean.freed_bytes(os.lstat(data)) == os.lstat(data).st_blocks * 512 > 0
    (tmp_path / "other-name").hardlink_to(data)
    assert shm_clean.freed_bytes(os.lstat(data)) == 0
    (tmp_path / "link").symlink_to(data)
    assert shm_clean.freed_bytes(os.lstat(tmp_path / "link")) == 0
