# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Build and check the inference server's command line on the controller.

The flag data lives on the controller (in the role), the checks need no host, and a bad
configuration must fail before anything on the host is touched: so this runs in the
controller's process, like fleet_report. The logic is in plugin_utils/_serve_command.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_flags, _serve_command
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._secret_checks import (
    inference_service_secret_problems, secret_masker)

# The role's settings (module_utils/_settings.py), then the options computed in the play.
ARGUMENT_SPEC = dict(_settings.argument_spec(_settings.ARGS), **{
    # The settings as one mapping, as the role passes them (cleanslate.gpu.inference_service_plugin_args).
    _settings.SETTINGS_OPTION: {"type": "dict", "default": {}},
    "host_engine_version": {"type": "str", "default": ""},
    "host_engine_problem": {"type": "str", "default": ""},
    "flag_dirs": {"type": "list", "elements": "path", "required": True},
})


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        try:
            self._task.args = _settings.expanded(self._task.args)
        except ValueError as exc:
            raise AnsibleActionFail("inference_service: %s" % exc) from None
        return super().run(tmp, task_vars)

    def act(self, args, task_vars, result):
        # The values serve two things only: a sentence never shows one (a secret pasted into the
        # served name would be printed by the served-name rule), and a command line, environment or
        # unit that would carry one is refused here, before its argv is ever returned (and printed
        # with -v). The builder is told only which ones are set.
        secrets = args.get("secrets") or {}
        args["secrets_set"] = _serve_command.secrets_set(secrets)
        mask = secret_masker(secrets)
        try:
            flags = _engine_flags.EngineFlags(_engine_flags.load(
                args["flag_dirs"], args["engine"], args["engine_version"],
                host_version=args.get("host_engine_version", ""), host_problem=args.get("host_engine_problem", ""),
                unchecked=bool(args.get("engine_dry_run"))))
            built = _serve_command.build(args, flags)
            problems = inference_service_secret_problems(secrets, built)
        except (_engine_flags.FlagError, _serve_command.ServeConfigError) as exc:
            problems = getattr(exc, "problems", None) or [str(exc)]
        if problems:
            # One line per problem, each whole (the report lists the lines apart); no secret in any.
            raise AnsibleActionFail("\n".join("inference_service: %s" % line for problem in problems
                                              for line in mask(str(problem)).splitlines()))
        result.update(built, changed=False)
        for warning in built["warnings"]:
            self._display.warning(mask(warning))
        return result
