"""Controllers of ansible-core releases that need a newer Python than this machine's (2.20 and 2.21
need >= 3.12; Debian 12 has 3.11), each in a venv inside a Debian 13 root file system.

  python tools/controller/controller.py ensure [CORE ...]     build what is missing, print the root
  python tools/controller/controller.py run CORE PROGRAM ARG ...   run PROGRAM of CORE's venv
  python tools/controller/controller.py shim CORE DIR        DIR/bin: this machine's Python (the
        project's venv) beside ansible-* wrappers that run CORE's: pytest started with DIR/bin/python
        runs the project's tests with CORE as the controller (the tests call the programs beside
        sys.executable).

The root file system (image.sh, mmdebstrap) is cached under build/controller/, keyed on image.sh's
hash; each release's venv inside it is made once (a stamp names what it holds). A run enters the
root file system in a mount namespace of its own (unshare), with this checkout (wherever it lives),
/tmp, /proc, /dev, /sys and this Python's venv and interpreter bind-mounted at the same paths: every path a test hands
the controller means the same there, and the network is this machine's, so the controller reaches
the test fleet's hosts as the tests do. Nothing of it outlives the run.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from prepare_ansible_test import install_bootstrap  # noqa: E402  pylint: disable=wrong-import-position

BUILD = REPO / "build" / "controller"
SCRIPT = Path(__file__).with_name("image.sh")
# The newest patch release of each minor release.
CORES = {"2.20": "2.20.10", "2.21": "2.21.5"}
# What the controller needs beside it, pinned as in requirements.txt, requirements-test.txt and
# constraints.txt: the project's controller requirements (psutil and nvidia-ml-py too: the simulated
# node's modules run on the controller's Python, as `ansible_playbook_python`), the current
# ansible-lint, and ansible-core's cryptography (left to the index, cryptography 51 came and every
# ansible-doc printed its DSA deprecation warning).
CONTROLLER_NEEDS = ("psutil", "nvidia-ml-py", "jmespath", "paramiko", "ansible-lint", "cryptography")


def _pins() -> dict:
    """{name: 'name==version'} of the project's requirements and constraints files."""
    pins = {}
    for name in ("constraints.txt", "requirements.txt", "requirements-test.txt"):
        for line in (REPO / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                pins[line.split("==", 1)[0].strip().lower()] = line
    return pins


CONTROLLER_PACKAGES = [_pins()[name] for name in CONTROLLER_NEEDS]
# The host's paths a run sees at the same place inside the root file system (and _binds()'s).
SYSTEM_BINDS = ["/tmp", "/proc", "/sys", "/dev"]


def _binds() -> list:
    """SYSTEM_BINDS, the checkout wherever it lives, this Python's venv and base interpreter (the
    shim's python and a local connection's modules run them inside), and where build/fake_nvml
    really is: each once, a path inside another left out."""
    wanted = [Path(path) for path in SYSTEM_BINDS] + [
        REPO, Path(sys.prefix, "lib").resolve().parent, Path(sys.base_prefix).resolve(),
        (REPO / "build" / "fake_nvml").resolve()]
    binds = []
    for path in sorted({path for path in wanted if path.is_dir()}, key=lambda path: len(path.parts)):
        if not any(path == bound or bound in path.parents for bound in binds):
            binds.append(path)
    return [str(path) for path in binds]


# Programs the shim wraps (ansible-test is not: it runs from CORE's venv by `run`).
PROGRAMS = ["ansible", "ansible-playbook", "ansible-doc", "ansible-galaxy", "ansible-inventory", "ansible-config",
            "ansible-lint"]


def rootfs() -> Path:
    """The Debian 13 root file system, built by image.sh when missing (about 30 s)."""
    key = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]
    root = BUILD / f"trixie-{key}"
    if root.is_dir():
        return root
    if not shutil.which("mmdebstrap"):
        raise SystemExit("controller: mmdebstrap is not installed (tools/install_os_deps.sh installs it)")
    BUILD.mkdir(parents=True, exist_ok=True)
    partial = BUILD / f"partial-{key}"
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    proc = subprocess.run(["sh", str(SCRIPT), str(partial)], capture_output=True, text=True, check=False)
    if proc.returncode:
        shutil.rmtree(partial, ignore_errors=True)
        raise SystemExit(f"controller: image.sh failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    partial.rename(root)
    for stale in BUILD.glob("trixie-*"):
        if stale != root:
            shutil.rmtree(stale, ignore_errors=True)
    print(f"controller: built {root.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return root


def _entered(root: Path, argv: list, cwd: str, env: dict | None = None) -> list:
    """argv run inside root, in a private mount namespace, from cwd (a path on both sides)."""
    mounts = []
    for path in _binds():
        if os.path.isdir(path):
            mounts.append(f"mkdir -p {shlex.quote(str(root) + path)} && mount --rbind {shlex.quote(path)} "
                          f"{shlex.quote(str(root) + path)}")
    # pip and ansible-test reach PyPI from inside: this machine's certificate authorities.
    ca = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    if os.path.isfile(ca):
        mounts.append(f"mount --bind {shlex.quote(ca)} {shlex.quote(str(root))}/etc/ssl/certs/ca-certificates.crt")
    inner = f"cd {shlex.quote(cwd)} && exec " + shlex.join(argv)
    script = " && ".join(mounts + [f"exec chroot {shlex.quote(str(root))} /bin/sh -c {shlex.quote(inner)}"])
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script]


def _environment(inside: Path) -> dict:
    """This machine's environment less pip's settings (its wheel folders are not inside), with
    PATH the venv's programs first, then Debian 13's: never pyenv's shims, bind-mounted as they are."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join([f"{inside}/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
    return env


def venv(core: str) -> Path:
    """/opt/ansible-core-X.Y inside the root file system, made once; its path as seen inside."""
    if core not in CORES:
        raise SystemExit(f"controller: no ansible-core {core!r} here; choose from {sorted(CORES)}")
    root = rootfs()
    inside = Path(f"/opt/ansible-core-{core}")
    packages = [f"ansible-core=={CORES[core]}", *CONTROLLER_PACKAGES]
    stamp = root / inside.relative_to("/") / ".installed"
    if stamp.exists() and stamp.read_text() == " ".join(packages):
        return inside
    shutil.rmtree(root / inside.relative_to("/"), ignore_errors=True)
    started = time.monotonic()
    script = (f"/usr/bin/python3 -m venv {inside} && {inside}/bin/pip install -q --disable-pip-version-check "
              f"--cert /etc/ssl/certs/ca-certificates.crt " + shlex.join(packages))
    proc = subprocess.run(_entered(root, ["/bin/sh", "-c", script], "/"), env=_environment(inside), check=False)
    if proc.returncode:
        raise SystemExit(f"controller: installing {' '.join(packages)} in {inside} failed")
    # ansible-test inside fetches get-pip from the internet: the project's offline stand-in instead.
    site = next((root / inside.relative_to("/") / "lib").glob("python3*/site-packages"))
    install_bootstrap(home=root / "root", ansible_test_dir=site / "ansible_test")
    stamp.write_text(" ".join(packages))
    print(f"controller: made {inside} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return inside


def run(core: str, program: str, args: list) -> int:
    inside = venv(core)
    return subprocess.run(_entered(rootfs(), [f"{inside}/bin/{program}", *args], os.getcwd()),
                          env=_environment(inside), check=False).returncode


def shim(core: str, directory: Path) -> Path:
    """DIR/bin/python (the project's venv, seen through DIR/pyvenv.cfg) and ansible-* running CORE's."""
    venv(core)
    project = Path(sys.prefix)
    directory = Path(directory).resolve()
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    (directory / "pyvenv.cfg").write_text((project / "pyvenv.cfg").read_text())
    lib = directory / "lib"
    if not lib.exists():
        lib.symlink_to(project / "lib")
    python = directory / "bin" / "python"
    python.unlink(missing_ok=True)
    python.symlink_to(os.path.realpath(project / "bin" / "python"))
    for program in PROGRAMS:
        wrapper = directory / "bin" / program
        wrapper.write_text("#!/bin/sh\nexec %s %s run %s %s \"$@\"\n" % (
            shlex.quote(str(python)), shlex.quote(str(Path(__file__).resolve())), core, program))
        wrapper.chmod(0o755)
    return directory / "bin" / "python"


def main(argv: list) -> int:
    if not argv or argv[0] not in ("ensure", "run", "shim"):
        raise SystemExit(__doc__)
    if argv[0] == "ensure":
        for core in argv[1:] or list(CORES):
            venv(core)
        print(rootfs())
        return 0
    if argv[0] == "run":
        if len(argv) < 3:
            raise SystemExit("usage: controller.py run CORE PROGRAM [ARG ...]")
        return run(argv[1], argv[2], argv[3:])
    if len(argv) != 3:
        raise SystemExit("usage: controller.py shim CORE DIR")
    print(shim(argv[1], Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
