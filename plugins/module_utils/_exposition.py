# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Prometheus text exposition format (0.0.4), read strictly, in pure Python for the hosts
(they get no new package). Private to this collection.

Written for an answer nobody vouches for (an engine's /metrics): a label value is a quoted
string with the escapes \\\\, \\" and \\n, read to its closing quote, so that no character inside
it (a brace, a quote, a Unicode space, a digit) can end it or start a value; blanks between tokens
are a space or a tab, nothing else that Python calls a space; lines end at a line feed only (not
at U+2028 or the other breaks of str.splitlines). A text that breaks the format anywhere is
refused whole, with the line number and what is wrong: skipping a line could drop one of the
samples a sum or a ratio needs, and a figure from the rest would be made up. For the same
reason a text must end with a line feed (one cut short mid-line could end in a shorter number),
and a series given twice is refused (a counter repeated would count twice).
"""

from __future__ import annotations

import re
from collections import namedtuple

Sample = namedtuple("Sample", "name labels value timestamp_ms")

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
BLANKS = re.compile(r"[ \t]*")
# A quoted label value, unrolled so that matching is linear in its length.
LABEL_VALUE = re.compile(r'"([^"\\\n]*(?:\\[\\"n][^"\\\n]*)*)"')
# Go's strconv.ParseFloat, which Prometheus uses, less its hexadecimal and underscore forms.
VALUE = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?"
                   r"|[nN][aA][nN])\Z")
TIMESTAMP = re.compile(r"-?[0-9]{1,19}\Z")
TOKEN = re.compile(r"[^ \t]+")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
LABEL_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
HELP_ESCAPE = re.compile(r"\\(.?)")
DEFAULT_MAX_SAMPLES = 100000


class ExpositionError(ValueError):
    """The text is not the exposition format; the message says where and what, without quoting
    the text (it is someone else's)."""


def _unescape(value):
    return re.sub(r'\\[\\"n]', lambda match: LABEL_ESCAPES[match.group(0)], value)


def _labels(line, pos):
    """({name: value}, position after the closing brace) of the label set opening at line[pos]."""
    labels = {}
    pos = BLANKS.match(line, pos + 1).end()
    while not line.startswith("}", pos):
        name = LABEL_NAME.match(line, pos)
        if not name:
            raise ExpositionError("a label name is expected at column %d" % (pos + 1))
        pos = BLANKS.match(line, name.end()).end()
        if not line.startswith("=", pos):
            raise ExpositionError("label %s has no = after it" % name.group(0))
        pos = BLANKS.match(line, pos + 1).end()
        value = LABEL_VALUE.match(line, pos)
        if not value:
            raise ExpositionError("label %s has no quoted value, or its value is not closed or has an escape "
                                  "other than \\\\, \\\" and \\n" % name.group(0))
        if name.group(0) in labels:
            raise ExpositionError("label %s is given twice" % name.group(0))
        labels[name.group(0)] = _unescape(value.group(1))
        pos = BLANKS.match(line, value.end()).end()
        if line.startswith(",", pos):
            pos = BLANKS.match(line, pos + 1).end()
        elif not line.startswith("}", pos):
            raise ExpositionError("label %s is followed by neither , nor }" % name.group(0))
    return labels, pos + 1


def _sample(line):
    name = METRIC_NAME.match(line)
    if not name:
        raise ExpositionError("a metric name is expected")
    labels, pos = {}, name.end()
    if line.startswith("{", pos):
        labels, pos = _labels(line, pos)
    rest = line[pos:]
    if rest[:1] not in (" ", "\t"):
        raise ExpositionError("metric %s is not followed by a blank and a value" % name.group(0))
    tokens = TOKEN.findall(rest)
    if not tokens or len(tokens) > 2 or not VALUE.match(tokens[0]):
        raise ExpositionError("metric %s has no number for its value, or more than a value and a timestamp after it"
                              % name.group(0))
    if len(tokens) == 2 and not TIMESTAMP.match(tokens[1]):
        raise ExpositionError("metric %s has a timestamp that is not an integer of milliseconds" % name.group(0))
    return Sample(name.group(0), labels, float(tokens[0]), int(tokens[1]) if len(tokens) == 2 else None)


def _comment(line, metadata):
    """Check a # HELP or # TYPE line and record it in metadata; any other # line is a comment."""
    tokens = re.split(r"[ \t]+", line.lstrip(" \t")[1:].strip(" \t"), maxsplit=2)
    if tokens[0] not in ("HELP", "TYPE"):
        return
    if len(tokens) < 2 or not METRIC_NAME.fullmatch(tokens[1]):
        raise ExpositionError("a # %s line without a metric name" % tokens[0])
    entry = metadata.setdefault(tokens[1], {})
    if tokens[0].lower() in entry:
        raise ExpositionError("a second # %s line for metric %s" % (tokens[0], tokens[1]))
    text = tokens[2] if len(tokens) > 2 else ""
    if tokens[0] == "TYPE":
        if text not in TYPES:
            raise ExpositionError("metric %s has a # TYPE that is none of %s" % (tokens[1], ", ".join(TYPES)))
        entry["type"] = text
    else:
        if any(escape.group(1) not in ("\\", "n") for escape in HELP_ESCAPE.finditer(text)):
            raise ExpositionError("metric %s has a # HELP with an escape other than \\\\ and \\n" % tokens[1])
        entry["help"] = HELP_ESCAPE.sub(lambda match: "\n" if match.group(1) == "n" else "\\", text)


def parse(body, max_samples=DEFAULT_MAX_SAMPLES):
    """(samples, metadata) of an exposition text (str, or bytes that must be UTF-8): samples a list
    of Sample(name, labels, value, timestamp_ms) in the text's order, metadata {metric name: {"type",
    "help"}} from its # TYPE and # HELP lines. Raises ExpositionError for a text that breaks the
    format anywhere, or that holds more than max_samples samples."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExpositionError("byte %d is not UTF-8" % (exc.start + 1)) from None
    if body and not body.endswith("\n"):
        raise ExpositionError("the text does not end with a line feed (cut short?)")
    samples, metadata, series = [], {}, set()
    for number, line in enumerate(body.split("\n")[:-1], 1):
        try:
            stripped = line.lstrip(" \t")
            if not stripped:
                continue
            if stripped.startswith("#"):
                _comment(line, metadata)
                continue
            sample = _sample(stripped)
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in series:
                raise ExpositionError("metric %s is given twice with the same labels" % sample.name)
            series.add(key)
            if len(samples) >= max_samples:
                raise ExpositionError("more than %d samples" % max_samples)
            samples.append(sample)
        except ExpositionError as exc:
            raise ExpositionError("line %d: %s" % (number, exc)) from None
    return samples, metadata
