"""A playbook run against the fleet and the report it writes, as the fleet tests read them: the
command line, the newest JSON report of the run's reports directory, its rows by host and a
host's rows by instance."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .fleet import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def clear_reports(reports: Path) -> None:
    """Remove the reports an earlier run wrote, so that the newest one found is the next run's."""
    for old in reports.glob("*"):
        old.unlink()


def newest_report(reports: Path, playbook: str = "reset_and_serve") -> dict | None:
    """The newest JSON report `playbook` (its name, without .yml) wrote under `reports`, or None
    when it wrote none (a run refused before its last play)."""
    found = sorted(reports.glob(f"{playbook}-*.json"))
    return json.loads(found[-1].read_text()) if found else None


def playbook_command(fleet, reports: Path, limit: str, extra=(), check=False, playbook="reset_and_serve.yml") -> list:
    """ansible-playbook playbooks/<playbook> on the fleet's inventory, limited to `limit`, its
    report written under `reports`; in check and diff mode when `check`."""
    return [ANSIBLE_PLAYBOOK, f"playbooks/{playbook}", "-i", str(fleet.inventory), "-l", limit,
            "-e", f"fleet_report_path={reports}", *extra] + (["--check", "--diff"] if check else [])


def play(fleet, reports: Path, limit: str, extra=(), check=False, playbook="reset_and_serve.yml", repo=REPO, env=None):
    """Run playbook_command() from the repository (`repo`: another checkout's, for a bench that
    measures two trees), after clear_reports(reports); (process, the run's report or None)."""
    clear_reports(reports)
    proc = subprocess.run(playbook_command(fleet, reports, limit, extra, check, playbook),
                          cwd=repo, capture_output=True, text=True, timeout=600, check=False, env=env)
    return proc, newest_report(reports, playbook.removesuffix(".yml"))


def rows_by_host(report) -> dict:
    """The report's rows by host; a host with two rows fails."""
    hosts = [row["host"] for row in report["hosts"]]
    assert len(hosts) == len(set(hosts)), hosts  # one row per host
    return {row["host"]: row for row in report["hosts"]}


def instance_rows(report, host: str) -> dict:
    """The rows of `host`'s instances (several servers on one host), by unit; a unit with two rows fails."""
    row = rows_by_host(report)[host]
    units = [instance["unit"] for instance in row.get("instances", [])]
    assert len(units) == len(set(units)), units  # one row per instance
    return {instance["unit"]: instance for instance in row["instances"]}
