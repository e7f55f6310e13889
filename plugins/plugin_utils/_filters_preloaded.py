# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The collection's filter plugins, loaded in the controller's main process before it forks workers.

ansible-core runs each task of each host in a worker forked from the main process. The first time a
worker renders a template naming any filter of a collection, ansible-core's Jinja plugin loader
imports every filter file of that collection, and the utilities they import, compiling each from
source (the collection loader keeps no bytecode). A worker forked after the main process did that
inherits it all. Measured on a 2-core machine (docs/fleet_scale.md, issue 42, third pass): 62 to
106 ms of CPU a worker, median 93, and 2 such workers per crashed host of reset.yml.

The fleet playbooks' first play takes its hosts from the fleet_targets lookup, which ansible-core
templates in the main process before any worker of the run is forked: it calls this."""

from __future__ import annotations

from ansible.plugins.loader import filter_loader

# A filter every fleet playbook uses: looking it up imports all the files (ansible-core 2.19's loader).
FILTER = "cleanslate.gpu.node_reset_result"


def load_filters_before_forks() -> None:
    """Import the collection's filter files into this process, once."""
    filter_loader.get(FILTER)
