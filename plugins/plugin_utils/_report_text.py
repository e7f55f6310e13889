# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Counts and sizes as the report says them: "1 host", "3 processes", "1.0 MiB".

Shared by the fleet_report action and the node_reset filters, which both write sentences a
person reads in the report."""

from __future__ import annotations

import math

UNITS = ("Bytes", "KiB", "MiB", "GiB", "TiB")


def count_of(number, noun: str) -> str:
    """"1 host", "2 hosts", "1 process", "3 processes": the noun in the number the count needs."""
    plural = noun + "es" if noun.endswith("s") else noun + "s"
    return "%d %s" % (number, noun if number == 1 else plural)


def human_bytes(count) -> str:
    """1024-based size as people read it: 0 Bytes, 512 Bytes, 1.0 MiB."""
    try:
        value = float(count or 0)
    except (TypeError, ValueError):
        value = 0.0
    # NaN, infinities and negative sizes are no size: shown as 0 rather than as "nan TiB".
    if not math.isfinite(value) or value < 0:
        value = 0.0
    unit = 0
    while value >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    return "%d Bytes" % value if unit == 0 else "%.1f %s" % (value, UNITS[unit])
