"""nvml_verify's xid check run as Ansible runs it, against the fake NVML, with the kernel log fed
from a file (xid_log_path), and what node_reset_result makes of its answer.

The fake NVML's GPU 1 sits on PCI bus 2A (an HGX board's second GPU); the log names it as the
driver does, in lower case and without the function."""
from __future__ import annotations

import pytest

from ansible_collections.cleanslate.gpu.plugins.filter.node_reset import node_reset_result
from tests.run_module import run_module

pytestmark = pytest.mark.timeout(120)


def verify_with_log(fake_nvml, tmp_path, lines):
    log = tmp_path / "kern.log"
    log.write_bytes(b"".join(line + b"\n" for line in lines))
    return run_module("nvml_verify", {"xid_log_path": str(log), "timeout": 0}, env=fake_nvml.env())


def bus_of(fake_nvml, index):
    """The bus id as the driver writes it in an Xid line: 0000:2a:00."""
    domain, bus, device = fake_nvml.gpus()[index]["pci_bus_id"].split(".")[0].split(":")
    return ("%s:%s:%s" % (domain[-4:], bus, device)).lower().encode()


def test_xid_79_on_gpu_1_makes_the_host_needs_reboot(fake_nvml, tmp_path):
    result = verify_with_log(fake_nvml, tmp_path, [
        b"2026-01-05T10:00:00+0000 h kernel: NVRM: Xid (PCI:%s): 13, pid=4242, name=python3, Graphics SM Warp"
        b" Exception" % bus_of(fake_nvml, 0),
        b"2026-01-05T10:00:01+0000 h kernel: NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has"
        b" fallen off the bus." % bus_of(fake_nvml, 1),
    ])
    assert result["failed"] and not result["ok"]
    assert result["xid_action"] == "needs_reboot" and result["xid_source"].endswith("kern.log")
    by_index = {gpu["index"]: gpu for gpu in result["gpus"]}
    assert by_index[1]["xid_action"] == "needs_reboot"
    assert [(record["code"], record["class"]) for record in by_index[1]["xid"]] == [(79, "needs_reboot")]
    assert "fallen off the bus" in by_index[1]["xid"][0]["line"]
    # GPU 0's Xid 13 is an application's: listed, and no reason to keep it from serving.
    assert by_index[0]["xid_action"] is None and by_index[0]["problems"] == []
    assert [record["class"] for record in by_index[0]["xid"]] == ["restart_app"]
    assert any("Xid 79" in problem for problem in by_index[1]["problems"])
    row = node_reset_result({"nvml_verify": result}, "gpu-node-1")
    assert row["status"] == "needs_reboot" and not row["ok"] and row["fails_host"]
    assert any("Xid 79" in problem for problem in row["problems"])


def test_an_application_xid_13_leaves_the_host_ok(fake_nvml, tmp_path):
    result = verify_with_log(fake_nvml, tmp_path, [
        b"NVRM: Xid (PCI:%s): 13, pid=4242, name=python3, Graphics SM Warp Exception" % bus_of(fake_nvml, 1),
    ])
    assert result["ok"] and not result.get("failed") and result["xid_action"] is None
    assert [record["code"] for record in result["gpus"][1]["xid"]] == [13]
    assert node_reset_result({"nvml_verify": result}, "gpu-node-1")["status"] == "ok"


def test_an_unreadable_log_is_a_warning_not_a_failure(fake_nvml, tmp_path):
    result = run_module("nvml_verify", {"xid_log_path": str(tmp_path / "absent.log"), "timeout": 0},
                        env=fake_nvml.env())
    assert result["ok"] and result["xid_action"] is None
    assert "cannot be read" in result["xid_log_problem"]
    assert "cannot be read" in str(result.get("warnings"))


def test_the_probe_reads_the_xid_records_in_its_own_process_and_fails_nothing_for_them(fake_nvml, tmp_path):
    """reset_and_serve.yml's look of one server (issue 42): the probe and the kernel log's read in one
    module run. nvml_verify's answer comes back whole, its own failure (the record) inside it; the probe
    of a server that is not there is still its verdict, not a failed task."""
    log = tmp_path / "kern.log"
    log.write_bytes(b"NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
                    % bus_of(fake_nvml, 1))
    probe = {"engine": "vllm", "url": "http://127.0.0.1:9", "served_name": "llama", "mode": "probe", "poll_interval": 0.1}
    xid = {"checks": ["xid"], "timeout": 0, "gpus": [], "xid_log_path": str(log)}
    result = run_module("inference_ready", dict(probe, xid=xid), env=fake_nvml.env())
    assert result["rc"] == 0 and not result.get("failed") and result["verdict"] == "unhealthy", result
    look = result["xid_look"]
    assert look["failed"] and look["xid_action"] == "needs_reboot", look
    assert [gpu["xid_action"] for gpu in look["gpus"]] == [None, "needs_reboot"] + [None] * (len(look["gpus"]) - 2)
    row = node_reset_result({"nvml_verify": look}, "gpu-node-1")
    assert row["status"] == "needs_reboot" and any("Xid 79" in problem for problem in row["problems"])
    # Arguments nvml_verify refuses are its answer's failure too, with its own sentence; the probe still answers.
    refused = run_module("inference_ready", dict(probe, xid={"checks": ["xid"], "timeout": -1}), env=fake_nvml.env())
    assert refused["rc"] == 0 and refused["verdict"] == "unhealthy", refused
    assert refused["xid_look"]["failed"] and "timeout" in refused["xid_look"]["msg"], refused["xid_look"]
    # No xid, no second look.
    assert "xid_look" not in run_module("inference_ready", probe, env=fake_nvml.env())
