"""The fleet's Debian image: built once by image.sh, cached under build/fleet/ by the script's hash.

Three things are cached, each keyed so that a change rebuilds only what it affects:
the image tarball (key: image.sh), its unpacked root file system that every host's overlay
uses as the read-only lower layer (same key), and the nvidia-ml-py wheel (key: its version).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

SCRIPT = Path(__file__).with_name("image.sh")
# The pynvml release the collection is tested with; the hosts get the same one.
NVML_PY_VERSION = "13.615.71"


class ImageError(RuntimeError):
    """The image, its root file system or the wheel could not be made."""


def image_key() -> str:
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]


@contextmanager
def _locked(path: Path):
    """One builder at a time: parallel test sessions wait for the first one's image."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="ascii") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _drop_stale(build_dir: Path, keep: set) -> None:
    """Remove images and root file systems made by older versions of image.sh."""
    for entry in build_dir.iterdir():
        if entry.name in keep or not entry.name.startswith(("bookworm-", "rootfs-")):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def image_path(build_dir: Path) -> Path:
    """Where the image tarball of this image.sh is cached (there or not)."""
    return Path(build_dir) / f"bookworm-{image_key()}.tar.zst"


def ensure_image(build_dir: Path, log=sys.stderr) -> Path:
    """The cached image tarball, built by image.sh when it is missing (about a minute)."""
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    key = image_key()
    tarball = image_path(build_dir)
    with _locked(build_dir / "image.lock"):
        if tarball.exists():
            return tarball
        if not shutil.which("mmdebstrap"):
            raise ImageError("mmdebstrap is not installed (apt-get install mmdebstrap)")
        partial = build_dir / f"partial-{key}.tar.zst"
        started = time.monotonic()
        proc = subprocess.run(["sh", str(SCRIPT), str(partial)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            partial.unlink(missing_ok=True)
            raise ImageError(f"image.sh failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        partial.rename(tarball)
        print(f"fleet: built {tarball.name} in {time.monotonic() - started:.0f} s", file=log)
        _drop_stale(build_dir, {tarball.name, f"rootfs-{key}"})
        return tarball


def ensure_rootfs(build_dir: Path) -> Path:
    """The image unpacked once: the shared read-only lower layer of every host's overlay."""
    build_dir = Path(build_dir)
    tarball = ensure_image(build_dir)
    rootfs = build_dir / f"rootfs-{image_key()}"
    with _locked(build_dir / "image.lock"):
        if rootfs.is_dir():
            return rootfs
        partial = build_dir / f"partial-rootfs-{image_key()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        proc = subprocess.run(["tar", "--zstd", "--numeric-owner", "-xpf", str(tarball), "-C", str(partial)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise ImageError(f"unpacking {tarball} failed: {proc.stderr[-2000:]}")
        partial.rename(rootfs)
        return rootfs


def ensure_nvml_wheel(build_dir: Path) -> Path:
    """nvidia-ml-py as a wheel, fetched once with pip; the hosts have no route to any index."""
    wheels = Path(build_dir) / "wheels"
    name = f"nvidia_ml_py-{NVML_PY_VERSION}-py3-none-any.whl"
    wheel = wheels / name
    with _locked(Path(build_dir) / "image.lock"):
        if wheel.exists():
            return wheel
        wheels.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               f"nvidia-ml-py=={NVML_PY_VERSION}", "-d", str(wheels)],
                              capture_output=True, text=True, check=False, env=dict(os.environ, PIP_NO_INPUT="1"))
        if proc.returncode != 0 or not wheel.exists():
            raise ImageError(f"pip could not download nvidia-ml-py=={NVML_PY_VERSION}:\n{proc.stderr[-2000:]}")
        return wheel
