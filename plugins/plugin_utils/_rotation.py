# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A server's load balancer (inference_service_rotation, issue 40): the role's check of the
setting, one sentence per fault, before any host is touched, and the servers of a host that a
transition (out of rotation, back in) applies to. Private to this collection.

The transitions themselves are cleanslate.gpu.lb_rotation's, on the balancer's host; its name rule
(a name that goes over HAProxy's line protocol) is the one checked here, so that a name the
module would refuse is refused before the reset stops anything."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.module_utils._rotation_names import name_fault
from ansible_collections.cleanslate.gpu.plugins.module_utils._settings import BY_NAME
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import shown

VARIABLE = "inference_service_rotation"
KEYS = tuple(BY_NAME["rotation"].suboptions)
# What each balancer needs beside its host.
NEEDS = {"haproxy": ("backend",), "command": ("command",), "http": ("url",)}
# Whole seconds, as the module takes them.
SECONDS = {"drain_timeout_s": (0, 3600), "timeout_s": (1, 3600)}


def configured(rotation) -> bool:
    """Whether the server has a balancer (V({}) or unset: none)."""
    return isinstance(rotation, Mapping) and len(rotation) > 0


def server_name(rotation_server, host: str) -> str:
    """The server's name on the balancer: inference_service_rotation_server, or the host's name."""
    return rotation_server if isinstance(rotation_server, str) and rotation_server else host


def problems(rotation, rotation_server, where: str = VARIABLE) -> list:
    """Why the balancer setting cannot be used: one sentence per fault ([] when none or unset). An
    unset server name is the host's, checked by the module where it runs (its one sentence)."""
    if not configured(rotation):
        return []  # unset, or not a mapping: the type check's sentence
    found = ["%s.%s: unknown key; the keys are %s." % (where, key, ", ".join(KEYS)) for key in rotation if key not in KEYS]
    balancer = rotation.get("balancer", "haproxy")
    if balancer not in NEEDS:
        return found + ["%s.balancer is %s: it must be one of %s." % (where, shown(balancer), ", ".join(NEEDS))]
    for key in ("host",) + NEEDS[balancer]:
        if rotation.get(key) in (None, "", []):
            found.append("%s.%s is missing: the %s balancer needs it." % (where, key, balancer))
    for key in ("host", "backend", "url"):
        value = rotation.get(key)
        if value is not None and not isinstance(value, str):
            found.append("%s.%s is %s: it must be text." % (where, key, shown(value)))
    backend = rotation.get("backend")
    fault = name_fault(backend, balancer) if isinstance(backend, str) and backend else None
    if fault:
        found.append("%s.backend is %s: %s." % (where, shown(backend), fault))
    for key in ("socket", "marker_dir"):
        path = rotation.get(key)
        if path is not None and (not isinstance(path, str) or not path.startswith("/")):
            found.append("%s.%s is %s: a path must be absolute (start with /)." % (where, key, shown(path)))
    command = rotation.get("command")
    if command is not None and (not isinstance(command, list) or not all(isinstance(item, str) and item for item in command)):
        found.append("%s.command is %s: it must be a list of texts, the program first (no shell)." % (where, shown(command)))
    url = rotation.get("url")
    if isinstance(url, str) and url and not url.startswith(("http://", "https://")):
        found.append("%s.url is %s: it must start with http:// or https://." % (where, shown(url)))
    headers = rotation.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        found.append("%s.headers is (hidden): it must be a mapping of header names to values." % where)
    for key, (low, high) in SECONDS.items():
        value = rotation.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            found.append("%s.%s is %s: it must be a whole number of seconds from %d to %d."
                         % (where, key, shown(value), low, high))
    fault = name_fault(rotation_server, balancer) if rotation_server not in (None, "") else None
    if fault:
        found.append("inference_service_rotation_server is %s: %s." % (shown(rotation_server), fault))
    return found


def same_server(one: Mapping, other: Mapping) -> bool:
    """Two servers of one host behind balancers under one name (the unset name is the host's):
    taking one out would take the other out."""
    return (configured(one.get("rotation")) and configured(other.get("rotation"))
            and (one.get("rotation_server") or "") == (other.get("rotation_server") or ""))


def servers(instances, host: str, units=None) -> list:
    """The servers behind a balancer, of resolved instances (each the role's variables without the
    prefix, as cleanslate.gpu.inference_service_instances gives them, or one server's), with
    {unit, server, rotation}; only those of `units` when given."""
    return [{"unit": instance.get("unit"), "server": server_name(instance.get("rotation_server"), host),
             "rotation": dict(instance["rotation"])}
            for instance in instances or []
            if isinstance(instance, Mapping) and configured(instance.get("rotation"))
            and (units is None or instance.get("unit") in units)]


def by_balancer(servers) -> list:
    """The servers of `servers` ({unit, server, rotation}) grouped by their whole balancer setting, in the order
    each first appears: [{rotation, servers: [{unit, server}]}], one cleanslate.gpu.lb_rotation call each (one read
    of the balancer's state, the drains side by side)."""
    groups = []
    for one in servers or []:
        group = next((group for group in groups if group["rotation"] == one["rotation"]), None)
        if group is None:
            group = {"rotation": one["rotation"], "servers": []}
            groups.append(group)
        group["servers"].append({"unit": one["unit"], "server": one["server"]})
    return groups
