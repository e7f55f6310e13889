# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the inference_service role found on the host before touching it, turned into refusals.

The role's host look (roles/inference_service/tasks/validate.yml, the module
cleanslate.gpu.inference_host) returns facts, never a decision; this filter decides, so that
the rules live in Python beside their tests instead of in a Jinja message. The rules that
matter most are about the unit: the role writes, stops and restarts only a unit it wrote
itself (the first line of its file is the role's marker). A hostile run found
`inference_service_unit: billing.service` (a running, hand-written unit) stopped and its file
overwritten without a backup, and `ssh.service` accepted as well."""

from __future__ import annotations

from collections.abc import Mapping

# Units the role never writes, stops or adopts, whatever the host says: the host's own services
# and the GPU daemons that a reset is careful never to signal, by the unit's whole stem or a
# family prefix (so that sshfs-models.service or cronos-llm.service stay possible). A name that
# systemd finds outside /etc/systemd/system (a package's unit) is refused on the host as well.
SYSTEM_STEMS = frozenset((
    "ssh", "sshd", "dbus", "dbus-broker", "cron", "crond", "anacron", "rsyslog", "syslog", "networking",
    "NetworkManager", "polkit", "udev", "init", "emergency", "rescue", "getty", "chrony", "chronyd", "ntp",
    "nvidia-persistenced", "nvidia-fabricmanager", "nv-hostengine", "nvidia-dcgm", "dcgm", "dcgm-exporter",
    "docker", "containerd", "kubelet", "lxc", "lxcfs", "qemu-server", "corosync", "apparmor", "auditd"))
SYSTEM_PREFIXES = ("systemd-", "getty@", "serial-getty@", "container-getty@", "console-getty", "user@",
                   "user-runtime-dir@", "pve", "ceph-")


def _part(facts, key) -> Mapping:
    value = facts.get(key)
    return value if isinstance(value, Mapping) else {}


def unit_refusals(unit: str, adopt: bool, found: Mapping, active, declared=()) -> list:
    """Why the role may not write, stop or restart `unit` on this host ([] when it may): `found` is
    the host look's `unit`, `active` its `managed_active`."""
    problems = []
    stem = unit[: -len(".service")] if unit.endswith(".service") else unit
    if stem in SYSTEM_STEMS or stem.startswith(SYSTEM_PREFIXES):
        return ["inference_service_unit %s is a system unit: the role never writes, stops or restarts it "
                "(name the inference server's own unit, e.g. vllm.service)" % unit]
    vendor = found.get("elsewhere") or ""
    state = found.get("file") or "absent"
    if vendor:
        problems.append("inference_service_unit %s has a unit file outside /etc/systemd/system (%s), installed by "
                        "a package or by hand: the role never overrides it; name the inference server's own unit"
                        % (unit, vendor))
    elif state == "symlink":
        problems.append("/etc/systemd/system/%s is a symbolic link (to %s), not a unit file this role wrote: a "
                        "masked unit or another unit's file; the role never replaces it"
                        % (unit, found.get("link") or "?"))
    elif state == "foreign" and not adopt:
        problems.append("/etc/systemd/system/%s exists and this role did not write it (its first line is not the "
                        "role's marker): the role does not stop, overwrite or restart it; set "
                        "inference_service_adopt_unit: true to let the role take it over (the old file is kept "
                        "as a backup beside it)" % unit)
    elif state == "absent" and found.get("loaded") is True:
        problems.append("inference_service_unit %s is loaded by systemd but has no file in /etc/systemd/system (a "
                        "runtime, transient or generated unit): not one this role wrote" % unit)
    # The host's other instances (inference_service_instances) are declared: their resets are scoped apart.
    for other in [str(name) for name in active or [] if str(name) not in declared]:
        problems.append("%s, a unit this role wrote earlier, still runs but the inventory now declares %s: a "
                        "reset would kill its GPU workers from under it; stop it first (systemctl disable --now "
                        "%s), or declare it as inference_service_unit or in inference_service_instances"
                        % (other, unit, other))
    return problems


def inference_service_host_problems(facts, settings):
    """Sentences that refuse this host before anything is touched, [] when it may be served. `facts`
    is what the module cleanslate.gpu.inference_host returned; a fact it did not return refuses."""
    if not isinstance(settings, Mapping):
        raise TypeError("inference_service_host_problems expects the role's settings as a mapping")
    if not isinstance(facts, Mapping):
        raise TypeError("inference_service_host_problems expects the result of cleanslate.gpu.inference_host, a mapping")
    problems = []
    if _part(facts, "executable").get("usable") is not True:
        problems.append("the executable %s does not exist or is not executable (set inference_service_executable "
                        "or inference_service_venv)" % settings.get("executable"))
    if _part(facts, "user").get("exists") is not True:
        problems.append("the user %s does not exist (inference_service_user)" % settings.get("user"))
    config_dir = _part(facts, "config_dir")
    if config_dir.get("state") not in ("safe", "missing"):
        problems.append("inference_service_config_dir %s is not a directory that root owns and only root may "
                        "write: it would hold the secrets, and the role changes no existing directory (%s)"
                        % (settings.get("config_dir"), config_dir.get("problem") or "the host did not say"))
    active = facts.get("managed_active")
    problems += unit_refusals(str(settings.get("unit", "")), bool(settings.get("adopt_unit")), _part(facts, "unit"),
                              active if isinstance(active, list) else [],
                              [str(name) for name in settings.get("instance_units") or []])
    return problems


class FilterModule:
    """The inference_service role's checks of what it found on the host."""

    def filters(self):
        return {"inference_service_host_problems": inference_service_host_problems}
