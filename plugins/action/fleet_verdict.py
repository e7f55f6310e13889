# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet playbooks' verdict on a host that is not ok, on the controller: failed, or unreachable
when the run found it so. Ansible's exit status tells the two apart (2 and 4); a ping to make a
silent host unreachable again would cost a second connection time-out per black-holed host."""

from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction

ARGUMENT_SPEC = {
    "status": {"type": "str", "required": True},
    "msg": {"type": "str", "required": True},
}


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args, task_vars, result):
        key = "unreachable" if args["status"] == "unreachable" else "failed"
        result.update({key: True, "changed": False, "msg": args["msg"]})
        return result
