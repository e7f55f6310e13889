"""module_utils/_xid.py: the Xid table, the parser of kernel log lines, and the match to GPUs."""
from __future__ import annotations

import json
import sys

import pytest

from tests.run_module import ensure_collection_link

sys.path.insert(0, str(ensure_collection_link()))

from ansible_collections.cleanslate.gpu.plugins.module_utils import _xid  # noqa: E402

GPUS = [{"pci_bus_id": "00000000:18:00.0"}, {"pci_bus_id": "00000000:2A:00.0"}, {"pci_bus_id": None}]


# NVIDIA's catalog: 63 is IGNORE, 94 RESTART_APP (a contained error ends only its application), 109 RESET_GPU.
@pytest.mark.parametrize("code, cls", [(79, "needs_reboot"), (48, "needs_reboot"), (63, "restart_app"),
                                       (94, "restart_app"), (95, "needs_reboot"), (109, "needs_reboot"), (119, "needs_reboot"),
                                       (120, "needs_reboot"), (64, "needs_service"), (13, "restart_app"),
                                       (31, "restart_app"), (43, "restart_app"), (999, "unknown")])
def test_the_table_classifies_what_a_reset_cannot_clear(code, cls):
    assert _xid.classify(code)[0] == cls


def test_every_row_names_its_class_mnemonic_and_meaning():
    for code, (cls, mnemonic, meaning) in _xid.XID_TABLE.items():
        assert cls in _xid.SEVERITY and cls != _xid.UNKNOWN, code
        assert mnemonic and mnemonic == mnemonic.upper() and meaning, code


def test_a_line_is_matched_to_its_gpu_by_bus_id_in_any_spelling():
    log = (b"Jan 05 kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off\n"
           b"NVRM: Xid (0000:18:00.0): 13, pid=7, name=python3, Graphics Exception\n"
           b"NVRM: GPU at PCI:0000:2a:00: GPU-5b3a7c1e\n")
    found, elsewhere = _xid.records_by_gpu(_xid.parse(log), GPUS)
    assert [(r["code"], r["class"]) for r in found[1]] == [(79, "needs_reboot")]
    assert [r["code"] for r in found[0]] == [13]
    assert elsewhere == [] and 2 not in found


def test_a_bus_nvml_does_not_know_is_kept_apart():
    found, elsewhere = _xid.records_by_gpu(_xid.parse(b"NVRM: Xid (PCI:0001:99:00): 79, off the bus\n"), GPUS)
    assert found == {} and [r["code"] for r in elsewhere] == [79]


def test_hostile_lines_stay_one_bounded_line_of_json():
    log = (b"NVRM: Xid (PCI:0000:2a:00): 13, name=\xff\xfe{{ lookup('pipe', 'id') }}\x1b[31m\r" + b"A" * 100000 + b"\n"
           b"NVRM: Xid (PCI:0000:2a:00): 4294967296999, overflow\n"
           b"NVRM: Xid (PCI:zzzz:2a:00): 79, not a bus\n")
    records = _xid.parse(log)
    assert len(records) == 1
    line = records[0]["line"]
    json.dumps(line).encode("utf-8")
    assert "\\xff\\xfe" in line and "{{ lookup('pipe', 'id') }}" in line  # shown as it is, never evaluated
    assert "\x1b" not in line and "\r" not in line and "\n" not in line
    assert len(line) <= _xid.LINE_MAX + 3


def test_a_gpu_keeps_its_worst_record_among_the_newest():
    log = b"NVRM: Xid (PCI:0000:18:00): 79, off\n" + b"NVRM: Xid (PCI:0000:18:00): 13, app\n" * 50
    found, dummy = _xid.records_by_gpu(_xid.parse(log), GPUS)
    assert len(found[0]) == _xid.RECORDS_MAX
    assert _xid.worst(found[0]) == "needs_reboot"


def test_worst_ranks_service_over_reboot_over_application():
    records = [{"class": c} for c in ("restart_app", "needs_service", "needs_reboot", "unknown")]
    assert _xid.worst(records) == "needs_service" and _xid.worst([]) is None


def test_a_log_file_is_read_from_its_newest_bytes(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(b"NVRM: Xid (PCI:0000:18:00): 79, old\n" + b"x" * _xid.OUTPUT_MAX
                    + b"\nNVRM: Xid (PCI:0000:18:00): 13, new\n")
    text, source, problem = _xid.read_kernel_log("", 5, str(log))
    assert problem is None and source == str(log)
    assert [r["code"] for r in _xid.parse(text)] == [13]


def test_a_missing_log_file_is_one_sentence(tmp_path):
    text, dummy, problem = _xid.read_kernel_log("", 5, str(tmp_path / "none"))
    assert text == b"" and "cannot be read" in problem and "\n" not in problem


def test_the_host_log_is_read_without_error_or_said_why():
    text, source, problem = _xid.read_kernel_log("-1min", 5)
    assert (problem is None and source in ("journalctl", "dmesg")) or (source is None and "cannot be read" in problem)


# NVIDIA's catalog, row 154: "Xid 154 GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
@pytest.mark.parametrize("text, cls", [
    (b"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "needs_reboot"),
    (b"GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "needs_reboot"),
    (b"GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "needs_reboot"),
    (b"GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "restart_app"),
    (b"GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "restart_app"),
    (b"GPU recovery action changed from None to Node Reboot Required", "needs_reboot"),
    (b"gpu recovery action changed from 0x2 (node reboot required) to 0x0 (NONE)  \r", "restart_app"),
    # What the driver never writes keeps the row's worst: an unknown action, a cut line, a lookalike.
    (b"GPU recovery action changed from 0x0 (None) to 0x9 (Something New)", "needs_reboot"),
    (b"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Requ", "needs_reboot"),
    (b"GPU recovery action changed from 0x0 (None) to 0x0 (None) extra", "needs_reboot"),
    (b"to 0x0 (None)", "needs_reboot"),
    (b"GPU recovery action changed from 0x0 (None) to 0x0 (None\xff)", "needs_reboot"),
])
def test_xid_154_is_classified_by_the_action_its_line_names(text, cls):
    records = _xid.parse(b"NVRM: Xid (PCI:0000:18:00): 154, " + text + b"\n")
    assert [(r["code"], r["class"]) for r in records] == [(154, cls)]
    assert records[0]["meaning"]


def test_a_154_saying_none_does_not_hide_the_xid_79_before_it():
    log = (b"NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
           b"NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)\n")
    found, dummy = _xid.records_by_gpu(_xid.parse(log), GPUS)
    assert _xid.worst(found[0]) == "needs_reboot"
