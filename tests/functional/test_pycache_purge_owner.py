"""cleanslate.gpu.pycache_purge and an interpreter that another user can change (issue 35).

The service's venv belongs to the service user (here `nobody`): Python runs its site-packages'
.pth files at every start, so started by root that user's code would run as root. Each test builds
a real venv of the system Python (root's own pyenv Python lies in /root, which `nobody` cannot
reach), hands it to `nobody`, and runs the module as root through run_module. Signals none.
"""
from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils._pyc_probe import PROBE_ID
from tests.functional.test_pycache_purge import (NEW, clean_env, compile_source, make_package, patch_keeping_stat, purge,
                                                 reasons)
from tests.readable_copy import readable_dir

SYSTEM_PY = "/usr/bin/python3"
NOBODY = 65534

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="handing files to other users needs root"),
    pytest.mark.skipif(not os.path.exists(SYSTEM_PY), reason="no system Python that every user can run"),
]


@pytest.fixture
def top():
    """A directory every user can reach (the venv's parents must be), removed after."""
    directory = readable_dir("cleanslate-pyc-owner-")
    yield directory
    shutil.rmtree(directory)


def service_venv(top):
    """A venv without pip: (its bin/python, its site-packages), root's for now."""
    venv = top / "venv"
    subprocess.run([SYSTEM_PY, "-m", "venv", "--without-pip", str(venv)], check=True, env=clean_env())
    return str(venv / "bin" / "python"), Path(glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0])


def give_to(path, uid):
    """path and everything under it to uid (links themselves, not what they point to)."""
    for each in [path, *path.rglob("*")]:
        os.lchown(each, uid, uid)


def spy(site, marker):
    """A .pth that records, at every start of the interpreter, the uid it started as."""
    (site / "spy.pth").write_text("import os; open(%r, 'a').write('%%d\\n' %% os.getuid())\n" % str(marker))


def uids_seen(marker):
    return marker.read_text().split() if marker.exists() else []


@pytest.mark.parametrize("named_by", ["modules", "paths"])
def test_the_service_users_venv_runs_as_that_user_and_its_stale_bytecode_still_goes(top, named_by):
    python, site = service_venv(top)
    source = make_package(site)
    pyc = compile_source(python, source)
    patch_keeping_stat(source, NEW)
    marker = top / "venv" / "uids"
    spy(site, marker)
    give_to(top / "venv", NOBODY)
    params = {"modules": ["pkg"]} if named_by == "modules" else {"paths": [str(site / "pkg")]}

    check = purge(params, python=python, check=True)
    real = purge(params, python=python)

    # Both runs started the interpreter (the .pth runs once per site directory: lib64 is lib), never as root.
    assert len(uids_seen(marker)) >= 2 and set(uids_seen(marker)) == {str(NOBODY)}, uids_seen(marker)
    assert check["rc"] == 0, check["msg"]
    assert reasons(check) == {pyc: "code differs"} and check["python"]["ran_as"] == "nobody"
    assert real["rc"] == 0, real["msg"]
    assert reasons(real) == {pyc: "code differs"} and real["python"]["ran_as"] == "nobody"
    assert not os.path.exists(pyc)


def test_a_root_owned_venv_still_runs_as_root(tmp_path):
    python, site = service_venv(tmp_path)
    source = make_package(site)
    pyc = compile_source(python, source)
    patch_keeping_stat(source, NEW)
    marker = tmp_path / "uids"
    spy(site, marker)

    result = purge({"modules": ["pkg"]}, python=python)

    assert result["rc"] == 0, result["msg"]
    assert result["python"]["ran_as"] == "root" and set(uids_seen(marker)) == {"0"}
    assert reasons(result) == {pyc: "code differs"}


def forged(python, targets, stale):
    """A .pth line that prints, as the interpreter exits (after the probe), a result of its own."""
    answer = {"probe": PROBE_ID, "executable": python, "version": "3.11.2", "implementation": "cpython",
              "cache_tag": "cpython-311", "pycache_prefix": None, "sys_path": [], "error": None,
              "targets": targets, "checked": len(stale), "stale": stale, "skipped": [], "problems": [],
              "compared": 0, "fast_fresh": 0}
    return "import atexit, sys; atexit.register(lambda: (sys.stdout.write(%r), sys.stdout.flush()))\n" % (
        "\n" + json.dumps(answer) + "\n")


@pytest.mark.parametrize("lie,said", [
    ("paths root /", "refusing to remove files outside __pycache__ under the targets, nothing removed: "),
    ("module root /", "refusing to purge module pkg found at / by python "),
    ("__pycache__ links to root's", "refusing to remove files outside __pycache__ under the targets, nothing removed: "),
])
def test_a_lying_probe_removes_nothing_outside_the_targets(top, lie, said):
    python, site = service_venv(top)
    make_package(site)
    # Bytecode of root's, outside the targets, in a __pycache__ of its own.
    victim = top / "roots" / "__pycache__" / "mod.cpython-311.pyc"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"root's bytecode")
    if lie == "paths root /":
        params, targets, pyc = {"paths": [str(site / "pkg")]}, [{"root": "/", "from": "paths"}], str(victim)
    elif lie == "module root /":
        params, targets, pyc = {"modules": ["pkg"]}, [{"root": "/", "from": "module pkg"}], str(victim)
    else:
        os.symlink(victim.parent, site / "pkg" / "__pycache__")
        params, targets = {"paths": [str(site / "pkg")]}, [{"root": str(site / "pkg"), "from": "paths"}]
        pyc = str(site / "pkg" / "__pycache__" / victim.name)
    (site / "liar.pth").write_text(forged(python, targets, [{"pyc": pyc, "source": None, "reason": "mode all"}]))
    give_to(top / "venv", NOBODY)

    result = purge(dict(params, mode="all"), python=python)

    assert victim.exists()
    assert result["rc"] == 1 and result["msg"].startswith(said), result["msg"]
    assert "\n" not in result["msg"]


def other_user():
    try:
        return pwd.getpwnam("daemon").pw_uid
    except KeyError:
        pytest.skip("no `daemon` user to own the link")


@pytest.mark.parametrize("case", ["venv's bin of another user", "link owned by another user",
                                  "link from another user's directory", "venv its group may write"])
def test_an_interpreter_more_than_one_user_can_change_is_refused_and_never_run(top, case):
    python, site = service_venv(top)
    source = make_package(site)
    pyc = compile_source(python, source)
    source.unlink()
    marker = top / "venv" / "uids"
    spy(site, marker)
    give_to(top / "venv", NOBODY)
    venv_nobody = "nobody (uid %d) owns %s" % (NOBODY, top / "venv")
    if case == "venv's bin of another user":
        give_to(top / "venv" / "bin", other_user())
        said = ["more than one user can change what it runs", "daemon (uid 1) owns %s" % (top / "venv" / "bin"),
                venv_nobody]
    elif case == "link owned by another user":
        os.lchown(python, other_user(), other_user())
        said = ["more than one user can change what it runs", "daemon (uid 1) owns %s" % python, venv_nobody]
    elif case == "link from another user's directory":
        # Started through this link, Python does not even take the venv for its own (no
        # pyvenv.cfg beside the link): the links into it count all the same.
        links = top / "links"
        links.mkdir()
        os.symlink(python, links / "python")
        give_to(links, other_user())
        python = str(links / "python")
        said = ["more than one user can change what it runs", "daemon (uid 1) owns %s" % links]
    else:
        site.chmod(0o775)
        said = ["%s may be written by its group (mode 0775)" % site]

    for check in (True, False):
        result = purge({"paths": [str(site)], "mode": "all"}, python=python, check=check)

        assert uids_seen(marker) == [] and os.path.exists(pyc)
        assert result["rc"] == 1, result
        assert result["msg"].startswith("refusing to run python %s: " % python), result["msg"]
        assert result["msg"].endswith("; nothing was run or removed")
        for words in said:
            assert words in result["msg"]


def test_the_service_users_probe_removes_with_that_users_rights_only(top):
    python, site = service_venv(top)
    give_to(top / "venv", NOBODY)
    # Bytecode of root's, whose source is gone, in a tree of root's that the operator names.
    roots = top / "roots"
    source = make_package(roots)
    pyc = compile_source(SYSTEM_PY, source)
    source.unlink()

    result = purge({"paths": [str(roots)]}, python=python)

    assert os.path.exists(pyc)
    assert result["rc"] == 1 and result["msg"].startswith("could not remove 1 stale bytecode file(s): "), result
    assert [item["path"] for item in result["errors"]] == [pyc] and "Permission denied" in result["errors"][0]["error"]
    assert result["python"]["ran_as"] == "nobody"
