# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The names a load balancer transition sends (a server, a backend, a balancer host): one rule,
for the role's check on the controller and the module on the balancer's host. Private to this
collection.

HAProxy's runtime API reads one line per request and splits it into commands at `;`: a name with
a space, a `;`, a control character or a newline would send another command than the one meant
(`a;shutdown sessions server b/c`). Printable ASCII without those is what HAProxy's own
configuration takes as a name."""

from __future__ import annotations

NAME_MAX_CHARS = 128
REFUSED = frozenset(";#\\'\"`")


def name_fault(value):
    """What is wrong with a balancer name, as a phrase without its value, or None."""
    if not isinstance(value, str):
        return "it must be text"
    if not value:
        return "it is empty"
    if len(value) > NAME_MAX_CHARS:
        return "it is %d characters long, at most %d" % (len(value), NAME_MAX_CHARS)
    if value.startswith("-") or any(not ("!" <= char <= "~") or char in REFUSED for char in value):
        return ("it must be one word of printable ASCII characters without ';', '#', quotes or backslashes, not "
                "starting with '-' (the balancer's commands are lines split at ';' and spaces)")
    return None
