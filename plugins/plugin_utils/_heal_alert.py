# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the heal reads of an alert (docs/self_healing.md, "What an alert may carry"). Private to
this collection.

An alert is whatever reached the webhook with its token: untrusted. ansible-rulebook hands the
event to ansible-playbook as extra vars, which ansible-core trusts as templates, so heal.yml never
names `ansible_eda` in a template: the action reads the raw event from its task_vars, here, and
keeps only the fields below, each as a plain `str` built here (never the tagged string the
variable holds, which ansible-core would still render when the result is used).

The one rule for a field's text: a field that is not a string is empty; every secret of the host
is masked; each character that is not printable (controls, newlines, format and surrogate
characters, any space but U+0020) is written as its Python escape (\\n, \\u2003, \\udcff); the
text is cut to FIELD_LIMIT characters, the last one `…`.
"""

from __future__ import annotations

from collections.abc import Mapping

# Long enough for a systemd unit name (255) or a host name (253), short for a report line.
FIELD_LIMIT = 256
CUT = "\u2026"
# The fields the heal reads: where each sits in the event (one Alertmanager alert, and the
# rulebook's `meta`).
FIELDS = {
    "host": ("labels", "host"),
    "alertname": ("labels", "alertname"),
    "unit": ("labels", "unit"),
    "fingerprint": ("fingerprint",),
    "starts_at": ("startsAt",),
    "received_at": ("meta", "received_at"),
}


def event_of(task_vars) -> Mapping:
    """The rulebook's event from the task's variables (`ansible_eda.event`), raw: {} without one."""
    eda = task_vars.get("ansible_eda") if isinstance(task_vars, Mapping) else None
    event = eda.get("event") if isinstance(eda, Mapping) else None
    return event if isinstance(event, Mapping) else {}


def raw_field(event, name):
    """The field `name` (FIELDS) as the event holds it, or None: for comparisons only, never shown."""
    value = event
    for key in FIELDS[name]:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _escaped(text: str) -> str:
    # A new plain str, character by character: no tag of the event's string survives.
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def field_text(value, mask) -> str:
    """The rule above, for one value. Masked before the escapes (the secret as the alert carried
    it) and after them (a secret that is itself an escape's spelling), and before the cut, so that
    no cut leaves part of a secret unmasked."""
    if not isinstance(value, str):
        return ""
    text = mask(_escaped(mask(str.__str__(value))))
    return text if len(text) <= FIELD_LIMIT else text[:FIELD_LIMIT - 1] + CUT


def read_alert(event, mask) -> dict:
    """{field: text} for every field of FIELDS (by the rule above); `mask` hides the host's secrets."""
    return {name: field_text(raw_field(event, name), mask) for name in FIELDS}
