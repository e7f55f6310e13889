# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """What this collection's modules share in their documentation, written once: the authors, full
    check mode support (each module says what it does in check mode, and its diff_mode), the platform.
    Used with ansible.builtin.action_common_attributes, which describes the attributes."""

    # Every module, and every action plugin documented as a module: Linux (/proc, systemd, the NVIDIA driver).
    DOCUMENTATION = r"""
options: {}
author:
  - cleanslate.gpu maintainers (@cleanslate)
attributes:
  check_mode:
    support: full
  platform:
    platforms: posix
"""

    # An action plugin documented as a module, with DOCUMENTATION above: it runs on the controller (or
    # runs modules on the host itself), once per host, never in the background.
    ACTION = r"""
options: {}
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
"""
