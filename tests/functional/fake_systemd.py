"""systemctl and journalctl stand-ins for the readiness gate's tests on a machine without systemd:
scripts on a PATH of their own that answer `systemctl show` from a list of unit states (one per
call, the last one repeated) and `journalctl` with fixed lines, and log every call (its argv,
CLOCK_MONOTONIC, which every process shares, and the names of its environment's variables) so a
test sees what the module asked, when, and with what environment.
The unit's own behaviour (dying, restarting) is the real systemd's; the fleet tests run that."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCRIPT = r'''#!%(python)s
import json, os, sys, time
state = json.load(open(%(state)r))
with open(%(log)r, "a") as log:
    log.write(json.dumps({"argv": sys.argv, "monotonic": time.monotonic(), "env": sorted(os.environ)}) + "\n")
if %(name)r == "journalctl":
    print("\n".join(state["journal"]))
    sys.exit(0)
if sys.argv[1:2] == ["stop"] and sys.argv[-1] in state["stop_fails"]:
    sys.stderr.write(state["stop_fails"][sys.argv[-1]] + "\n")
    sys.exit(1)
calls = sum(1 for line in open(%(log)r) if json.loads(line)["argv"][0].endswith("/systemctl"))
unit = state["by_unit"].get(sys.argv[-1]) or state["units"][min(calls, len(state["units"])) - 1]
print("\n".join("%%s=%%s" %% item for item in unit.items()))
'''
INVOCATION = "4b3c0f0e2b8a4c1d9f7e6a5b4c3d2e1f"


def unit(**changes) -> dict:
    """An active unit's `systemctl show` properties, with changes."""
    state = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
             "MainPID": "4242", "NRestarts": "0", "InvocationID": INVOCATION, "ExecMainStatus": "0",
             "ExecMainStartTimestampMonotonic": "0", "ControlGroup": "/system.slice/gate-test.service"}
    state.update(changes)
    return state


class FakeSystemd:
    """`units`: the properties `systemctl show` prints, one set per call; `by_unit`: {unit: its
    properties}, for every call that names that unit last; `stop_fails`: {unit: systemctl's
    message}, a `systemctl stop` of that unit that fails with it."""

    def __init__(self, where: Path, units: list, journal=(), stop_fails=None, by_unit=None):
        self.bin = where / "bin"
        self.bin.mkdir(parents=True)
        self.log = where / "calls.jsonl"
        self.log.touch()
        state = where / "systemd.json"
        state.write_text(json.dumps({"units": units, "journal": list(journal), "stop_fails": stop_fails or {},
                                     "by_unit": by_unit or {}}))
        for name in ("systemctl", "journalctl"):
            path = self.bin / name
            path.write_text(SCRIPT % {"python": sys.executable, "state": str(state), "log": str(self.log), "name": name})
            path.chmod(0o755)

    @property
    def env(self) -> dict:
        return {"PATH": "%s:%s" % (self.bin, os.environ["PATH"])}

    def calls(self, name: str) -> list:
        return [call for call in map(json.loads, self.log.read_text().splitlines())
                if call["argv"][0].endswith("/" + name)]
