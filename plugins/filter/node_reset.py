# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The node_reset role's two computations, in Python: the checks of its variables and its result
(plugin_utils/_node_reset_result.py, which the action cleanslate.gpu.reset_steps runs too).

Filters, not Jinja in set_fact tasks: a few milliseconds per host, and the rules read as code
(fewer tasks: docs/design.md#why-tasks-are-few).
"""

from __future__ import annotations

import re
from collections.abc import Mapping


from ansible_collections.cleanslate.gpu.plugins.module_utils import _ranges
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import is_unit_name
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _node_reset_steps as _steps
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _role_spec
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._node_reset_result import node_reset_result

# (variable, minimum, exclusive minimum, maximum, the rule in words); 0 is also allowed where
# ZERO_ALLOWED says so. A number given with -e is a string: it is converted first. A module
# option's variable takes the module's own range (module_utils/_ranges.py), the role's own
# variables have theirs here.


def _module_rule(name, rule, zero_allowed=False):
    words = _ranges.words(rule)
    if zero_allowed:
        words += ", or 0 (no check)"
    return (name, rule.minimum, rule.above, rule.maximum, words)


NUMBERS = tuple(_module_rule(name, rule, zero_allowed=name == "node_reset_nvml_verify_expected_count")
                for name, rule in _steps.number_rules().items()) + (
    ("node_reset_pve_vmid", 100, None, 999999999, "0 (no container) or a vmid from 100 to 999999999"),
    ("node_reset_pve_connect_timeout", 1, None, 3600, "a number of seconds from 1 to 3600"),
    ("node_reset_pve_sweep_after", 0, None, 86400, "a number of seconds from 0 to 86400"),
)
ZERO_ALLOWED = ("node_reset_pve_vmid", "node_reset_nvml_verify_expected_count")
SELECTORS = ("node_reset_gpu_reset_gpus", "node_reset_nvml_verify_gpus", "node_reset_gpu_reset_spare_gpus")
SELECTOR = re.compile(r"([0-9]+|GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})\Z")
# Lists whose items must be absolute paths (the modules refuse anything else, after gpu_reset ran).
ABSOLUTE = ("node_reset_shm_clean_path", "node_reset_pycache_purge_paths", "node_reset_metrics_dir")
# Python's own rule for a module name: dotted identifiers.
MODULE_NAME = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*\Z")


def spec() -> dict:
    """The role's argument spec (meta/argument_specs.yml, the entry points share their options): the
    types and choices are checked here, one sentence per variable, instead of by ansible-core's
    validation task, whose failure prints the whole spec (some 6 KB) after the one line that matters.
    Read on first use: node_reset_result, which every host runs too, needs none of it."""
    return _role_spec.load_spec("node_reset")


def variables() -> tuple:
    """The variables node_reset_problems reads, for the role to pass (tests compare the two lists): all."""
    return tuple(spec())


def _text(value) -> str:
    """Jinja's `string` filter."""
    return value if isinstance(value, str) else str(value)


def spec_problems(values: Mapping) -> list:
    """Types, choices and list items of the argument spec (the numbers are left to their rule)."""
    return _role_spec.spec_problems(spec(), values, skip=tuple(rule[0] for rule in NUMBERS) + SELECTORS)


def path_problems(values: Mapping) -> list:
    """What the modules would refuse only after gpu_reset had run: said before any step."""
    problems = []
    for name in ABSOLUTE:
        value = values.get(name)
        # A number is no path (-e gives text; Ansible would make "5" of a 5 silently).
        items = [value] if isinstance(value, (str, int, float)) else value if isinstance(value, list) else []
        bad = [item for item in items if not isinstance(item, str) or not item.startswith("/") or "\0" in item
               or "\n" in item]
        if bad:
            problems.append("%s has %s: a path must be absolute (start with /), on one line." % (
                name, ", ".join(map(_role_spec.shown, bad))))
    modules = values.get("node_reset_pycache_purge_modules")
    modules = _role_spec.as_list(modules) if isinstance(modules, (str, list)) else []
    bad = [item for item in modules if not isinstance(item, str) or not MODULE_NAME.match(item)]
    if bad:
        problems.append("node_reset_pycache_purge_modules has %s: a module is a dotted Python name such as"
                        " vllm or vllm.model_executor." % ", ".join(map(_role_spec.shown, bad)))
    patterns = values.get("node_reset_gpu_reset_cmdline_patterns")
    for pattern in patterns if isinstance(patterns, list) else []:
        try:
            re.compile(_text(pattern))
        except re.error as exc:
            problems.append("node_reset_gpu_reset_cmdline_patterns has %s: not a regular expression (%s)."
                            % (_role_spec.shown(pattern), exc))
    tmp_path = values.get("node_reset_shm_clean_tmp_path")
    # Empty: no pass over it. A number is no path, as above.
    if tmp_path not in (None, "") and (not isinstance(tmp_path, str) or not tmp_path.startswith("/")
                                       or "\0" in tmp_path or "\n" in tmp_path):
        problems.append("node_reset_shm_clean_tmp_path is %s: a path must be absolute (start with /), on one line, "
                        "or empty to skip it." % _role_spec.shown(tmp_path))
    patterns = values.get("node_reset_shm_clean_tmp_patterns")
    for pattern in patterns if isinstance(patterns, list) else []:
        try:
            compiled = re.compile(_text(pattern))
        except re.error as exc:
            problems.append("node_reset_shm_clean_tmp_patterns has %s: not a regular expression (%s)."
                            % (_role_spec.shown(pattern), exc))
            continue
        if any(compiled.fullmatch(name) for name in ("", ".", "..")):
            problems.append("node_reset_shm_clean_tmp_patterns has %s: it matches an empty name, . or ..; a pattern "
                            "must name leftovers only." % _role_spec.shown(pattern))
    for name in ("node_reset_shm_clean_patterns", "node_reset_gpu_reset_device_paths"):
        value = values.get(name)
        if isinstance(value, list) and any(not _text(item).strip() for item in value):
            problems.append("%s is %s: an empty item would match nothing or everything." % (name, _role_spec.shown(value)))
    return problems


def number_problems(values: Mapping) -> list:
    return _role_spec.number_problems(NUMBERS, values, ZERO_ALLOWED)


def _unit_name(name: str) -> str:
    """A unit as systemd names it: systemctl adds .service to a name without a suffix."""
    return name if "." in name.rsplit("@", 1)[-1] else name + ".service"


def unit_problems(values: Mapping) -> list:
    """The units stopped (node_reset_units) and spared (node_reset_gpu_reset_spare_units): systemd
    names, and never one unit both (a stop would take down the neighbour the reset spares)."""
    problems = []
    stopped = values.get("node_reset_units")
    stopped = _role_spec.as_list(stopped) if stopped is not None else []
    # A unit stopped by name may leave out its .service; a spared one names its cgroup, so it has its suffix.
    bad = [u for u in stopped if not is_unit_name(u)]
    if bad:
        problems.append("node_reset_units has %s: a unit is a systemd unit name such as vllm-a.service, on one line."
                        % ", ".join(map(_role_spec.shown, bad)))
    spared = values.get("node_reset_gpu_reset_spare_units")
    spared = _role_spec.as_list(spared) if spared is not None else []
    bad = [u for u in spared if not is_unit_name(u, holds_processes=True)]
    if bad:
        problems.append("node_reset_gpu_reset_spare_units has %s: a unit is a systemd unit name with the suffix of a"
                        " unit that holds processes (.service, .scope, .slice), such as vllm-b.service."
                        % ", ".join(map(_role_spec.shown, bad)))
    unit = values.get("node_reset_unit")
    stopped_names = {_unit_name(u) for u in stopped + [unit] if isinstance(u, str) and u}
    both = [u for u in spared if isinstance(u, str) and u in stopped_names]
    if both and not bad:
        problems.append("node_reset_gpu_reset_spare_units has %s, which node_reset_unit or node_reset_units stops: a"
                        " unit cannot be stopped and spared at once." % ", ".join(map(_role_spec.shown, both)))
    return problems


def gpu_overlap_problems(values: Mapping) -> list:
    """A spared GPU that the reset also selects or checks: gpu_reset would refuse it after the units
    stopped, and nvml_verify would find the healthy neighbour's memory on it."""
    spared = {_text(item).strip().lower() for item in _role_spec.as_list(values.get("node_reset_gpu_reset_spare_gpus") or [])}
    both = [_text(item) for name in ("node_reset_gpu_reset_gpus", "node_reset_nvml_verify_gpus")
            for item in _role_spec.as_list(values.get(name) or []) if _text(item).strip().lower() in spared]
    if not both:
        return []
    return ["node_reset_gpu_reset_spare_gpus has %s, which node_reset_gpu_reset_gpus or node_reset_nvml_verify_gpus"
            " also names: a GPU cannot be reset and spared at once." % ", ".join(map(_role_spec.shown, sorted(set(both))))]


def input_problems(values: Mapping, pve_host_known=True) -> list:
    problems = unit_problems(values)
    for name in SELECTORS:
        bad = [item for item in map(_text, _role_spec.as_list(values.get(name))) if not SELECTOR.match(item)]
        if bad:
            problems.append("%s has %s: a GPU is an index (a non-negative integer such as 0) or a UUID"
                            " (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)." % (name, ", ".join(map(_role_spec.shown, bad))))
    problems += gpu_overlap_problems(values)  # after the selectors' own sentences: one per variable
    # nvml_verify's own checks (its documented choices, which the role's spec takes: tools/gen_node_reset_docs.py).
    known = spec()["node_reset_nvml_verify_checks"]["choices"]
    checks = values.get("node_reset_nvml_verify_checks")
    checks = _role_spec.as_list(checks) if checks or isinstance(checks, str) else []
    if not checks:
        problems.append("node_reset_nvml_verify_checks is empty: give at least one of %s (with none, any GPU would"
                        " pass)." % ", ".join(known))
    unknown = [check for check in checks if check not in known]
    if unknown:
        problems.append("node_reset_nvml_verify_checks has %s: the checks are %s."
                        % (", ".join(map(_role_spec.shown, unknown)), ", ".join(known)))
    cgroup = values.get("node_reset_gpu_reset_cgroup")
    if cgroup is not None and not _text(cgroup).strip():
        problems.append("node_reset_gpu_reset_cgroup is %s: an empty cgroup text would match every process; leave"
                        " it unset (null) for no cgroup limit." % _role_spec.shown(cgroup))
    users = values.get("node_reset_gpu_reset_users")
    if users is not None:
        given = _role_spec.as_list(users)
        if not given or any(not _text(user).strip() for user in given):
            problems.append("node_reset_gpu_reset_users is %s: an empty list or name would match no process; leave"
                            " it unset (null) for any user." % _role_spec.shown(users))
    host, vmid = values.get("node_reset_pve_host"), values.get("node_reset_pve_vmid")
    host = "" if host is None else _text(host)
    if (len(host) > 0) != ((_role_spec.as_number(vmid) or 0) != 0):
        problems.append("node_reset_pve_host (%s) and node_reset_pve_vmid (%s) must be given together."
                        % (_role_spec.shown(host), _role_spec.shown(vmid)))
    if host and not pve_host_known:
        problems.append("node_reset_pve_host %s is not a host of the inventory." % _role_spec.shown(host))
    return problems


def node_reset_problems(values, pve_host_known=True):
    """Why the role's variables cannot be used: one sentence per bad variable, [] when none.

    `values` maps each name of variables() to its value; `pve_host_known` says whether
    node_reset_pve_host names a host of the inventory."""
    if not isinstance(values, Mapping):
        raise TypeError("node_reset_problems expects a mapping of the role's variables, got %s"
                        % type(values).__name__)
    problems, named = [], set()
    # One sentence per variable: the most specific rule first (a GPU selector's own words rather
    # than "a list of texts"), the argument spec's types and choices last.
    for problem in (number_problems(values) + input_problems(values, bool(pve_host_known)) + path_problems(values)
                    + spec_problems(values)):
        name = problem.split(" ", 1)[0]
        if name not in named or name == "node_reset_pve_host":
            problems.append(problem)
        named.add(name)
    return problems


def node_reset_step_args(values, read_only=False, pve=False):
    """cleanslate.gpu.reset_steps' arguments from the role's variables (see _node_reset_steps)."""
    if not isinstance(values, Mapping):
        raise TypeError("node_reset_step_args expects a mapping of the role's variables, got %s" % type(values).__name__)
    return _steps.step_arguments(values, read_only=bool(read_only), pve=bool(pve),
                                 sweep_after=values.get("node_reset_pve_sweep_after"))


def node_reset_sweep_args(values):
    """The Proxmox node's sweep of a container: gpu_reset scoped to the container's cgroup
    (node_reset_pve_cgroup, else /lxc/<vmid>/), then nvml_verify in the container."""
    if not isinstance(values, Mapping):
        raise TypeError("node_reset_sweep_args expects a mapping of the role's variables, got %s" % type(values).__name__)
    cgroup = values.get("node_reset_pve_cgroup") or "/lxc/%s/" % values.get("node_reset_pve_vmid")
    return _steps.sweep_arguments(values, str(cgroup))


class FilterModule:
    """The node_reset role's checks and result."""

    def filters(self):
        return {"node_reset_problems": node_reset_problems, "node_reset_result": node_reset_result,
                "node_reset_step_args": node_reset_step_args, "node_reset_sweep_args": node_reset_sweep_args}
