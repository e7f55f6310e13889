"""`make demo`: a crashed GPU node, reset by Ansible, with the report printed.

1. Build a simulated crashed node under build/demo/node (tests/sim: device holders, an API
   server, a SIGTERM-ignoring worker, an orphan, a bystander, nvidia-persistenced, shm
   leftovers, stale bytecode, and a fake NVML showing their memory); its table marks the
   processes that must survive the reset (tests/sim/processes.py, SPARED).
2. Run `ansible-playbook playbooks/reset.yml -i inventory/simulated.yml -l gpu_nodes` against it,
   scoped to the simulated node's device files, shm directory and site-packages.
3. Run it again: a clean node changes nothing; the table again, each process alive or stopped
   (the demo fails if one that must survive is gone, or one that must be stopped is alive).
4. Remove the simulation (only what it started), whatever happened.
5. The whole cycle on a real systemd host (tools/demo_serve.py): a crashed vLLM, reset, the
   stand-in engine served by systemd until it answers, the fleet report.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tools import demo_serve  # noqa: E402  pylint: disable=wrong-import-position
from tests import sim  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim.procinfo import alive  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim.processes import SPARED  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim.role_vars import node_reset_vars  # noqa: E402  pylint: disable=wrong-import-position

BUILD = REPO / "build"


def table(procs: dict, is_alive=None) -> tuple:
    """The simulated processes, one line each with what the reset must do to it; given `is_alive`
    (pid -> bool), also what it did. Returns the lines and how many went the wrong way."""
    lines, wrong = [], 0
    for role, entries in procs.items():
        for entry in entries:
            now = ""
            if is_alive is not None:
                right = is_alive(entry["pid"]) == (role in SPARED)
                wrong += not right
                now = "%-14s" % ("%s%s" % ("alive" if is_alive(entry["pid"]) else "stopped", "" if right else " WRONG"))
            lines.append("  %-15s pid %-7d %-19s gpus %-6s %s%s" % (
                role, entry["pid"], entry["name"], ",".join(map(str, entry["gpus"])) or "-", now,
                "* must survive: " + SPARED[role] if role in SPARED else "  to be stopped"))
    return lines, wrong


def playbook(vars_file: Path) -> int:
    cmd = ["ansible-playbook", "playbooks/reset.yml", "-i", "inventory/simulated.yml", "-l", "gpu_nodes",
           "-e", "@%s" % vars_file]
    print("\n$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO, check=False).returncode


INTRO = """make demo: two parts, about a minute (2 more the first time, to build the host's image).
  1. A simulated crashed GPU node on this machine (processes, device files, shm, a fake NVML),
     reset by playbooks/reset.yml, then checked: what must survive is alive, the rest stopped.
  2. A Debian host under systemd (systemd-nspawn): a crashed vLLM reset, and vLLM served again by
     playbooks/reset_and_serve.yml until it answers a completion.
  In part 2, %s.""" % demo_serve.STAND_IN


def main() -> int:
    print(INTRO, flush=True)
    root = BUILD / "demo" / "node"
    sim.clean(root)  # a previous demo that was interrupted
    manifest = sim.crash(root, lib_dir=BUILD / "fake_nvml")
    try:
        procs = manifest["processes"]
        print("Simulated crashed node under %s (* must survive the reset):" % root)
        print("\n".join(table(procs)[0]))
        leftovers = len(manifest["shm"]["leftovers"])
        print("  shm leftovers: %d, stale bytecode: %s" % (leftovers, manifest["site_packages"]["pyc"]))
        vars_file = root.parent / "vars.json"
        vars_file.write_text(json.dumps(node_reset_vars(manifest), indent=2))
        first = playbook(vars_file)
        second = playbook(vars_file)
        lines, wrong = table(procs, alive)
        print("\nAfter the reset (* must survive):\n" + "\n".join(lines))
        print("every process that must survive is alive, every one to be stopped is stopped" if not wrong else
              "%d process(es) went the wrong way (WRONG above)" % wrong)
        return first or second or (1 if wrong else 0)
    finally:
        sim.clean(root)
        print("simulation removed: %s" % root)


if __name__ == "__main__":
    sys.exit(main() or demo_serve.main())
