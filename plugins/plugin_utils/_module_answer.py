# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What an action that runs modules through _execute_module owes the task: the callback prints a
task's warnings and deprecations, never those of a module the action ran inside it."""

from __future__ import annotations


def lift_messages(answer: dict, result: dict) -> None:
    """Add the module answer's warnings and deprecations to the task's result."""
    for key in ("warnings", "deprecations"):
        if answer.get(key):
            result.setdefault(key, []).extend(answer[key])
