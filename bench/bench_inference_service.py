"""reset_and_serve.yml end to end on a real systemd host, against the manual way (needs root).

Boots one fleet host (tests/integration/fleet) with the stand-in engine (load time 0), serves it
once so that the unit exists, then for each round:

  ours      a crashed host (a hand-started vLLM whose API server died, its two TP workers holding
            GPUs 0-1, their memory and /dev/shm segments) -> ansible-playbook reset_and_serve.yml
            -l node1, which ends after the first real completion, the stability window
            (inference_service_stable_s, 5 s) and the report; also timed: the moment it serves
            again (the gate's first /health 200 plus its first completion, CLOCK_MONOTONIC, which
            the nspawn host shares with this machine) and where the run's time goes, per phase
            (bench/callbacks/task_seconds.py: each task's wall time)
  ritual    the same crash -> over ssh: fuser -TERM on the devices, sleep 3, fuser -KILL, rm the
            NCCL segments, systemctl restart the unit, then ask for a completion every second until
            one answers (what people do; it checks nothing else)
  latency   the unit restarted with a 2 s load: the gate's first 200 from /health minus the
            moment the stand-in began listening, both read from the host's CLOCK_MONOTONIC;
            it must stay within one poll interval

The target, within 1.5x the ritual, is on "crash to serving again": the ritual ends at its first
answer, and so did the run that issue 26's 9.5 s against 4.4 s timed ("crashed host to the first
completion", before the stability window existed). The end of the run is shown without a target.

  versus    (--versus CHECKOUT) the same crash -> that checkout's reset_and_serve.yml (cwd the
            checkout: its playbooks, roles and collection link), in the same round, on the same host,
            so that today's tree and another one are measured under the same load

Grace period 3 s for both. JSON: build/bench/inference_service.json (every round's figures and
phases, their medians, the uptime load beside each round, the trees measured and the load).

    .venv/bin/python bench/bench_inference_service.py [--repeat 3] [--stable-s 0] [--load-s N] [--versus CHECKOUT]

--stable-s 0 times the runs without the stability window (JSON: inference_service-stable-0.json), a
figure reported apart from the default's. --load-s N has the restarted server load N seconds before it
listens, in the run and the ritual alike (a real model's load; JSON: inference_service-load-N.json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.fixtures.fake_nvml import build_library  # noqa: E402  pylint: disable=wrong-import-position
from tests.integration.conftest import HOST_NVML_LIB, HOST_TESTS  # noqa: E402  pylint: disable=wrong-import-position
from tests.integration.fleet import Fleet, engines  # noqa: E402  pylint: disable=wrong-import-position
from bench import provenance  # noqa: E402  pylint: disable=wrong-import-position
from bench.ssh_contacts import contact_times, ssh_counter  # noqa: E402  pylint: disable=wrong-import-position

GRACE = 3
POLL = 1.0
CALLBACKS = Path(__file__).resolve().parent / "callbacks"
# The phases of a run, by the file a task comes from (the first match wins); "ansible start" is the
# wall time before the first task (the controller reads the playbooks, roles and inventory).
PHASES = (("roles/node_reset/", "reset"), ("tasks/validate.yml", "configuration check"),
          ("tasks/assess.yml", "assessment"), ("tasks/files.yml", "unit and files"),
          ("tasks/service.yml", "start"), ("tasks/gate.yml", "gate"),
          ("roles/inference_service/", "serve, other"), ("", "report and bookkeeping"))
# Actions that run on the controller alone: a task of these, or one delegated, is no host contact.
CONTROLLER_ACTIONS = {"ansible.builtin." + name for name in (
    "set_fact", "assert", "fail", "debug", "include_tasks", "include_role", "import_tasks", "import_role",
    "meta", "set_stats", "add_host", "group_by", "include_vars")} | {"cleanslate.gpu." + name for name in (
        "inference_args", "fleet_report", "fleet_preflight", "fleet_verdict", "heal_breaker")}
UNIT = "inference-server.service"
PLAYBOOK = [str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/reset_and_serve.yml"]
ROLE_VARS = {
    "inference_service_model": "sim/Llama-3.1-8B-Instruct",
    "inference_service_served_name": "llama",
    "inference_service_tensor_parallel_size": 2,
    "inference_service_speculative": {"method": "ngram", "num_speculative_tokens": 3},
    "inference_service_environment": {"CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVML_STATE": engines.NVML_STATE,
                                      "STANDIN_LOAD_S": "0", "STANDIN_STATE_FILE": "/run/standin.json",
                                      "STANDIN_FAULT_FILE": "/etc/standin.json"},
    "inference_service_poll_interval": POLL,
    "inference_service_smoke_completions": 1,
    "inference_service_drain_timeout": 2,
    "node_reset_environment": {"LD_LIBRARY_PATH": HOST_NVML_LIB, "FAKE_NVML_STATE": engines.NVML_STATE},
    "node_reset_nvml_verify_expected_count": engines.GPUS,
    "node_reset_gpu_reset_grace_period": GRACE,
}
# The curl loop, with python3's urllib in curl's place (the test image has no curl).
CURL_LOOP = ("until python3 -c \"import urllib.request as u; u.urlopen(u.Request("
             "'http://127.0.0.1:8000/v1/completions', data=b'{\\\"model\\\": \\\"llama\\\", "
             "\\\"prompt\\\": \\\"x\\\", \\\"max_tokens\\\": 8}', "
             "headers={'Content-Type': 'application/json'}), timeout=5)\" 2>/dev/null; do sleep 1; done")


def crash(fleet) -> None:
    """A vLLM started by hand died: its workers hold GPUs 0-1 (the unit is down, as after a crash)."""
    fleet.run("node1", ["systemctl", "stop", UNIT, "crashed-vllm.service"], check=False)
    env = {"FAKE_NVML_STATE": engines.NVML_STATE, "STANDIN_LOAD_S": "0", "STANDIN_FAULT": "orphan_workers",
           "STANDIN_SHM_DIR": "/dev/shm", "STANDIN_STATE_FILE": "/run/crashed.json"}
    fleet.spawn("node1", "crashed-vllm", ["sh", "-c", "/usr/local/bin/vllm serve sim/model --tensor-parallel-size 2 "
                                                      "--port 8011; exit 0"], env=env)


def playbook(fleet, reports: Path) -> float:
    return profiled_playbook(fleet, reports)["seconds"]


def profiled_playbook(fleet, reports: Path, repo: Path = REPO) -> dict:
    """One run of `repo`'s playbook: its wall time, when it served again, the seconds of each phase and
    task, and its host contacts (ssh clients started) in all and before it served again."""
    tasks_file = reports.parent / "task_seconds.json"
    tasks_file.unlink(missing_ok=True)
    wrapper, ssh_log = ssh_counter(reports.parent)
    env = dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=str(CALLBACKS), ANSIBLE_CALLBACKS_ENABLED="task_seconds",
               BENCH_TASK_SECONDS=str(tasks_file), ANSIBLE_SSH_EXECUTABLE=str(wrapper), BENCH_SSH_LOG=str(ssh_log))
    started = time.monotonic()
    proc = subprocess.run(PLAYBOOK + ["-i", str(fleet.inventory), "-l", "node1", "-e", f"fleet_report_path={reports}"],
                          cwd=repo, capture_output=True, text=True, check=False, env=env)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{repo}: reset_and_serve.yml failed:\n{proc.stdout[-4000:]}")
    timed = json.loads(tasks_file.read_text())
    service = json.loads(sorted(reports.glob("reset_and_serve-*.json"))[-1].read_text())["hosts"][0]["service"]
    phases = {"ansible start": round(seconds - timed["total_s"], 3)}
    for task_s, path, _name in timed["tasks"]:
        phase = next(name for part, name in PHASES if part in path)
        phases[phase] = round(phases.get(phase, 0.0) + task_s, 3)
    # The gate's first completion came first_completion_ms after its first /health 200 at the latest.
    serving = service["ready_monotonic"] + (service["first_completion_ms"] or 0) / 1000.0 - started
    # /proc/uptime has 10 ms steps: a contact within them of the moment counts as before it.
    contacts = [at - started for at in contact_times(ssh_log)]
    return {"seconds": seconds, "serving_s": serving, "phases": phases, "gate_s": service["gate_s"],
            "ssh_contacts": len(contacts), "ssh_contacts_to_serving": sum(1 for at in contacts if at <= serving + 0.01),
            "ready_s": service.get("ready_s"), "tasks": timed["tasks"],
            # Skipped ones too: each costs the controller a worker even when the host is not contacted.
            "tasks_started": sum(1 for _s, path, _n in timed["tasks"] if path),
            "host_contacts": sum(1 for _path, action, delegated in timed["ran"]
                                 if action not in CONTROLLER_ACTIONS and not delegated)}


def ritual(fleet) -> float:
    devs = "/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3 /dev/nvidiactl /dev/nvidia-uvm"
    script = (f"fuser -k -TERM {devs} >/dev/null 2>&1; sleep {GRACE}; fuser -k -KILL {devs} >/dev/null 2>&1; "
              f"rm -f /dev/shm/nccl-*; systemctl restart {UNIT}; {CURL_LOOP}")
    started = time.monotonic()
    fleet.ssh("node1", script, timeout=300)
    return time.monotonic() - started


def latency(fleet, reports: Path) -> float:
    """Engine listening -> gate passed, on the host's monotonic clock."""
    fleet.hosts["node1"].root.joinpath("etc/standin.json").write_text(json.dumps({"load_s": 2}))
    try:
        playbook_vars = fleet.inventory.parent / "host_vars" / "node1.yml"
        values = yaml.safe_load(playbook_vars.read_text())
        playbook_vars.write_text(yaml.safe_dump(dict(values, fleet_force_reset=True)))
        playbook(fleet, reports)
        playbook_vars.write_text(yaml.safe_dump(values))
    finally:
        fleet.hosts["node1"].root.joinpath("etc/standin.json").unlink(missing_ok=True)
    report = json.loads(sorted(reports.glob("reset_and_serve-*.json"))[-1].read_text())
    gate_ready = report["hosts"][0]["service"]["ready_monotonic"]
    engine_ready = json.loads(fleet.run("node1", ["cat", "/run/standin.json"]).stdout)["ready_monotonic"]
    return gate_ready - engine_ready


def versus_rows(med: dict, labels: list) -> list:
    """Each other checkout's two figures against ours, measured in the same rounds (baseline: that tree)."""
    rows = []
    for label in labels:
        for measure, key in (("crash to serving", "_serving"), ("crash to end of run", "")):
            rows.append({"measure": f"serve: {measure}, vs another tree", "ours_s": med["ours" + key],
                         "baseline": label, "baseline_s": med[label + key],
                         "ratio": med["ours" + key] / med[label + key], "target": None, "met": None})
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    # The stability window is the product's default (5 s); 0 measures what the run costs without it,
    # a figure reported apart (docs/inference_service.md, "Measured"), never the default.
    parser.add_argument("--stable-s", type=float, default=None,
                        help="inference_service_stable_s for the timed runs (default: the role's, 5 s)")
    parser.add_argument("--versus", metavar="CHECKOUT", action="append", default=[],
                        help="also run another checkout's reset_and_serve.yml in each round, on the same host")
    # A real model loads for seconds to minutes after its start, in both ways of serving again.
    parser.add_argument("--load-s", type=float, default=0.0,
                        help="seconds the restarted server loads before it listens, in the run and the ritual "
                             "(default: 0, the stand-in's start alone)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if not 0 <= args.load_s <= 600:
        parser.error("--load-s must be 0 to 600 seconds")
    checkouts = provenance.versus_checkouts(parser, args.versus)
    measured_on = provenance.begin("inference_service", versus=checkouts)
    # The other trees' figures go by their tree and folder, e.g. "7f8f175 (base)".
    labels = ["%s (%s)" % (tree["label"], Path(tree["path"]).name) for tree in measured_on["versus"]]
    role_vars = dict(ROLE_VARS) if args.stable_s is None else dict(ROLE_VARS, inference_service_stable_s=args.stable_s)
    role_vars["inference_service_environment"] = dict(role_vars["inference_service_environment"],
                                                      STANDIN_LOAD_S="%g" % args.load_s)
    out = REPO / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    lib = build_library(REPO / "build" / "fake_nvml")
    times = {"ours": [], "ours_serving": [], "ritual": [], "latency": []}
    for label in labels:
        times.update({label: [], f"{label}_serving": []})
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        fleet = Fleet(Path(tmp) / "fleet", hosts=1, copy_in={HOST_TESTS: REPO / "tests", HOST_NVML_LIB: lib})
        fleet.up()
        try:
            engines.install(fleet.hosts["node1"].root)
            (fleet.inventory.parent / "host_vars").mkdir(exist_ok=True)
            (fleet.inventory.parent / "host_vars" / "node1.yml").write_text(yaml.safe_dump(role_vars))
            reports = Path(tmp) / "reports"
            playbook(fleet, reports)  # the unit exists from here on, as on a node that ran before
            for _round in range(args.repeat):
                crash(fleet)
                ours = profiled_playbook(fleet, reports)
                times["ours"].append(ours["seconds"])
                times["ours_serving"].append(ours["serving_s"])
                others = {}
                for label, checkout in zip(labels, checkouts):
                    crash(fleet)
                    others[label] = profiled_playbook(fleet, reports, checkout)
                    times[label].append(others[label]["seconds"])
                    times[f"{label}_serving"].append(others[label]["serving_s"])
                crash(fleet)
                times["ritual"].append(ritual(fleet))
                times["latency"].append(latency(fleet, reports))
                rounds.append(dict(ours, ritual_s=times["ritual"][-1], load=os.getloadavg()[0], versus=others))
        finally:
            fleet.run("node1", ["systemctl", "stop", UNIT, "crashed-vllm.service"], check=False)
            boot = dict(fleet.timings)
            fleet.down()
    med = {key: statistics.median(values) for key, values in times.items()}
    phases = {name: statistics.median(one["phases"].get(name, 0.0) for one in rounds) for name in rounds[0]["phases"]}
    report = {"times_s": times, "median_s": med, "stable_s": args.stable_s, "load_s": args.load_s, "fleet_boot": boot,
              "grace_period_s": GRACE, "poll_interval_s": POLL, "measured_on": provenance.end(measured_on),
              "phases_median_s": phases, "rounds": rounds,
              # The ritual ends at its first answer; so does the target's measure (issue 26's 1.5x, set
              # against "crashed host to the first completion"). The run's end adds the stability
              # window and the report, which the ritual has no counterpart of: shown, no target.
              "summary": [
                  {"measure": "reset_and_serve: crash to serving again", "ours_s": med["ours_serving"],
                   "baseline": "ritual + manual start + curl loop", "baseline_s": med["ritual"],
                   "ratio": med["ours_serving"] / med["ritual"], "target": "<= 1.5x the ritual",
                   "met": med["ours_serving"] / med["ritual"] <= 1.5},
                  {"measure": "reset_and_serve: crash to the end of the run", "ours_s": med["ours"],
                   "baseline": "ritual + manual start + curl loop", "baseline_s": med["ritual"],
                   "ratio": med["ours"] / med["ritual"], "target": None, "met": None},
                  {"measure": "readiness seen (engine ready to gate)", "ours_s": med["latency"],
                   "baseline": "one poll interval", "baseline_s": POLL, "ratio": med["latency"] / POLL,
                   "target": "<= %.1f s (every round)" % POLL, "met": max(times["latency"]) <= POLL},
              ]}
    report["summary"] += versus_rows(med, labels)
    name = "inference_service%s%s.json" % ("" if args.stable_s is None else "-stable-%g" % args.stable_s,
                                           "-load-%g" % args.load_s if args.load_s else "")
    (out / name).write_text(json.dumps(report, indent=2))
    for key, value in med.items():
        print(f"{key:12s} {value:7.2f} s  (all: {', '.join('%.2f' % v for v in times[key])})")
    print("ours, host contacts per run (tasks a host ran, not on the controller alone): %s"
          % ", ".join(str(one["host_contacts"]) for one in rounds))

    def contacts(runs) -> str:
        return ", ".join("%d/%d" % (one["ssh_contacts_to_serving"], one["ssh_contacts"]) for one in runs)

    print("host contacts (ssh clients started) before serving again / in the run, per round: ours %s%s"
          % (contacts(rounds), "".join("; %s %s" % (label, contacts([one["versus"][label] for one in rounds]))
                                       for label in labels)))
    print("ours, median seconds per phase:")
    for name, value in sorted(phases.items(), key=lambda item: -item[1]):
        print(f"  {name:24s} {value:6.2f}")


if __name__ == "__main__":
    main()
