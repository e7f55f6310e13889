"""What a test runs as another user (`nobody`), copied where that user can read it.

A checkout may live where only its owner can look: root's home is 0700, so from a clone there a
module run as `nobody` cannot open plugins/modules/<name>.py, import the collection, ansible's
module_utils or the venv's libraries, and the simulator cannot be imported. Tests that run
something as another user run it from a copy made here instead: a fresh directory under the
system's temporary directory, directories 0755 and files 0644 (0755 if executable) whatever the
checkout's umask was, removed by the caller (remove()).

The interpreter is not copied: the user must be able to run the one the test names.
"""
from __future__ import annotations

import importlib.util
import shutil
import stat
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLLECTION = Path("ansible_collections", "cleanslate", "gpu")
# What a module imports besides the standard library, as AnsiballZ would ship ansible's part:
# ansible's module_utils (with the package's own __init__ and what it imports), psutil and pynvml.
ANSIBLE_PARTS = ("__init__.py", "release.py", "_vendor", "module_utils")
HOST_LIBRARIES = ("psutil", "pynvml")


def readable_dir(prefix: str) -> Path:
    """A new directory that every user can reach and list."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    top.chmod(0o755)
    closed = [str(p) for p in [top, *top.parents] if not p.stat().st_mode & stat.S_IXOTH]
    if closed:
        shutil.rmtree(top)
        raise AssertionError("other users cannot reach %s (%s is closed to them): set TMPDIR to a directory "
                             "they can reach" % (top, closed[-1]))
    return top


def copy(source: Path, target: Path) -> Path:
    """Copy a file or a tree (bytecode caches left out) to target."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)
    return target


def open_up(top: Path) -> Path:
    """Every directory under top 0755, every file 0644 or, if executable, 0755."""
    for path in [top, *top.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or path.stat().st_mode & stat.S_IXUSR else 0o644)
    return top


def modules() -> Path:
    """The collection's modules and module_utils, ansible's module_utils, psutil and pynvml under
    one new directory: pass it as run_module's `collections` (which puts it first on PYTHONPATH)."""
    top = readable_dir("cleanslate-modules-")
    for part in ("modules", "module_utils"):
        copy(REPO / "plugins" / part, top / COLLECTION / "plugins" / part)
    ansible = Path(importlib.util.find_spec("ansible").origin).parent
    for part in ANSIBLE_PARTS:
        copy(ansible / part, top / "ansible" / part)
    for name in HOST_LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is not None:  # a module without it says so itself, as on a host without it
            source = Path(spec.origin)
            source = source.parent if source.name == "__init__.py" else source
            copy(source, top / source.name)
    return open_up(top)


def simulator(lib_dir: Path) -> Path:
    """The crashed-node simulator (tests/sim, with the fake NVML's Python side) importable as
    `tests.sim` from the returned directory, and the fake library under its `fake_nvml`."""
    top = readable_dir("cleanslate-sim-")
    copy(REPO / "tests" / "__init__.py", top / "tests" / "__init__.py")
    copy(REPO / "tests" / "sim", top / "tests" / "sim")
    copy(REPO / "tests" / "fixtures", top / "tests" / "fixtures")
    copy(Path(lib_dir), top / "fake_nvml")
    return open_up(top)


def remove(top: Path) -> None:
    shutil.rmtree(top, ignore_errors=True)
