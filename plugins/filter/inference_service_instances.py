# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Several servers on one host: inference_service_instances resolved into one set of the role's
variables per instance, and every reason the host cannot run them, before anything runs.

Each item overrides the single-service variables with its keys (the role's variable names without
the `inference_service_` prefix). The GPUs of an instance are read from its
environment.CUDA_VISIBLE_DEVICES, the only thing that confines an engine to some GPUs: they scope the
reset of a broken instance and keep its neighbours' GPUs out of it, so two instances sharing one
would have one reset kill the other's workers."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import (
    _secret_values, inference_service_problems, secret_masker, spec, visible_secret_problems)
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _rotation
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._role_spec import shown
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._serve_command import executable_path, share_addresses, unit_fault

PREFIX = "inference_service_"
VARIABLE = PREFIX + "instances"
# The playbook's (fail_host) and the list itself are the host's, not an instance's.
NOT_PER_INSTANCE = ("instances", "fail_host")
# A whole GPU's UUID as NVML and nvidia-smi print it; MIG-... (a slice of a GPU) cannot be reset alone.
GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z", re.IGNORECASE)
INDEX = re.compile(r"[0-9]{1,4}\Z")
# What CUDA reads as a GPU index it has not (a negative one, or too large): that GPU and every later one ignored.
NO_SUCH_INDEX = re.compile(r"-?[0-9]+\Z")


def instance_keys() -> list:
    """The keys an item may hold: the role's variables without the prefix, but the host's own."""
    return sorted(name[len(PREFIX):] for name in spec() if name[len(PREFIX):] not in NOT_PER_INSTANCE)


def parse_gpus(value) -> tuple:
    """(GPUs, kind, problem) of a CUDA_VISIBLE_DEVICES value: indices (int) or UUIDs (as NVML prints them: GPU- and lower-case hexadecimal),
    kind `index` or `uuid`; problem is a phrase (None when good)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return [], None, "is %s: it must be GPU indices or GPU-... UUIDs, separated by commas" % shown(value)
    items = [item.strip() for item in str(value).split(",")]
    if not any(items):
        return [], None, "is empty: the server would see no GPU (or, for some programs, every GPU)"
    gpus, kinds = [], set()
    for item in items:
        if INDEX.match(item):
            gpus.append(int(item))
            kinds.add("index")
        elif GPU_UUID.match(item):
            gpus.append("GPU-" + item[4:].lower())  # as NVML prints it
            kinds.add("uuid")
        elif item.upper().startswith("MIG-"):
            return [], None, ("names %s, a MIG instance: a GPU reset cannot be scoped to a slice of a GPU; give whole "
                              "GPUs" % shown(item))
        elif NO_SUCH_INDEX.match(item):
            return [], None, ("holds %s: CUDA ignores that GPU and every one after it; give the GPUs the server "
                              "uses" % shown(item))
        elif any(char.isdigit() and not char.isascii() for char in item):
            # str.isdigit takes Arabic-Indic or fullwidth digits; CUDA reads only 0-9.
            return [], None, ("holds %s, whose digits are not the ASCII digits 0-9, the only ones CUDA reads as a GPU "
                              "index" % shown(item))
        else:
            return [], None, ("holds %s, which is neither a GPU index nor a whole GPU's UUID (GPU- and 32 hexadecimal "
                              "digits)" % shown(item))
    if len(kinds) > 1:
        return [], None, "mixes GPU indices and UUIDs: give one or the other"
    repeated = sorted({str(gpu) for gpu in gpus if gpus.count(gpu) > 1})
    if repeated:
        return [], None, "names %s more than once" % ", ".join(repeated)
    return gpus, kinds.pop(), None


def _unknown_key(where: str, key) -> str:
    text = str(key)
    close = difflib.get_close_matches(text.removeprefix(PREFIX), instance_keys(), n=1)
    if text.removeprefix(PREFIX) in NOT_PER_INSTANCE:
        return "%s.%s: the host's setting, not an instance's; set %s%s for the host." % (where, text, PREFIX, text)
    return "%s.%s: unknown key%s" % (where, shown(text) if not isinstance(key, str) else text,
                                     "; did you mean %s?" % close[0] if close else ".")


def _renamed(problem: str, where: str) -> str:
    """A sentence of the role's check about `inference_service_x`, about the instance's `x` instead."""
    return re.sub(r"\b%s(?!instances\b)([a-z_]+)" % PREFIX, lambda m: "%s.%s" % (where, m.group(1)), problem)


def _secrets(item: Mapping, single: Mapping):
    """The instance's secrets: its own, else the host's ({} when not a mapping: refused by type)."""
    found = item.get("secrets", single.get(PREFIX + "secrets"))
    return found if isinstance(found, Mapping) else {}


def _instance(index: int, item, single: Mapping, count: int) -> tuple:
    """(resolved instance or None, problems) of one item."""
    where = "%s[%d]" % (VARIABLE, index)
    if not isinstance(item, Mapping):
        return None, ["%s is %s: each instance must be a mapping of the role's variable names without the prefix "
                      "(unit, port, environment, ...)." % (where, shown(item))]
    unit = item.get("unit", single.get(PREFIX + "unit"))
    if unit_fault(unit) is None and secret_masker(_secrets(item, single))(unit) == unit:
        # Named by its unit only when the unit is one and holds no secret: the unit rule's own
        # sentence shows a bad one, once.
        where = "%s (%s)" % (where, unit)
    known = set(instance_keys())
    problems = [_unknown_key(where, key) for key in item if key not in known]
    merged = dict(single)
    merged.update({PREFIX + key: value for key, value in item.items() if key in known})
    merged.pop(VARIABLE, None)
    problems += [_renamed(problem, where) for problem in inference_service_problems(merged)]
    # Ansible's dict check takes "k=v" text for a mapping; the role's templates do not.
    for name, option in spec().items():
        key = name[len(PREFIX):]
        said = any(problem.startswith("%s.%s " % (where, key)) for problem in problems)
        if option.get("type") == "dict" and key in item and not isinstance(merged[name], Mapping) and not said:
            problems.append("%s.%s is %s: it must be a mapping of names to values."
                            % (where, key, "(hidden)" if option.get("no_log") else shown(merged[name])))
    if problems:
        return None, problems
    resolved = {name[len(PREFIX):]: value for name, value in merged.items()
                if name.startswith(PREFIX) and name[len(PREFIX):] in known}
    environment = dict(resolved.get("environment") or {})
    resolved["environment"] = environment
    resolved["gpus"], resolved["gpu_kind"] = [], None
    visible = environment.get("CUDA_VISIBLE_DEVICES")
    if "CUDA_VISIBLE_DEVICES" not in environment:
        if count > 1:
            problems.append("%s.environment has no CUDA_VISIBLE_DEVICES: with several instances on a host, each must "
                            "name its GPUs, or it would see and load every GPU of the host." % where)
        return resolved, problems
    gpus, kind, problem = parse_gpus(visible)
    if problem:
        return None, ["%s.environment.CUDA_VISIBLE_DEVICES %s." % (where, problem)]
    order = environment.get("CUDA_DEVICE_ORDER")
    if kind == "index":
        if order is None:
            # CUDA numbers GPUs fastest first unless told; NVML, nvidia-smi and the reset by PCI bus.
            environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        elif order != "PCI_BUS_ID":
            return None, ["%s.environment.CUDA_DEVICE_ORDER is %s: GPU indices in CUDA_VISIBLE_DEVICES then do not "
                          "count GPUs as NVML does, and the reset would pick other GPUs; use PCI_BUS_ID or GPU UUIDs."
                          % (where, shown(order))]
    resolved["gpus"], resolved["gpu_kind"] = gpus, kind
    return resolved, problems


def _clashes(instances: list) -> list:
    """Two instances of one host sharing a unit, a port on the same address, a GPU, or a balancer's server name."""
    problems = []
    for later, (index, one) in enumerate(instances):
        for other_index, other in instances[:later]:
            pair = "%s[%d] (%s) and %s[%d] (%s)" % (VARIABLE, other_index, other["unit"], VARIABLE, index, one["unit"])
            if one["unit"] == other["unit"]:
                problems.append("%s share the unit %s: each instance needs its own unit." % (pair, one["unit"]))
            if int(one["port"]) == int(other["port"]) and share_addresses(one["host"], other["host"]):
                problems.append("%s share the port %s: the second server could not listen on it." % (pair, one["port"]))
            shared = [gpu for gpu in one["gpus"] if gpu in other["gpus"]]
            if shared:
                problems.append("%s share the GPU %s: a reset of one would kill the other's workers."
                                % (pair, ", ".join(map(str, shared))))
            if _rotation.same_server(one, other):
                problems.append("%s share the balancer's server name %s: each instance behind a balancer needs its own "
                                "rotation_server." % (pair, one.get("rotation_server") or "(unset: the host's name)"))
    kinds = {one["gpu_kind"] for dummy, one in instances if one["gpu_kind"]}
    if len(kinds) > 1:
        problems.append("%s mixes GPU indices and UUIDs in CUDA_VISIBLE_DEVICES across instances: an index and a UUID "
                        "of the same GPU cannot be told apart before the host is read; use one or the other."
                        % VARIABLE)
    return problems


def inference_service_instances(variables):
    """{instances: [resolved instance], problems: [sentence]} of the role's variables by name.

    An instance holds every per-instance variable without the prefix, its environment with
    CUDA_DEVICE_ORDER PCI_BUS_ID added to GPU indices, `gpus` (indices or UUIDs as NVML prints them) and
    `gpu_kind` (`index`, `uuid`, or None: every GPU). No instance list: one instance of the
    single-service variables. Problems: none is returned with an instance list (nothing may run)."""
    if not isinstance(variables, Mapping):
        raise TypeError("inference_service_instances expects a mapping of the role's variables, got %s"
                        % type(variables).__name__)
    items = variables.get(VARIABLE)
    single = {name: value for name, value in variables.items() if name != VARIABLE}
    if items is None or items == []:
        resolved, problems = _instance(0, {}, single, 1)
        if resolved is None:
            return {"instances": [], "problems": problems}
        return {"instances": [resolved], "problems": problems}
    if not isinstance(items, list):
        return {"instances": [], "problems": ["%s is %s: it must be a list of instances (mappings)."
                                              % (VARIABLE, shown(items))]}
    problems, resolved = [], []
    for index, item in enumerate(items):
        instance, found = _instance(index, item, single, len(items))
        found += _neighbours_secrets(index, items, single)
        problems += found
        if instance is not None and not found:
            resolved.append((index, instance))
    problems += _clashes(resolved)
    # No sentence shows any instance's secret, whichever instance's text it was pasted into.
    mask = secret_masker({"environment": {"%d.%s" % (index, name): value for index, item in enumerate(items)
                                          if isinstance(item, Mapping)
                                          for name, value in _secret_values(_secrets(item, single))}})
    return {"instances": [] if problems else [instance for dummy, instance in resolved], "problems": mask(problems)}


def _neighbours_secrets(index: int, items: list, single: Mapping) -> list:
    """Where another instance's own secret was pasted into this instance's visible texts (its own
    secrets and the host's are compared by the role's check)."""
    item = items[index]
    if not isinstance(item, Mapping):
        return []
    merged = dict(single)
    merged.update({PREFIX + key: value for key, value in item.items() if key in set(instance_keys())})
    problems = []
    for other, neighbour in enumerate(items):
        if other == index or not isinstance(neighbour, Mapping) or not isinstance(neighbour.get("secrets"), Mapping) \
                or neighbour.get("secrets") == _secrets(item, single):
            continue
        named = list(_secret_values(neighbour["secrets"]))
        problems += [_renamed(problem, "%s[%d]" % (VARIABLE, index)).replace(
            "%s[%d].secrets." % (VARIABLE, index), "%s[%d].secrets." % (VARIABLE, other))
            for problem in visible_secret_problems(merged, named)]
    return problems


def inference_service_host_looks(instances):
    """cleanslate.gpu.inference_host's options for each resolved instance (validate.yml's look at its
    server, the marker aside): the executable the unit will run, the user, the secrets' directory, the
    unit, and the engine whose version to read unless its version is given. A value the instance's own
    checks will refuse is passed as it is: the module refuses that instance alone."""
    if not isinstance(instances, list) or not all(isinstance(item, Mapping) for item in instances):
        raise TypeError("inference_service_host_looks expects the resolved instances, a list of mappings")
    looks = []
    for item in instances:
        try:
            executable = executable_path({"executable": item.get("executable"), "venv": item.get("venv")}, item.get("engine"))
        except (TypeError, AttributeError):
            executable = item.get("executable")
        look = {"executable": executable, "user": item.get("user") or "", "config_dir": item.get("config_dir"),
                "unit": item.get("unit")}
        if not item.get("engine_version"):
            look["engine"] = item.get("engine")
        looks.append(look)
    return looks


def inference_service_early_starts(written, pending):
    """What the write pass (instance_write.yml) did for each reset instance, by unit, for its gate:
    {unit: {files: its answer in the task's `instances`, look: its probe}}. Only an instance whose files
    were written and whose unit's state was read (its answer's unit has a load_state) is kept: one the task
    refused, or every one when the task failed as a whole or its host did not answer, is left to its serve
    step, which writes and starts it itself."""
    if not isinstance(pending, list) or not all(isinstance(item, Mapping) and "unit" in item for item in pending):
        raise TypeError("inference_service_early_starts expects the kept instances, a list of mappings that name their unit")
    answers = written.get("instances") if isinstance(written, Mapping) else None
    answers = answers if isinstance(answers, list) else []
    kept = {}
    for item, answer in zip(pending, answers):
        unit = answer.get("unit") if isinstance(answer, Mapping) else None
        if isinstance(unit, Mapping) and "load_state" in unit and not answer.get("failed"):
            kept[item["unit"]] = {"files": dict(answer), "look": item.get("look", {})}
    return kept


class FilterModule:
    """Several servers on one host."""

    def filters(self):
        return {"inference_service_instances": inference_service_instances,
                "inference_service_host_looks": inference_service_host_looks,
                "inference_service_early_starts": inference_service_early_starts}
