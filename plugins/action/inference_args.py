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

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_flags, _serve_command
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._controller_action import ControllerAction

ARGUMENT_SPEC = {
    "engine": {"type": "str", "required": True, "choices": ["vllm", "sglang"]},
    "engine_version": {"type": "str", "default": ""},
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
        secrets = args["secrets_set"]
        args["secrets_set"] = {
            "api_key": bool(secrets.get("api_key")), "hf_token": bool(secrets.get("hf_token")),
            "admin_api_key": bool(secrets.get("admin_api_key")),
            "environment": list(secrets.get("environment") or []),
        }
        try:
            flags = _engine_flags.EngineFlags(_engine_flags.load(args["flag_dirs"], args["engine"],
                                                                 args["engine_version"]))
            built = _serve_command.build(args, flags)
        except (_engine_flags.FlagError, _serve_command.ServeConfigError) as exc:
            raise AnsibleActionFail("inference_service: %s" % exc) from exc
        result.update(built, changed=False)
        for warning in built["warnings"]:
            self._display.warning(warning)
        return result
