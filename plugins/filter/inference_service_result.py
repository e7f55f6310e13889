# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference_service role's result, and its row keys in the fleet report, in Python.

Each outcome (served, failed while serving, refused before anything was touched) is one branch
of one function that writes the keys once, as node_reset's result is (plugins/filter/node_reset.py);
a filter, not Jinja in set_fact tasks (fewer tasks: docs/design.md#why-tasks-are-few)."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._engine_check import checks as _checks

# The gate's statuses with which a host serves (`check`: check mode, where the gate does not run).
SERVING = ("ready", "check")
# Stages at which the role stopped before touching the host: reset_and_serve.yml records these as
# node_reset's problem (`invalid`, `unreachable`), so the report row says them once.
BEFORE_ANY_CHANGE = ("validate", "unreachable")


def _mapping(value) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _changed(result) -> bool:
    return bool(_mapping(result).get("changed"))


def _summary(registered: Mapping, host, engine, unit, files_changed, warnings) -> dict:
    """What every result of a run that got past the validation holds. The command line holds no secret."""
    args = _mapping(registered.get("args"))
    restarted = _changed(registered.get("restarted")) or _changed(registered.get("started"))
    return {
        "host": host, "engine": engine, "engine_version": args.get("engine_version") or "",
        # The version given or reported, when its local label (0.32.0+cpu) is not the flag data's name.
        "engine_version_named": args.get("engine_version_named") or args.get("engine_version") or "", "unit": unit,
        "url": args.get("url") or "", "served_name": args.get("served_name") or "",
        "speculative_method": _mapping(args.get("speculative")).get("method"),
        "command_line": args.get("command_line") or "", "argv": list(args.get("argv") or []),
        "changed": bool(files_changed) or restarted, "restarted": restarted,
        "warnings": list(args.get("warnings") or []) + list(warnings or []),
        "rotation": _rotation(_mapping(registered.get("rotation"))),
    }


def _rotation(rotation: Mapping) -> dict:
    """What its load balancer did (issue 40): {} when it has none, else its server name, the
    balancer's host, the transitions as the role's rotation tasks kept them, and `left_out`: taken
    out by this run and not put back (the gate failed, or a degraded server stays out)."""
    if not rotation:
        return {}
    return dict(rotation, left_out="out" in rotation and "restored" not in rotation)


def engine_words(result: Mapping) -> str:
    """The engine and its version for the report: `vllm 0.32.0`, or where the version has a local
    label `vllm 0.32.0+cpu (flag data of 0.32.0)`."""
    version, named = result.get("engine_version") or "", result.get("engine_version_named") or ""
    if named and version and named != version:
        version = "%s (flag data of %s)" % (named, version)
    return " ".join(str(part) for part in (result.get("engine"), version) if part)


def _gate(gate: Mapping) -> dict:
    """What the gate measured, whether it passed or not (`check` when it did not run)."""
    speculation = _mapping(gate.get("speculation"))
    main_pid = _mapping(gate.get("unit")).get("MainPID") or 0
    try:
        main_pid = int(main_pid)
    except (TypeError, ValueError):
        main_pid = 0
    return {
        "status": gate.get("status") or "check", "reason": gate.get("reason") or "",
        "ready_s": gate.get("ready_s"), "gate_s": gate.get("gate_s"),
        # The host's CLOCK_MONOTONIC when the health endpoint first answered (for readiness latency).
        "ready_monotonic": gate.get("ready_monotonic"), "first_completion_ms": gate.get("first_completion_ms"),
        "completion": gate.get("completion") or "", "acceptance_rate": speculation.get("acceptance_rate"),
        "mean_acceptance_length": speculation.get("mean_acceptance_length"), "main_pid": main_pid,
        # What the stability window counted from: the gate's first answer, or the assessment's look
        # at a server the run left running.
        "stable_since": gate.get("stable_since"),
    }


def _left_out(result: Mapping) -> str:
    rotation = result["rotation"]
    return ("left out of rotation: %s on %s is %s until a run serves it and its gate passes"
            % (rotation.get("server"), rotation.get("host"), _mapping(rotation.get("out")).get("state_after") or "out"))


def _would(registered: Mapping) -> str:
    """What a run in check mode would do to the server."""
    if _changed(registered.get("restarted")):
        return "would restart"
    loaded = _mapping(registered.get("unit_state")).get("load_state") or "not-found"
    if _changed(registered.get("started")) or loaded == "not-found":
        return "would start"
    return "would leave the server running"


def inference_service_result(registered, host, engine="", unit="", files_changed=False, warnings=None,
                             check_mode=False, failed_stage=None, failed_result=None):
    """inference_service_result (see docs/inference_service.md) from what the role's tasks registered.

    `registered` maps args (inference_args), gate (inference_ready), restarted, started (the
    systemd_service tasks) to their results ({} for a task that did not run) and unit_state to
    {load_state} as inference_files read it (prepare_start). `failed_stage` names the task that
    failed (`validate` or `unreachable`: before anything was touched), `failed_result` is its result."""
    if not isinstance(registered, Mapping):
        raise TypeError("inference_service_result expects a mapping of the registered results, got %s"
                        % type(registered).__name__)
    failed_result = _mapping(failed_result)
    if failed_stage in BEFORE_ANY_CHANGE:
        return {"host": host, "engine": engine, "unit": unit, "status": "failed", "ok": False, "stage": failed_stage,
                "changed": False, "reason": str(failed_result.get("msg") or "validation failed"),
                "checks": _checks(registered.get("dry_run"), registered.get("args"))}
    result = _summary(registered, host, engine, unit, files_changed, warnings)
    # Which checks the command line got: the flag data's, the engine's own (docs/inference_service.md).
    result["checks"] = _checks(registered.get("dry_run"), registered.get("args"))
    result.update(_gate(_mapping(registered.get("gate"))))
    if failed_stage is not None:
        # The gate registers its result even when it fails: a degraded host keeps its measurements.
        result.update(status="degraded" if failed_result.get("status") == "degraded" else "failed", ok=False,
                      stage=str(failed_stage), reason=str(failed_result.get("msg") or "failed")
                      + ("; " + _left_out(result) if result["rotation"].get("left_out") else ""),
                      journal=list(failed_result.get("journal") or []),
                      journal_errors=list(failed_result.get("journal_errors") or []))
        return result
    result["ok"] = True
    if check_mode and result["rotation"]:
        # --check took nothing out: the transition it shows is what a run would do.
        result["rotation"]["left_out"] = False
    if result["rotation"].get("left_out"):
        result["warnings"].append(_left_out(result))
    if check_mode:
        result["reason"] = "check mode: %s" % _would(registered)
    return result


def _shown(value, form):
    return "-" if value is None else form % float(value)


def _checks_text(checks) -> str:
    """`flag data passed, engine refused` ("-" before any check)."""
    checks = _mapping(checks)
    return ", ".join("%s %s" % (name, checks[key]) for key, name in (("flag_data", "flag data"), ("engine", "engine"))
                     if checks.get(key)) or "-"


def inference_service_report_row(result):
    """The host's keys in the fleet report (fleet_report_rows, merged into its row): the service
    columns, ready to print, and the service's problem when it does not serve."""
    if not isinstance(result, Mapping):
        raise TypeError("inference_service_report_row expects inference_service_result, got %s" % type(result).__name__)
    status = result.get("status")
    serving = status in SERVING
    problems = [] if serving or result.get("stage") in BEFORE_ANY_CHANGE else [
        "service %s: %s" % (status, result.get("reason") or "no details")]
    rate = result.get("acceptance_rate")
    row = {
        "host": result.get("host"), "ok": serving, "problems": problems, "service": dict(result),
        "service_engine": engine_words(result),
        "service_ready_s": _shown(result.get("ready_s"), "%.1f"),
        "service_first_completion_ms": _shown(result.get("first_completion_ms"), "%.0f"),
        "service_acceptance": "-" if rate is None else "%.0f%%" % (float(rate) * 100),
        "service_status": status,
        "service_checks": _checks_text(result.get("checks")),
    }
    if isinstance(result.get("instances"), list):
        # Several servers on the host: one row each (fleet_report adds what the reset stopped and freed).
        row["instances"] = [_instance_row(instance) for instance in result["instances"] if isinstance(instance, Mapping)]
        row["ok"] = serving and all(instance["ok"] for instance in row["instances"])
        if result.get("stage") not in BEFORE_ANY_CHANGE:
            row["problems"] = ["%s: service %s: %s" % (instance["unit"], instance["service_status"],
                                                       instance["reason"] or "no details")
                               for instance in row["instances"] if not instance["ok"]]
    return row


def _instance_row(result: Mapping) -> dict:
    """One instance's row: its unit, GPUs, service status, ready seconds and acceptance."""
    rate = result.get("acceptance_rate")
    return {"unit": result.get("unit"), "gpus": list(result.get("gpus") or []),
            "ok": result.get("status") in SERVING and result.get("stage") not in BEFORE_ANY_CHANGE,
            "service_status": result.get("status"), "reason": result.get("reason") or "",
            "restarted": bool(result.get("restarted")), "reset": bool(result.get("reset")),
            "main_pid": result.get("main_pid"),
            "ready_s": result.get("ready_s"), "service_ready_s": _shown(result.get("ready_s"), "%.1f"),
            "acceptance_rate": rate, "service_acceptance": "-" if rate is None else "%.0f%%" % (float(rate) * 100),
            "service": dict(result)}


# Worst first: what a host with several instances says of itself is its worst instance's word.
# Degraded, slow and unproven all serve without proof of serving well (an instance left running is
# slow or unproven): one rank, below failed, above ready.
SERVICE_RANK = {"failed": 0, "degraded": 1, "slow": 1, "unproven": 1}
VERDICT_RANK = {"unhealthy": 0, "hung": 0, "slow": 1, "unproven": 1, "loading": 1}


def inference_service_host_result(results, host):
    """A host's inference_service_result from its instances' (inference_service_instances, in their
    order): the worst instance's result, with every instance's under `instances`. An instance
    refused before anything was touched refuses the host: its stage, and one reason line per
    refusal, each naming the instance's unit."""
    if not isinstance(results, list) or not all(isinstance(result, Mapping) for result in results) or not results:
        raise TypeError("inference_service_host_result expects the instances' results, a non-empty list of mappings")
    refused = [result for result in results if result.get("stage") in BEFORE_ANY_CHANGE]
    if refused:
        stage = "unreachable" if any(result.get("stage") == "unreachable" for result in refused) else "validate"
        reasons = ["%s: %s" % (result.get("unit"), line) for result in refused
                   for line in str(result.get("reason") or "refused").splitlines() if line]
        return {"host": host, "engine": refused[0].get("engine") or "", "unit": refused[0].get("unit") or "",
                "status": "failed", "ok": False, "stage": stage, "changed": False, "reason": "\n".join(reasons),
                "instances": [dict(result) for result in results]}
    worst = min(enumerate(results), key=lambda item: (bool(item[1].get("ok")),
                                                      SERVICE_RANK.get(item[1].get("status"), 2), item[0]))[1]
    host_result = dict(worst)
    host_result.update(host=host, ok=all(bool(result.get("ok")) for result in results),
                       changed=any(bool(result.get("changed")) for result in results),
                       restarted=any(bool(result.get("restarted")) for result in results),
                       instances=[dict(result) for result in results])
    if not host_result["ok"]:
        host_result["reason"] = "\n".join("%s: %s" % (result.get("unit"), result.get("reason") or result.get("status"))
                                          for result in results if not result.get("ok"))
    return host_result


def _assessment(answer, unit, task_msg) -> dict:
    """One server's assessment from its probe's answer (a look that failed, or none: unhealthy, its
    reason the failure's message)."""
    state = _mapping(answer.get("unit"))
    verdict = answer.get("verdict") or "unhealthy"
    return {
        "unit": unit, "verdict": verdict,
        "healthy": not bool(answer.get("needs_reset", True)),
        "reason": answer.get("last_seen") or "the look failed: %s" % (answer.get("msg") or task_msg or "?"),
        "main_pid": int(state.get("MainPID") or 0) if str(state.get("MainPID") or "0").isdigit() else 0,
        "active_state": state.get("ActiveState") or "",
        "healthy_seen": ({"invocation_id": state.get("InvocationID"), "monotonic": answer["healthy_monotonic"]}
                         if "healthy_monotonic" in answer and "unit" in answer else {}),
        "xid_look": _mapping(answer.get("xid_look")),
        "loading_baseline": ({"invocation_id": state.get("InvocationID"), "n_restarts": int(state.get("NRestarts") or 0)}
                             if verdict == "loading" and "unit" in answer else {}),
    }


def inference_service_assessments(probe, servers):
    """Each server's inference_service_assessment from one probe task (cleanslate.gpu.inference_ready,
    mode=probe): the first of `servers` from the task's own answer, the others from its `servers`
    answers, in their order; each server a mapping with its `unit` (and `gpus`, kept)."""
    if not isinstance(servers, list) or not servers or not all(isinstance(item, Mapping) and "unit" in item
                                                               for item in servers):
        raise TypeError("inference_service_assessments expects the servers looked at, a non-empty list of mappings "
                        "that name their unit")
    probe = _mapping(probe)
    others = probe.get("servers") if isinstance(probe.get("servers"), list) else []
    # A task that failed as a whole (refused, unreachable) answered for no server: its message is each one's.
    answers = [probe] + [_mapping(answer) for answer in others]
    assessments = []
    for index, server in enumerate(servers):
        answer = answers[index] if index < len(answers) else {}
        assessment = _assessment(answer, server["unit"], probe.get("msg"))
        if "gpus" in server:
            assessment["gpus"] = server["gpus"]
        assessments.append(assessment)
    return assessments


def inference_service_host_assessment(assessments):
    """A host's inference_service_assessment from its instances': healthy only when every instance
    is, the worst verdict, and each instance's (unit, verdict, healthy, reason, main_pid, gpus)
    under `instances`, which reset_and_serve.yml splits into the units to reset and those to spare."""
    if not isinstance(assessments, list) or not all(isinstance(item, Mapping) for item in assessments) or not assessments:
        raise TypeError("inference_service_host_assessment expects the instances' assessments, a non-empty list of "
                        "mappings")
    worst = min(assessments, key=lambda item: VERDICT_RANK.get(item.get("verdict"), 2))
    healthy = all(str(item.get("healthy")).lower() == "true" for item in assessments)
    return {"unit": worst.get("unit"), "verdict": worst.get("verdict"), "healthy": healthy,
            "reason": "; ".join("%s %s (%s)" % (item.get("unit"), item.get("verdict"), item.get("reason"))
                                for item in assessments),
            "main_pid": worst.get("main_pid"),
            # The Xid records read in the look's host contact (one probe for every instance: the first's answer).
            "xid_look": next((item["xid_look"] for item in assessments if item.get("xid_look")), {}),
            "instances": [dict(item, healthy=str(item.get("healthy")).lower() == "true") for item in assessments]}


class FilterModule:
    """The inference_service role's result and report row."""

    def filters(self):
        return {"inference_service_result": inference_service_result,
                "inference_service_report_row": inference_service_report_row,
                "inference_service_host_result": inference_service_host_result,
                "inference_service_host_assessment": inference_service_host_assessment,
                "inference_service_assessments": inference_service_assessments}
