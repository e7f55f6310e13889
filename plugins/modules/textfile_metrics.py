#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: textfile_metrics
short_description: Write a metrics file for node_exporter's textfile collector, atomically
version_added: 0.2.0
description:
  - Writes O(families) as one file C(<path>/<name>.prom) in the Prometheus text format, for node_exporter's
    textfile collector (C(--collector.textfile.directory)).
  - The file appears whole or not at all. It is written under a temporary name in the same directory that
    does not end in C(.prom) (the collector reads only C(*.prom)), synced to disk, then renamed over the old
    file. Ansible's own copy and template fall back to a temporary name that ends in the destination's
    name, which the collector would read half-written.
  - A write killed between write and rename leaves its temporary file behind. Each write first removes this
    file's own leftover temporaries (the name carries the writer's pid and start time) whose writer no longer
    runs or that are older than an hour; a concurrent writer's temporary and any other file are left alone.
  - No sample carries a timestamp (the collector skips a whole file that has one). HELP texts and label
    values are escaped as the format says (backslash, double quote, newline); a byte that is not UTF-8 is
    written as C(\xNN).
  - A family with O(families[].keep_previous=true) keeps its samples from the file this module wrote last
    time when that file has any, and takes the samples given here only otherwise. The roles use it for the
    time of the last success, which a failed run must not lose.
  - When O(path) does not exist, nothing is written, RV(written) is false and a warning says so, and why
    (node_exporter's package creates the directory; a host without it has no collector to read the file).
  - With O(files), several such files are written in one task and one host contact, each as above and each on its
    own. A file that cannot be written leaves the others written, and the task fails after the last one, naming it.
  - The roles C(cleanslate.gpu.node_reset) and C(cleanslate.gpu.inference_service) call it with the families
    of the filter C(cleanslate.gpu.metric_families); docs/observability.md lists the metrics. The playbook
    C(reset_and_serve.yml) writes every file of its run at its end, with O(files).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details:
      - Nothing is written; C(changed) says whether the file would change.
  diff_mode:
    support: full
    details:
      - The file's text before and after.
options:
  path:
    description:
      - The collector's directory, an absolute path.
    type: path
    default: /var/lib/prometheus/node-exporter
  name:
    description:
      - The file's name without C(.prom), made of letters, digits, C(_), C(.), C(@), C(:) and C(-), not starting with a dot.
    type: str
  families:
    description:
      - The metric families, in the order they are written. With O(name), required; O(files) takes neither.
    type: list
    elements: dict
    suboptions:
      name:
        description: The metric name.
        type: str
        required: true
      help:
        description: The HELP text.
        type: str
      type:
        description: The metric type.
        type: str
        choices: [gauge, counter, untyped]
        default: gauge
      samples:
        description:
          - The samples, each C({labels, value}). C(value) is a number, or V(now) for the host's clock in seconds
            since the epoch. A label with an empty value is left out, as Prometheus treats it.
        type: list
        elements: dict
        default: []
      keep_previous:
        description: Keep this family's samples from the previous file when it has any.
        type: bool
        default: false
  mode:
    description:
      - The file's permissions, octal. The collector's user (C(prometheus) on Debian) must be able to read it.
    type: str
    default: "0644"
  files:
    description:
      - Several files, each C({path, name, families, mode}) as the options of the same names (O(path) and O(mode) have
        the same defaults), written in the order given. Not with O(name) or O(families).
    type: list
    elements: dict
notes:
  - The file names no host. node_exporter's own C(instance) label says which host it came from, and the roles
    add a C(host) label with the inventory name.
seealso:
  - name: node_exporter's textfile collector
    description: The collector's documentation.
    link: https://github.com/prometheus/node_exporter#textfile-collector
"""

EXAMPLES = r"""
- name: Write the time of the last backup for node_exporter
  cleanslate.gpu.textfile_metrics:
    name: backup
    families:
      - name: backup_last_run_timestamp_seconds
        help: When the last backup ran.
        samples:
          - labels: {host: "{{ inventory_hostname }}"}
            value: now

- name: Write two files in one host contact
  cleanslate.gpu.textfile_metrics:
    files:
      - name: backup
        families: [{name: backup_last_run_timestamp_seconds, samples: [{value: now}]}]
      - name: restore
        families: [{name: restore_last_run_timestamp_seconds, samples: [{value: now}]}]

- name: Write node_reset's metrics, as the role does
  cleanslate.gpu.textfile_metrics:
    name: "{{ __metrics.name }}"
    families: "{{ __metrics.families }}"
  vars:
    __metrics: "{{ node_reset_result | cleanslate.gpu.metric_families(role='node_reset', host=inventory_hostname) }}"
"""

RETURN = r"""
path:
  description: The file's path.
  returned: with O(name)
  type: str
  sample: /var/lib/prometheus/node-exporter/cleanslate_gpu_node_reset.prom
written:
  description: Whether the file was written (false in check mode, when nothing changed, or when O(path) does not exist).
  returned: always
  type: bool
  sample: true
content:
  description: The file's text as written (or as it would be written in check mode).
  returned: when O(path) exists
  type: str
  sample: "# HELP cleanslate_gpu_run_ok Whether the last run ended ok (1) or not (0).\n..."
kept_previous:
  description: The families whose samples came from the previous file.
  returned: when O(path) exists
  type: list
  elements: str
  sample: [cleanslate_gpu_last_success_timestamp_seconds]
removed_temporaries:
  description:
    - The temporary files of this metrics file that an earlier write left when it was killed between write and rename, removed
      before this write.
    - Only this file's temporaries (C(.NAME.prom.PID-STARTTIME.XXXXXXXX.tmp)) whose writer no longer runs or that are older than an hour.
  returned: when the file was written
  type: list
  elements: str
  sample: [.cleanslate_gpu_node_reset.prom.4242-918273.k3j2h1g0.tmp]
files:
  description:
    - With O(files), what each file's write returned (the keys above, C(changed), and C(msg) for a file that was not
      written), in the order given.
  returned: with O(files)
  type: list
  elements: dict
  sample: [{path: /var/lib/prometheus/node-exporter/cleanslate_gpu_node_reset.prom, written: true, changed: true}]
"""

import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.cleanslate.gpu.plugins.module_utils._textfile import TextfileError, parse, render, write_atomically

FILE_NAME = re.compile(r"[A-Za-z0-9_@:-][A-Za-z0-9_.@:-]{0,199}\Z")
MODE = re.compile(r"0?[0-7]{3}\Z")

# The one sentence of a missing directory; it names no host, so Ansible prints it once for a fleet.
NO_DIRECTORY = ("no metrics file was written: %s does not exist, so no node_exporter textfile collector reads it "
                "(node_reset_metrics_dir and inference_service_metrics_dir name the collector's "
                "--collector.textfile.directory; node_reset_metrics and inference_service_metrics false write none)")


def _value(metric, value, now):
    if isinstance(value, str):
        if value == "now":
            return now
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TextfileError("families: a sample of %s has value %r; it must be a number or 'now'" % (metric, value))
    return value


def families_to_write(families, previous, now):
    """The families with their values resolved; a keep_previous family takes the previous file's
    samples when there are any. Returns (families, names kept from the previous file)."""
    result, kept = [], []
    for family in families:
        name = family["name"]
        samples = family.get("samples") or []
        if family.get("keep_previous") and previous.get(name):
            samples, kept = previous[name], kept + [name]
        resolved = []
        for sample in samples:
            if not isinstance(sample, dict) or "value" not in sample:
                raise TextfileError("families: each sample of %s must be a dictionary with a value" % name)
            labels = sample.get("labels") or {}
            if not isinstance(labels, dict):
                raise TextfileError("families: the labels of a sample of %s must be a dictionary" % name)
            resolved.append({"labels": labels, "value": _value(name, sample["value"], now)})
        result.append(dict(family, samples=resolved))
    return result, kept


FAMILY_OPTIONS = dict(
    name=dict(type="str", required=True),
    help=dict(type="str"),
    type=dict(type="str", choices=["gauge", "counter", "untyped"], default="gauge"),
    samples=dict(type="list", elements="dict", default=[]),
    keep_previous=dict(type="bool", default=False),
)
FILE_OPTIONS = dict(
    path=dict(type="path", default="/var/lib/prometheus/node-exporter"),
    name=dict(type="str", required=True),
    families=dict(type="list", elements="dict", required=True, options=FAMILY_OPTIONS),
    mode=dict(type="str", default="0644"),
)


class Unwritten(Exception):
    """A file that was not written: the sentence, and what is known of the file."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result


def write_file(module, spec) -> dict:
    """One file: its result as the module returns it (its diff under `diff`); Unwritten when it cannot be."""
    directory, name = spec["path"], spec["name"]
    if not directory or not os.path.isabs(directory):
        raise Unwritten("path must be an absolute directory, got %r" % directory)
    if not FILE_NAME.match(name or ""):
        raise Unwritten("name must be 1 to 200 letters, digits or _ . @ : - and not start with a dot, got %r" % name)
    if not MODE.match(spec["mode"] or ""):
        raise Unwritten("mode must be octal permissions such as 0644, got %r" % spec["mode"])
    target = os.path.join(directory, name + ".prom")
    if not os.path.isdir(directory):
        # A warning, not only msg (which a task that is ok never prints): the run says its metrics went nowhere.
        missing = NO_DIRECTORY % directory
        module.warn(missing)
        return dict(changed=False, written=False, path=target, msg=missing)
    try:
        with open(target, "rb") as handle:
            before = handle.read().decode("utf-8", "backslashreplace")
    except FileNotFoundError:
        before = ""
    except OSError as exc:
        raise Unwritten("cannot read the previous %s: %s" % (target, exc.strerror), path=target) from exc
    try:
        families, kept = families_to_write(spec["families"], parse(before), round(time.time(), 3))
        content = render(families)
    except TextfileError as exc:
        raise Unwritten(str(exc), path=target) from exc
    changed = content != before
    result = dict(changed=changed, written=False, path=target, content=content, kept_previous=kept)
    if module._diff:
        result["diff"] = {"before": before, "after": content, "before_header": target, "after_header": target}
    if changed and not module.check_mode:
        try:
            result["removed_temporaries"] = write_atomically(directory, name + ".prom", content, int(spec["mode"], 8))
        except OSError as exc:
            raise Unwritten("cannot write %s: %s" % (target, exc.strerror or exc), path=target) from exc
        result["written"] = True
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            FILE_OPTIONS,
            name=dict(type="str"),
            families=dict(type="list", elements="dict", options=FAMILY_OPTIONS),
            # Each entry is checked against FILE_OPTIONS below: the options of the same names, documented once.
            files=dict(type="list", elements="dict"),
        ),
        required_one_of=[("name", "files")],
        mutually_exclusive=[("name", "files"), ("families", "files")],
        required_together=[("name", "families")],
        supports_check_mode=True,
    )
    if module.params["files"] is None:
        try:
            module.exit_json(**write_file(module, module.params))
        except Unwritten as exc:
            module.fail_json(msg=str(exc), **exc.result)
    results, unwritten, specs = [], [], []
    for index, entry in enumerate(module.params["files"]):
        checked = ArgumentSpecValidator(FILE_OPTIONS).validate(entry)
        if checked.error_messages:
            module.fail_json(msg="files[%d]: %s" % (index, "; ".join(checked.error_messages)))
        specs.append(checked.validated_parameters)
    for spec in specs:
        try:
            results.append(write_file(module, spec))
        except Unwritten as exc:
            results.append(dict(exc.result, changed=False, written=False, failed=True, msg=str(exc)))
            unwritten.append(str(exc))
    answer = dict(changed=any(result["changed"] for result in results),
                  files=[{key: value for key, value in result.items() if key != "diff"} for result in results])
    if module._diff:
        answer["diff"] = [result["diff"] for result in results if "diff" in result]
    if unwritten:
        module.fail_json(msg="; ".join(unwritten), **answer)
    module.exit_json(**answer)


if __name__ == "__main__":
    main()
