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

from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import NAMES as ENGINE_NAMES
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_flags, _serve_command
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._secret_checks import (
    inference_service_secret_problems, secret_masker)

ARGUMENT_SPEC = {
    "engine": {"type": "str", "required": True, "choices": ENGINE_NAMES},
    "engine_version": {"type": "str", "default": ""},
    "host_engine_version": {"type": "str", "default": ""},
    "host_engine_problem": {"type": "str", "default": ""},
    "flag_dirs": {"type": "list", "elements": "path", "required": True},
    "model": {"type": "str", "required": True},
    "served_name": {"type": "str", "default": ""},
    "tensor_parallel_size": {"type": "int", "default": 1},
    "host": {"type": "str", "default": "0.0.0.0"},
    "port": {"type": "int", "default": 8000},
    "gpu_memory_fraction": {"type": "float", "default": 0},
    "max_model_len": {"type": "int", "default": 0},
    "speculative": {"type": "dict", "default": {}},
    "extra_args": {"type": "list", "elements": "raw", "default": []},
    "environment": {"type": "dict", "default": {}},
    "secrets_set": {"type": "dict", "default": {}},
    # The values, for two things only: a sentence never shows one (a secret pasted into the served
    # name would be printed by the served-name rule), and a command line, environment or unit that
    # would carry one is refused here, before its argv is ever returned (and printed with -v).
    "secrets": {"type": "dict", "default": {}, "no_log": True},
    "executable": {"type": "str", "default": ""},
    "venv": {"type": "str", "default": ""},
    "unit": {"type": "str", "required": True},
    "user": {"type": "str", "default": ""},
    "drain_timeout": {"type": "int", "default": 30},
    "config_dir": {"type": "str", "default": "/etc/cleanslate/inference"},
}


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args, task_vars, result):
        given = args["secrets_set"]
        args["secrets_set"] = {
            "api_key": bool(given.get("api_key")), "hf_token": bool(given.get("hf_token")),
            "admin_api_key": bool(given.get("admin_api_key")),
            "environment": list(given.get("environment") or []),
        }
        secrets = args.get("secrets") or {}
        mask = secret_masker(secrets)
        try:
            flags = _engine_flags.EngineFlags(_engine_flags.load(
                args["flag_dirs"], args["engine"], args["engine_version"],
                host_version=args.get("host_engine_version", ""), host_problem=args.get("host_engine_problem", "")))
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
