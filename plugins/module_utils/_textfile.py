# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""node_exporter's textfile format, in pure Python for the hosts (they get no new package).
Private to this collection.

The collector reads every `*.prom` file of its directory at each scrape and drops a whole file
that does not parse or that carries a client-side timestamp, so the text is rendered here
(Prometheus text format 0.0.4: escaped HELP and label values, no timestamps) and written under a
temporary name that does not end in `.prom`, synced, then renamed over the old file: the
collector sees the old file or the new one, never a half-written one. Ansible's copy and template
fall back to a temporary name that ends in the destination's basename, which the collector reads.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time

from ansible_collections.cleanslate.gpu.plugins.module_utils._procs import alive, read_stat
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TYPES = ("gauge", "counter", "untyped")
# The text format's escapes, by the character escaped.
LABEL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
HELP_ESCAPES = {"\\": "\\\\", "\n": "\\n"}
SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)[ \t]*\Z')
LABEL_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|\Z)')
UNESCAPE = re.compile(r"\\(.)")
# A temporary file older than this is left over whoever wrote it: a write takes well under a second.
STALE_AFTER_S = 3600


class TextfileError(ValueError):
    """A family or sample that the format cannot carry; the message is one sentence."""


def _escaped(text, escapes) -> str:
    # A label value is UTF-8 in the format: a byte that is not (a unit name read from the host)
    # is written as \xNN, the collection's one spelling of such bytes.
    return "".join(escapes.get(char, char) for char in printable(text))


def format_value(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TextfileError("a sample's value must be a number, got %r" % (value,))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 2 ** 53:
        return "%d" % value
    return repr(float(value))


def render(families) -> str:
    """The text of `families`: [{name, help, type, samples: [{labels: {..}, value}]}], in order.
    A family without samples is left out (the collector refuses a TYPE line with no sample
    after it only in later versions; none is simpler)."""
    lines = []
    seen = set()
    for family in families:
        name = family["name"]
        if not METRIC_NAME.match(name):
            raise TextfileError("metric name %r is not a Prometheus metric name" % name)
        if name in seen:
            raise TextfileError("metric %s is given twice; a family is one entry with all its samples" % name)
        seen.add(name)
        kind = family.get("type") or "gauge"
        if kind not in TYPES:
            raise TextfileError("metric %s has type %r; it must be one of %s" % (name, kind, ", ".join(TYPES)))
        samples = family.get("samples") or []
        if not samples:
            continue
        lines.append("# HELP %s %s" % (name, _escaped(family.get("help") or name, HELP_ESCAPES)))
        lines.append("# TYPE %s %s" % (name, kind))
        series = set()
        for sample in samples:
            labels = sample.get("labels") or {}
            for label in labels:
                if not LABEL_NAME.match(str(label)) or str(label).startswith("__"):
                    raise TextfileError("metric %s has label name %r, which is not a Prometheus label name" % (name, label))
            pairs = ",".join('%s="%s"' % (label, _escaped(str(value), LABEL_ESCAPES))
                             for label, value in sorted(labels.items()) if str(value) != "")
            if pairs in series:
                raise TextfileError("metric %s has two samples with the labels {%s}" % (name, pairs))
            series.add(pairs)
            lines.append("%s%s %s" % (name, "{%s}" % pairs if pairs else "", format_value(sample["value"])))
    return "".join(line + "\n" for line in lines)


def _number(text: str) -> float:
    return float({"+Inf": "inf", "-Inf": "-inf"}.get(text, text))


def parse(text: str) -> dict:
    """The samples of a file this module wrote: {metric name: [{labels, value}]}. A line that is
    not a sample (a comment, or a line some other writer broke) is skipped."""
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name, body, value = match.groups()
        labels, rest = {}, body or ""
        while rest.strip():
            pair = LABEL_PAIR.match(rest)
            if not pair:
                labels = None
                break
            labels[pair.group(1)] = UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), pair.group(2))
            rest = rest[pair.end():]
        try:
            number = _number(value)
        except ValueError:
            continue
        if labels is not None:
            samples.setdefault(name, []).append({"labels": labels, "value": number})
    return samples


def _temporary_name(filename: str):
    """The pattern of `filename`'s temporaries: .FILENAME.PID-STARTTIME.XXXXXXXX.tmp (mkstemp's
    eight characters); the writer's pid and start time say whether it still runs."""
    return re.compile(r"\.%s\.(\d+)-(\d+)\.[a-z0-9_]{8}\.tmp\Z" % re.escape(filename))


def remove_stale_temporaries(directory: str, filename: str, now=None) -> list:
    """Remove the temporaries of directory/filename that a crashed writer left (killed between
    write and rename): those whose writer no longer runs, or older than STALE_AFTER_S (a reused
    pid). Only names of this file's pattern; a concurrent writer's temporary is kept. Returns
    the names removed."""
    pattern, now = _temporary_name(filename), time.time() if now is None else now
    removed = []
    for entry in os.listdir(directory):
        match = pattern.match(entry)
        if not match:
            continue
        path = os.path.join(directory, entry)
        try:
            age = now - os.lstat(path).st_mtime
        except FileNotFoundError:  # its writer renamed it since the listing
            continue
        # unreadable=True: a writer whose /proc entry hides is taken as alive (the safe side).
        if age <= STALE_AFTER_S and alive(int(match.group(1)), int(match.group(2))):
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(entry)
    return sorted(removed)


def write_atomically(directory: str, filename: str, text, mode: int, uid: int = -1, gid: int = -1) -> list:
    """Write `text` (str as UTF-8, or bytes) to directory/filename through a temporary name that
    does not end in .prom (the collector's pattern) nor in .service (systemd's), owned by uid:gid
    (-1: the writer's), synced before the rename and the directory synced after it. The rename
    replaces a symbolic link at the name, never writes through it. First removes the temporaries
    a crashed earlier write left; returns their names."""
    removed = remove_stale_temporaries(directory, filename)
    stat = read_stat(os.getpid())
    fd, temporary = tempfile.mkstemp(prefix=".%s.%d-%d." % (filename, os.getpid(), stat["starttime"] if stat else 0),
                                     suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            # Owner first: a chown clears the set-id bits a mode may carry.
            if uid != -1 or gid != -1:
                os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)
            handle.write(text if isinstance(text, bytes) else text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temporary, os.path.join(directory, filename))
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
    return removed
