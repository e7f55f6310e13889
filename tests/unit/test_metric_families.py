"""The roles' results as metric families (filter cleanslate.gpu.metric_families): the figures a
dashboard shows are the fleet report's, and a failed run keeps the last success."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import host_row
from ansible_collections.cleanslate.gpu.plugins.filter.metrics import metric_families
from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import node_reset_result
from ansible_collections.cleanslate.gpu.plugins.module_utils._textfile import render
from ansible_collections.cleanslate.gpu.plugins.modules.textfile_metrics import FILE_NAME

MIB = 1024 * 1024


def gpu(index, uuid, mib, problems=()):
    return {"index": index, "uuid": uuid, "memory_used_mib": mib, "problems": list(problems)}


def reset_steps(after=None):
    return {
        "gpu_reset": {"changed": True, "elapsed_s": 3.5, "killed": [{"pid": 10}, {"pid": 11}],
                      "memory_before": [gpu(0, "GPU-a", 80000), gpu(1, "GPU-b", 1200)]},
        "shm_clean": {"changed": True, "elapsed_s": 0.2, "bytes_freed": 4096, "removed": [{"path": "/dev/shm/nccl-1"}]},
        "pycache_purge": {"changed": True, "elapsed_s": 0.4, "removed": [{"pyc": "a"}, {"pyc": "b"}, {"pyc": "c"}]},
        "nvml_verify": {"ok": after is None, "waited_s": 1.25, "count": 2,
                        "gpus": after or [gpu(0, "GPU-a", 0), gpu(1, "GPU-b", 0)]},
    }


def samples(families) -> dict:
    """{metric name: {frozenset(labels): value}} for the families that have samples."""
    return {fam["name"]: {frozenset(s["labels"].items()): s["value"] for s in fam["samples"]}
            for fam in families if fam["samples"]}


def only(families, name):
    values = list(samples(families)[name].values())
    assert len(values) == 1, values
    return values[0]


def test_a_reset_is_written_with_the_reports_figures():
    result = node_reset_result(reset_steps(), "node1", started=1000.0, now=1010.0)
    out = metric_families(result, "node_reset", "node1")
    assert out["name"] == "cleanslate_gpu_node_reset"
    families = out["families"]
    got = samples(families)
    base = frozenset({"host": "node1", "role": "node_reset"}.items())
    assert got["cleanslate_gpu_run_ok"] == {base: 1}
    assert got["cleanslate_gpu_run_status"] == {base | {("status", "ok"), ("step", "")}: 1}
    assert got["cleanslate_gpu_reset_processes_stopped"] == {base: 2}
    freed = {base | {("gpu", "0")}: 80000 * MIB, base | {("gpu", "1")}: 1200 * MIB}
    assert got["cleanslate_gpu_reset_gpu_memory_freed_bytes"] == freed
    assert got["cleanslate_gpu_reset_shm_freed_bytes"] == {base: 4096}
    assert got["cleanslate_gpu_reset_bytecode_files_removed"] == {base: 3}
    assert got["cleanslate_gpu_reset_gpus"] == {base: 2} and got["cleanslate_gpu_reset_gpus_clean"] == {base: 2}
    assert got["cleanslate_gpu_run_seconds"] == {base: 10.0}
    # Seconds per step: the report's own figures.
    row = host_row("node1", result)
    assert {dict(labels)["step"]: value for labels, value in got["cleanslate_gpu_reset_step_seconds"].items()} \
        == row["seconds_per_step"] == {"gpu_reset": 3.5, "shm_clean": 0.2, "pycache_purge": 0.4, "nvml_verify": 1.25}
    # A success: its time now, taken as given; no failure to date.
    last_success, = [fam for fam in families if fam["name"] == "cleanslate_gpu_last_success_timestamp_seconds"]
    assert last_success["samples"][0]["value"] == "now" and not last_success["keep_previous"]
    assert "cleanslate_gpu_failing_since_timestamp_seconds" not in got


def test_a_failed_reset_keeps_the_last_success_and_names_the_step():
    result = node_reset_result(reset_steps(), "node1", failed_step="gpu_reset", failed_result={"msg": "boom"},
                               started=1000.0, now=1001.0)
    families = metric_families(result, "node_reset", "node1")["families"]
    by_name = {fam["name"]: fam for fam in families}
    assert only(families, "cleanslate_gpu_run_ok") == 0
    labels, = samples(families)["cleanslate_gpu_run_status"]
    assert dict(labels) == {"host": "node1", "role": "node_reset", "status": "failed", "step": "gpu_reset"}
    # No time of its own for the last success: the previous file's is kept.
    assert by_name["cleanslate_gpu_last_success_timestamp_seconds"]["keep_previous"]
    assert by_name["cleanslate_gpu_last_success_timestamp_seconds"]["samples"] == []
    # The first failure's time is kept through the next failures.
    assert by_name["cleanslate_gpu_failing_since_timestamp_seconds"]["keep_previous"]
    assert by_name["cleanslate_gpu_failing_since_timestamp_seconds"]["samples"][0]["value"] == "now"


def test_a_dirty_host_counts_only_the_clean_gpus():
    after = [gpu(0, "GPU-a", 0), gpu(1, "GPU-b", 900, problems=["GPU 1 (GPU-b): 900 MiB used"])]
    result = node_reset_result(reset_steps(after), "node1")
    families = metric_families(result, "node_reset", "node1")["families"]
    assert only(families, "cleanslate_gpu_reset_gpus_clean") == 1 and only(families, "cleanslate_gpu_reset_gpus") == 2
    labels, = samples(families)["cleanslate_gpu_run_status"]
    assert dict(labels)["status"] == "dirty"
    assert samples(families)["cleanslate_gpu_reset_gpu_memory_freed_bytes"][frozenset(
        {"host": "node1", "role": "node_reset", "gpu": "1"}.items())] == 300 * MIB


def test_a_verify_run_has_its_own_role_and_file():
    result = node_reset_result(reset_steps(), "node1", kind="verify", read_only=True)
    out = metric_families(result, "node_reset", "node1")
    assert out["name"] == "cleanslate_gpu_node_verify"
    assert {dict(labels)["role"] for fam in out["families"] for labels in samples([fam]).get(fam["name"], {})} == {"node_verify"}


def service_result(**values):
    base = {"host": "node1", "engine": "vllm", "engine_version": "0.33.0", "unit": "inference-server.service",
            "speculative_method": "eagle3", "status": "ready", "ok": True, "ready_s": 12.5, "gate_s": 14.0,
            "first_completion_ms": 840.0, "acceptance_rate": 0.71, "mean_acceptance_length": 3.13}
    base.update(values)
    return base


def test_a_service_start_is_written_with_its_times_acceptance_and_engine():
    out = metric_families(service_result(), "inference_service", "node1", min_acceptance_rate=0.3)
    assert out["name"] == "cleanslate_gpu_inference_service_inference-server"
    families = out["families"]
    assert only(families, "cleanslate_gpu_service_start_to_ready_seconds") == 12.5
    assert only(families, "cleanslate_gpu_service_first_completion_seconds") == 0.84
    assert only(families, "cleanslate_gpu_service_start_to_first_completion_seconds") == 13.34
    assert only(families, "cleanslate_gpu_service_speculative_acceptance_rate") == 0.71
    assert only(families, "cleanslate_gpu_service_speculative_mean_acceptance_length") == 3.13
    assert only(families, "cleanslate_gpu_service_min_acceptance_rate") == 0.3
    assert only(families, "cleanslate_gpu_run_seconds") == 14.0
    labels, = samples(families)["cleanslate_gpu_service_info"]
    assert dict(labels) == {"host": "node1", "role": "inference_service", "unit": "inference-server.service",
                            "engine": "vllm", "version": "0.33.0", "speculative_method": "eagle3"}


def test_what_the_gate_did_not_measure_is_absent_not_zero():
    """A server left running (no start): no start-to-ready time; no speculation: no rate. A 0
    would read as an instant start or a speculation that never hits."""
    families = metric_families(service_result(ready_s=None, acceptance_rate=None, mean_acceptance_length=None,
                                              status="degraded"),
                               "inference_service", "node1")["families"]
    got = samples(families)
    for name in ("cleanslate_gpu_service_start_to_ready_seconds", "cleanslate_gpu_service_start_to_first_completion_seconds",
                 "cleanslate_gpu_service_speculative_acceptance_rate", "cleanslate_gpu_service_speculative_mean_acceptance_length"):
        assert name not in got
    assert got["cleanslate_gpu_service_first_completion_seconds"]


@pytest.mark.parametrize("unit", ['we"ird.service', "a/b.service", "a\nb.service", "caf\u00e9@1.service", "x\udcff.service",
                                  "..service", "a_x2e.service", "a..service"])
def test_every_unit_name_gives_a_file_name_of_its_own_that_the_module_accepts(unit):
    name = metric_families(service_result(unit=unit), "inference_service", "n")["name"]
    assert FILE_NAME.match(name), name
    others = {metric_families(service_result(unit=other), "inference_service", "n")["name"]
              for other in ('we"ird.service', "a/b.service", "a\nb.service", "caf\u00e9@1.service", "x\udcff.service",
                            "..service", "a_x2e.service", "a..service") if other != unit}
    assert name not in others


def test_the_rendered_files_parse_and_say_the_same_help_for_the_same_metric():
    """node_exporter merges the families of all its files and refuses one whose HELP differs."""
    reset = metric_families(node_reset_result(reset_steps(), "n1"), "node_reset", "n1")["families"]
    service = metric_families(service_result(), "inference_service", "n1")["families"]
    helps = {}
    for families in (reset, service):
        concrete = [dict(fam, samples=[dict(s, value=1 if s["value"] == "now" else s["value"]) for s in fam["samples"]])
                    for fam in families]
        for fam in text_string_to_metric_families(render(concrete)):
            assert helps.setdefault(fam.name, fam.documentation) == fam.documentation
    assert "cleanslate_gpu_run_ok" in helps and "cleanslate_gpu_service_info" in helps


@pytest.mark.parametrize("args, words", [(([], "node_reset", "n"), "expects the role's result"),
                                         (({}, "node_reset", ""), "host must be"),
                                         (({}, "node_reset", None), "host must be"),
                                         (({}, "other", "n"), "role must be")])
def test_a_wrong_call_says_what_is_wrong(args, words):
    with pytest.raises(AnsibleFilterError, match=words):
        metric_families(*args)


# ----- the roles' metrics variables, refused before any step -----

BAD_DIRS = [("relative/dir", "must be absolute"), ("", "must be absolute"), ("/var/lib/a\nb", "on one line"),
            (5, "")]


@pytest.mark.parametrize("value, words", BAD_DIRS)
def test_a_bad_metrics_directory_refuses_the_host_with_one_sentence(value, words):
    from tests.unit.test_node_reset_filter import values  # pylint: disable=import-outside-toplevel
    from tests.unit.test_inference_service_problems import _service_values  # pylint: disable=import-outside-toplevel
    from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import (  # pylint: disable=import-outside-toplevel
        inference_service_problems)
    from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import (  # pylint: disable=import-outside-toplevel
        node_reset_problems)
    for name, problems in (("node_reset_metrics_dir", node_reset_problems(values(node_reset_metrics_dir=value))),
                           ("inference_service_metrics_dir",
                            inference_service_problems(_service_values(inference_service_metrics_dir=value)))):
        assert len(problems) == 1 and problems[0].startswith(name) and words in problems[0], problems


@pytest.mark.parametrize("value", ["maybe", 2, None, [True]])
def test_a_metrics_switch_that_is_no_boolean_is_refused(value):
    from tests.unit.test_node_reset_filter import values  # pylint: disable=import-outside-toplevel
    from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import (  # pylint: disable=import-outside-toplevel
        node_reset_problems)
    problems = node_reset_problems(values(node_reset_metrics=value))
    assert len(problems) == 1 and problems[0].startswith("node_reset_metrics "), problems


def test_the_docs_metrics_table_names_exactly_what_the_filter_writes():
    """docs/observability.md's metrics table against the families the filter writes for a full
    reset, a failed one and a service start: a renamed or added metric shows in both or fails."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    table = docs.split("## The metrics", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for row in re.findall(r"^\| ([^|]+) \|", table, re.M):
        documented |= set(re.findall(r"`(cleanslate_gpu_\w+)`", row))
    ok = node_reset_result(reset_steps(), "n1", started=1000.0, now=1010.0)
    failed = node_reset_result(reset_steps(), "n1", failed_step="gpu_reset", failed_result={"msg": "boom"})
    xid = node_reset_result(xid_steps(), "n1", started=1000.0, now=1010.0)
    written = set()
    for families in (metric_families(ok, "node_reset", "n1")["families"], metric_families(failed, "node_reset", "n1")["families"],
                     metric_families(xid, "node_reset", "n1")["families"],
                     metric_families(service_result(), "inference_service", "n1", min_acceptance_rate=0.3)["families"]):
        written |= {fam["name"] for fam in families if fam["samples"] or fam["keep_previous"]}
    assert documented == written, {"documented, never written": documented - written, "written, not documented": written - documented}


def test_a_refused_configuration_is_invalid_and_starts_the_failure():
    """reset_and_serve.yml's first play refuses a host before anything is touched: its service
    file says `invalid` (the serve-failed alert's status), keeps the last success and starts
    failing_since, and measured nothing."""
    refused = {"host": "node1", "engine": "vllm", "unit": "inference-server.service", "status": "failed", "ok": False,
               "stage": "validate", "changed": False, "reason": "inference_service_port is -1: ..."}
    families = metric_families(refused, "inference_service", "node1", min_acceptance_rate=0.3)["families"]
    by_name = {fam["name"]: fam for fam in families}
    labels, = samples(families)["cleanslate_gpu_run_status"]
    assert dict(labels)["status"] == "invalid" and only(families, "cleanslate_gpu_run_ok") == 0
    assert by_name["cleanslate_gpu_last_success_timestamp_seconds"]["keep_previous"]
    assert by_name["cleanslate_gpu_failing_since_timestamp_seconds"]["samples"][0]["value"] == "now"
    assert "cleanslate_gpu_service_start_to_ready_seconds" not in samples(families)
    # A failure after the validation (the gate) stays `failed`.
    labels, = samples(metric_families(dict(refused, stage="gate"), "inference_service", "node1")["families"])["cleanslate_gpu_run_status"]
    assert dict(labels)["status"] == "failed"


def xid_steps():
    """A reset whose final check found Xid 79 (and an application's Xid 13) on GPU 1."""
    lost = dict(gpu(1, "GPU-b", 0), xid_action="needs_reboot", problems=["needs_reboot: Xid 79 ..."],
                xid=[{"code": 13, "class": "restart_app"}, {"code": 79, "class": "needs_reboot"}])
    steps = reset_steps(after=[dict(gpu(0, "GPU-a", 0), xid_action=None, xid=[{"code": 13, "class": "restart_app"}]),
                               lost])
    steps["nvml_verify"]["xid_action"] = "needs_reboot"
    return steps


def test_a_gpu_whose_xid_a_reset_cannot_clear_is_written_per_gpu_and_as_the_status():
    result = node_reset_result(xid_steps(), "node1", started=1000.0, now=1010.0)
    got = samples(metric_families(result, "node_reset", "node1")["families"])
    base = frozenset({"host": "node1", "role": "node_reset"}.items())
    assert got["cleanslate_gpu_reset_gpu_xid_action"] == {
        base | {("gpu", "1"), ("action", "needs_reboot"), ("code", "79")}: 1}
    assert got["cleanslate_gpu_run_status"] == {base | {("status", "needs_reboot"), ("step", "")}: 1}
