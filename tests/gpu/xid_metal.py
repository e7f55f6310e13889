"""The Xid reader on metal (issue 39): nvml_verify's xid check as Ansible runs it, against the real
driver and the real kernel log (this machine has no journald and PID 1 is not systemd: dmesg is
read), and the NVRM lines dmesg itself shows, to compare. Read-only. Prints one JSON document.

    python3 tests/gpu/xid_metal.py
"""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    sys.path.insert(0, str(REPO))
    from tests.run_module import run_module  # pylint: disable=import-outside-toplevel
    dmesg = subprocess.run(["dmesg"], capture_output=True, check=False)
    nvrm = [line for line in dmesg.stdout.splitlines() if b"NVRM" in line]
    result = run_module("nvml_verify", {"checks": ["xid"], "timeout": 0})
    shown = {key: result.get(key) for key in ("failed", "msg", "xid_action", "xid_source", "xid_log_problem",
                                              "xid_other_buses", "warnings")}
    shown["gpus"] = [{key: gpu.get(key) for key in ("index", "pci_bus_id", "xid", "xid_action")}
                     for gpu in result.get("gpus", [])]
    print(json.dumps({"dmesg_status": dmesg.returncode, "dmesg_nvrm_lines": len(nvrm),
                      "dmesg_xid_lines": sum(b"Xid" in line for line in nvrm),
                      "dmesg_nvrm_sample": [line.decode("utf-8", "backslashreplace") for line in nvrm[-5:]],
                      "nvml_verify": shown}, indent=1))
    return 0 if not result.get("failed") and not result.get("xid_log_problem") else 1


if __name__ == "__main__":
    sys.exit(main())
