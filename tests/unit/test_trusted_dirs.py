"""A directory a privileged writer may use (plugins/module_utils/_trusted_dirs.py): real directories
from `/` down, owned by root (or a trusted uid), writable by no one else; a sticky parent such as
/tmp is accepted, the directory itself never."""
from __future__ import annotations

import os
import sys

import pytest

from tests.run_module import ensure_collection_link

sys.path.insert(0, str(ensure_collection_link()))
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import trusted_directory_problem  # noqa: E402

ME = (os.geteuid(),)
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")


@pytest.fixture
def base(tmp_path):
    """A directory that passes: pytest's own (the user's, 0700) under /tmp (1777, sticky)."""
    assert trusted_directory_problem(str(tmp_path), ME) == ""
    return tmp_path


def made(path, mode=0o755):
    path.mkdir()
    path.chmod(mode)
    return path


def test_a_good_directory_and_the_sticky_parents_pass(base):
    sticky = made(base / "sticky", 0o1777)
    inner = made(sticky / "mine", 0o700)
    assert trusted_directory_problem(str(inner), ME) == ""
    assert trusted_directory_problem(str(inner) + "/", ME) == ""
    assert trusted_directory_problem(str(inner).replace("/mine", "/./mine"), ME) == ""
    assert trusted_directory_problem("/", ()) == ""


@pytest.mark.parametrize("mode, words", [
    (0o1777, "may be written by others (mode 1777)"),  # sticky: fine above, never the directory itself
    (0o777, "may be written by others (mode 0777)"),
    (0o775, "may be written by its group (mode 0775)"),
    (0o757, "may be written by others (mode 0757)"),
])
def test_a_directory_others_may_write_is_refused(base, mode, words):
    bad = made(base / "bad", mode)
    problem = trusted_directory_problem(str(bad), ME)
    assert problem.startswith("directory %s is not safe to write in: %s %s;" % (bad, bad, words)), problem


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o2777])
def test_a_parent_others_may_write_without_the_sticky_bit_is_refused(base, mode):
    parent = made(base / "open", mode)
    inner = made(parent / "mine", 0o700)
    problem = trusted_directory_problem(str(inner), ME)
    assert "is not safe to write in: %s may be written by" % parent in problem, problem


def test_a_symbolic_link_anywhere_on_the_way_is_refused(base):
    real = made(base / "real")
    made(real / "leaf")
    (base / "link").symlink_to(real)
    (base / "leaflink").symlink_to(real / "leaf")
    for path, component in ((base / "link" / "leaf", base / "link"), (base / "leaflink", base / "leaflink")):
        problem = trusted_directory_problem(str(path), ME)
        assert "%s is a symbolic link;" % component in problem, problem
    (base / "dangling").symlink_to(base / "nowhere")
    assert "is a symbolic link" in trusted_directory_problem(str(base / "dangling" / "x"), ME, missing_ok=True)


@root_only
def test_a_directory_or_parent_of_another_user_is_refused_unless_trusted(base):
    theirs = made(base / "theirs")
    os.chown(theirs, NOBODY, NOBODY)
    inner = made(theirs / "mine")
    problem = trusted_directory_problem(str(inner), ME)
    assert "%s is owned by uid %d" % (theirs, NOBODY) in problem and "owned by root" in problem, problem
    assert trusted_directory_problem(str(inner), ME + (NOBODY,)) == ""
    # The controller's user is trusted only where the caller says so (the host's code: root only).
    assert "is owned by uid %d" % NOBODY in trusted_directory_problem(str(inner), ())


def test_missing_parts_a_file_and_bad_paths(base):
    missing = base / "a" / "b"
    assert trusted_directory_problem(str(missing), ME, missing_ok=True) == ""
    assert trusted_directory_problem(str(missing), ME) == "directory %s does not exist: %s is missing" % (missing, base / "a")
    (base / "file").write_text("x")
    assert "%s is not a directory;" % (base / "file") in trusted_directory_problem(str(base / "file" / "x"), ME, missing_ok=True)
    up = "%s/x/../y" % base
    assert "goes up with `..`" in trusted_directory_problem(up, ME, missing_ok=True)
    for bad in ("relative/dir", "", None, 5, ["/"], b"/tmp"):
        assert "is not an absolute directory path" in trusted_directory_problem(bad, ME), bad


def test_the_sentence_shows_a_name_that_is_not_utf8_readably(base):
    odd = base / os.fsdecode(b"bad\xffname")
    made(odd, 0o777)
    problem = trusted_directory_problem(str(odd), ME)
    assert "bad\\xffname may be written by others" in problem
    problem.encode("utf-8")  # a result Ansible can carry
