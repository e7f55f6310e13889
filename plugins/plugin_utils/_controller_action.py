# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one shape of the collection's controller-only actions (fleet_report, fleet_preflight,
inference_args): nothing runs on a target, a check-mode run computes the same answer, and the
options are checked against the action's ARGUMENT_SPEC before `act` sees them."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ControllerAction(ActionBase):
    """Subclasses set ARGUMENT_SPEC and implement act(args, task_vars, result) -> result."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    ARGUMENT_SPEC: dict = {}

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # not used: nothing runs on a target
        dummy, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        return self.act(args, task_vars or {}, result)

    def act(self, args: dict, task_vars: dict, result: dict) -> dict:
        raise NotImplementedError("%s must implement act()" % type(self).__name__)
