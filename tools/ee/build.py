"""Build the execution environment of execution-environment.yml here, without a container registry
or Galaxy: `make ee`.

1. The base image: tools/ee/base.sh (mmdebstrap, Debian 12 with python3 and pip) imported into
   podman as localhost/cleanslate-ee-base:bookworm-<hash of base.sh>, once per version of base.sh.
2. The two collections as local tarballs under build/ee/collections: cleanslate.gpu built from
   this checkout (`ansible-galaxy collection build`, as released), community.proxmox packed from
   the copy `make setup` installed out of the pinned `ansible` wheel (an installed collection is
   its artifact's MANIFEST.json, FILES.json and files; the wheel leaves out the collection's
   tests and CI files, so FILES.json is narrowed to the files present and MANIFEST.json given
   its new checksum, and ansible-galaxy still checks every file against it).
3. build/ee/execution-environment.yml: the repository's definition with its galaxy requirements
   pointing at those tarballs (and copied into the build context) and that base image's tag;
   nothing else changes.
4. `ansible-builder build` with podman (runc, no default ulimits: tools/ee/containers.conf).

Prints the image name and the time of each step. Usage: python tools/ee/build.py [TAG]
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OUT = REPO / "build" / "ee"
BASE_SCRIPT = REPO / "tools" / "ee" / "base.sh"
BASE_IMAGE = "localhost/cleanslate-ee-base:bookworm-" + hashlib.sha256(BASE_SCRIPT.read_bytes()).hexdigest()[:12]
PROXMOX = REPO / ".ansible" / "collections" / "ansible_collections" / "community" / "proxmox"
ENV = dict(os.environ, CONTAINERS_CONF=str(REPO / "tools" / "ee" / "containers.conf"))


def _run(argv, **kwargs):
    return subprocess.run([str(arg) for arg in argv], check=True, env=ENV, **kwargs)


def ensure_base() -> str:
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE], env=ENV, check=False).returncode == 0:
        return "present"
    OUT.mkdir(parents=True, exist_ok=True)
    rootfs = OUT / "base.tar"
    _run(["sh", BASE_SCRIPT, rootfs])
    _run(["podman", "import", rootfs, BASE_IMAGE], stdout=subprocess.DEVNULL)
    rootfs.unlink()
    return "built"


def collection_tarballs() -> list:
    """[(name, tarball)] for cleanslate.gpu and community.proxmox under build/ee/collections."""
    dest = OUT / "collections"
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.tar.gz"):
        old.unlink()
    _run([BIN / "ansible-galaxy", "collection", "build", "--force", "--output-path", dest, REPO],
         stdout=subprocess.DEVNULL)
    manifest = json.loads((PROXMOX / "MANIFEST.json").read_text())
    proxmox = dest / f"community-proxmox-{manifest['collection_info']['version']}.tar.gz"
    files = json.loads((PROXMOX / "FILES.json").read_text())
    files["files"] = [entry for entry in files["files"] if entry["name"] == "." or (PROXMOX / entry["name"]).exists()]
    files_json = json.dumps(files, indent=4).encode()
    manifest["file_manifest_file"]["chksum_sha256"] = hashlib.sha256(files_json).hexdigest()
    with tarfile.open(proxmox, "w:gz") as tar:
        for name, data in (("MANIFEST.json", json.dumps(manifest, indent=4).encode()), ("FILES.json", files_json)):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        for entry in files["files"][1:]:
            tar.add(PROXMOX / entry["name"], arcname=entry["name"], recursive=False)
    (ours,) = dest.glob("cleanslate-gpu-*.tar.gz")
    return [("cleanslate.gpu", ours), ("community.proxmox", proxmox)]


def offline_definition(tarballs: list) -> Path:
    definition = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    names = [entry["name"] for entry in definition["dependencies"]["galaxy"]["collections"]]
    assert names == [name for name, _path in tarballs], names
    # ansible-builder copies additional_build_files into the context's _build/, which the galaxy
    # stage copies to /build and installs from: the paths are relative to /build.
    definition["dependencies"]["galaxy"] = {"collections": [
        {"name": f"collections/{path.name}", "type": "file"} for _name, path in tarballs]}
    definition["images"]["base_image"]["name"] = BASE_IMAGE
    definition["additional_build_files"] = [{"src": str(OUT / "collections"), "dest": "collections"}]
    path = OUT / "execution-environment.yml"
    path.write_text("# Written by tools/ee/build.py from ../../execution-environment.yml: local collection tarballs.\n"
                    + yaml.safe_dump(definition, sort_keys=False))
    return path


def main(argv) -> int:
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    tag = argv[0] if argv else f"localhost/cleanslate-gpu-ee:{version}"
    if not PROXMOX.joinpath("MANIFEST.json").exists():
        raise SystemExit("ee: community.proxmox is not installed under .ansible/collections (make setup)")
    times = {}
    started = time.monotonic()
    base = ensure_base()
    times[f"base image ({base})"] = time.monotonic() - started
    started = time.monotonic()
    definition = offline_definition(collection_tarballs())
    times["collection tarballs"] = time.monotonic() - started
    started = time.monotonic()
    _run([BIN / "ansible-builder", "build", "-f", definition, "-c", OUT / "context", "-t", tag,
          "--container-runtime", "podman", "-v", "2"])
    times["ansible-builder build"] = time.monotonic() - started
    for step, seconds in times.items():
        print(f"ee: {step}: {seconds:.0f} s")
    print(f"ee: built {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
