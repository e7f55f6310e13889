# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference_service role's secrets against what others read: the Masker of its sentences,
and where a secret's value would be shown (the command line, the unit's environment), named
without the value. Read by the role's variable check (filter inference_service_problems, before
any host contact) and by the inference_args action (on the command line it built).

The command line is compared item by item, raw and as JSON escapes a value, never as the
shell-quoted line: there a quote in a secret (sk'X is written 'sk'"'"'X') would hide it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker, secret_values

# A character that ends a line (of the secrets file, of a path the role writes) or moves the terminal.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Shorter, a secret is guessed in a moment, turns up inside ordinary text (a one-character key is in
# "8000" and in "serve"), and a sentence saying where it turned up would all but show it.
SECRET_MIN_CHARS = 8


def short_secret_problems(named: list) -> list:
    """A sentence for each secret shorter than SECRET_MIN_CHARS: refused whole, never compared (a
    sentence saying where a short one turned up would narrow it down)."""
    return ["inference_service_secrets.%s is shorter than %d characters: it can be guessed, and it would turn up "
            "inside ordinary text; use a longer secret." % (name, SECRET_MIN_CHARS)
            for name, value in named if len(value) < SECRET_MIN_CHARS]


def secret_masker(secrets):
    """A Masker of every value of the role's secrets mapping, in every form a program prints it. One
    shorter than SECRET_MIN_CHARS is refused before anything runs, and not masked in that refusal:
    it would turn every letter it matches in the sentences to stars."""
    return Masker([value for dummy, value in secret_values(secrets if isinstance(secrets, Mapping) else {})
                   if len(value) >= SECRET_MIN_CHARS])


def forms(value: str) -> set:
    """The value as the command line may hold it: raw, and as JSON writes it inside a string
    (--speculative-config: quotes, backslashes and non-ASCII escaped)."""
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}


def _argument(argv: list, index: int, secrets: list, flag_variables: Mapping) -> str:
    """Which argument argv[index] is, in words that show no secret."""
    if index == 0:
        return "the executable (inference_service_executable or inference_service_venv)"
    if index == 2 and argv[1] == "serve" and not argv[2].startswith("-"):
        return "argument 2, the model (inference_service_model)"
    previous = argv[index - 1].split("=", 1)[0]
    option = argv[index].split("=", 1)[0] if argv[index].startswith("--") and "=" in argv[index] else None
    flag = option or (previous if previous.startswith("-") else None)
    if flag is None or any(form in flag for _name, value in secrets for form in forms(value)):
        return "argument %d" % index
    # The role's own flags by the variable that sets them (inference_args' flag_variables); any other
    # came from the extra arguments.
    variable = flag_variables.get(flag, "inference_service_extra_args")
    return "argument %d, the value of %s (%s)" % (index, flag, variable)


def inference_service_secret_problems(secrets, args):
    """Where a secret's value would be read by others, one sentence per problem, each naming
    the secret and the place, never the value: a secret holding a control character (it would
    end its line in the secrets file); a secret inside an argument of the command line (every
    user of the host reads it in /proc, and the unit file is world-readable), compared raw and
    as JSON escapes it; a secret inside a value of inference_service_environment (the unit
    file, and --diff). `args` is the result of cleanslate.gpu.inference_args."""
    if not isinstance(secrets, Mapping) or not isinstance(args, Mapping):
        raise TypeError("inference_service_secret_problems expects the secrets mapping and the inference_args result, "
                        "got %s and %s" % (type(secrets).__name__, type(args).__name__))
    named = secret_values(secrets)
    argv = [str(item) for item in args.get("argv") or []]
    environment = args.get("environment") if isinstance(args.get("environment"), Mapping) else {}
    flag_variables = args.get("flag_variables") if isinstance(args.get("flag_variables"), Mapping) else {}
    problems = short_secret_problems(named)
    for name, value in named:
        if name in ("api_key", "admin_api_key") and not value.isascii():
            # An HTTP header carries no other text: no client could ever use the key.
            problems.append("inference_service_secrets.%s holds a character outside ASCII, which no HTTP "
                            "Authorization header can carry." % name)
        if CONTROL.search(value):
            problems.append("inference_service_secrets.%s holds a control character, which would end its line in "
                            "the secrets file." % name)
        if len(value) < SECRET_MIN_CHARS:
            continue  # refused whole above
        written = forms(value)
        for index, item in enumerate(argv):
            if any(form in item for form in written):
                problems.append("inference_service_secrets.%s is in the command line (%s), which every user of the "
                                "host reads in /proc and in the unit file: change the secret or that argument."
                                % (name, _argument(argv, index, named, flag_variables)))
        for variable, text in sorted(environment.items()):
            if value in str(text):
                problems.append("inference_service_environment.%s holds the value of inference_service_secrets.%s: "
                                "the unit file and --diff show it to every user; move it to "
                                "inference_service_secrets.environment." % (variable, name))
    return problems
