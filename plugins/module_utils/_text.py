# -*- coding: utf-8 -*-
# Copyright (c) 2025, cleanslate.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Names as a result may carry them. Private to this collection.

File names and command lines are bytes; Ansible serialises results as UTF-8 and fails the
whole task ("Refusing to deserialize an invalid UTF8 string value") when a string holds a
byte that is not UTF-8, losing what the module did. Every name a module returns goes through
printable(): valid UTF-8 is returned as it is, and each byte that is not UTF-8 becomes the
four characters \\xNN (Python's backslashreplace), so the name stays readable and the result
stays valid JSON. The module docs say so where a name is returned.
"""

from __future__ import annotations

import os


def printable(name):
    """The name (str from os.fsdecode, or bytes) with every non-UTF-8 byte written as \\xNN."""
    if isinstance(name, str):
        name = os.fsencode(name)
    return name.decode("utf-8", "backslashreplace")
