"""The playbooks of the installed tarball, run by FQCN as a Galaxy user runs them, against the
simulated crashed node: verify finds it dirty and touches nothing, reset cleans it, verify passes."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.release.artifact import BIN, simulated_inventory
from tests.sim import procinfo
from tests.sim.role_vars import node_reset_vars


def _play(installed, name: str, manifest: dict, tmp_path: Path, default_path: bool = False, **overrides) -> tuple:
    """ansible-playbook cleanslate.gpu.NAME from a directory outside the checkout; (process, report row).
    default_path: no fleet_report_path, so the report goes to ./reports of that directory."""
    _collections, _root, workdir, env = installed
    reports = Path(workdir) / "reports" if default_path else tmp_path / "reports"
    extra = tmp_path / "vars.json"
    paths = {} if default_path else {"fleet_report_path": str(reports)}
    extra.write_text(json.dumps(node_reset_vars(manifest, **paths, **overrides)))
    before = set(reports.glob("*.json"))
    proc = subprocess.run([str(BIN / "ansible-playbook"), f"cleanslate.gpu.{name}", "-i",
                           str(simulated_inventory(tmp_path / "inventory.json")), "-l", "gpu_nodes",
                           "-e", f"@{extra}"], cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    found = sorted(set(reports.glob(f"{name}-*.json")) - before)
    assert len(found) == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc, json.loads(found[0].read_text())["hosts"][0]


def test_verify_reset_verify_by_fqcn_from_the_installed_tarball(installed, crashed_node, tmp_path):
    _collections, root, _workdir, _env = installed
    every_pid = [entry["pid"] for entries in crashed_node["processes"].values() for entry in entries]

    proc, row = _play(installed, "verify", crashed_node, tmp_path)
    assert proc.returncode == 2 and row["status"] == "dirty", proc.stdout[-3000:]
    assert all(procinfo.alive(pid) for pid in every_pid), "verify must not signal anything"
    # The role ran, from the only cleanslate.gpu this Ansible can see (test_tarball checks that).
    assert "TASK [cleanslate.gpu.node_reset" in proc.stdout
    assert not (root / "reports").exists()  # fleet_report_path was given: nothing inside the collection

    proc, row = _play(installed, "reset", crashed_node, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert row["status"] == "ok" and row["killed"] >= len(crashed_node["processes"]["worker"]), row
    assert row["shm_bytes_freed"] > 0 and row["bytecode_removed"] >= 1, row
    assert all(procinfo.alive(entry["pid"]) for role in ("bystander", "persistenced")
               for entry in crashed_node["processes"][role])

    # No fleet_report_path: ./reports under the directory ansible-playbook runs in, never inside
    # the installed collection (playbook_dir/../reports was, for a playbook run by its FQCN).
    proc, row = _play(installed, "verify", crashed_node, tmp_path, default_path=True)
    assert proc.returncode == 0 and row["status"] == "clean", proc.stdout[-3000:]
    assert not (root / "reports").exists() and not list(root.rglob("verify-*.json"))
