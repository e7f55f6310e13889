# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The self-healing circuit breaker (docs/self_healing.md): its state on the controller, one JSON
file, and the decision for each heal an alert asks for. Private to this collection.

The rulebook runs heals for different hosts at the same time, each in its own ansible-playbook:
every change reads, decides and rewrites the whole file under an exclusive lock (flock on a
file beside it), so one host's count never overwrites another's, and the new text goes to a
temporary name that is renamed over the old file, so a crash mid-write leaves the old state.
A file that is not the breaker's state is never overwritten: the heal is refused instead.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
from contextlib import contextmanager

from ansible_collections.cleanslate.gpu.plugins.module_utils._textfile import render, write_atomically

METRICS_FILE = "cleanslate_gpu_heal.prom"
# What an entry keeps of the alert that asked for a heal: who triggered it.
TRIGGER_KEYS = ("alertname", "fingerprint", "unit", "received_at", "starts_at")
# The statuses of a reset (node_reset_result) that no heal can change: a GPU whose kernel log holds
# an Xid only a GPU reset, a reboot or service clears (module_utils/_xid.py), none of which the
# collection does. Such a host's breaker opens at once and stays open until the close command.
HOLD_OPEN = ("needs_reboot", "needs_service")
# The breaker's cause when it opened on its count of heals.
HEALS = "heals"
STARTS_AT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)\Z")


class BreakerError(RuntimeError):
    """The state cannot be read or written; the message is one sentence naming the file."""


def _empty_entry() -> dict:
    return {"heals": [], "open": False, "opened_at": None, "reason": "", "last_request_at": None, "refused": 0, "cause": ""}


def _valid_entry(entry) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("heals"), list) and isinstance(entry.get("open"), bool)


def _valid(state) -> bool:
    # `units` (per server on a host of several) and `fleet` are newer than the first format: a
    # state without them is valid and gains them when first needed.
    if not isinstance(state, dict) or not isinstance(state.get("hosts"), dict):
        return False
    fleet = state.get("fleet", {"heals": [], "open": False, "held_back": []})
    if not _valid_entry(fleet) or not isinstance(fleet.get("held_back", []), list):
        return False
    return all(_valid_entry(entry) and isinstance(entry.get("units", {}), dict)
               and all(_valid_entry(unit) for unit in entry.get("units", {}).values())
               for entry in state["hosts"].values())


def load(path: str) -> dict:
    """The state in `path`; a missing file is a fresh state."""
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        return {"hosts": {}}
    except (OSError, ValueError) as exc:
        raise BreakerError("the heal breaker's state %s cannot be read (%s): nothing is healed until it is fixed or removed"
                           % (path, exc)) from exc
    if not _valid(state):
        raise BreakerError("the heal breaker's state %s is not a breaker state (a JSON object with `hosts`): nothing is "
                           "healed until it is fixed or removed" % path)
    return state


def _save(path: str, state: dict) -> None:
    # The metrics' atomic writer: synced temporary, rename, directory synced; mode 0600 as
    # mkstemp made it before (the state names hosts and alerts, for the controller's user only).
    write_atomically(os.path.dirname(path) or ".", os.path.basename(path),
                     json.dumps(state, indent=2, sort_keys=True) + "\n", 0o600)


@contextmanager
def locked(path: str):
    """The state of `path`, held under an exclusive lock; what the block leaves in it is saved
    (unless the block raised)."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise BreakerError("the heal breaker's state %s cannot be locked: %s" % (path, exc)) from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = load(path)
        yield state
        try:
            _save(path, state)
        except OSError as exc:
            raise BreakerError("the heal breaker's state %s cannot be written: %s" % (path, exc)) from exc
    finally:
        os.close(lock)  # releases the lock


def alert_start(text) -> float | None:
    """Alertmanager's startsAt (RFC 3339, nanoseconds, `Z`) as seconds; None when it is no time."""
    match = STARTS_AT.match(str(text or ""))
    if not match:
        return None
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    try:
        # Python keeps microseconds: the nanoseconds beyond them are cut.
        return datetime.datetime.fromisoformat(match.group(1) + (match.group(2) or "")[:7] + zone).timestamp()
    except ValueError:
        return None


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _close(entry: dict, now: float, why: str) -> None:
    entry.update(open=False, opened_at=None, reason=why, heals=[], last_request_at=now, refused=0, cause="")


def _entry(state: dict, host: str, unit: str) -> dict:
    """The breaker a heal counts against: the host's, or with `unit` that server's on the host."""
    entry = state["hosts"].setdefault(host, _empty_entry())
    if not unit:
        return entry
    return entry.setdefault("units", {}).setdefault(unit, _empty_entry())


def request_heal(state: dict, host: str, now: float, max_heals: int, window_s: float, quiet_s: float,
                 trigger: dict, unit: str = "", fleet: dict | None = None) -> dict:
    """Count a heal of `host` asked for at `now`; {allowed, open, opened (this request opened it),
    closed (a quiet period closed it first), heals (in the window, this one included), reason}.

    With `unit` (an alert about one server of a host with several), the heal counts against that
    server's breaker; the host's own breaker, opened by alerts without a unit or by hold_open(),
    still refuses it (docs/self_healing.md). With `fleet` ({max_hosts, window_s}), a heal the host
    lets through is then counted by the fleet breaker (request_fleet), which may refuse it.

    At most `max_heals` heals within `window_s` seconds; the next request opens the breaker, and
    every request while it is open is refused. An open breaker closes at the first request that
    comes `quiet_s` seconds or more after the previous one (the alert stayed quiet that long), or by
    close(): a host that keeps crashing keeps it open, so no reset loop ever starts again by itself.
    A breaker hold_open() opened closes only by close(): the GPU is as broken after any quiet."""
    whole = state["hosts"].setdefault(host, _empty_entry())
    if unit and whole["open"]:
        whole["refused"] = int(whole.get("refused") or 0) + 1
        return {"allowed": False, "open": True, "opened": False, "closed": False, "heals": len(whole["heals"]),
                "reason": whole["reason"]}
    entry = _entry(state, host, unit)
    name = "%s (%s)" % (host, unit) if unit else host
    closed = False
    if entry["open"]:
        last = entry.get("last_request_at") or 0
        if now - last < quiet_s or entry.get("cause") in HOLD_OPEN:
            entry["last_request_at"] = now
            entry["refused"] = int(entry.get("refused") or 0) + 1
            return {"allowed": False, "open": True, "opened": False, "closed": False, "heals": len(entry["heals"]),
                    "reason": entry["reason"]}
        _close(entry, now, "closed: no alert for %g s (the quiet period)" % quiet_s)
        closed = True
    recent = [heal for heal in entry["heals"] if isinstance(heal, dict) and now - float(heal.get("at", 0)) < window_s]
    # An alert that began before the host's last heal started is the outage that heal answered
    # (Alertmanager's repeat, the other down alert of the same crash, queued behind the lock while
    # the heal ran): not a new crash, so neither a heal nor a count.
    began, last_heal = alert_start(trigger.get("starts_at")), entry.get("last_heal_at")
    if began is not None and last_heal is not None and began < float(last_heal):
        return {"allowed": False, "open": False, "opened": False, "closed": closed, "heals": len(recent), "answered": True,
                "reason": "%s: not healed again, the alert %s began before the heal that started at %s"
                          % (name, trigger.get("alertname") or "(no name)", _utc(float(last_heal)))}
    entry["last_request_at"] = now
    if len(recent) >= max_heals:
        entry.update(heals=recent, open=True, opened_at=now, refused=1, cause=HEALS, reason=(
            "%s was healed %d times within %g s: the breaker is open, healing it stopped and the node is left as it is "
            "for a human (it closes after %g s without an alert, or by the close command)"
            % (name, len(recent), window_s, quiet_s)))
        return {"allowed": False, "open": True, "opened": True, "closed": closed, "heals": len(recent),
                "reason": entry["reason"]}
    if fleet:
        held = request_fleet(state, host, unit, now, fleet["max_hosts"], fleet["window_s"], trigger)
        if held:
            return dict(held, closed=closed, heals=len(recent))
    heal = {"at": now}
    heal.update({key: trigger[key] for key in TRIGGER_KEYS if trigger.get(key) not in (None, "")})
    entry.update(heals=recent + [heal], reason="", last_heal_at=now)
    return {"allowed": True, "open": False, "opened": False, "closed": closed, "heals": len(recent) + 1, "reason": ""}


def _fleet(state: dict) -> dict:
    return state.setdefault("fleet", {"heals": [], "open": False, "opened_at": None, "reason": "", "held_back": []})


def _hold_back(fleet: dict, host: str, unit: str, now: float, trigger: dict) -> None:
    # One line per (host, unit), the newest alert's: bounded by the fleet's servers however long
    # the storm lasts.
    held = [item for item in fleet.get("held_back", []) if isinstance(item, dict)
            and (item.get("host"), item.get("unit", "")) != (host, unit)]
    fleet["held_back"] = held + [{"host": host, "unit": unit, "alertname": trigger.get("alertname") or "", "at": now}]


def request_fleet(state: dict, host: str, unit: str, now: float, max_hosts: int, window_s: float,
                  trigger: dict) -> dict | None:
    """Count a heal of `host` (which its own breaker let through) against the fleet: at most
    `max_hosts` hosts healed within `window_s` seconds. None when it may run (counted); otherwise
    the refusal {allowed, open, opened, fleet_open, reason}, the host kept in `held_back`. A host
    already healed in the window adds no host (its own breaker limits its heals). The fleet
    breaker closes only by close_fleet()."""
    fleet = _fleet(state)
    recent = [heal for heal in fleet["heals"] if isinstance(heal, dict) and now - float(heal.get("at", 0)) < window_s]
    hosts = sorted({str(heal.get("host")) for heal in recent})
    if not fleet["open"] and (host in hosts or len(hosts) < max_hosts):
        heal = {"host": host, "unit": unit, "at": now, "alertname": trigger.get("alertname") or ""}
        fleet.update(heals=recent + [heal], window_s=window_s)
        return None
    opened = not fleet["open"]
    if opened:
        fleet.update(open=True, opened_at=now, heals=recent, window_s=window_s, reason=(
            "the fleet's heal cap is reached, %d hosts healed within %g s (%s; at most %d): the fleet breaker is open and "
            "no host is healed until a human closes it (cleanslate.gpu.heal_breaker_close -e heal_close=fleet)"
            % (len(hosts), window_s, ", ".join(hosts) or "none", max_hosts)))
    _hold_back(fleet, host, unit, now, trigger)
    return {"allowed": False, "open": True, "opened": opened, "fleet_open": True,
            "reason": "%s: held back, %s" % ("%s (%s)" % (host, unit) if unit else host, fleet["reason"])}


def close_fleet(state: dict, now: float) -> dict:
    """Close the fleet breaker by hand: forget its heals and the hosts it held back; {changed, was_open}."""
    fleet = state.get("fleet")
    if not fleet or (not fleet["open"] and not fleet["heals"] and not fleet.get("held_back")):
        return {"changed": False, "was_open": False}
    was_open = fleet["open"]
    fleet.update(open=False, opened_at=None, heals=[], held_back=[], reason="closed by the close command", closed_at=now)
    return {"changed": True, "was_open": was_open}


def hold_open(state: dict, host: str, now: float, status: str, detail: str) -> dict:
    """Open the breaker of `host` at once, after its reset ended `status` (one of HOLD_OPEN):
    counted toward max_heals, each heal would stop the host's processes and reload its model on a
    GPU that cannot serve. `detail` (the reset's problems: which GPU, which Xid line) goes into the
    reason. {changed, opened (this call opened it), open, reason}."""
    if status not in HOLD_OPEN:
        raise ValueError("hold_open: %r is not one of %s" % (status, ", ".join(HOLD_OPEN)))
    entry = state["hosts"].setdefault(host, _empty_entry())
    reason = ("%s: its reset ended %s (%s): a heal cannot help, so its breaker opened at once. The collection never "
              "resets a GPU or reboots a host: a human does (or sends the GPU for service), then closes the breaker "
              "(cleanslate.gpu.heal_breaker_close)" % (host, status, detail or "no detail"))
    opened = not entry["open"]
    changed = opened or entry.get("cause") != status or entry.get("reason") != reason
    entry.update(open=True, opened_at=now if opened else entry.get("opened_at") or now, cause=status, reason=reason)
    return {"changed": changed, "opened": opened, "open": True, "reason": reason}


def close(state: dict, host: str, now: float, unit: str = "") -> dict:
    """Close the breaker of `host` by hand and forget its heals, its servers' breakers included;
    with `unit`, that server's breaker alone; {changed, was_open}."""
    whole = state["hosts"].get(host)
    if whole is None:
        return {"changed": False, "was_open": False}
    units = whole.get("units", {})
    entries = [units[unit]] if unit in units else [] if unit else [whole] + list(units.values())
    touched = [entry for entry in entries if entry["open"] or entry["heals"]]
    was_open = any(entry["open"] for entry in touched)
    for entry in touched:
        _close(entry, now, "closed by the close command")
    return {"changed": bool(touched), "was_open": was_open}


def _breakers(state: dict):
    """(labels, entry) of every breaker: each host's, then each of its servers' (label `unit`)."""
    for host in sorted(state["hosts"]):
        entry = state["hosts"][host]
        yield {"host": host}, entry
        for unit in sorted(entry.get("units", {})):
            yield {"host": host, "unit": unit}, entry["units"][unit]


def metric_families(state: dict, now: float, window_s: float) -> list:
    """Every breaker as textfile metric families, the fleet's included (docs/observability.md)."""
    open_, recent, opened, last = [], [], [], []
    for labels, entry in _breakers(state):
        open_.append({"labels": labels, "value": 1 if entry["open"] else 0})
        heals = [heal for heal in entry["heals"] if isinstance(heal, dict)]
        recent.append({"labels": labels, "value": sum(1 for heal in heals if now - float(heal.get("at", 0)) < window_s)})
        if entry["open"] and entry.get("opened_at"):
            # Why: `heals` (healed too often) or the reset's status that no heal changes (HOLD_OPEN).
            opened.append({"labels": dict(labels, cause=str(entry.get("cause") or HEALS)), "value": float(entry["opened_at"])})
        if heals:
            newest = heals[-1]
            last.append({"labels": dict(labels, alertname=str(newest.get("alertname", "")),
                                        fingerprint=str(newest.get("fingerprint", ""))), "value": float(newest["at"])})
    fleet = _fleet(dict(state))
    fleet_window = float(fleet.get("window_s") or window_s)
    fleet_hosts = {str(heal.get("host")) for heal in fleet["heals"]
                   if isinstance(heal, dict) and now - float(heal.get("at", 0)) < fleet_window}
    return [
        {"name": "cleanslate_gpu_heal_breaker_open", "type": "gauge", "samples": open_,
         "help": "1 while the heal circuit breaker of the host (or of one server, unit) is open: no heal runs, a human must look"},
        {"name": "cleanslate_gpu_heal_recent_heals", "type": "gauge", "samples": recent,
         "help": "Heals of the host (or of one server, unit) within the breaker's window"},
        {"name": "cleanslate_gpu_heal_breaker_opened_timestamp_seconds", "type": "gauge", "samples": opened,
         "help": "When the host's heal breaker opened; cause: heals (healed too often), needs_reboot or needs_service"
                 " (its reset found a GPU no heal can bring back)"},
        {"name": "cleanslate_gpu_heal_last_timestamp_seconds", "type": "gauge", "samples": last,
         "help": "When the last heal of the host started, with the alert that triggered it"},
        {"name": "cleanslate_gpu_heal_fleet_breaker_open", "type": "gauge",
         "samples": [{"labels": {}, "value": 1 if fleet["open"] else 0}],
         "help": "1 while the fleet's heal breaker is open: the cap of hosts healed within its window was reached, no host is healed"},
        {"name": "cleanslate_gpu_heal_fleet_recent_heals", "type": "gauge",
         "samples": [{"labels": {}, "value": len(fleet_hosts)}],
         "help": "Hosts healed within the fleet breaker's window"},
        {"name": "cleanslate_gpu_heal_fleet_held_back", "type": "gauge",
         "samples": [{"labels": {}, "value": len(fleet.get("held_back", []))}],
         "help": "Servers (host and unit) the open fleet breaker held back from a heal"},
    ]


def write_metrics(directory: str, state: dict, now: float, window_s: float) -> None:
    """The whole state as one textfile (mode 0644, for node_exporter's user), written atomically."""
    write_atomically(directory, METRICS_FILE, render(metric_families(state, now, window_s)), 0o644)
