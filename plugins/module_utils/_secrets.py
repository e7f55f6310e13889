# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Secrets hidden in every form a program prints them. Private to this collection.

Ansible hides a no_log value only where it appears as it is. Engines print keys otherwise:
SGLang logs `server_args=ServerArgs(..., api_key='...')`, a Python repr, which escapes quotes
and backslashes; an error body carries JSON escaping; a command line in a log is shell-quoted;
a URL percent-encodes. A Masker replaces each of these forms (and each quoted once more, as a
repr of a line that held a repr) with the marker Ansible uses.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from urllib.parse import quote, quote_plus

MARK = "********"
_SHELL_SPECIAL = re.compile(r"([^\w./,:@%+=-])")  # what printf %q and a shell backslash-escape


def _forms(secret):
    """The ways a program may print the secret, the secret itself included."""
    escaped = secret.replace("\\", "\\\\")
    first = {
        secret,
        repr(secret)[1:-1],
        escaped.replace("'", "\\'"),  # inside '...' of a repr that had to escape them
        escaped.replace('"', '\\"'),  # inside "..."
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        shlex.quote(secret),
        "".join("\\" + char if char in '\\$`"' else char for char in secret),  # inside shell "..."
        _SHELL_SPECIAL.sub(r"\\\1", secret),
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
    }
    again = {text for form in first for text in (repr(form)[1:-1], json.dumps(form)[1:-1])}
    return first | again


def _pattern(form):
    """A form as a regular expression; percent-escapes match in either case (%2f or %2F)."""
    pieces = re.split(r"(%[0-9A-F]{2})", form)
    return "".join("%[" + piece[1] + piece[1].lower() + "][" + piece[2] + piece[2].lower() + "]"
                   if re.match(r"%[0-9A-F]{2}$", piece) else re.escape(piece) for piece in pieces)


class Masker:
    """Call it on a string, list or dict: a copy with every form of every secret replaced by MARK."""

    def __init__(self, secrets):
        forms = {form for secret in secrets if secret for form in _forms(secret)}
        # Longest first: where forms overlap, the whole of the longer one goes.
        self._found = re.compile("|".join(_pattern(form) for form in sorted(forms, key=len, reverse=True))) \
            if forms else None

    def __call__(self, value):
        if self._found is None:
            return value
        if isinstance(value, str):
            return self._found.sub(MARK, value)
        if isinstance(value, dict):
            return {key: self(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self(item) for item in value]
        return value


def secret_values(secrets) -> list:
    """[(its name in the role's variables, value)] of every secret a `secrets` mapping of the
    inference_service role (inference_service_secrets, an instance's `secrets`) sets; [] for
    anything that is not a mapping."""
    if not isinstance(secrets, Mapping):
        return []
    named = [(key, secrets.get(key)) for key in ("api_key", "hf_token", "admin_api_key")]
    environment = secrets.get("environment")
    if isinstance(environment, Mapping):
        named += [("environment.%s" % name, value) for name, value in environment.items()]
    # YAML reads an all-digit secret as a number; a mapping or list here was refused by the type check.
    return [(name, str(value)) for name, value in named
            if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value) != ""]


# What names a secret in a command line any program may have (a process a reset stops is not
# necessarily one this collection started, so its secrets are not known by value): a flag or an
# environment assignment one of whose words is one of these (--api-key, --hf-token, HF_TOKEN=,
# --password), never a longer word (--tokenizer, --max-num-batched-tokens are no secrets).
SECRET_WORDS = frozenset(("key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials",
                          "auth"))
_NAME_WORDS = re.compile(r"[a-z0-9]+")
_ASSIGNMENT = re.compile(r"(-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(.+)", re.DOTALL)
_BEARER = re.compile(r"\b(?:Bearer|Basic)\s+(\S+)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"://[^/\s:@]*:([^/\s@]+)@")


def _names_secret(name) -> bool:
    return bool(SECRET_WORDS.intersection(_NAME_WORDS.findall(name.lower())))


def argument_secrets(argv) -> list:
    """The secret values an argument vector carries: the value of a flag that names a secret
    (`--api-key K`, `--api-key=K`), of such an environment assignment (`HF_TOKEN=K`), a bearer
    token, a URL's password. A flag's value is the next argument unless that is a flag itself."""
    found = []
    for at, arg in enumerate(argv):
        assignment = _ASSIGNMENT.match(arg)
        if assignment and _names_secret(assignment.group(1)):
            found.append(assignment.group(2))
        elif arg.startswith("-") and _names_secret(arg) and at + 1 < len(argv) and not argv[at + 1].startswith("--"):
            found.append(argv[at + 1])
        found += _BEARER.findall(arg) + _URL_PASSWORD.findall(arg)
    return [value for value in found if value]


def masked_command_line(argv) -> str:
    """The arguments joined by spaces, every form of every secret they carry (argument_secrets)
    replaced by MARK, wherever it appears in the line (a key given twice, or inside a URL)."""
    return Masker(argument_secrets(argv))(" ".join(argv))
