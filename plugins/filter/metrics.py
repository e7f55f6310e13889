# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The filter cleanslate.gpu.metric_families (plugin_utils/_metric_families.py computes it)."""

from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._metric_families import metric_families


class FilterModule:
    """The roles' results as metric families."""

    def filters(self):
        return {"metric_families": metric_families}
