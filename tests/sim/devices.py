"""The node's NVIDIA device files: character devices that behave like /dev/zero (1:5) when
we may create them, plain files otherwise.

Either kind can be mapped, as a CUDA context maps the real ones: a MAP_PRIVATE mapping of a
1:5 node (or of a plain file) shows up in /proc/PID/maps under the node's own path. (A 1:3
node, /dev/null, cannot be mapped at all, and a MAP_SHARED mapping of 1:5 shows as
"/dev/zero (deleted)".)"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from .procinfo import SimError

KINDS = ("auto", "char", "file")
ZERO_DEVICE = os.makedev(1, 5)


def names(gpu_count: int) -> list:
    return ["nvidia%d" % i for i in range(gpu_count)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]


def patterns(dev_dir: Path) -> list:
    """The globs gpu_reset's device_paths takes to find exactly this node's devices."""
    return [str(dev_dir / "nvidia[0-9]*"), str(dev_dir / "nvidiactl"), str(dev_dir / "nvidia-uvm*")]


def can_make_char(near: Path) -> bool:
    """Try once, in a scratch directory beside the root, because only the kernel knows: root
    in a user namespace has CAP_MKNOD yet gets EPERM, and a nodev mount lets mknod succeed
    but refuses the open."""
    probe = Path(tempfile.mkdtemp(prefix=".sim-mknod-", dir=near))
    try:
        node = probe / "zero"
        os.mknod(node, 0o666 | stat.S_IFCHR, ZERO_DEVICE)
        os.close(os.open(node, os.O_RDWR))
        return True
    except PermissionError:
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def resolve_kind(kind: str, near: Path) -> str:
    """Decide before anything is built, so that a refusal leaves no trace."""
    if kind not in KINDS:
        raise SimError("device kind must be one of %s, not %r" % (", ".join(KINDS), kind))
    if kind == "file":
        return "file"
    if can_make_char(near):
        return "char"
    if kind == "char":
        raise SimError("cannot create character devices here (needs root with CAP_MKNOD and a "
                       "filesystem without nodev); use --device-kind file or auto")
    return "file"


def create(dev_dir: Path, gpu_count: int, kind: str) -> list:
    dev_dir.mkdir()
    paths = []
    for name in names(gpu_count):
        path = dev_dir / name
        if kind == "char":
            os.mknod(path, 0o666 | stat.S_IFCHR, ZERO_DEVICE)
            os.chmod(path, 0o666)  # like the driver's nodes, whatever the umask
        else:
            path.touch(0o666)
        paths.append(str(path))
    return paths
