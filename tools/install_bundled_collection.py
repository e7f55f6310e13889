"""Install one collection from the pinned `ansible` community package, without Galaxy.

Galaxy is not reachable from every machine that builds this project, but PyPI is, and the
`ansible` package on PyPI bundles the released community collections. This downloads the
pinned wheel once (its sha256 is checked by pip and again here), keeps it under WHEELS (a
cache: a second run, or a run without network, reuses it) and copies only the wanted
collection, as released, into COLLECTIONS/ansible_collections/NAMESPACE/NAME.

Usage: python tools/install_bundled_collection.py REQUIREMENTS WHEELS COLLECTIONS NAMESPACE.NAME VERSION
  REQUIREMENTS: a pip requirements file holding one line `ansible==X --hash=sha256:H`
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

USAGE = "Usage: python tools/install_bundled_collection.py REQUIREMENTS WHEELS COLLECTIONS NAMESPACE.NAME VERSION"
FQCN = re.compile(r"^(?P<namespace>[a-z0-9_]+)\.(?P<name>[a-z0-9_]+)$")
PIN = re.compile(r"^ansible==(?P<version>[0-9.]+)\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})\s*$")


class InstallError(RuntimeError):
    pass


def read_pin(requirements: Path) -> tuple:
    """(version, sha256) of the one `ansible==X --hash=sha256:H` line."""
    pins = [PIN.match(line.strip()) for line in requirements.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    if len(pins) != 1 or pins[0] is None:
        raise InstallError(f"{requirements} must hold exactly one line `ansible==X --hash=sha256:H`")
    return pins[0]["version"], pins[0]["sha256"]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_wheel(requirements: Path, wheels: Path) -> Path:
    """The pinned wheel under WHEELS, downloaded by pip (with --require-hashes) when absent."""
    version, sha256 = read_pin(requirements)
    wheel = wheels / f"ansible-{version}-py3-none-any.whl"
    if not wheel.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--require-hashes", "-r", str(requirements), "-d", str(wheels)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not wheel.exists():
            raise InstallError(f"pip could not download ansible=={version}:\n{proc.stderr[-2000:]}")
    if sha256_of(wheel) != sha256:
        raise InstallError(f"{wheel} does not have the pinned sha256 {sha256}: delete it and run again")
    return wheel


def install(wheel: Path, collections: Path, fqcn: str, version: str) -> Path:
    """Copy ansible_collections/NAMESPACE/NAME out of the wheel; check its MANIFEST version and
    every file against the collection's own FILES.json. A refused copy leaves nothing behind,
    and what was installed before stays as it was."""
    match = FQCN.match(fqcn)
    if not match:
        raise InstallError(f"{fqcn!r} is not a collection name of the form namespace.name")
    prefix = f"ansible_collections/{match['namespace']}/{match['name']}/"
    target = collections / "ansible_collections" / match["namespace"] / match["name"]
    staging = target.with_name(f".{match['name']}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _extract(wheel, prefix, staging, fqcn)
        _check(staging, wheel, fqcn, version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _extract(wheel: Path, prefix: str, staging: Path, fqcn: str) -> None:
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith(prefix) and not m.endswith("/")]
        if not members:
            raise InstallError(f"{wheel.name} bundles no {fqcn}")
        for member in members:
            path = staging / member[len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(archive.read(member))


def _check(staging: Path, wheel: Path, fqcn: str, version: str) -> None:
    found = json.loads((staging / "MANIFEST.json").read_text())["collection_info"]["version"]
    if found != version:
        raise InstallError(f"{wheel.name} bundles {fqcn} {found}, not the pinned {version}")
    listed = {entry["name"]: entry["chksum_sha256"]
              for entry in json.loads((staging / "FILES.json").read_text())["files"] if entry["ftype"] == "file"}
    for path in staging.rglob("*"):
        relative = path.relative_to(staging).as_posix()
        if path.is_file() and relative not in ("MANIFEST.json", "FILES.json") and listed.get(relative) != sha256_of(path):
            raise InstallError(f"{fqcn}: {relative} does not match the collection's FILES.json")


def main(argv) -> int:
    if len(argv) != 5:
        print(USAGE, file=sys.stderr)
        return 2
    requirements, wheels, collections, fqcn, version = argv
    try:
        wheel = cached_wheel(Path(requirements), Path(wheels))
        target = install(wheel, Path(collections), fqcn, version)
    except (InstallError, OSError, KeyError, ValueError) as exc:
        print(f"install_bundled_collection: {exc}", file=sys.stderr)
        return 1
    print(f"{fqcn} {version} from {wheel.name} -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
