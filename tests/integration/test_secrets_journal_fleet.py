"""Every secret of the inference_service role is a canary, and none is found where others read it
(issue 35, point 3): on a vLLM host (node1) and an SGLang host (node2) of the session's fleet, one
real run of reset_and_serve.yml at -vvv that writes every secret file and starts both servers with
their keys (the gate, which gets the keys, runs only there), then one `--check --diff -vvv` run in
which every secret would change. Then, for each canary:
the host's whole journal (`journalctl -o cat` and `-o json`, whose escaping differs), the playbook's
output, the reports (JSON and Markdown), the metrics files, the unit file and every /proc/*/cmdline.

The canaries are letters, digits and '-', which every escaping (repr, JSON, a shell, a URL) leaves
as they are: one found in any form of any text is found here. On main, cleanslate.gpu.inference_files
logged its options to the journal ("Invoked with secret_files=[{... 'content': ...}]"), every key in
them.
"""
from __future__ import annotations

import json
import os
import secrets as random_secrets
import shutil
import subprocess

import pytest
import yaml

from tests.integration.fleet import engines
from tests.integration.fleet.fleet import REPO
from tests.integration.fleet.reports import ANSIBLE_PLAYBOOK, play, rows_by_host
from tests.integration.test_inference_service_fleet import UNIT, base_vars

pytestmark = pytest.mark.fleet

HOSTS = ("node1", "node2")
METRICS = "/var/lib/prometheus/node-exporter"
# SGLang (and the stand-in, as it) logs its arguments with both keys at each start; the fleet's
# systemd 252 cannot drop that line (LogFilterPatterns= needs 253), and the role warns so. It is the
# one line of the engine's own that may hold them, and only those two.
SGLANG_ARGS_LINE = "server_args=ServerArgs("
# node1's vLLM is served from a venv its service user (nobody) owns, with a .pth of that user's that
# notes, at every start of the venv's Python, who started it (issue 35, point 4).
VENV = "/opt/standin-venv"
NOBODY = 65534
PTH_RAN = "/var/tmp/cleanslate-pth-ran"
PTH = "import os, sys; open(%r, 'a').write('%%d %%s\\n' %% (os.getuid(), sys.argv[:1]))\n" % PTH_RAN


def canaries(run: str) -> dict:
    """{host: inference_service_secrets} with a canary of its own in every secret."""
    tag = random_secrets.token_hex(4)

    def canary(name):
        return f"canary-{run}-{name}-{tag}"
    return {
        "node1": {"api_key": canary("vllm-api-key"), "hf_token": canary("vllm-hf-token"),
                  "environment": {"WANDB_API_KEY": canary("vllm-env-wandb"), "S3_SECRET": canary("vllm-env-s3")}},
        "node2": {"api_key": canary("sglang-api-key"), "admin_api_key": canary("sglang-admin-key"),
                  "hf_token": canary("sglang-hf-token"), "environment": {"WANDB_API_KEY": canary("sglang-env-wandb")}},
    }


def values(host_secrets: dict) -> dict:
    """{where: canary} of one host's secrets."""
    found = {key: value for key, value in host_secrets.items() if isinstance(value, str)}
    found.update({"environment." + key: value for key, value in host_secrets["environment"].items()})
    return found


@pytest.fixture(scope="module")
def runs(fleet_session, tmp_path_factory):
    """The two runs: (real run, check run, {host: {where: canary}} of both runs' canaries)."""
    fleet = fleet_session
    workdir = tmp_path_factory.mktemp("secrets-journal")
    host_vars = fleet.inventory.parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    for name in HOSTS:
        if not fleet.hosts[name].running():
            fleet.boot(name)
        engines.install(fleet.hosts[name].root)
    python = fleet.run("node1", ["/usr/bin/python3", "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"]).stdout.strip()
    site = engines.install_venv(fleet.hosts["node1"].root, VENV, "vllm", python, NOBODY)
    pth = fleet.hosts["node1"].root / site.lstrip("/") / "zz-who-ran.pth"
    pth.write_text(PTH)
    os.lchown(pth, NOBODY, NOBODY)
    fleet.run("node1", ["sh", "-c", f"rm -f {PTH_RAN}; install -m 0666 /dev/null {PTH_RAN}"])
    venv = {"node1": {"inference_service_venv": VENV}, "node2": {}}
    first, second = canaries("run"), canaries("check")

    def run(secrets, check, verbosity):
        for name in HOSTS:
            (host_vars / f"{name}.yml").write_text(yaml.safe_dump(dict(base_vars(name), **venv[name],
                                                                       inference_service_secrets=secrets[name])))
        proc, report = play(fleet, workdir / "reports", ",".join(HOSTS), extra=[verbosity], check=check)
        markdown = "".join(path.read_text() for path in (workdir / "reports").glob("*.md"))
        return proc, report, markdown
    try:
        real = run(first, False, "-vvv")
        checked = run(second, True, "-vvv")
        yield real, checked, {name: {"run " + where: value for where, value in values(first[name]).items()}
                              | {"check " + where: value for where, value in values(second[name]).items()}
                              for name in HOSTS}
    finally:
        for name in HOSTS:
            (host_vars / f"{name}.yml").unlink(missing_ok=True)
            if fleet.hosts[name].running():
                fleet.run(name, ["systemctl", "disable", "--now", UNIT], check=False, timeout=120)
                fleet.run(name, ["sh", "-c", f"rm -rf /etc/systemd/system/{UNIT} /etc/cleanslate "
                                             "/dev/shm/nccl-standin-*; systemctl daemon-reload; "
                                             f"systemctl reset-failed {UNIT}"], check=False)
            engines.uninstall(fleet.hosts[name].root)
        shutil.rmtree(fleet.hosts["node1"].root / VENV.lstrip("/"), ignore_errors=True)
        (fleet.hosts["node1"].root / PTH_RAN.lstrip("/")).unlink(missing_ok=True)


def host_texts(fleet, name: str) -> dict:
    """{where: text} of what others read on the host."""
    host = fleet.hosts[name]
    run = fleet.run
    texts = {
        "journal (-o cat)": run(name, ["journalctl", "--no-pager", "-o", "cat"]).stdout,
        "journal (-o json)": run(name, ["journalctl", "--no-pager", "-o", "json"]).stdout,
        "unit file": (host.root / "etc/systemd/system" / UNIT).read_text(),
        "/proc/*/cmdline": run(name, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], check=False).stdout,
    }
    metrics = host.root / METRICS.lstrip("/")
    texts["metrics files"] = "".join(path.read_text() for path in sorted(metrics.glob("*.prom")))
    assert "cleanslate_gpu" in texts["metrics files"], sorted(metrics.iterdir())  # the run wrote them
    if name == "node2":
        texts["journal (-o cat)"] = "\n".join(line for line in texts["journal (-o cat)"].splitlines()
                                              if not line.startswith("INFO " + SGLANG_ARGS_LINE))
        texts["journal (-o json)"] = "\n".join(line for line in texts["journal (-o json)"].splitlines()
                                               if not engines_own_arguments(json.loads(line)))
    return texts


def engines_own_arguments(entry: dict) -> bool:
    """Whether a journal entry is SGLang's arguments line, written by the server itself."""
    message = entry.get("MESSAGE")
    return entry.get("SYSLOG_IDENTIFIER") == UNIT.removesuffix(".service") and isinstance(message, str) \
        and message.startswith("INFO " + SGLANG_ARGS_LINE)


def excerpt(text: str, canary: str) -> str:
    at = text.index(canary)
    return text[max(0, at - 300):at + 60]


def test_no_secret_reaches_the_journal_output_reports_metrics_unit_or_cmdline(runs, fleet_session):
    (real, real_report, real_md), (check, check_report, check_md), planted = runs
    assert real.returncode == 0, real.stdout[-6000:] + real.stderr[-2000:]
    assert check.returncode == 0, check.stdout[-6000:] + check.stderr[-2000:]
    rows = rows_by_host(real_report)
    assert [rows[name]["service"]["status"] for name in HOSTS] == ["ready", "ready"], rows
    # The check run compared new secret files (each would change), so its module saw every canary too.
    assert "Would change: /etc/cleanslate/inference/inference-server.env (" in check.stdout
    assert "| node1 |" in real_md and "| node2 |" in check_md
    shared = {"ansible output": real.stdout + real.stderr + check.stdout + check.stderr,
              "reports": json.dumps(real_report) + json.dumps(check_report) + real_md + check_md}
    leaks = []
    for name in HOSTS:
        texts = dict(shared, **host_texts(fleet_session, name))
        for where, text in texts.items():
            leaks += [f"{name} {secret} in the {where}: ...{excerpt(text, canary)}..."
                      for secret, canary in planted[name].items() if canary in text]
    assert leaks == [], "\n".join(leaks)
    # The journal does hold the run (a journal the test could not read would hold no canary either).
    journal = fleet_session.run("node1", ["journalctl", "--no-pager", "-o", "cat"]).stdout
    assert "secret_files=[{'path': '/etc/cleanslate/inference/inference-server.env'" in journal
    assert "(the texts not logged)" in journal
    # The keys reached the servers: the real run's secret files hold them (0600), and SGLang's
    # arguments line (the one place excluded above) holds its keys only, never a token or a variable.
    node1 = fleet_session.hosts["node1"].root / "etc/cleanslate/inference/inference-server.env"
    assert oct(node1.stat().st_mode & 0o777) == "0o600"
    assert planted["node1"]["run api_key"] in node1.read_text()
    logged = [line for line in fleet_session.run("node2", ["journalctl", "--no-pager", "-o", "cat"]).stdout.splitlines()
              if line.startswith("INFO " + SGLANG_ARGS_LINE)]
    assert logged and all(planted["node2"][where] not in line for line in logged
                          for where in ("run hf_token", "run environment.WANDB_API_KEY"))
    assert any(planted["node2"]["run api_key"] in line for line in logged)


def test_root_never_starts_the_service_users_python_in_a_real_run_nor_in_check_mode(runs, fleet_session):
    """Issue 35, point 4, on systemd: node1's vLLM is served from a venv nobody owns, with a .pth of
    nobody's in its site-packages that notes each start of the venv's Python (uid, argv[0]). After
    the real run and the `--check --diff -vvv` run, the one start by root is the server's own (its
    unit runs as root here, inference_service_user empty: the operator's choice), never a probe of
    the role's. On d3c1d0d the version probe ran `python -c 'import importlib.metadata ...'` as root
    in both runs ("0 ['-c']")."""
    (real, real_report, dummy), (check, dummy, dummy), dummy = runs
    assert real.returncode == 0 and check.returncode == 0, real.stdout[-3000:] + check.stdout[-3000:]
    assert rows_by_host(real_report)["node1"]["service"]["status"] == "ready"
    assert "argv[]=%s/bin/vllm serve " % VENV in fleet_session.run("node1", ["systemctl", "show", "-P", "ExecStart", UNIT]).stdout
    starts = (fleet_session.hosts["node1"].root / PTH_RAN.lstrip("/")).read_text().splitlines()
    server = "0 ['%s/bin/vllm']" % VENV
    assert server in starts, starts  # the .pth runs at each start of that Python
    assert [line for line in starts if line.startswith("0 ") and line != server] == [], starts


def test_reset_steps_logs_no_evidence_secret_to_the_journal(fleet_session, tmp_path):
    """Issue 42: cleanslate.gpu.reset_steps gets every step's arguments in one module process on the
    host. That process logs none of them to the host's journal: each step logs its own, as its
    module does, the evidence's secrets masked (its no_log option). The journal does hold the
    evidence's own line, so a journal the test could not read would not pass."""
    if not fleet_session.hosts["node1"].running():
        fleet_session.boot("node1")
    canary = "canary-reset-steps-" + random_secrets.token_hex(4)
    playbook = tmp_path / "steps.yml"
    playbook.write_text(json.dumps([{"hosts": "node1", "gather_facts": False, "tasks": [{
        "name": "Keep the evidence and look at the leftovers",
        "cleanslate.gpu.reset_steps": {
            "evidence": {"path": "/var/tmp/cleanslate-steps-evidence", "secrets": [canary],
                         "cmdline_patterns": ["cleanslate-matches-no-process"]},
            "shm_clean": {"path": "/dev/shm", "patterns": ["cleanslate-matches-no-file-*"]}}}]}]))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", str(fleet_session.inventory), "-l", "node1", "-vvv"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    journal = fleet_session.run("node1", ["journalctl", "--no-pager", "-o", "json"]).stdout
    assert "secrets=NOT_LOGGING_PARAMETER" in journal and "cleanslate-matches-no-process" in journal
    assert canary not in journal, excerpt(journal, canary)
    assert canary not in proc.stdout + proc.stderr, excerpt(proc.stdout + proc.stderr, canary)


def test_the_one_probe_of_several_servers_logs_none_of_their_secrets(fleet_session, tmp_path):
    """Issue 42: the several servers of a node are looked at by one inference_ready probe, each other
    server's options a mapping in `servers`, which no no_log of the module's spec covers. Their keys and
    secrets (given on their own and in their settings, as the role gives them) reach neither the host's
    journal (the module's "Invoked with" line names `servers`, so a journal the test could not read would
    not pass) nor the output at -vvv (the invocation's module_args). The same for the gate's `servers`,
    those it watches while it holds its window (it fails here: its unit is not installed)."""
    if not fleet_session.hosts["node1"].running():
        fleet_session.boot("node1")
    tag = random_secrets.token_hex(4)
    key, secret, in_settings, watched = (f"canary-probe-{what}-{tag}" for what in ("key", "secret", "settings", "watched"))
    server = {"engine": "vllm", "url": "http://127.0.0.1:9", "served_name": "llama", "poll_interval": 0.1}
    playbook = tmp_path / "probe.yml"
    playbook.write_text(json.dumps([{"hosts": "node1", "gather_facts": False, "tasks": [{
        "name": "Look at three servers that are not there",
        "cleanslate.gpu.inference_ready": dict(server, mode="probe", servers=[
            dict(server, api_key=key, secrets=[secret]),
            {"settings": dict(server, api_key=in_settings)}])}, {
        "name": "Gate a server that is not there, watching two",
        "cleanslate.gpu.inference_ready": dict(server, unit="cleanslate-none.service", timeout=1, servers=[
            dict(server, unit="cleanslate-none-b.service", api_key=watched),
            {"settings": dict(server, unit="cleanslate-none-c.service", secrets=[watched])}]),
        "ignore_errors": True}]}]))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", str(fleet_session.inventory), "-l", "node1", "-vvv"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "servers" in proc.stdout and "connection refused" in proc.stdout, proc.stdout[-4000:]
    journal = fleet_session.run("node1", ["journalctl", "--no-pager", "-o", "json"]).stdout
    assert "served_name=llama" in journal and "servers=" in journal and "unit=cleanslate-none.service" in journal
    assert "unit cleanslate-none.service is not installed" in proc.stdout, proc.stdout[-4000:]
    for canary in (key, secret, in_settings, watched):
        assert canary not in journal, excerpt(journal, canary)
        assert canary not in proc.stdout + proc.stderr, excerpt(proc.stdout + proc.stderr, canary)


def test_the_one_write_of_several_servers_files_logs_none_of_their_secrets(fleet_session, tmp_path):
    """Issue 42: the files of the servers a run reset are written by one inference_files task, each server's
    secret files in `instances`. Their texts reach neither the host's journal (the module's "Invoked with" line
    names each server's files, so a journal the test could not read would not pass) nor the output at -vvv,
    and they are in the files written."""
    if not fleet_session.hosts["node1"].running():
        fleet_session.boot("node1")
    tag = random_secrets.token_hex(4)
    where = "/var/tmp/cleanslate-write-" + tag
    fleet_session.run("node1", ["mkdir", "-p", where + "/system", where + "/inference"])
    canaries = {name: f"canary-write-{name}-{tag}" for name in ("a", "b")}
    marker = "# Managed by Ansible (cleanslate.gpu.inference_service); local changes are overwritten."
    servers = [{"unit": {"path": f"{where}/system/vllm-{name}.service", "marker": marker,
                         "content": marker + "\n[Service]\nExecStart=/bin/true\n"},
                "secret_files": [{"path": f"{where}/inference/vllm-{name}.env", "content": f'VLLM_API_KEY="{canary}"\n'}]}
               for name, canary in canaries.items()]
    playbook = tmp_path / "write.yml"
    playbook.write_text(json.dumps([{"hosts": "node1", "gather_facts": False, "tasks": [{
        "name": "Write two servers' files", "cleanslate.gpu.inference_files": {"instances": servers}}]}]))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", str(fleet_session.inventory), "-l", "node1", "-vvv"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    journal = fleet_session.run("node1", ["journalctl", "--no-pager", "-o", "json"]).stdout
    assert f"{where}/inference/vllm-b.env" in journal and "instances=[" in journal, journal[-2000:]
    for name, canary in canaries.items():
        assert canary in fleet_session.run("node1", ["cat", f"{where}/inference/vllm-{name}.env"]).stdout
        assert canary not in journal, excerpt(journal, canary)
        assert canary not in proc.stdout + proc.stderr, excerpt(proc.stdout + proc.stderr, canary)
