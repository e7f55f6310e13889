# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Quote words for systemd unit files so that each one reaches the process unchanged.
Private to this collection.

systemd.syntax(7), "Quoting": a double-quoted item may hold spaces; inside it C-style escapes
are decoded (so a backslash and a double quote must be escaped). systemd.unit(5): "%"
specifiers are expanded in every setting, quoted or not, so "%" is written "%%".
systemd.service(5), "Command lines": "$FOO" and "${FOO}" are replaced by environment variables
in Exec lines, so "$" is written "$$" there (not in Environment=, which expands no variables);
a lone ";" separates commands, which a quoted ";" does not.
"""

from __future__ import annotations

ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b",
           "\f": "\\f", "\v": "\\v", "%": "%%"}


def quote(word: str, exec_line: bool = True) -> str:
    """One item, double-quoted, for ExecStart= (exec_line) or Environment=."""
    out = []
    for char in word:
        if char in ESCAPES:
            out.append(ESCAPES[char])
        elif char == "$" and exec_line:
            out.append("$$")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append("\\x%02x" % ord(char))
        else:
            out.append(char)
    return '"%s"' % "".join(out)


def exec_line(argv: list, indent: str = "    ") -> str:
    """The value of ExecStart=: one quoted item per line, joined by line continuations, so that
    a diff of the unit shows each argument that changed."""
    return (" \\\n" + indent).join(quote(word) for word in argv)


def environment_item(name: str, value: str) -> str:
    """The value of one Environment= line."""
    return quote("%s=%s" % (name, value), exec_line=False)
