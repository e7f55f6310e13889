"""cleanslate.gpu.pycache_purge against real bytecode compiled by real interpreters.

Each test builds a small package under its own tmp_path, compiles it with py_compile in a
child interpreter, patches it the way engineers do, runs the module through run_module, and
then imports the package in a fresh interpreter to see which code actually runs.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
from pathlib import Path

from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import RANGES
from tests.run_module import REPO, ensure_collection_link, run_module
from tests.sim import procinfo

VENV_PY = sys.executable
SYSTEM_PY = "/usr/bin/python3"

# The venv's Python, and the system Python when it is another build (3.11.7 and 3.11.2 here).
INTERPRETERS = [VENV_PY]
if os.path.exists(SYSTEM_PY) and os.path.realpath(SYSTEM_PY) != os.path.realpath(VENV_PY):
    INTERPRETERS.append(SYSTEM_PY)

OLD = 'VALUE = "old"\n'
NEW = 'VALUE = "new"\n'  # same length as OLD: a patch that keeps the size


def clean_env(**extra):
    """Environment for child interpreters: no inherited bytecode settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env.update(extra)
    return env


def tag_of(python):
    return subprocess.run([python, "-c", "import sys; print(sys.implementation.cache_tag)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def make_package(site, text=OLD, name="pkg"):
    """site/pkg/__init__.py and site/pkg/mod.py; returns the path of mod.py."""
    package = site / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    module = package / "mod.py"
    module.write_text(text)
    return module


def compile_source(python, source, mode="TIMESTAMP", optimize=-1, env=None):
    """Compile one source with py_compile under python; returns the pyc path it wrote."""
    code = ("import py_compile, sys; print(py_compile.compile(sys.argv[1], doraise=True, optimize=int(sys.argv[3]), "
            "invalidation_mode=py_compile.PycInvalidationMode[sys.argv[2]]))")
    # surrogateescape: a name that is not UTF-8 comes back as os.fsdecode gives it.
    out = subprocess.run([python, "-c", code, str(source), mode, str(optimize)], capture_output=True, text=True,
                         errors="surrogateescape", check=True, env=env or clean_env()).stdout.strip()
    return out


def patch_keeping_stat(source, text):
    """Rewrite source with text of the same length and put its old mtime back, as cp -p would."""
    before = os.stat(source)
    assert len(text.encode()) == before.st_size
    with open(source, "w") as handle:
        handle.write(text)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))


def imported_value(python, site, module="pkg.mod", write_bytecode=True, env=None):
    """VALUE of module as a fresh interpreter imports it from site."""
    args = [python] + ([] if write_bytecode else ["-B"])
    args += ["-c", "import sys; sys.path.insert(0, sys.argv[1]); import importlib; "
             "print(importlib.import_module(sys.argv[2]).VALUE)", str(site), module]
    return subprocess.run(args, capture_output=True, text=True, check=True, env=env or clean_env()).stdout.strip()


def purge(params, python=VENV_PY, check=False, diff=False, env=None, timeout=180):
    """Run the module; python is the interpreter whose bytecode counts."""
    args = dict(params)
    args.setdefault("python", python)
    return run_module("pycache_purge", args, check=check, diff=diff, env=env, timeout=timeout)


def reasons(result):
    return {item["pyc"]: item["reason"] for item in result["removed"]}


@pytest.mark.parametrize("python", INTERPRETERS)
@pytest.mark.parametrize("mode,reason,python_sees_patch", [
    ("TIMESTAMP", "code differs", False),
    ("UNCHECKED_HASH", "hash differs", False),
    ("CHECKED_HASH", "hash differs", True),
])
def test_patch_that_keeps_size_and_mtime_runs_after_purge(tmp_path, python, mode, reason, python_sees_patch):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(python, source, mode)
    patch_keeping_stat(source, NEW)
    # The scenario is real: with timestamp or unchecked-hash bytecode, Python runs the old code.
    assert imported_value(python, site, write_bytecode=False) == ("new" if python_sees_patch else "old")

    result = purge({"paths": [str(site)]}, python=python)

    assert result["rc"] == 0, result
    assert result["changed"] is True
    assert reasons(result) == {pyc: reason}
    assert result["removed"][0]["source"] == str(source)
    assert not os.path.exists(pyc)
    assert imported_value(python, site) == "new"
    # The import above wrote fresh bytecode of the patched source: nothing is stale now.
    assert os.path.exists(pyc)
    again = purge({"paths": [str(site)]}, python=python)
    assert again["rc"] == 0 and again["changed"] is False and again["removed"] == []
    assert again["checked"] == 2


@pytest.mark.parametrize("python", INTERPRETERS)
def test_timestamp_mismatches_are_removed(tmp_path, python):
    site = tmp_path / "site"
    source = make_package(site)
    other = site / "pkg" / "other.py"
    other.write_text(OLD)
    pyc_mod = compile_source(python, source)
    pyc_other = compile_source(python, other)
    # mod.py: same size, mtime moved to another second. other.py: longer, mtime restored.
    st = os.stat(source)
    source.write_text(NEW)
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    st = os.stat(other)
    other.write_text('VALUE = "newer"\n')
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))

    result = purge({"paths": [str(site)]}, python=python)

    assert result["rc"] == 0, result
    assert reasons(result) == {pyc_mod: "mtime differs", pyc_other: "size differs"}
    assert imported_value(python, site, "pkg.other") == "newer"


def test_source_missing_removes_bytecode_of_every_tag(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    foreign = os.path.join(os.path.dirname(pyc), "mod.cpython-310.pyc")
    shutil.copy(pyc, foreign)
    source.unlink()

    result = purge({"paths": [str(site)]})

    assert result["rc"] == 0, result
    assert reasons(result) == {pyc: "source missing", foreign: "source missing"}
    assert not os.path.exists(pyc) and not os.path.exists(foreign)
    # Without the pyc the module is really gone, as its source is.
    proc = subprocess.run([VENV_PY, "-B", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import pkg.mod", str(site)],
                          capture_output=True, text=True, env=clean_env(), check=False)
    assert "ModuleNotFoundError" in proc.stderr


@pytest.mark.parametrize("python", INTERPRETERS)
@pytest.mark.parametrize("compare_code", ["auto", "always"])
def test_fresh_bytecode_and_other_files_stay(tmp_path, python, compare_code):
    site = tmp_path / "site"
    source = make_package(site, text='"""Docstring."""\nVALUE = "old"\nassert VALUE\n\ndef f(x=-0.0):\n    return {x: 1.0}\n')
    kept = [compile_source(python, site / "pkg" / "__init__.py")]
    for mode in ("TIMESTAMP", "CHECKED_HASH", "UNCHECKED_HASH"):
        extra = site / "pkg" / ("m_" + mode.lower() + ".py")
        shutil.copy(source, extra)
        kept.append(compile_source(python, extra, mode))
    for level in (0, 1, 2):
        kept.append(compile_source(python, source, optimize=level))
    pycache = site / "pkg" / "__pycache__"
    # Not .pyc, or not in __pycache__: never touched, even when stale or orphaned.
    others = [pycache / "notes.txt", pycache / "gone.cpython-311.pyc.tmp", site / "pkg" / "legacy.pyc",
              site / "pkg" / "mod.pyc"]
    for path in others:
        path.write_bytes(b"not bytecode")

    result = purge({"paths": [str(site)], "compare_code": compare_code}, python=python)

    assert result["rc"] == 0, result
    assert result["changed"] is False and result["removed"] == []
    assert result["checked"] == len(kept) == 7
    # always compiles every timestamp pyc and every hash pyc whose hash matches; auto none here.
    assert result["compared"] == (7 if compare_code == "always" else 0)
    for path in kept + [str(p) for p in others]:
        assert os.path.exists(path), path


def test_bytecode_names_are_read_as_cache_from_source_writes_them(tmp_path):
    """A source whose name holds a dot has bytecode named after its whole stem (py_compile writes
    foo.bar.<tag>.pyc, which importlib.util.source_from_cache refuses): judged against foo.bar.py.
    A name of this interpreter's tag with an optimization level import never writes is kept."""
    site = tmp_path / "site"
    make_package(site)
    dotted, orphan = site / "pkg" / "foo.bar.py", site / "pkg" / "gone.too.py"
    dotted.write_text(OLD)
    orphan.write_text(OLD)
    fresh, stale = compile_source(VENV_PY, dotted), compile_source(VENV_PY, orphan)
    orphan.unlink()
    odd_level = os.path.join(os.path.dirname(fresh), "mod.%s.opt-3.pyc" % tag_of(VENV_PY))
    shutil.copy(compile_source(VENV_PY, site / "pkg" / "mod.py"), odd_level)

    result = purge({"paths": [str(site)], "compare_code": "always"})

    assert result["rc"] == 0, result
    assert reasons(result) == {stale: "source missing"}
    assert {item["pyc"]: item["reason"] for item in result["kept"]} == {odd_level: "unknown optimization tag opt-3"}
    assert os.path.exists(fresh) and not os.path.exists(stale) and os.path.exists(odd_level)


def test_bytecode_of_another_interpreter_is_kept_and_reported(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    foreign = os.path.join(os.path.dirname(pyc), "mod.cpython-310.pyc")
    shutil.copy(pyc, foreign)
    patch_keeping_stat(source, NEW)

    result = purge({"paths": [str(site)]})

    assert result["rc"] == 0, result
    assert reasons(result) == {pyc: "code differs"}
    assert result["kept"] == [{"pyc": foreign, "source": str(source),
                               "reason": "compiled for cpython-310; this interpreter is %s" % tag_of(VENV_PY)}]
    assert os.path.exists(foreign)


def other_versions():
    """Interpreters of another minor version than the venv's, when this machine has some."""
    mine = tag_of(VENV_PY)
    found = {}
    for python in sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3") + glob.glob("/usr/bin/python3.[0-9]*")):
        if not os.access(python, os.X_OK) or python.endswith("-config"):
            continue
        try:
            tag = tag_of(python)
        except (subprocess.CalledProcessError, OSError):
            continue
        version = tag.split("-")[-1]
        if tag != mine and tag.startswith("cpython-3") and int(version[1:] or 0) >= 8:
            found.setdefault(tag, python)
    # The oldest and the newest cover the range without running every version.
    tags = sorted(found, key=lambda tag: int(tag.split("-")[-1]))
    return sorted(set(found[tag] for tag in tags[:1] + tags[-1:]))


@pytest.mark.parametrize("python", other_versions() or [pytest.param(None, marks=pytest.mark.skip(reason="no Python of another version here"))])
def test_another_version_judges_its_own_bytecode(tmp_path, python):
    """Different magic number, hash key and compiler: the probe runs under that interpreter."""
    site = tmp_path / "site"
    source = make_package(site)
    mine = compile_source(VENV_PY, source)
    theirs_hash = compile_source(python, source, "UNCHECKED_HASH")
    patch_keeping_stat(source, NEW)
    assert imported_value(python, site, write_bytecode=False) == "old"

    result = purge({"paths": [str(site)]}, python=python)

    assert result["rc"] == 0, result
    assert result["python"]["cache_tag"] == tag_of(python)
    assert reasons(result) == {theirs_hash: "hash differs"}
    assert [item["pyc"] for item in result["kept"]] == [mine]
    assert imported_value(python, site) == "new"
    # And the venv's own run catches its own stale bytecode, leaving the other version's fresh one.
    result = purge({"paths": [str(site)]})
    assert reasons(result) == {mine: "code differs"}
    assert imported_value(VENV_PY, site) == "new"


def test_mode_all_removes_every_pyc_and_nothing_else(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pycs = [compile_source(VENV_PY, source), compile_source(VENV_PY, source, optimize=2),
            compile_source(VENV_PY, site / "pkg" / "__init__.py", "CHECKED_HASH")]
    foreign = os.path.join(os.path.dirname(pycs[0]), "mod.cpython-310.pyc")
    untagged = os.path.join(os.path.dirname(pycs[0]), "odd.pyc")
    for extra in (foreign, untagged):
        shutil.copy(pycs[0], extra)
    notes = site / "pkg" / "__pycache__" / "notes.txt"
    notes.write_text("keep")
    legacy = site / "pkg" / "mod.pyc"
    shutil.copy(pycs[0], legacy)

    result = purge({"paths": [str(site)], "mode": "all"})

    assert result["rc"] == 0, result
    assert sorted(reasons(result)) == sorted(pycs + [foreign, untagged])
    assert set(reasons(result).values()) == {"mode all"}
    assert os.listdir(site / "pkg" / "__pycache__") == ["notes.txt"]
    assert legacy.exists()


def test_check_mode_removes_nothing_and_diff_lists_what_goes(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    patch_keeping_stat(source, NEW)

    planned = purge({"paths": [str(source)]}, check=True, diff=True)

    assert planned["rc"] == 0, planned
    assert planned["changed"] is True
    assert reasons(planned) == {pyc: "code differs"}
    assert os.path.exists(pyc)
    assert planned["diff"]["before"] == "%s (code differs)\n" % pyc
    assert planned["diff"]["after"] == ""
    assert imported_value(VENV_PY, site, write_bytecode=False) == "old"

    done = purge({"paths": [str(source)]}, diff=True)
    assert reasons(done) == reasons(planned)
    assert not os.path.exists(pyc)


def test_a_file_target_touches_only_its_own_bytecode(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    sibling = site / "pkg" / "modx.py"
    sibling.write_text(OLD)
    pyc = compile_source(VENV_PY, source)
    sibling_pyc = compile_source(VENV_PY, sibling)
    patch_keeping_stat(source, NEW)
    patch_keeping_stat(sibling, NEW)

    result = purge({"paths": [str(source)]})

    assert result["rc"] == 0, result
    assert reasons(result) == {pyc: "code differs"}
    assert result["checked"] == 1
    assert os.path.exists(sibling_pyc)


def make_venv(tmp_path):
    """A real virtual environment (no pip) whose site-packages holds the package."""
    venv = tmp_path / "venv"
    subprocess.run([VENV_PY, "-m", "venv", "--without-pip", str(venv)], check=True, env=clean_env())
    site = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0]
    return str(venv / "bin" / "python"), Path(site)


def test_modules_are_found_on_the_interpreters_path_without_importing(tmp_path):
    python, site = make_venv(tmp_path)
    marker = tmp_path / "imported"
    source = make_package(site)
    # Importing the package would leave a marker file: the module must never do it.
    (source.parent / "__init__.py").write_text("open(%r, 'w').close()\n" % str(marker))
    sub = source.parent / "sub"
    sub.mkdir()
    (sub / "__init__.py").write_text("")
    deep = sub / "deep.py"
    deep.write_text(OLD)
    pyc = compile_source(python, source)
    deep_pyc = compile_source(python, deep)
    patch_keeping_stat(source, NEW)
    patch_keeping_stat(deep, NEW)

    one = purge({"modules": ["pkg.mod"]}, python=python)
    assert one["rc"] == 0, one
    assert one["targets"] == [{"root": str(source), "from": "module pkg.mod"}]
    assert reasons(one) == {pyc: "code differs"}
    assert os.path.exists(deep_pyc)

    tree = purge({"modules": ["pkg"]}, python=python)
    assert tree["rc"] == 0, tree
    assert tree["targets"] == [{"root": str(source.parent), "from": "module pkg"}]
    assert reasons(tree) == {deep_pyc: "code differs"}
    assert not marker.exists()
    assert imported_value(python, site, "pkg.sub.deep") == "new"


@pytest.mark.parametrize("name,missing,searched", [
    ("nosuchpkg.mod", "no 'nosuchpkg' in the sys.path of", "site-packages"),
    ("pkg.nosuch", "no 'nosuch' in package 'pkg'", os.path.join("site-packages", "pkg")),
])
def test_unknown_module_is_an_error_that_lists_where_it_looked(tmp_path, name, missing, searched):
    python, site = make_venv(tmp_path)
    source = make_package(site)
    pyc = compile_source(python, source)
    patch_keeping_stat(source, NEW)

    result = purge({"modules": ["pkg.mod", name]}, python=python)

    assert result["rc"] == 1 and result["failed"] is True
    assert missing in result["msg"]
    assert "searched: " in result["msg"] and searched in result["msg"]
    assert os.path.exists(pyc)


def test_pycache_prefix_of_the_interpreters_environment(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    prefix = tmp_path / "prefix"
    env = clean_env(PYTHONPYCACHEPREFIX=str(prefix))
    in_prefix = compile_source(VENV_PY, source, env=env)
    beside = compile_source(VENV_PY, source)
    assert in_prefix.startswith(str(prefix)) and "__pycache__" in beside
    patch_keeping_stat(source, NEW)
    assert imported_value(VENV_PY, site, write_bytecode=False, env=env) == "old"

    result = purge({"paths": [str(site)]}, env={"PYTHONPYCACHEPREFIX": str(prefix)})

    assert result["rc"] == 0, result
    assert result["python"]["pycache_prefix"] == str(prefix)
    assert reasons(result) == {in_prefix: "code differs", beside: "code differs"}
    assert imported_value(VENV_PY, site, env=env) == "new"
    assert imported_value(VENV_PY, site) == "new"


def test_symlink_loops_and_links_out_are_reported_not_fatal(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    patch_keeping_stat(source, NEW)
    os.symlink(site / "pkg", site / "pkg" / "loop")
    (site / "pkg" / "sub").mkdir()
    os.symlink(site / "pkg", site / "pkg" / "sub" / "up")  # an ancestor further up
    os.symlink("self", site / "pkg" / "self")
    outside = tmp_path / "outside"
    outside_source = make_package(outside, name="ext")
    outside_pyc = compile_source(VENV_PY, outside_source)
    outside_source.unlink()
    os.symlink(outside / "ext", site / "pkg" / "ext")

    result = purge({"paths": [str(site)]})

    assert result["rc"] == 0, result
    assert reasons(result) == {pyc: "code differs"}
    problems = {item["path"]: item["problem"] for item in result["problems"]}
    assert problems[str(site / "pkg" / "loop")] == "symlink loop: points to its own ancestor %s" % (site / "pkg")
    assert problems[str(site / "pkg" / "sub" / "up")] == "symlink loop: points to its own ancestor %s" % (site / "pkg")
    assert problems[str(site / "pkg" / "self")] == "symlink loop"
    assert "outside the targets: not followed" in problems[str(site / "pkg" / "ext")]
    assert "symlink loop" in str(result["warnings"])  # ansible-core 2.19 returns structured warnings
    # The orphaned pyc behind the link out of the target is not ours to remove.
    assert os.path.exists(outside_pyc)


def unprivileged_python(tmp_path):
    """An interpreter command for which file permissions apply: as root, the venv's Python without
    the capabilities that bypass them; otherwise the venv's Python itself."""
    if os.geteuid() != 0:
        return VENV_PY
    if not shutil.which("setpriv"):
        pytest.skip("root without setpriv: permissions cannot be made to apply")
    wrapper = tmp_path / "python-nodac"
    wrapper.write_text('#!/bin/sh\nexec setpriv --bounding-set -dac_override,-dac_read_search %s "$@"\n' % VENV_PY)
    wrapper.chmod(0o755)
    return str(wrapper)


def test_unreadable_directory_is_reported_and_the_rest_is_purged(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    patch_keeping_stat(source, NEW)
    secret = site / "pkg" / "secret"
    secret.mkdir()
    secret.chmod(0)
    try:
        result = run_module("pycache_purge", {"paths": [str(site)], "python": VENV_PY}, python=unprivileged_python(tmp_path))
    finally:
        secret.chmod(0o755)
    assert result["rc"] == 0, result
    assert reasons(result) == {pyc: "code differs"}
    assert result["problems"] == [{"path": str(secret), "problem": "unreadable directory: Permission denied"}]


def test_bytecode_that_cannot_be_removed_fails_the_task(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    other = site / "pkg" / "other.py"
    other.write_text(OLD)
    pyc = compile_source(VENV_PY, source)
    patch_keeping_stat(source, NEW)
    sub = site / "sub"
    sub_source = make_package(sub)
    sub_pyc = compile_source(VENV_PY, sub_source)
    sub_source.unlink()
    locked = site / "pkg" / "__pycache__"
    locked.chmod(0o555)
    try:
        result = run_module("pycache_purge", {"paths": [str(site)], "python": VENV_PY}, python=unprivileged_python(tmp_path))
    finally:
        locked.chmod(0o755)
    assert result["rc"] == 1 and result["failed"] is True
    assert "could not remove 1 stale bytecode file" in result["msg"] and pyc in result["msg"]
    assert [item["path"] for item in result["errors"]] == [pyc]
    assert reasons(result) == {sub_pyc: "source missing"}
    assert os.path.exists(pyc) and not os.path.exists(sub_pyc)


def test_corrupt_bytecode_is_removed(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    other = site / "pkg" / "other.py"
    other.write_text(OLD)
    pyc = compile_source(VENV_PY, source)
    other_pyc = compile_source(VENV_PY, other)
    with open(pyc, "r+b") as handle:
        handle.truncate(10)
    with open(other_pyc, "r+b") as handle:
        handle.seek(0)
        handle.write(b"\0\0\0\0")

    result = purge({"paths": [str(site)]})

    assert reasons(result) == {pyc: "corrupt header: truncated header (10 bytes)", other_pyc: "magic number differs"}


@pytest.mark.parametrize("damage,reason", [("source", "source does not compile"), ("bytecode", "corrupt bytecode")])
def test_bytecode_of_a_source_that_no_longer_compiles_or_of_a_cut_body_is_removed(tmp_path, damage, reason):
    """A patch that broke the source but kept its size and mtime: Python goes on running the old
    bytecode, and the breakage shows only once it is gone. A pyc whose header is sound but whose
    code was cut short (a full disk while it was written) cannot be loaded at all."""
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    if damage == "source":
        patch_keeping_stat(source, 'VALUE = (old"\n')
        assert imported_value(VENV_PY, site, write_bytecode=False) == "old"
    else:
        with open(pyc, "r+b") as handle:
            handle.truncate(21)  # the 16-byte header and 5 bytes of code
        patch_keeping_stat(source, OLD)  # touched, so auto compares the code

    result = purge({"paths": [str(site)]})

    assert result["rc"] == 0, result
    assert reasons(result) == {pyc: reason}
    assert not os.path.exists(pyc)
    if damage == "source":
        with pytest.raises(subprocess.CalledProcessError) as failed:
            imported_value(VENV_PY, site, write_bytecode=False)
        assert "SyntaxError" in failed.value.stderr
    else:
        assert imported_value(VENV_PY, site) == "old"


def broken_interpreter(tmp_path):
    script = tmp_path / "fakepython"
    script.write_text("#!/bin/sh\necho 'this is not python'\nexit 3\n")
    script.chmod(0o755)
    return str(script)


def unrunnable(tmp_path):
    """An executable file the kernel cannot execute: no shebang, not a binary."""
    path = tmp_path / "python-noexec"
    path.write_text("just text\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("case", ["no targets", "missing path", "relative path", "missing python", "not executable",
                                  "not python", "not runnable", "bad module name", "timeout zero", "timeout negative",
                                  "timeout nan", "timeout inf", "timeout huge", "timeout not a number"])
def test_bad_input_fails_with_one_message_and_removes_nothing(tmp_path, case):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    source.unlink()  # the pyc is stale: any run that got going would remove it
    params = {"paths": [str(site)], "python": VENV_PY}
    expected = {
        "no targets": ({"paths": None}, "nothing to purge: give paths, modules or both"),
        "missing path": ({"paths": [str(site), str(tmp_path / "nope")]}, "paths that do not exist: %s" % (tmp_path / "nope")),
        "relative path": ({"paths": [str(site), "site"]}, "paths entry 'site' must be an absolute path"),
        "missing python": ({"python": str(tmp_path / "python9")}, "python %s does not exist" % (tmp_path / "python9")),
        "not executable": ({"python": str(source.parent / "__init__.py")}, "is not an executable file"),
        "not python": ({"python": broken_interpreter(tmp_path)}, "is not a Python 3.8+ interpreter: it exited with rc 3 and said: this is not python"),
        "not runnable": ({"python": unrunnable(tmp_path)}, "python %s cannot be run: [Errno 8] Exec format error" % unrunnable(tmp_path)),
        "bad module name": ({"modules": ["pkg..mod"]}, "modules entry 'pkg..mod' is not a dotted module name"),
        "timeout zero": ({"probe_timeout": 0}, "probe_timeout must be more than 0 seconds, got 0.0"),
        "timeout negative": ({"probe_timeout": -5}, "probe_timeout must be more than 0 seconds, got -5.0"),
        "timeout nan": ({"probe_timeout": "nan"}, "probe_timeout must be a finite number of seconds, got nan"),
        "timeout inf": ({"probe_timeout": "inf"}, "probe_timeout must be a finite number of seconds, got inf"),
        "timeout huge": ({"probe_timeout": 1e10}, "probe_timeout must be %s or less seconds, got 10000000000.0"
                         % RANGES["pycache_purge"]["probe_timeout"].maximum),
        "timeout not a number": ({"probe_timeout": "soon"}, "argument 'probe_timeout' is of type str and we were unable to convert to float"),
    }[case]
    params.update(expected[0])

    result = purge(params)

    assert result["rc"] == 1 and result["failed"] is True
    assert expected[1] in result["msg"]
    assert os.path.exists(pyc)


def test_neither_paths_nor_modules_is_refused_before_anything_runs(tmp_path):
    """Both options left out: the argument spec's required_one_of refuses the task, in Ansible's
    own words, before a probe runs."""
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    source.unlink()

    result = purge({})

    assert result["rc"] == 1 and result["failed"] is True
    assert result["msg"] == "one of the following is required: paths, modules"
    assert os.path.exists(pyc)


# -- the probe's own failures are reported as what happened (issue 11) ------------------------

def shell_wrapper(tmp_path, name, body):
    """An executable shell script standing in for the task's python."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def many_sources(site, count=70):
    """A package of count modules compiled by the venv's Python, one of them then patched keeping
    size and mtime; returns that one's pyc. Enough for compare_code=always to fork its workers."""
    package = site / "many"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for index in range(count):
        (package / ("m%02d.py" % index)).write_text(OLD)
    subprocess.run([VENV_PY, "-m", "compileall", "-q", str(package)], check=True, env=clean_env(), capture_output=True)
    patched = package / "m07.py"
    pyc = os.path.join(str(package), "__pycache__", "m07.%s.pyc" % tag_of(VENV_PY))
    patch_keeping_stat(patched, NEW)
    return pyc


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare to mount over /dev/shm")
@pytest.mark.parametrize("shm", ["read-only", "full"])
def test_a_read_only_or_full_dev_shm_does_not_stop_the_probe(tmp_path, shm):
    """glibc creates a POSIX semaphore (what multiprocessing's Pool needs) as a file in /dev/shm:
    read-only gave EROFS, full gave ENOSPC, and the module said python was no Python 3.8+."""
    pyc = many_sources(tmp_path / "site")
    mount = {"read-only": "mount -t tmpfs -o ro,size=64k tmpfs /dev/shm",
             "full": "mount -t tmpfs -o size=4k tmpfs /dev/shm && { head -c 65536 /dev/zero > /dev/shm/fill 2>/dev/null; true; }"}[shm]
    # The probe alone runs in a mount namespace of its own, over a /dev/shm that cannot take a file.
    python = shell_wrapper(tmp_path, "python-shm", "exec unshare --mount sh -c '%s || exit 97; "
                           "if printf x > /dev/shm/w 2>/dev/null; then exit 98; fi; exec \"$0\" \"$@\"' %s \"$@\"\n"
                           % (mount, VENV_PY))

    result = purge({"paths": [str(tmp_path / "site")], "compare_code": "always"}, python=python)

    assert result["rc"] == 0, result["msg"]
    assert result["compared"] == 71
    assert reasons(result) == {pyc: "code differs"}
    assert not os.path.exists(pyc)


CRASH_HOOK = '''
import os, signal, sys, time
ACTION = os.environ["PROBE_TEST_ACTION"]
MAIN = os.getpid()

def hook(event, args):
    if ACTION == "worker" and event == "compile" and os.getpid() != MAIN:
        os.kill(os.getpid(), signal.SIGKILL)  # a comparison worker dies, as under the OOM killer
    if event != "open" or not str(args[0]).endswith(".pyc") or os.getpid() != MAIN:
        return
    if ACTION == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if ACTION == "exit":
        sys.stderr.write("Fatal: disk on fire\\n")
        sys.stderr.flush()
        os._exit(3)
    if ACTION == "hang":
        time.sleep(3600)

sys.addaudithook(hook)
'''


def crashing_python(tmp_path, action, before=""):
    """The venv's Python with a sitecustomize that makes the probe fail as action says, once
    it is running (at its first .pyc, or in a comparison worker)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(CRASH_HOOK)
    return shell_wrapper(tmp_path, "python-" + action, '%sPROBE_TEST_ACTION=%s PYTHONPATH="%s:$PYTHONPATH" exec %s "$@"\n'
                         % (before, action, hooks, VENV_PY))


@pytest.mark.parametrize("action,said", [
    ("segv", "was killed by signal SIGSEGV (11) before it gave a result, nothing was removed and printed nothing on stderr"),
    ("exit", "exited with rc 3 before it gave a result, nothing was removed and said: Fatal: disk on fire"),
])
def test_a_probe_that_crashes_is_reported_as_what_happened(tmp_path, action, said):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    source.unlink()
    python = crashing_python(tmp_path, action)

    result = purge({"paths": [str(site)]}, python=python)

    assert result["rc"] == 1 and result["failed"] is True
    assert result["msg"] == "the probe under python %s %s" % (python, said)
    assert os.path.exists(pyc)


def test_an_interpreter_killed_before_the_probe_ran_is_not_called_a_non_python(tmp_path):
    site = tmp_path / "site"
    make_package(site)
    python = shell_wrapper(tmp_path, "python-dies", "kill -SEGV $$\n")

    result = purge({"paths": [str(site)]}, python=python)

    assert result["rc"] == 1
    assert result["msg"] == "python %s was killed by signal SIGSEGV (11) before it ran the probe and printed nothing on stderr" % python


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="comparisons are forked only with 2 CPUs or more")
def test_a_comparison_worker_that_dies_fails_the_task_at_once(tmp_path):
    """multiprocessing's Pool waited forever for a killed worker's share."""
    pyc = many_sources(tmp_path / "site")

    result = purge({"paths": [str(tmp_path / "site")], "compare_code": "always"},
                   python=crashing_python(tmp_path, "worker"), timeout=60)

    assert result["rc"] == 1
    assert "a code comparison worker (pid " in result["msg"] and "was killed by signal SIGKILL (9) while comparing" in result["msg"]
    assert os.path.exists(pyc)


def test_a_probe_that_hangs_is_stopped_with_its_processes_at_probe_timeout(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    source.unlink()
    pidfile = tmp_path / "sleeper"
    # A process the probe started (it inherits the probe's stdout): it must not outlive the timeout.
    sleeper = 'sleep 3600 & echo "$! $(cut -d" " -f22 /proc/$!/stat)" > %s\n' % pidfile
    python = crashing_python(tmp_path, "hang", before=sleeper)
    try:
        # A module that cannot stop the probe waits for it forever: give up well before pytest's 600 s.
        result = purge({"paths": [str(site)], "probe_timeout": 2}, python=python, timeout=30)
    finally:
        pid, ticks = (int(field) for field in pidfile.read_text().split())
        still_there = procinfo.alive(pid) and procinfo.start_ticks(pid) == ticks
        if still_there:
            os.kill(pid, 9)

    assert result["rc"] == 1
    assert result["msg"] == ("the probe under python %s did not finish within 2.0 seconds (probe_timeout); it was "
                             "stopped with its processes, nothing was removed" % python)
    assert not still_there, "the probe's child outlived the timeout"
    assert os.path.exists(pyc)


# -- names: FIFOs, '..' after a symlink, names that are not UTF-8 (issues 10 and 11) ---------

def test_a_fifo_or_socket_named_like_a_source_is_never_opened(tmp_path):
    site = tmp_path / "site"
    source = make_package(site)
    pyc = compile_source(VENV_PY, source)
    patch_keeping_stat(source, NEW)
    package = site / "pkg"
    piped = package / "piped.py"
    piped.write_text(OLD)
    piped_pyc = compile_source(VENV_PY, piped, "CHECKED_HASH")  # its hash would be read from the source
    piped.unlink()
    os.mkfifo(piped)
    sock = package / "sock.py"
    sock.write_text(OLD)
    sock_pyc = compile_source(VENV_PY, sock)
    sock.unlink()
    # bind() in a child, from the directory: a socket path is limited to 108 bytes.
    subprocess.run([VENV_PY, "-c", "import os, socket, sys; os.chdir(sys.argv[1]); "
                    "socket.socket(socket.AF_UNIX).bind('sock.py')", str(package)], check=True)
    # A FIFO named like bytecode, beside a real source: not bytecode, never opened nor removed.
    (package / "named.py").write_text(OLD)
    fifo_pyc = package / "__pycache__" / ("named.%s.pyc" % tag_of(VENV_PY))
    os.mkfifo(fifo_pyc)

    result = purge({"paths": [str(site)], "compare_code": "always"}, timeout=30)  # a FIFO opened blocks for ever

    assert result["rc"] == 0, result
    assert reasons(result) == {pyc: "code differs", piped_pyc: "source is not a regular file (FIFO)",
                               sock_pyc: "source is not a regular file (socket)"}
    assert result["checked"] == 3  # mod, piped, sock: the FIFO named like a pyc is not bytecode
    assert fifo_pyc.exists() and piped.exists()


def test_dotdot_after_a_symlink_is_the_tree_the_kernel_resolves(tmp_path):
    """x/link/../pkg is real/pkg when link points to real/deep; normpath made it x/pkg."""
    (tmp_path / "real" / "deep").mkdir(parents=True)
    kernels = make_package(tmp_path / "real")
    textual = make_package(tmp_path / "x")
    os.symlink(tmp_path / "real" / "deep", tmp_path / "x" / "link")
    kernels_pyc = compile_source(VENV_PY, kernels)
    textual_pyc = compile_source(VENV_PY, textual)
    given = str(tmp_path / "x" / "link" / ".." / "pkg")
    assert os.path.samefile(given, tmp_path / "real" / "pkg")

    result = purge({"paths": [given], "mode": "all"})

    assert result["rc"] == 0, result
    assert result["targets"] == [{"root": str(tmp_path / "real" / "pkg"), "from": "paths"}]
    assert reasons(result) == {kernels_pyc: "mode all"}
    assert not os.path.exists(kernels_pyc) and os.path.exists(textual_pyc)


def assert_valid_utf8(result):
    """What Ansible's controller requires of a result: no lone surrogate anywhere."""
    json.dumps(result, ensure_ascii=False).encode("utf-8")


def shown(raw):
    """A name as the module documents it returns: each byte that is not UTF-8 as \\xNN."""
    return raw.decode("utf-8", "backslashreplace")


def test_names_that_are_not_utf8_are_returned_escaped(tmp_path):
    site = tmp_path / "site"
    make_package(site)
    package = os.fsencode(str(site / "pkg"))
    odd_dir = package + b"/sub\xff"
    os.mkdir(odd_dir)
    gone = odd_dir + b"/caf\xe9.py"
    with open(gone, "wb") as handle:
        handle.write(OLD.encode())
    gone_pyc = compile_source(VENV_PY, os.fsdecode(gone))
    os.unlink(gone)
    kept = package + b"/na\xefve.py"
    with open(kept, "wb") as handle:
        handle.write(OLD.encode())
    mine = compile_source(VENV_PY, os.fsdecode(kept))
    foreign = mine.replace(tag_of(VENV_PY), "cpython-310")
    os.rename(mine, foreign)
    os.symlink(package, package + b"/loop\xfe")

    result = purge({"paths": [str(site)]})

    assert result["rc"] == 0, result
    assert_valid_utf8(result)
    assert result["removed"] == [{"pyc": shown(os.fsencode(gone_pyc)), "source": shown(gone), "reason": "source missing"}]
    assert "\\xff" in result["removed"][0]["pyc"] and "caf\\xe9" in result["removed"][0]["pyc"]
    assert [item["pyc"] for item in result["kept"]] == [shown(os.fsencode(foreign))]
    assert [item["path"] for item in result["problems"]] == [shown(package + b"/loop\xfe")]
    assert not os.path.exists(gone_pyc) and os.path.exists(foreign)


def test_a_module_found_under_a_directory_that_is_not_utf8(tmp_path):
    site = os.fsencode(str(tmp_path)) + b"/lib\xff"
    os.mkdir(site)
    source = make_package(Path(os.fsdecode(site)))
    pyc = compile_source(VENV_PY, source)
    patch_keeping_stat(source, NEW)

    result = purge({"modules": ["pkg"]}, env={"PYTHONPATH": os.fsdecode(site)})

    assert result["rc"] == 0, result
    assert_valid_utf8(result)
    assert result["targets"] == [{"root": str(tmp_path) + "/lib\\xff/pkg", "from": "module pkg"}]
    assert [item["pyc"] for item in result["removed"]] == [os.fsencode(pyc).decode("utf-8", "backslashreplace")]
    assert not os.path.exists(pyc)


def test_a_playbook_reports_bytecode_whose_name_is_not_utf8(tmp_path):
    """Ansible's controller refused the whole result ("Refusing to deserialize an invalid UTF8
    string value") after the module had removed the file."""
    site = tmp_path / "site"
    make_package(site)
    gone = os.fsencode(str(site / "pkg")) + b"/caf\xe9.py"
    with open(gone, "wb") as handle:
        handle.write(OLD.encode())
    gone_pyc = compile_source(VENV_PY, os.fsdecode(gone))
    os.unlink(gone)
    saved = tmp_path / "result.json"
    playbook = tmp_path / "purge.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "Purge", "cleanslate.gpu.pycache_purge": {"paths": [str(site)]}, "register": "purged"},
        {"name": "Save", "ansible.builtin.copy": {"content": "{{ purged | to_json }}", "dest": str(saved)}},
    ]}]))
    ensure_collection_link()
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=VENV_PY, ANSIBLE_LOCALHOST_WARNING="false")
    proc = subprocess.run([str(Path(VENV_PY).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)

    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(saved.read_text())
    assert [item["pyc"] for item in result["removed"]] == [os.fsencode(gone_pyc).decode("utf-8", "backslashreplace")]
    assert not os.path.exists(gone_pyc)


# -- modules that only an import finder knows (issue 11) ---------------------------------------

def test_modules_finds_an_editable_install_that_only_a_meta_path_finder_knows(tmp_path):
    """A flat-layout `pip install -e` puts a .pth that installs setuptools' __editable__ finder on
    sys.meta_path, with no sys.path entry for the project."""
    venv = tmp_path / "venv"
    subprocess.run([VENV_PY, "-m", "venv", str(venv)], check=True, env=clean_env())
    python = str(venv / "bin" / "python")
    project = tmp_path / "project"
    source = make_package(project, name="edpkg")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "edpkg"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["edpkg"]\n')
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "-e", str(project)], capture_output=True, text=True,
                          env=clean_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The scenario is real: sys.path alone does not know the package, the interpreter does.
    lookup = subprocess.run([python, "-c", "import importlib.machinery as m, importlib.util as u; "
                             "print(m.PathFinder.find_spec('edpkg') is None, u.find_spec('edpkg').origin)"],
                            capture_output=True, text=True, check=True, env=clean_env()).stdout.split()
    assert lookup == ["True", str(source.parent / "__init__.py")]
    pyc = compile_source(python, source)
    patch_keeping_stat(source, NEW)

    one = purge({"modules": ["edpkg.mod"]}, python=python)
    assert one["rc"] == 0, one["msg"]
    assert one["targets"] == [{"root": str(source), "from": "module edpkg.mod"}]
    assert reasons(one) == {pyc: "code differs"}
    compile_source(python, source)
    tree = purge({"modules": ["edpkg"]}, python=python)
    assert tree["targets"] == [{"root": str(source.parent), "from": "module edpkg"}]
    assert imported_value(python, project, "edpkg.mod") == "new"


BROKEN_FINDER = '''
class BrokenFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        raise RuntimeError("package index unreachable")
'''


def test_an_import_finder_that_raises_is_reported_and_nothing_is_removed(tmp_path):
    python, site = make_venv(tmp_path)
    source = make_package(site)
    pyc = compile_source(python, source)
    source.unlink()
    (site / "brokenfinder.py").write_text(BROKEN_FINDER)
    # Last, as an editable install's finder: asked only for what sys.path does not have.
    (site / "zz-broken.pth").write_text("import sys, brokenfinder; sys.meta_path.append(brokenfinder.BrokenFinder)\n")

    result = purge({"modules": ["pkg", "absent"]}, python=python)

    assert result["rc"] == 1
    assert result["msg"] == ("module 'absent' cannot be looked up: the import finder brokenfinder.BrokenFinder failed "
                             "on 'absent': RuntimeError: package index unreachable")
    assert os.path.exists(pyc)


def test_a_namespace_package_inside_a_package_is_found(tmp_path):
    """A directory without __init__.py inside a package: its lookup needed the parent imported."""
    python, site = make_venv(tmp_path)
    source = make_package(site)
    plugins = source.parent / "plugins"
    plugins.mkdir()
    extra = plugins / "extra.py"
    extra.write_text(OLD)
    pyc = compile_source(python, extra)
    patch_keeping_stat(extra, NEW)

    result = purge({"modules": ["pkg.plugins"]}, python=python)

    assert result["rc"] == 0, result["msg"]
    assert result["targets"] == [{"root": str(plugins), "from": "module pkg.plugins"}]
    assert reasons(result) == {pyc: "code differs"}


def test_what_a_pth_file_or_a_finder_prints_does_not_break_the_result(tmp_path):
    python, site = make_venv(tmp_path)
    source = make_package(site)
    pyc = compile_source(python, source)
    source.unlink()
    (site / "chatty.py").write_text(
        "import sys\n\nclass ChattyFinder:\n    @classmethod\n    def find_spec(cls, fullname, path=None, target=None):\n"
        "        sys.stdout.write('looking for %s' % fullname)\n        return None\n")
    # Startup output without a newline, then a finder asked first for every name.
    (site / "chatty.pth").write_text("import sys, chatty; sys.stdout.write('hello from a .pth'); "
                                     "sys.meta_path.insert(0, chatty.ChattyFinder)\n")

    result = purge({"modules": ["pkg"]}, python=python)

    assert result["rc"] == 0, result["msg"]
    assert reasons(result) == {pyc: "source missing"}
