# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The names a load balancer transition sends (a server, a backend): one rule per balancer, for
the role's check on the controller and cleanslate.gpu.lb_rotation on the balancer's host. Private
to this collection.

HAProxy's runtime API reads a line and splits it into commands at `;` and newlines, its words at
spaces: a name must be one word of HAProxy's own name characters (invalid_char() in its
src/tools.c), or `a;shutdown sessions server b/c` would be a second command. A hook gets the name
as an argument or in JSON: printable ASCII without a space or `;`."""

from __future__ import annotations

import re

NAME_MAX = 255
HAPROXY_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,%d}" % NAME_MAX)


def name_fault(name, balancer="haproxy"):
    """What is wrong with a server's or backend's name for `balancer`, as a phrase, or None."""
    if not isinstance(name, str):
        return "it must be text"
    if balancer == "haproxy":
        if HAPROXY_NAME.fullmatch(name) is None:
            return "it is not a HAProxy name (letters, digits, _ . : - only, 1 to %d)" % NAME_MAX
        return None
    if not 0 < len(name) <= NAME_MAX or not all(0x21 <= ord(char) <= 0x7E and char != ";" for char in name):
        return "it must be printable ASCII without spaces or ; (1 to %d characters)" % NAME_MAX
    return None
