"""A site-packages tree with a module patched in place whose old bytecode still loads.

This is what a hot-fix with `sed -i` plus a restored mtime (or a copy that keeps size and
mtime) leaves behind: the timestamp-mode .pyc still matches the source's size and mtime, so
the interpreter keeps running the old code."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from .procinfo import SimError

MODULE = "simvllm.spec_decode.eagle"
OLD_MARKER = "eagle-propose-old-v1"
NEW_MARKER = "eagle-propose-new-v2"  # same length: the patch must keep the file size

EAGLE = '''"""Simulated vLLM EAGLE proposer."""

BEHAVIOUR = "%s"


def propose():
    return BEHAVIOUR
'''

# Compile every file in timestamp mode whatever SOURCE_DATE_EPOCH says, and print the path
# the interpreter itself would load bytecode from (its own cache tag).
COMPILE = r'''
import importlib.util, py_compile, sys
for source in sys.argv[1:]:
    py_compile.compile(source, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    print(importlib.util.cache_from_source(source))
'''


def build(site: Path, python: str) -> dict:
    package = site / "simvllm"
    spec_decode = package / "spec_decode"
    spec_decode.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Simulated vLLM package."""\n')
    (spec_decode / "__init__.py").write_text('"""Simulated speculative decoding."""\n')
    eagle = spec_decode / "eagle.py"
    eagle.write_text(EAGLE % OLD_MARKER)
    # As if installed an hour ago: the patch below (made now) must restore this mtime to
    # keep the bytecode valid, so a patch that did not would show up.
    installed = int(time.time()) - 3600
    for source in (package / "__init__.py", spec_decode / "__init__.py", eagle):
        os.utime(source, (installed, installed))
    sources = [str(package / "__init__.py"), str(spec_decode / "__init__.py"), str(eagle)]
    done = subprocess.run([python, "-c", COMPILE] + sources, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SimError("cannot compile the site-packages tree with %s: %s"
                       % (python, (done.stderr.strip().splitlines() or ["?"])[-1]))
    pyc = done.stdout.split()[-1]
    patch_in_place(eagle, OLD_MARKER, NEW_MARKER)
    return {"path": str(site), "module": MODULE, "source": str(eagle), "pyc": pyc,
            "old_marker": OLD_MARKER, "new_marker": NEW_MARKER}


def patch_in_place(path: Path, old: str, new: str) -> None:
    before = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise SimError("patching %s changed its size or mtime" % path)
