"""The self-healing circuit breaker (plugins/plugin_utils/_heal_breaker.py, action heal_breaker):
N heals within the window, then nothing until a quiet period or the close command; the state
shared by concurrent heals of different hosts without losing a count; bad options refused."""
from __future__ import annotations

import json
import math
import multiprocessing
import os

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action import heal_breaker as action
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker
from ansible_collections.cleanslate.gpu.plugins.module_utils._textfile import parse
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _heal_breaker as breaker
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._heal_alert import read_alert

NO_SECRETS = Masker([])
TRIGGER = {"alertname": "CleanslateGpuEngineDown", "fingerprint": "ab12", "unit": "", "received_at": "x"}


def heal(state, host, now, max_heals=3, window_s=3600, quiet_s=600):
    return breaker.request_heal(state, host, now, max_heals, window_s, quiet_s, TRIGGER)


def test_n_heals_pass_then_the_breaker_opens_and_refuses_every_later_one():
    state = {"hosts": {}}
    assert [heal(state, "gpu1", 1000 + i)["allowed"] for i in range(3)] == [True, True, True]
    fourth = heal(state, "gpu1", 1010)
    assert not fourth["allowed"] and fourth["opened"] and fourth["open"]
    assert "gpu1 was healed 3 times within 3600 s" in fourth["reason"] and "human" in fourth["reason"]
    # Alerts keep coming every few minutes: each is refused and none closes it (no reset loop).
    for minute in range(1, 60):
        later = heal(state, "gpu1", 1010 + 300 * minute)
        assert not later["allowed"] and not later["opened"], minute
    assert state["hosts"]["gpu1"]["refused"] == 60


def test_heals_older_than_the_window_do_not_count():
    state = {"hosts": {}}
    for when in (0, 100, 200):
        assert heal(state, "gpu1", when)["allowed"]
    # The first heal left the window (3600 s) at 3600: room for one more.
    assert heal(state, "gpu1", 3600.5)["allowed"]
    assert not heal(state, "gpu1", 3601)["allowed"]


def test_the_breaker_closes_only_after_a_quiet_period_without_alerts():
    state = {"hosts": {}}
    for when in range(4):
        heal(state, "gpu1", when)
    assert state["hosts"]["gpu1"]["open"]
    assert not heal(state, "gpu1", 3 + 599)["allowed"]  # 599 s after the last alert: still open
    again = heal(state, "gpu1", 3 + 599 + 600)  # 600 s of quiet
    assert again["allowed"] and again["closed"] and again["heals"] == 1


def test_the_close_command_closes_and_forgets_the_heals():
    state = {"hosts": {}}
    for when in range(4):
        heal(state, "gpu1", when)
    assert breaker.close(state, "gpu1", 10) == {"changed": True, "was_open": True}
    assert breaker.close(state, "gpu1", 11) == {"changed": False, "was_open": False}
    assert breaker.close(state, "never-seen", 11) == {"changed": False, "was_open": False}
    assert all(heal(state, "gpu1", 12 + i)["allowed"] for i in range(3))


def test_each_host_has_its_own_breaker():
    state = {"hosts": {}}
    for when in range(4):
        heal(state, "gpu1", when)
    assert heal(state, "gpu2", 5)["allowed"] and not heal(state, "gpu1", 6)["allowed"]


def test_a_heal_records_who_triggered_it_and_the_metrics_say_so():
    state = {"hosts": {}}
    heal(state, "gpu1", 100)
    for when in range(101, 105):  # the fourth opens the breaker
        heal(state, "gpu2", when)
    (record,) = state["hosts"]["gpu1"]["heals"]
    assert record["alertname"] == "CleanslateGpuEngineDown" and record["fingerprint"] == "ab12" and "unit" not in record
    samples = parse(breaker.render(breaker.metric_families(state, 200, 3600)))
    opened = {s["labels"]["host"]: s["value"] for s in samples["cleanslate_gpu_heal_breaker_open"]}
    assert opened == {"gpu1": 0, "gpu2": 1}
    assert {s["labels"]["host"]: s["value"] for s in samples["cleanslate_gpu_heal_recent_heals"]} == {"gpu1": 1, "gpu2": 3}
    (last,) = [s for s in samples["cleanslate_gpu_heal_last_timestamp_seconds"] if s["labels"]["host"] == "gpu1"]
    assert last["labels"] == {"host": "gpu1", "alertname": "CleanslateGpuEngineDown", "fingerprint": "ab12"}
    assert last["value"] == 100
    assert [s["labels"]["host"] for s in samples["cleanslate_gpu_heal_breaker_opened_timestamp_seconds"]] == ["gpu2"]


@pytest.mark.parametrize("status", breaker.HOLD_OPEN)
def test_a_reset_that_finds_a_gpu_no_heal_can_help_opens_the_breaker_at_once_until_closed(status):
    """One heal whose reset ends needs_reboot/needs_service: the breaker opens then, not after
    max_heals more resets of a GPU that cannot serve, and no quiet period closes it."""
    state = {"hosts": {}}
    assert heal(state, "gpu1", 0)["allowed"]
    line = "GPU 1 (00000000:2A:00.0): %s: Xid 79 ... \"NVRM: Xid (PCI:0000:2a:00): 79, {{ lookup('pipe', 'id') }}\"" % status
    decision = breaker.hold_open(state, "gpu1", 10, status, line)
    assert decision["opened"] and decision["open"] and decision["changed"]
    assert status in decision["reason"] and line in decision["reason"] and "never resets a GPU or reboots" in decision["reason"]
    assert breaker.hold_open(state, "gpu1", 11, status, line)["changed"] is False  # the same again changes nothing
    # Far past the quiet period: still refused, with the Xid reason (a count-opened breaker would close here).
    later = heal(state, "gpu1", 10 ** 6)
    assert not later["allowed"] and later["open"] and status in later["reason"]
    samples = parse(breaker.render(breaker.metric_families(state, 10 ** 6, 3600)))
    (opened,) = samples["cleanslate_gpu_heal_breaker_opened_timestamp_seconds"]
    assert opened["labels"] == {"host": "gpu1", "cause": status} and opened["value"] == 10
    assert breaker.close(state, "gpu1", 10 ** 6 + 1)["was_open"] and heal(state, "gpu1", 10 ** 6 + 2)["allowed"]
    # A breaker the count opened says so.
    for when in range(4):
        heal(state, "gpu2", when)
    samples = parse(breaker.render(breaker.metric_families(state, 5, 3600)))
    assert {s["labels"]["host"]: s["labels"]["cause"] for s in samples["cleanslate_gpu_heal_breaker_opened_timestamp_seconds"]} \
        == {"gpu2": "heals"}


def test_only_a_status_no_heal_changes_opens_the_breaker_at_once():
    with pytest.raises(ValueError):
        breaker.hold_open({"hosts": {}}, "gpu1", 0, "dirty", "")


def _heal_many(path, host, count, queue):
    for dummy in range(count):
        with breaker.locked(path) as state:
            breaker.request_heal(state, host, 1000.0, 10 ** 6, 3600, 60, TRIGGER)
    queue.put(host)


def test_concurrent_heals_of_different_hosts_lose_no_count(tmp_path):
    """Eight processes (the rulebook runs heals of different hosts at once), each counting 40
    heals of its host in the one state file: every count is there."""
    path = str(tmp_path / "state" / "breaker.json")
    queue = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_heal_many, args=(path, "gpu%d" % n, 40, queue)) for n in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    with open(path, encoding="utf-8") as handle:
        state = json.load(handle)
    assert {host: len(entry["heals"]) for host, entry in state["hosts"].items()} == {"gpu%d" % n: 40 for n in range(8)}
    assert not [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp")]


def test_the_state_stays_private_and_a_write_that_dies_keeps_the_old_state(tmp_path, monkeypatch):
    """The state names hosts and alerts: only the controller's user reads it. A write killed
    after the temporary was written (here the rename fails) leaves the old state whole and no
    temporary behind."""
    path = str(tmp_path / "breaker.json")
    with breaker.locked(path) as state:
        breaker.request_heal(state, "gpu1", 1000.0, 3, 3600, 60, TRIGGER)
    assert os.stat(path).st_mode & 0o777 == 0o600
    before = open(path, encoding="utf-8").read()

    def rename_fails(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "rename", rename_fails)
    with pytest.raises(breaker.BreakerError, match="cannot be written: disk full"):
        with breaker.locked(path) as state:
            breaker.request_heal(state, "gpu1", 1001.0, 3, 3600, 60, TRIGGER)
    monkeypatch.undo()
    assert open(path, encoding="utf-8").read() == before
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_a_state_file_that_is_not_the_breakers_is_never_overwritten(tmp_path):
    path = tmp_path / "breaker.json"
    for text in ("not json", "[]", '{"hosts": []}', '{"hosts": {"gpu1": {"heals": "x", "open": false}}}', "\xff\xfe"):
        path.write_text(text, encoding="latin-1")
        with pytest.raises(breaker.BreakerError, match="nothing is healed until it is fixed or removed"):
            with breaker.locked(str(path)) as state:
                breaker.request_heal(state, "gpu1", 1, 3, 60, 60, TRIGGER)
        assert path.read_text(encoding="latin-1") == text


def args(**changes):
    values = {"path": "/var/lib/cleanslate-gpu/heal_breaker.json", "host": "gpu1", "state": "heal", "secrets": [],
              "configured_units": None, "max_heals": 3, "window_s": 3600, "quiet_s": 3600,
              # No metrics: the default directory's trust depends on the machine (Debian's
              # prometheus-blackbox-exporter gives /var/lib/prometheus to its user), which these
              # tests of the numbers must not.
              "metrics_dir": ""}
    values.update(changes)
    return values


@pytest.mark.parametrize("name, value", [
    ("max_heals", 0), ("max_heals", -1), ("max_heals", "three"), ("max_heals", 2.5), ("max_heals", True),
    ("max_heals", 10 ** 9), ("max_heals", ""), ("max_heals", None), ("max_heals", [3]),
    ("window_s", 0), ("window_s", -5), ("window_s", float("nan")), ("window_s", "nan"), ("window_s", math.inf),
    ("window_s", "inf"), ("window_s", 10 ** 12), ("window_s", "1h"), ("window_s", 0.5), ("window_s", {}),
    ("quiet_s", -1), ("quiet_s", "NaN"), ("quiet_s", False), ("quiet_s", "$(reboot)"),
])
def test_bad_numbers_are_refused_naming_the_option(name, value):
    with pytest.raises(AnsibleActionFail) as caught:
        action.check_args(args(**{name: value}))
    message = str(caught.value.message)
    assert message.startswith(name + " must be") and message.count(";") == 0, message


@pytest.mark.parametrize("name, value", [
    ("host", ""), ("host", "  "), ("host", "gpu1\nrm -rf /"), ("host", "a\x00b"),
    ("path", "state.json"), ("path", ""), ("path", "/tmp/x\nnew"), ("metrics_dir", "relative/dir"),
])
def test_bad_names_and_paths_are_refused_naming_the_option(name, value):
    with pytest.raises(AnsibleActionFail) as caught:
        action.check_args(args(**{name: value}))
    assert str(caught.value.message).startswith(name + " "), caught.value.message


def test_good_options_pass_with_strings_from_jinja():
    assert action.check_args(args(max_heals="2", window_s="90", quiet_s=1.5, metrics_dir="")) == {
        "max_heals": 2, "window_s": 90.0, "quiet_s": 1.5, "fleet": None}


def test_an_alert_about_another_host_or_unit_is_refused():
    event = {"labels": {"alertname": "CleanslateGpuServerDown", "unit": "other.service", "host": "gpu1"},
             "fingerprint": "f1", "meta": {"received_at": "t"}}

    def problem(host, event, served):
        return action.target_problem(host, event, read_alert(event, NO_SECRETS), served)

    assert read_alert(event, NO_SECRETS) == {"host": "gpu1", "alertname": "CleanslateGpuServerDown", "unit": "other.service",
                                             "fingerprint": "f1", "starts_at": "", "received_at": "t"}
    assert "is about other.service, but the host serves inference-server.service (" in \
        problem("gpu1", event, ["inference-server.service"])

    def about(unit):
        return dict(event, labels=dict(event["labels"], unit=unit))

    assert problem("gpu1", about("inference-server.service"), ["inference-server.service"]) == ""
    assert problem("gpu1", about(""), ["inference-server.service"]) == ""
    # A host with several servers: an alert about any of them may heal it, about none of them not,
    # nor about a unit whose name only contains one of theirs, nor a unit label that is no text.
    served = ["vllm-a.service", "vllm-b.service"]
    assert problem("gpu1", about("vllm-b.service"), served) == ""
    for stranger in ("vllm-c.service", "vllm-a", "vllm-a.service.d", "vllm-a.service vllm-b.service", "vllm-a.service\n"):
        assert "but the host serves vllm-a.service, vllm-b.service" in problem("gpu1", about(stranger), served), stranger
    for junk in (["vllm-a.service"], 5, {"vllm-a.service": 1}):
        assert "is about a unit that is not text, but the host serves" in problem("gpu1", about(junk), served), junk
    # Another host, no host, a host that differs by a space or a newline, no event at all.
    ours = about("x")
    for other, named in (("gpu2", "host 'gpu1'"), ("gpu1 ", "host 'gpu1'")):
        assert problem(other, ours, ["x"]) == \
            "%s: not healed, the alert names %s (heal.yml heals only the host of the rulebook's event, ansible_eda.event)" % (other, named)
    assert "the alert names host 'gpu1\\n'" in problem("gpu1", dict(event, labels={"host": "gpu1\n"}), ["x"])
    # The comparison is on the alert's own value, never on its text: an inventory name that spells
    # an escape (or the cut) is not the alert's host.
    assert "not healed, the alert names host 'gpu1\\u2003'" in problem("gpu1\\u2003", {"labels": {"host": "gpu1\u2003"}}, ["x"])
    assert "not healed" in problem("g" * 255 + "\u2026", {"labels": {"host": "g" * 300}}, ["x"])
    for junk in ({}, "junk", {"labels": "x"}, {"labels": {"host": ""}}, {"labels": {"host": ["gpu1"]}}, None):
        assert "gpu1: not healed, the alert names no host" in problem("gpu1", junk, ["x"]), junk


def test_an_alert_that_began_before_the_last_heal_is_answered_already():
    """Alertmanager repeats a firing alert, and a crash fires both down alerts: one that began before
    the host's last heal started is that heal's outage, queued behind the lock while it ran."""
    state = {"hosts": {}}
    start = breaker.alert_start("2026-12-02T01:00:00.123456789Z")
    assert heal(state, "gpu1", start + 2, quiet_s=60)["allowed"]
    for repeat in ({"starts_at": "2026-12-02T01:00:00.123456789Z"}, {"starts_at": "2026-12-02T01:00:01Z"},
                   {"starts_at": "2026-12-02T02:00:00+01:00"}):
        again = breaker.request_heal(state, "gpu1", start + 30, 3, 3600, 60, dict(TRIGGER, **repeat))
        assert not again["allowed"] and again["answered"] and again["heals"] == 1, repeat
        assert again["reason"].startswith("gpu1: not healed again, the alert CleanslateGpuEngineDown began before the heal")
    # A crash after the heal is a new alert: healed, counted.
    later = breaker.request_heal(state, "gpu1", start + 60, 3, 3600, 60, dict(TRIGGER, starts_at="2026-12-02T01:00:40Z"))
    assert later["allowed"] and later["heals"] == 2
    # No time, or garbage: counted as a new alert (the throttle and the breaker still bound it).
    for junk in ("", "yesterday", "2026-13-45T99:00:00Z", None, 5):
        assert breaker.alert_start(junk) is None, junk


def test_alert_start_reads_alertmanagers_times():
    assert breaker.alert_start("1970-01-01T00:01:00Z") == 60
    assert breaker.alert_start("1970-01-01T01:01:00+01:00") == 60
    assert abs(breaker.alert_start("1970-01-01T00:01:00.5Z") - 60.5) < 1e-6
