"""The pycache_purge probe's pure parts: pyc names and headers, code comparison, module lookup,
and the module's own safety check on what may be removed."""
from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys

import pytest

from tests.run_module import ensure_collection_link

ensure_collection_link()
sys.path.insert(0, str(ensure_collection_link()))

from ansible_collections.cleanslate.gpu.plugins.module_utils import _pyc_probe as probe  # noqa: E402
from ansible_collections.cleanslate.gpu.plugins.module_utils import _pycache_purge_module as pycache_purge  # noqa: E402

TAG = sys.implementation.cache_tag


@pytest.mark.parametrize("name,expected", [
    ("mod.cpython-311.pyc", ("mod", "cpython-311", "")),
    ("mod.cpython-311.opt-1.pyc", ("mod", "cpython-311", "opt-1")),
    ("mod.cpython-311.opt-2.pyc", ("mod", "cpython-311", "opt-2")),
    ("foo.bar.cpython-39.pyc", ("foo.bar", "cpython-39", "")),
    ("mod.pypy39.pyc", ("mod", "pypy39", "")),
    ("mod.pyc", None),
    ("mod.opt-1.pyc", None),
    (".cpython-311.pyc", None),
    ("mod.cpython-311.pyc.tmp", None),
    ("mod.py", None),
])
def test_pyc_names(name, expected):
    assert probe.parse_pyc_name(name) == expected


@pytest.mark.parametrize("mode", list(py_compile.PycInvalidationMode))
def test_headers_of_real_bytecode(tmp_path, mode):
    source = tmp_path / "m.py"
    source.write_text("X = 1\n")
    pyc = py_compile.compile(str(source), invalidation_mode=mode, doraise=True)
    with open(pyc, "rb") as handle:
        header = probe.parse_header(handle.read(16))
    assert header["magic"] == probe.importlib.util.MAGIC_NUMBER
    if mode is py_compile.PycInvalidationMode.TIMESTAMP:
        assert header["hash_based"] is False
        assert header["mtime"] == int(os.stat(source).st_mtime) and header["size"] == 6
    else:
        assert header["hash_based"] is True
        assert header["checked"] is (mode is py_compile.PycInvalidationMode.CHECKED_HASH)
        assert header["source_hash"] == probe.importlib.util.source_hash(b"X = 1\n")


@pytest.mark.parametrize("data,message", [
    (b"\x00" * 15, "truncated header (15 bytes)"),
    (b"abcd" + (4).to_bytes(4, "little") + b"\x00" * 8, "invalid flags 0x4"),
])
def test_malformed_headers(data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        probe.parse_header(data)


def child_compiled_body(tmp_path, text, optimize=0):
    """Compile text in another process, as a real import would, and return the pyc's code bytes."""
    source = tmp_path / "m.py"
    source.write_text(text)
    out = subprocess.run([sys.executable, "-c", "import py_compile, sys; print(py_compile.compile(sys.argv[1], "
                          "doraise=True, optimize=int(sys.argv[2])))", str(source), str(optimize)],
                         capture_output=True, text=True, check=True).stdout.strip()
    with open(out, "rb") as handle:
        return handle.read()[16:], str(source)


TEXT = '"""Doc."""\nimport os\n\ndef f(a, b=-0.0):\n    """F."""\n    assert a\n    return [os.sep, a, b, 1.5, (1, 2)]\n'


def test_same_source_compiled_in_another_process_is_the_same_code(tmp_path):
    body, path = child_compiled_body(tmp_path, TEXT)
    assert probe.same_code(body, TEXT.encode(), path, 0)
    # The file name is not part of the comparison: importlib rewrites it on load.
    assert probe.same_code(body, TEXT.encode(), "/elsewhere/m.py", 0)


@pytest.mark.parametrize("patched", [
    TEXT.replace("-0.0", "0.0"),          # a constant that == would call equal
    TEXT.replace("1.5", "2.5"),
    TEXT.replace("(a, b", "(b, a"),
    TEXT.replace('"""F."""', '"""G."""'),  # a docstring runs at -O0 (help(), __doc__)
    "\n" + TEXT[:-1],                      # same size, every line moved down
])
def test_a_patch_changes_the_code(tmp_path, patched):
    body, path = child_compiled_body(tmp_path, TEXT)
    assert not probe.same_code(body, patched.encode(), path, 0)


def test_optimization_level_is_respected(tmp_path):
    body, path = child_compiled_body(tmp_path, TEXT, optimize=2)
    # At -OO docstrings and asserts are gone, so changing them changes nothing that runs.
    assert probe.same_code(body, TEXT.replace('"""F."""', '"""G."""').encode(), path, 2)
    assert not probe.same_code(body, TEXT.encode(), path, 0)


def test_comparisons_in_forked_workers_match_serial_ones(tmp_path):
    items, patched = [], set()
    for index in range(probe.PARALLEL_MIN_ITEMS + 6):
        source = tmp_path / ("m%d.py" % index)
        source.write_text("X = %d\n" % (index % 10))
        pyc = py_compile.compile(str(source), doraise=True)
        if index % 9 == 0:
            source.write_text("X = %d\n" % ((index + 1) % 10))
            patched.add(pyc)
        items.append((pyc, str(source), 0))
    parallel = probe.compare_all(items)
    serial = [probe.compare_one(item) for item in items]
    assert parallel == serial
    assert {pyc for pyc, reason, problem in parallel if reason == "code differs" and problem is None} == patched


def make_tree(root, importing_fails=True):
    package = root / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n" if importing_fails else "")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "leaf.py").write_text("X = 1\n")
    return package


def test_modules_resolve_without_importing(tmp_path):
    package = make_tree(tmp_path)
    assert probe.resolve_module("pkg.sub.leaf", [str(tmp_path)]) == [str(package / "sub" / "leaf.py")]
    assert probe.resolve_module("pkg.sub", [str(tmp_path)]) == [str(package / "sub")]
    assert "pkg" not in sys.modules


def test_namespace_package_means_all_its_directories(tmp_path):
    for side in ("a", "b"):
        (tmp_path / side / "ns").mkdir(parents=True)
        (tmp_path / side / "ns" / (side + ".py")).write_text("")
    found = probe.resolve_module("ns", [str(tmp_path / "a"), str(tmp_path / "b")])
    assert sorted(found) == [str(tmp_path / "a" / "ns"), str(tmp_path / "b" / "ns")]


@pytest.mark.parametrize("name,message", [
    ("pkg.nope", "module 'pkg.nope' not found: no 'nope' in package 'pkg'; searched: {root}/pkg"),
    ("nope", "module 'nope' not found: no 'nope' in the sys.path of {exe}; searched: {root}"),
    ("pkg.sub.leaf.x", "module 'pkg.sub.leaf.x' not found: 'pkg.sub.leaf' is a module ({root}/pkg/sub/leaf.py), not a package"),
    ("pkg..x", "'pkg..x' is not a dotted module name"),
])
def test_unknown_modules(tmp_path, name, message):
    make_tree(tmp_path)
    with pytest.raises(probe.ProbeError) as raised:
        probe.resolve_module(name, [str(tmp_path)])
    assert str(raised.value) == message.format(root=tmp_path, exe=sys.executable)


@pytest.mark.parametrize("pyc,allowed", [
    ("site/pkg/__pycache__/a.%s.pyc" % TAG, True),
    ("site/pkg/deep/er/__pycache__/a.%s.opt-2.pyc" % TAG, True),
    ("site/pkg/__pycache__/notes.txt", False),
    ("site/pkg/a.pyc", False),
    ("site/pkg/__pycache__/../a.pyc", False),
    ("site/pkgx/__pycache__/a.%s.pyc" % TAG, False),
    ("site/__pycache__/pkg.%s.pyc" % TAG, False),
    ("other/__pycache__/mod.%s.pyc" % TAG, True),
    ("other/__pycache__/modx.%s.pyc" % TAG, False),
    ("other/sub/__pycache__/mod.%s.pyc" % TAG, False),
    ("prefix/{root}/site/pkg/a.%s.pyc" % TAG, True),
    ("prefix/{root}/site/pkg/sub/a.%s.pyc" % TAG, True),
    ("prefix/{root}/other/mod.%s.pyc" % TAG, True),
    ("prefix/{root}/other/x.%s.pyc" % TAG, False),
    ("prefix/{root}/site/a.%s.pyc" % TAG, False),
])
def test_only_pyc_inside_pycache_under_a_target_may_go(tmp_path, pyc, allowed):
    (tmp_path / "site" / "pkg").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mod.py").write_text("")
    targets = [{"root": str(tmp_path / "site" / "pkg"), "from": "paths"},
               {"root": str(tmp_path / "other" / "mod.py"), "from": "paths"}]
    path = os.path.join(str(tmp_path), pyc.format(root=str(tmp_path).lstrip("/")))
    assert pycache_purge.removable(path, targets, str(tmp_path / "prefix")) is allowed


def test_dotdot_is_resolved_where_the_kernel_is(tmp_path):
    """'link/..' goes up from link's target, as open() does; os.path.normpath drops it as text."""
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "real" / "pkg").mkdir()
    (tmp_path / "x").mkdir()
    os.symlink(tmp_path / "real" / "deep", tmp_path / "x" / "link")
    given = "%s/x/link/../pkg/." % tmp_path
    assert probe.resolve_path(given) == str(tmp_path / "real" / "pkg")
    assert os.path.samefile(probe.resolve_path(given), given)
    # Other links stay as spelled: PYTHONPYCACHEPREFIX keys bytecode by the path as given.
    assert probe.resolve_path("%s/x//link/./" % tmp_path) == str(tmp_path / "x" / "link")
    assert probe.resolve_path("/..") == "/"


def test_a_module_under_a_dotdot_path_entry_is_the_kernels(tmp_path):
    make_tree(tmp_path / "real", importing_fails=False)
    (tmp_path / "real" / "deep").mkdir()
    (tmp_path / "x").mkdir()
    os.symlink(tmp_path / "real" / "deep", tmp_path / "x" / "link")
    entry = "%s/x/link/.." % tmp_path
    assert probe.resolve_module("pkg.sub", [entry]) == [str(tmp_path / "real" / "pkg" / "sub")]


def test_a_namespace_package_inside_a_package_resolves_without_importing_the_parent(tmp_path):
    """PathFinder builds a namespace path from its parent's __path__, read from sys.modules:
    with the parent not imported this raised KeyError and the probe died."""
    package = make_tree(tmp_path)
    (package / "plugins").mkdir()
    (package / "plugins" / "extra.py").write_text("")
    assert probe.resolve_module("pkg.plugins", [str(tmp_path)]) == [str(package / "plugins")]
    assert probe.resolve_module("pkg.plugins.extra", [str(tmp_path)]) == [str(package / "plugins" / "extra.py")]
    assert "pkg" not in sys.modules and "pkg.plugins" not in sys.modules


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_file_that_is_not_regular_is_refused_without_being_opened(tmp_path, kind):
    path = tmp_path / "m.py"
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    else:
        subprocess.run([sys.executable, "-c", "import os, socket, sys; os.chdir(sys.argv[1]); "
                        "socket.socket(socket.AF_UNIX).bind('m.py')", str(tmp_path)], check=True)
    with pytest.raises(probe.NotRegularFile, match={"fifo": r"\(FIFO\)", "socket": r"\(socket\)"}[kind]):
        probe.read_regular(str(path))


def test_a_regular_file_is_read_in_full_or_up_to_a_size(tmp_path):
    path = tmp_path / "m.py"
    path.write_bytes(b"x" * 3000000)
    data, info = probe.read_regular(str(path))
    assert data == b"x" * 3000000 and info.st_size == 3000000
    assert probe.read_regular(str(path), 16)[0] == b"x" * 16


@pytest.mark.parametrize("raw", [b"/site/plain.py", b"/site/caf\xc3\xa9.py", b"/site/bad\xff\xfe.py"])
def test_names_travel_as_wire_text_and_come_back_as_the_same_bytes(raw):
    name = os.fsdecode(raw)
    wire = probe.to_wire(name)
    assert json.loads(json.dumps(wire)) == wire  # survives the probe's JSON
    assert os.fsencode(probe.from_wire(wire)) == raw
