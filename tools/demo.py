"""`make demo`: a crashed GPU node, reset by Ansible, with the report printed.

1. Build a simulated crashed node under build/demo/node (tests/sim: device holders, an API
   server, a SIGTERM-ignoring worker, an orphan, a bystander, nvidia-persistenced, shm
   leftovers, stale bytecode, and a fake NVML showing their memory).
2. Run `ansible-playbook playbooks/reset.yml -i inventory/simulated.yml -l gpu_nodes` against it,
   scoped to the simulated node's device files, shm directory and site-packages.
3. Run it again: a clean node changes nothing.
4. Remove the simulation (only what it started), whatever happened.
5. The whole cycle on a real systemd host (tools/demo_serve.py): a crashed vLLM, reset, the
   stand-in engine served by systemd until it answers, the fleet report.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests import sim  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim.role_vars import node_reset_vars  # noqa: E402  pylint: disable=wrong-import-position

BUILD = REPO / "build"


def playbook(vars_file: Path) -> int:
    cmd = ["ansible-playbook", "playbooks/reset.yml", "-i", "inventory/simulated.yml", "-l", "gpu_nodes",
           "-e", "@%s" % vars_file]
    print("\n$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO, check=False).returncode


def main() -> int:
    root = BUILD / "demo" / "node"
    sim.clean(root)  # a previous demo that was interrupted
    manifest = sim.crash(root, lib_dir=BUILD / "fake_nvml")
    try:
        procs = manifest["processes"]
        print("Simulated crashed node under %s:" % root)
        for role, entries in procs.items():
            for entry in entries:
                print("  %-14s pid %-7d %-16s gpus %s" % (role, entry["pid"], entry["name"], entry["gpus"]))
        leftovers = len(manifest["shm"]["leftovers"])
        print("  shm leftovers: %d, stale bytecode: %s" % (leftovers, manifest["site_packages"]["pyc"]))
        vars_file = root.parent / "vars.json"
        vars_file.write_text(json.dumps(node_reset_vars(manifest), indent=2))
        first = playbook(vars_file)
        second = playbook(vars_file)
        survivors = [e["pid"] for r in ("bystander", "persistenced") for e in procs[r]
                     if os.path.exists("/proc/%d" % e["pid"])]
        print("\nbystander and nvidia-persistenced still running: %s" % (
            "yes" if len(survivors) == len(procs["bystander"]) + len(procs["persistenced"]) else "NO"))
        return first or second
    finally:
        sim.clean(root)
        print("simulation removed: %s" % root)


if __name__ == "__main__":
    import demo_serve  # noqa: E402  pylint: disable=import-outside-toplevel,wrong-import-position
    sys.exit(main() or demo_serve.main())
