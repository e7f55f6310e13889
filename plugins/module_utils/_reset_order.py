# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The order of a reset's module steps: the module cleanslate.gpu.reset_steps runs them in it on the
host, and the steps' registry on the controller (plugin_utils/_node_reset_steps.py) lists them in it."""

from __future__ import annotations

# pycache_purge first: it is the one step whose inputs only the host can refuse (a module that does
# not resolve, a path that is not there), and it needs no process stopped (an interpreter that
# imported a module never reads its .pyc again, and one that imports it later compiles the source
# as it is now), so a refusal comes before any signal. Then no segment is removed while its holders
# live, and the GPUs are read last.
STEP_ORDER = ("pycache_purge", "gpu_reset", "shm_clean", "nvml_verify")
