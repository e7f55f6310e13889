# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which hosts of a group a run targets, and the sentence when it targets none.

Shared by the fleet_targets lookup (the hosts of the fleet playbooks' first play, templated
before any limit is applied, so it holds whatever the inventory and limit) and the
fleet_preflight action."""

from __future__ import annotations

import re

from ansible.inventory.manager import InventoryManager


def shown(name) -> str:
    """A name as one line, whatever it holds: repr, without the quotes of a plain one."""
    text = repr(name)
    return text[1:-1] if re.match(r"[A-Za-z0-9_]+\Z", str(name)) else text


def targeted(group_hosts, play_hosts) -> list:
    """The hosts of the group that this run targets, in the group's order."""
    play = set(play_hosts or [])
    return [host for host in group_hosts or [] if host in play]


def limited(groups: dict, limit, loader) -> list:
    """The inventory's hosts that the limit admits (all without one), as ansible-playbook applies
    --limit: host patterns, groups, `a:&b`, `!c`, `@retry-file`. Built from the `groups` variable
    as ansible.builtin.inventory_hostnames is: the run's own inventory object is not in reach."""
    manager = InventoryManager(loader, parse=False)
    for group, hosts in (groups or {}).items():
        manager.add_group(group)
        for host in hosts or []:
            manager.add_host(host, group=group)
    if limit:
        manager.subset(limit)
    return [host.name for host in manager.get_hosts("all")]


def no_target_message(group, limit, groups, sources) -> str:
    """One sentence: no host of `group` is targeted, where the run looked, and that it fails."""
    sources = ", ".join(map(str, sources or [])) or "none"
    where = ("the limit %s" % shown(limit) if limit else
             "this inventory" if group in (groups or {}) else "this inventory, which has no such group")
    return ("no host of the group %s matches %s (inventory: %s): nothing would be reset or checked, so the"
            " run fails rather than succeed without doing anything." % (shown(group), where, sources))
