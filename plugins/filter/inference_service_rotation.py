# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The servers of a host behind a load balancer (issue 40), for the role's rotation tasks."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _rotation

# What the result keeps of each transition (cleanslate.gpu.lb_rotation's return values).
STEP_KEYS = ("changed", "state_before", "state_after", "sessions_at_maint", "drained_s")


def inference_service_rotation_servers(instances, host, units=None):
    """[{unit, server, rotation}] of the servers behind a balancer (plugin_utils/_rotation.py)."""
    if not isinstance(instances, list):
        raise TypeError("inference_service_rotation_servers expects a list of instances, got %s" % type(instances).__name__)
    return _rotation.servers(instances, str(host), units=None if units is None else list(units))


def inference_service_rotation_by_balancer(servers):
    """[{rotation, servers: [{unit, server}]}]: the servers grouped by balancer, one transition call each."""
    if not isinstance(servers, list) or not all(isinstance(one, Mapping) for one in servers):
        raise TypeError("inference_service_rotation_by_balancer expects the list of inference_service_rotation_servers")
    return _rotation.by_balancer(servers)


def inference_service_rotation_steps(call, step):
    """What one lb_rotation call of the rotation tasks' loop did to each of its servers, to keep under each unit:
    {unit: {server, host, <step>: {changed, state_before, state_after, sessions_at_maint, drained_s}}}."""
    if not isinstance(call, Mapping):
        raise TypeError("inference_service_rotation_steps expects a registered loop item, got %s" % type(call).__name__)
    item = call.get("item") if isinstance(call.get("item"), Mapping) else {}
    rotation = item.get("rotation") if isinstance(item.get("rotation"), Mapping) else {}
    said = {one.get("server"): one for one in call.get("servers") or [] if isinstance(one, Mapping)}
    return {server.get("unit"): {"server": server.get("server"), "host": rotation.get("host"),
                                 str(step): {key: said.get(server.get("server"), {}).get(key) for key in STEP_KEYS}}
            for server in item.get("servers") or [] if isinstance(server, Mapping)}


class FilterModule:
    """The servers behind a load balancer."""

    def filters(self):
        return {"inference_service_rotation_servers": inference_service_rotation_servers,
                "inference_service_rotation_by_balancer": inference_service_rotation_by_balancer,
                "inference_service_rotation_steps": inference_service_rotation_steps}
