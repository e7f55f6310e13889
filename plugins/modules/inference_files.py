#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_files
short_description: Compare and write an inference server's unit file, its secret files and its root programs in one host contact
version_added: 0.2.0
description:
  - Compares the systemd unit file O(unit) and each of O(secret_files) (the unit's C(EnvironmentFile), SGLang's
    C(--config) file) with the texts given, and writes those that differ, each atomically (a temporary name in the
    same directory that ends in neither C(.service) nor C(.prom), synced, renamed over the old file). The role
    C(cleanslate.gpu.inference_service) renders the texts on the controller from its templates and calls this module
    once, in one host contact (the collection's C(docs/design.md), "Why tasks are few").
  - Every file is examined before any is written, so a refusal leaves every file as it was.
  - The unit file is written only when it does not exist or its first line is O(unit.marker) (the role wrote it), or
    with O(unit.adopt) (a file the role did not write, taken over; the old file is kept beside it as
    C(<unit>.<pid>.<date>~), which systemd never reads). A symbolic link, a directory or any other file that is not
    a regular file at O(unit.path) is refused (a masked unit is a link to C(/dev/null)). O(unit.content) must start
    with the marker line, so that the next run knows the file.
  - A secret file is never written through a symbolic link; a link at its path is replaced by the file. A directory,
    FIFO, socket or device at its path is refused and never opened.
  - A file whose text is the same but whose mode, owner or group differ is written again, whole.
  - The secret files' texts are never returned, shown in a diff or logged (C(no_log)); RV(secret_files) says which
    changed. The C(Invoked with) line in the host's journal names the files, never their texts.
  - O(programs) are files root runs for the unit (its pre-start cleanup, C(ExecStartPre=+)), written as the others, owned by
    root, mode C(0644), in O(programs.dir). Root never runs code from a directory another user could change, so that
    directory and each one above it must be root's and writable by root alone (the rule of the collection's
    C(plugins/module_utils/_trusted_dirs.py)); the missing ones are made, owned by root, mode C(0755). One that breaks
    the rule is refused, and nothing is written.
  - With O(unit.prepare_start), the same host contact then reads the unit's C(LoadState) and C(ActiveState)
    (C(systemctl show)) and, for a loaded unit that is not running, clears its failed state and start limit
    (C(systemctl reset-failed)). A server that crashed C(StartLimitBurst) times within C(StartLimitIntervalSec)
    would be refused by every start until its limit is cleared; the start that follows is an explicit one, not a
    crash loop. A unit that systemd unloaded has no failed state or start limit left (C(not loaded)). The role reads
    the state to choose between start, restart and leaving the server running.
  - With O(unit.start) as well, the same contact then starts the unit when it is stopped (C(inactive) or C(failed)),
    after C(systemctl daemon-reload) when its file changed, so that the start of a server after a reset costs no
    task and no host contact of its own. The servers of O(instances) are started in the same contact, after every
    server's files. It starts only a loaded unit whose C(UnitFileState) already is what O(unit.enabled)
    asks (V(enabled), or V(disabled)); any other unit (not loaded, masked, static, about to be enabled or disabled,
    running, stopping) is left as it is and RV(unit.start_left) says why, for the caller's
    M(ansible.builtin.systemd_service). A running unit is never restarted here.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details:
      - Nothing is written; RV(unit) and RV(secret_files) say what would be done and C(changed) whether anything would change.
      - With O(unit.prepare_start), the unit's state is read, and no failed state is cleared; O(unit.start) starts nothing.
  diff_mode:
    support: partial
    details:
      - The unit file's text before and after, each server's with O(instances). The secret files and the programs are
        never shown.
options:
  unit: &unit_option
    description:
      - The systemd unit file. Required for each server of O(instances); the task's own server is optional when
        O(instances) is given.
    type: dict
    suboptions:
      path:
        description: The unit file's absolute path, normally C(/etc/systemd/system/<unit>).
        type: path
        required: true
      content:
        description: The unit file's whole text, which starts with the O(unit.marker) line.
        type: str
        required: true
      marker:
        description:
          - The first line of every unit file the caller writes. An existing file whose first line differs is refused
            unless O(unit.adopt).
        type: str
        required: true
      adopt:
        description: Take over an existing unit file whose first line is not O(unit.marker), keeping the old file as a backup.
        type: bool
        default: false
      mode:
        description: The unit file's permissions, octal.
        type: str
        default: "0644"
      owner:
        description: The unit file's owner, a user name or number.
        type: str
        default: root
      group:
        description: The unit file's group, a group name or number.
        type: str
        default: root
      prepare_start:
        description:
          - After the files, read the unit's state and clear the failed state and start limit of a loaded unit that is not
            running (see the description). The unit's name is the file name of O(unit.path).
        type: bool
        default: false
      start:
        description:
          - With O(unit.prepare_start), start the unit when it is stopped and its enablement is already O(unit.enabled)
            (see the description).
        type: bool
        default: false
      enabled:
        description:
          - The enablement (C(systemctl enable)) the caller wants. O(unit.start) starts only a unit whose unit file
            already is so, and never enables or disables one.
        type: bool
        default: true
  secret_files: &secret_files_option
    description: The files that hold secrets, each written or removed.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file's absolute path. Its directory must exist.
        type: path
        required: true
      state:
        description: V(present) writes O(secret_files[].content); V(absent) removes the file (or a symbolic link at its path).
        type: str
        choices: [present, absent]
        default: present
      content:
        description: The file's whole text, required with O(secret_files[].state=present). Never logged.
        type: str
      mode:
        description: The file's permissions, octal.
        type: str
        default: "0600"
      owner:
        description: The file's owner, a user name or number.
        type: str
        default: root
      group:
        description: The file's group, a group name or number; unset, a new file gets the writer's and an existing one keeps its own.
        type: str
  programs: &programs_option
    description: Files that root runs for the unit, under one directory.
    type: dict
    suboptions:
      dir:
        description: The programs' directory, an absolute path.
        type: path
        required: true
      files:
        description:
          - Each file's path under O(programs.dir) (relative, without C(.) or C(..)), mapped to its whole text.
        type: dict
        required: true
  instances:
    description:
      - More servers of the same host whose files to write in the same host contact (the servers of one node that a
        run reset, C(inference_service_instances)), each a mapping of O(unit), O(secret_files) and O(programs), planned,
        written and started as the task's own.
      - Every server is planned before any file is written. The task's own refusal fails the task and writes nothing;
        an instance's is its answer in RV(instances) (C(failed) and C(msg)), and the others are written.
      - No two servers write the same unit or secret file. A program of the same path must have the same text in each,
        and is written once (reported by the first server that names it).
      - With O(unit.start), C(systemctl daemon-reload) runs once, after every server's files, when any started server's
        unit file changed.
    type: list
    elements: dict
    default: []
    version_added: 0.3.0
    suboptions:
      unit: *unit_option
      secret_files: *secret_files_option
      programs: *programs_option
notes:
  - A file larger than 1 MiB is never read whole; it differs from the text given, and its diff says only its size.
seealso:
  - module: ansible.builtin.template
    description: Renders one file per task, comparing it on the host in several contacts.
"""

EXAMPLES = r"""
- name: Write the unit, its environment file and its secrets, as the role inference_service does
  cleanslate.gpu.inference_files:
    unit:
      path: /etc/systemd/system/vllm.service
      content: "{{ lookup('ansible.builtin.template', 'unit.service.j2') }}"
      marker: "# Managed by Ansible (cleanslate.gpu.inference_service); local changes are overwritten."
    secret_files:
      - path: /etc/cleanslate/inference/vllm.env
        content: "{{ lookup('ansible.builtin.template', 'environment.j2') }}"
      - path: /etc/cleanslate/inference/vllm.secrets.yaml
        state: absent
    programs:
      dir: /usr/local/libexec/cleanslate-gpu
      files:
        prestart_clean.py: "{{ lookup('ansible.builtin.file', 'prestart_clean.py', rstrip=false) }}"
  register: written

- name: Reload systemd when the unit file changed
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: written.unit.changed

- name: Write two servers' files and start their stopped units, in one host contact
  cleanslate.gpu.inference_files:
    instances:
      - unit:
          path: /etc/systemd/system/vllm-a.service
          content: "{{ lookup('ansible.builtin.template', 'vllm-a.service.j2') }}"
          marker: "# Managed by Ansible (cleanslate.gpu.inference_service); local changes are overwritten."
          prepare_start: true
          start: true
        secret_files:
          - path: /etc/cleanslate/inference/vllm-a.env
            content: "{{ lookup('ansible.builtin.template', 'vllm-a.env.j2') }}"
      - unit:
          path: /etc/systemd/system/vllm-b.service
          content: "{{ lookup('ansible.builtin.template', 'vllm-b.service.j2') }}"
          marker: "# Managed by Ansible (cleanslate.gpu.inference_service); local changes are overwritten."
          prepare_start: true
          start: true
        secret_files:
          - path: /etc/cleanslate/inference/vllm-b.env
            content: "{{ lookup('ansible.builtin.template', 'vllm-b.env.j2') }}"
  register: both
"""

RETURN = r"""
unit:
  description: What was done to the unit file (or would be, in check mode).
  returned: when O(unit) is given
  type: dict
  contains:
    path:
      description: The unit file's path.
      type: str
      sample: /etc/systemd/system/vllm.service
    action:
      description:
        - V(unchanged), V(created), V(updated) (its text), V(attributes) (its mode, owner or group only) or V(adopted) (a
          file the role did not write, kept as RV(unit.backup)).
      type: str
      sample: updated
    changed:
      description: Whether the file changed (or would).
      type: bool
      sample: true
    backup:
      description: The adopted file's backup.
      type: str
      returned: when the unit was adopted, not in check mode
      sample: /etc/systemd/system/vllm.service.4242.2026-12-02@04:40:00~
    load_state:
      description: The unit's C(LoadState) after the files were written (V(not-found) for a unit systemd has not loaded yet).
      type: str
      returned: with O(unit.prepare_start)
      sample: loaded
    active_state:
      description: The unit's C(ActiveState) then, before anything was cleared.
      type: str
      returned: with O(unit.prepare_start)
      sample: failed
    unit_file_state:
      description: The unit's C(UnitFileState) then (V(enabled), V(disabled), V(static), ...; empty for a unit systemd has not loaded).
      type: str
      returned: with O(unit.prepare_start)
      sample: enabled
    cleared:
      description: Whether a failed state was cleared (it counts as a change; never in check mode).
      type: bool
      returned: with O(unit.prepare_start)
      sample: true
    started:
      description: Whether this task started the unit (it counts as a change; never in check mode).
      type: bool
      returned: with O(unit.start)
      sample: true
    start_left:
      description: Why the unit was not started here, for the caller's own start; empty when it was started.
      type: str
      returned: with O(unit.start)
      sample: "its unit file is disabled, not enabled"
instances:
  description:
    - What was done for each server of O(instances), in their order, as for the task's own (RV(unit), RV(secret_files),
      RV(programs)) with its own C(changed); or C(failed) and C(msg) for one that was refused, its files left as they
      were (or, for a write that failed, as far as it got).
  returned: always
  type: list
  elements: dict
  sample: []
secret_files:
  description: What was done to each secret file, in the order given; never their texts.
  returned: when O(unit) is given
  type: list
  elements: dict
  contains:
    path:
      description: The file's path.
      type: str
      sample: /etc/cleanslate/inference/vllm.env
    action:
      description:
        - V(unchanged), V(created), V(updated), V(attributes), V(replaced a symbolic link), V(removed), V(removed a symbolic
          link) or V(absent) (nothing to remove).
      type: str
      sample: unchanged
    changed:
      description: Whether the file changed (or would).
      type: bool
      sample: false
programs:
  description: What was done to each program file and to each directory made for them, in path order.
  returned: when O(unit) is given
  type: list
  elements: dict
  contains:
    path:
      description: The file's or directory's path.
      type: str
      sample: /usr/local/libexec/cleanslate-gpu/prestart_clean.py
    action:
      description: V(unchanged), V(created), V(updated), V(attributes), V(replaced a symbolic link) or, for a directory, V(made).
      type: str
      sample: unchanged
    changed:
      description: Whether it changed (or would).
      type: bool
      sample: false
"""

import grp
import os
import pwd
import re
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cleanslate.gpu.plugins.module_utils._textfile import write_atomically
from ansible_collections.cleanslate.gpu.plugins.module_utils._trusted_dirs import MISSING, SAFE, trusted_directory

MODE = re.compile(r"0?[0-7]{3,4}\Z")
# Bigger files are not read whole: none of the role's is near it.
MAX_READ = 1 << 20


class Refused(Exception):
    """One sentence: why a file is not written; nothing was written."""


def _id(value, table, what, option):
    """A user or group name or number, as a number."""
    text = str(value)
    if text.isdigit():
        return int(text)
    try:
        return table(text)[2]
    except (KeyError, UnicodeEncodeError):
        raise Refused("%s: there is no %s %r on this host" % (option, what, text)) from None


def _checked(spec, option, content_required, check_mode=False):
    """The file's wanted state from its options: (path, content bytes or None, mode, uid, gid or -1).
    In check mode a missing directory is no error: the role's task before this one would have made it."""
    path = spec["path"]
    if not path or not os.path.isabs(path) or "\n" in path or path.endswith("/"):
        raise Refused("%s.path must be an absolute file path on one line, got %r" % (option, path))
    if not MODE.match(spec.get("mode") or ""):
        raise Refused("%s.mode must be octal permissions such as 0600, got %r" % (option, spec.get("mode")))
    content = spec.get("content")
    if content_required and content is None:
        raise Refused("%s.content is required for %s" % (option, path))
    if content is not None:
        try:
            content = content.encode("utf-8")
        except UnicodeEncodeError:
            raise Refused("%s.content of %s is not text that UTF-8 can write" % (option, path)) from None
    if not check_mode and not os.path.isdir(os.path.dirname(path)):
        raise Refused("%s: the directory of %s does not exist" % (option, path))
    uid = _id(spec.get("owner") or "root", pwd.getpwnam, "user", option + ".owner")
    gid = _id(spec["group"], grp.getgrnam, "group", option + ".group") if spec.get("group") else -1
    return path, content, int(spec["mode"], 8), uid, gid


def _read(path):
    """(lstat, the file's first MAX_READ + 1 bytes), or (None, None) when absent. Only a regular file is
    opened (O_NOFOLLOW, O_NONBLOCK: a FIFO swapped in after the lstat never blocks the read)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(found.st_mode):
        return found, b""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino) or not stat.S_ISREG(opened.st_mode):
            raise Refused("%s changed while it was read; run again" % path)
        data = os.read(fd, MAX_READ + 1)
        chunk = data
        while chunk and len(data) <= MAX_READ:
            chunk = os.read(fd, MAX_READ + 1 - len(data))
            data += chunk
    finally:
        os.close(fd)
    return opened, data


def _kind(found) -> str:
    mode = found.st_mode
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _action(found, data, content, mode, uid, gid) -> str:
    """How an existing regular file differs from the wanted one."""
    if len(data) > MAX_READ or data != content:
        return "updated"
    if stat.S_IMODE(found.st_mode) != mode or found.st_uid != uid or (gid != -1 and found.st_gid != gid):
        return "attributes"
    return "unchanged"


def plan_unit(spec, check_mode=False):
    """What to do to the unit file: a dict with path, action, and what the write needs."""
    path, content, mode, uid, gid = _checked(spec, "unit", True, check_mode)
    marker = spec["marker"]
    if not marker or "\n" in marker:
        raise Refused("unit.marker must be one line of text, got %r" % marker)
    if content.split(b"\n", 1)[0] != marker.encode("utf-8"):
        raise Refused("unit.content for %s does not start with the unit.marker line: the next run could not tell "
                      "that it wrote the file" % path)
    found, data = _read(path)
    if found is None:
        return dict(path=path, action="created", before="", content=content, mode=mode, uid=uid, gid=gid)
    if stat.S_ISLNK(found.st_mode):
        raise Refused("%s is a symbolic link (to %s), not a unit file the role wrote: a masked unit or another "
                      "unit's file; it is left as it is" % (path, os.readlink(path)))
    if not stat.S_ISREG(found.st_mode):
        raise Refused("%s is %s, not a unit file; it is left as it is" % (path, _kind(found)))
    ours = data.split(b"\n", 1)[0] == marker.encode("utf-8")
    if not ours and not spec["adopt"]:
        raise Refused("%s exists and was not written by this role (its first line is not the marker): it is not "
                      "overwritten; set inference_service_adopt_unit: true to take it over (the old file is kept "
                      "as a backup beside it)" % path)
    action = _action(found, data, content, mode, uid, gid) if ours else "adopted"
    before = data.decode("utf-8", "backslashreplace") if len(data) <= MAX_READ else "(%d bytes, not shown)\n" % found.st_size
    return dict(path=path, action=action, before=before, content=content, mode=mode, uid=uid, gid=gid)


def plan_secret(spec, index, check_mode=False):
    """What to do to one secret file (never keeping its text in what is returned)."""
    option = "secret_files[%d]" % index
    absent = spec["state"] == "absent"
    path, content, mode, uid, gid = _checked(spec, option, not absent, check_mode)
    found, data = _read(path)
    if found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISLNK(found.st_mode):
        raise Refused("%s is %s, not a file this role wrote; it is left as it is" % (path, _kind(found)))
    link = found is not None and stat.S_ISLNK(found.st_mode)
    if absent:
        action = "absent" if found is None else ("removed a symbolic link" if link else "removed")
    elif found is None:
        action = "created"
    elif link:
        action = "replaced a symbolic link"
    else:
        action = _action(found, data, content, mode, uid, gid)
    return dict(path=path, action=action, content=content, mode=mode, uid=uid, gid=gid)


def _program_dirs(top, relative_paths):
    """The directories the programs need, parents first, each once: the missing ones above `top`
    (Debian has no /usr/local/libexec), `top`, and those between it and each file."""
    dirs = [top]
    while not os.path.lexists(os.path.dirname(dirs[0])):
        dirs.insert(0, os.path.dirname(dirs[0]))
    for relative in relative_paths:
        parts = relative.split("/")[:-1]
        for end in range(1, len(parts) + 1):
            path = os.path.join(top, *parts[:end])
            if path not in dirs:
                dirs.append(path)
    return dirs


def plan_programs(spec, check_mode=False):
    """What to do for the programs: (directories to make, file plans). A directory that another user
    could change is refused: root would run what they put there."""
    if not spec:
        return [], []
    top = spec["dir"]
    if not top or not os.path.isabs(top) or "\n" in top:
        raise Refused("programs.dir must be an absolute directory path on one line, got %r" % top)
    top = os.path.normpath(top)
    files = spec["files"]
    for relative in files:
        parts = relative.split("/") if isinstance(relative, str) else [""]
        if not relative or relative.startswith("/") or "\n" in relative or any(part in ("", ".", "..") for part in parts):
            raise Refused("programs.files: %r is not a relative file path under programs.dir (no `.`, `..` or empty "
                          "part)" % relative)
        if not isinstance(files[relative], str):
            raise Refused("programs.files: the text of %s must be a string" % relative)
    make = []
    for directory in _program_dirs(top, files):
        state, why = trusted_directory(directory)
        if state == MISSING:
            make.append(directory)
        elif state != SAFE:
            raise Refused("programs: %s: root would run code from a directory another user could change; make it "
                          "root's and writable by root alone" % why)
    plans = []
    for relative in sorted(files):
        path = os.path.join(top, relative)
        found, data = (None, None) if os.path.dirname(path) in make else _read(path)
        if found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISLNK(found.st_mode):
            raise Refused("%s is %s, not a program this role wrote; it is left as it is" % (path, _kind(found)))
        content = files[relative].encode("utf-8", "surrogateescape")
        if found is None:
            action = "created"
        elif stat.S_ISLNK(found.st_mode):
            action = "replaced a symbolic link"
        else:
            action = _action(found, data, content, 0o644, 0, 0)
        plans.append(dict(path=path, action=action, content=content, mode=0o644, uid=0, gid=0))
    return make, plans


def _make_dirs(make):
    """Make the missing program directories, root's, 0755; then each must pass the rule (a directory
    another user made in between fails it)."""
    for directory in make:
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            pass
        else:
            os.chown(directory, 0, 0)
            os.chmod(directory, 0o755)
    for directory in make:
        state, why = trusted_directory(directory)
        if state != SAFE:
            raise Refused("programs: %s: root would run code from a directory another user could change" % why)


# One server's options: the task's own, and each of `instances`.
_FILE_OPTIONS = dict(path=dict(type="path", required=True), mode=dict(type="str"),
                     owner=dict(type="str", default="root"), group=dict(type="str"))
SERVER_OPTIONS = dict(
    unit=dict(type="dict", options=dict(
        _FILE_OPTIONS, content=dict(type="str", required=True), marker=dict(type="str", required=True),
        adopt=dict(type="bool", default=False), mode=dict(type="str", default="0644"),
        group=dict(type="str", default="root"), prepare_start=dict(type="bool", default=False),
        start=dict(type="bool", default=False), enabled=dict(type="bool", default=True))),
    secret_files=dict(type="list", elements="dict", default=[], no_log=False, options=dict(
        _FILE_OPTIONS, content=dict(type="str", no_log=True), mode=dict(type="str", default="0600"),
        state=dict(type="str", choices=["present", "absent"], default="present"))),
    programs=dict(type="dict", options=dict(dir=dict(type="path", required=True),
                                            files=dict(type="dict", required=True))),
)


class _Module(AnsibleModule):
    """AnsibleModule whose "Invoked with" line in the host's journal holds no file's text.

    AnsibleModule logs secret_files as the str() of the list, in which each content's newlines are
    escaped: the no_log value is then not found in it, and every key was readable by the groups adm
    and systemd-journal. Neither of its own switches fits: the constructor's no_log is overridden
    by the task's (_ansible_no_log), and no_log on secret_files makes every string of the list a
    no_log value, so its paths, "root" and "0600" would be masked in the result and the unit's diff.
    """

    def _log_invocation(self):
        def textless(params):
            unit = {key: value for key, value in (params["unit"] or {}).items() if key != "content"}
            files = [{key: value for key, value in spec.items() if key != "content"} for spec in params["secret_files"]]
            programs = params["programs"] and dict(dir=params["programs"]["dir"], files=sorted(params["programs"]["files"]))
            return "unit=%s secret_files=%s programs=%s" % (unit, files, programs)
        own = textless(self.params) + " " if self.params["unit"] is not None else ""
        self.log("Invoked with %sinstances=[%s] (the texts not logged)" % (
            own, "; ".join(textless(params) for params in self.params["instances"])))


def _apply(module, plan):
    if plan["action"] in ("unchanged", "absent"):
        return
    if plan["action"].startswith("removed"):
        os.unlink(plan["path"])
        return
    if plan["action"] == "adopted":
        plan["backup"] = module.backup_local(plan["path"])
    directory, name = os.path.split(plan["path"])
    write_atomically(directory, name, plan["content"], plan["mode"], plan["uid"], plan["gid"])


def plan_server(params, check_mode, planned):
    """What to do for one server: {unit, secrets, make, programs}. `planned` holds what the servers before
    it in this task write ({path: a program's text, or None}): a server shares a program of theirs when its
    text is the same (written once, reported by the first), never any other file."""
    if params["unit"] is None:
        raise Refused("unit is required")
    unit = plan_unit(params["unit"], check_mode)
    secrets = [plan_secret(spec, index, check_mode) for index, spec in enumerate(params["secret_files"])]
    make, programs = plan_programs(params["programs"], check_mode)
    paths = [unit["path"]] + [plan["path"] for plan in secrets + programs]
    if len(set(paths)) != len(paths):
        raise Refused("unit and secret_files name the same path twice: %s" % ", ".join(sorted(
            {path for path in paths if paths.count(path) > 1})))
    taken = [plan for plan in [unit] + secrets if plan["path"] in planned]
    taken += [plan for plan in programs if plan["path"] in planned and planned[plan["path"]] != plan["content"]]
    if taken:
        raise Refused("%s is written for another server of this task too" % taken[0]["path"])
    return dict(unit=unit, secrets=secrets, make=[path for path in make if path not in planned],
                programs=[plan for plan in programs if plan["path"] not in planned])


def _planned(server) -> dict:
    """{path: a program's text, or None for any other file or directory} of what a server's plan writes."""
    written = {plan["path"]: None for plan in [server["unit"]] + server["secrets"]}
    written.update((path, None) for path in server["make"])
    written.update((plan["path"], plan["content"]) for plan in server["programs"])
    return written


def write_server(module, server):
    """Write one server's files: the programs and secrets first, so that a unit that names its
    EnvironmentFile or ExecStartPre program finds it written."""
    try:
        _make_dirs(server["make"])
    except OSError as exc:
        raise Refused("cannot make %s: %s" % (exc.filename, exc.strerror or exc)) from None
    for plan in server["programs"] + server["secrets"] + [server["unit"]]:
        try:
            _apply(module, plan)
        except OSError as exc:
            raise Refused("cannot write %s: %s" % (plan["path"], exc.strerror or exc)) from None


def _public_server(server) -> dict:
    """What may be returned of one server: its files' paths and actions (never a secret's text), the unit's
    state when it was read, `failed` and `msg` when it was refused."""
    if "refused" in server:
        return dict(failed=True, msg=server["refused"])
    public = dict(unit=dict(_public(server["unit"]), **server.get("state", {})),
                  secret_files=[_public(plan) for plan in server["secrets"]],
                  programs=[dict(path=path, action="made", changed=True) for path in server["make"]]
                  + [_public(plan) for plan in server["programs"]])
    state = server.get("state", {})
    public["changed"] = any(item["changed"] for item in [public["unit"]] + public["secret_files"] + public["programs"]) \
        or state.get("cleared", False) or state.get("started", False)
    return public


def _diff(plan) -> dict:
    return dict(before=plan["before"], after=plan["content"].decode("utf-8"),
                before_header=plan["path"], after_header=plan["path"])


def main():
    module = _Module(
        argument_spec=dict(SERVER_OPTIONS, instances=dict(type="list", elements="dict", default=[], options=SERVER_OPTIONS)),
        supports_check_mode=True,
    )
    if module.params["unit"] is None and not module.params["instances"]:
        module.fail_json(msg="unit, or at least one server in instances, is required: there is nothing to write")
    # The task's own server (when O(unit) is given), then each of `instances`, every one planned before any file is
    # written. The task's own refusal fails the task and writes nothing; an instance's is that instance's answer alone.
    own = module.params["unit"] is not None
    servers, planned = [], {}
    for index, params in enumerate(([module.params] if own else []) + module.params["instances"]):
        name = "instances[%d]: " % (index - own) if index >= own else ""
        try:
            server = plan_server(params, module.check_mode, planned)
            # Looked up before anything is written: a host without systemd gets its files only where it can start them.
            server["systemctl"] = _systemctl_path(module) if params["unit"]["prepare_start"] else None
        except (Refused, OSError) as exc:
            msg = str(exc) if isinstance(exc, Refused) else "cannot read %s: %s" % (exc.filename, exc.strerror or exc)
            if not name:
                module.fail_json(msg=msg)
            servers.append(dict(refused=name + msg))
            continue
        server.update(params=params, name=name)
        planned.update(_planned(server))
        servers.append(server)
    todo = [server for server in servers if "refused" not in server]

    def finish(fail=None):
        answers = [_public_server(server) for server in servers]
        result = dict(answers[0] if own else {}, instances=answers[own:])
        result["changed"] = any(answer.get("changed") for answer in answers)
        if module._diff and todo:
            diffs = [_diff(server["unit"]) for server in todo]
            result["diff"] = diffs[0] if len(servers) == 1 else diffs
        if fail is not None:
            module.fail_json(msg=fail, **result)
        module.exit_json(**result)

    def refuse(server, exc):
        """The task's own failure fails the task; an instance's is its answer."""
        if not server["name"]:
            finish(fail=str(exc))
        server["refused"] = server["name"] + str(exc)

    if not module.check_mode:
        for server in todo:
            try:
                write_server(module, server)
            except Refused as exc:
                refuse(server, exc)
    started = [server for server in todo if "refused" not in server and server["systemctl"]]
    if not module.check_mode and any(server["params"]["unit"]["start"] and server["unit"]["action"] != "unchanged"
                                     for server in started):
        # systemd reads the new files before it is asked anything about the units: once for the task.
        try:
            _systemctl_checked(module, started[0]["systemctl"], "daemon-reload", "daemon-reload")
        except Refused as exc:
            finish(fail=str(exc))
    for server in started:
        name, unit = os.path.basename(server["unit"]["path"]), server["params"]["unit"]
        try:
            state = prepare_start(module, server["systemctl"], name)
            if unit["start"]:
                state.update(start_stopped(module, server["systemctl"], name, state, unit["enabled"]))
        except Refused as exc:
            refuse(server, exc)
            continue
        server["state"] = state
    finish()


def _systemctl(module, systemctl, *args):
    """(rc, stdout, stderr) of systemctl, in the C locale (its messages are matched)."""
    return module.run_command([systemctl] + list(args), environ_update={"LC_ALL": "C", "LANG": "C"})


def _systemctl_path(module) -> str:
    systemctl = module.get_bin_path("systemctl")
    if systemctl is None:
        raise Refused("unit.prepare_start: systemctl is not on this host's PATH: the unit cannot be started here")
    return systemctl


def _systemctl_checked(module, systemctl, what, *args) -> str:
    """systemctl's output; `systemctl <what>: ` and its own sentence as the refusal when it fails."""
    rc, out, err = _systemctl(module, systemctl, *args)
    if rc != 0:
        raise Refused("systemctl %s: %s" % (what, (err or out).strip() or "exit status %d" % rc))
    return out


def prepare_start(module, systemctl, name) -> dict:
    """The unit's state, read after its files were written, and its failed state and start limit
    cleared when it is loaded and not running (never in check mode)."""
    # KEY=VALUE lines: systemctl prints the properties in its own order, not the order asked.
    out = _systemctl_checked(module, systemctl, "show " + name, "show", "--property=LoadState", "--property=ActiveState",
                             "--property=UnitFileState", "--", name)
    shown = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    if "LoadState" not in shown or "ActiveState" not in shown:
        raise Refused("systemctl show %s: %s" % (name, out.strip() or "no LoadState or ActiveState"))
    state = dict(load_state=shown["LoadState"], active_state=shown["ActiveState"], cleared=False)
    state["unit_file_state"] = shown.get("UnitFileState", "")
    if module.check_mode or state["load_state"] == "not-found" or state["active_state"] in ("active", "activating", "reloading"):
        return state
    rc, out, err = _systemctl(module, systemctl, "reset-failed", "--", name)
    if rc != 0:
        if "not loaded" in err + out:
            return state
        raise Refused("systemctl reset-failed %s: %s" % (name, (err or out).strip() or "exit status %d" % rc))
    # An inactive unit had a start limit at most to clear: only a failed state's clearing is a change.
    state["cleared"] = state["active_state"] == "failed"
    return state


def start_stopped(module, systemctl, name, state, enabled) -> dict:
    """Start the unit prepare_start read as stopped, when nothing but a start is due: any other
    case (check mode, not loaded, running or stopping, enablement to change) is the caller's."""
    wanted = "enabled" if enabled else "disabled"
    if module.check_mode:
        left = "check mode starts nothing"
    elif state["load_state"] != "loaded":
        left = "systemd has not loaded it (%s)" % state["load_state"]
    elif state["active_state"] not in ("inactive", "failed"):
        left = "it is %s" % state["active_state"]
    elif state["unit_file_state"] != wanted:
        left = "its unit file is %s, not %s" % (state["unit_file_state"] or "of no state", wanted)
    else:
        _systemctl_checked(module, systemctl, "start " + name, "start", "--", name)
        return dict(started=True, start_left="")
    return dict(started=False, start_left=left)


def _public(plan) -> dict:
    """What may be returned of a file's plan: never a secret file's text."""
    public = dict(path=plan["path"], action=plan["action"], changed=plan["action"] not in ("unchanged", "absent"))
    if plan.get("backup"):
        public["backup"] = plan["backup"]
    return public


if __name__ == "__main__":
    main()
