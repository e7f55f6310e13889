# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which checks a server's command line got, and the engine's verdict as the role says it (issue 37).
Private to this collection.

Two checks, in order: the flag data's on the controller (inference_args: `passed`, `no data` for a
version without data, whose command line is built unchecked, or `refused`), then the engine's own on
the host (inference_dry_run: `passed`, `refused`, or `not run: why`). Read by the role's validation
(the filter inference_service_engine_problem: what refuses the host) and its result
(inference_service_result's `checks`), so the two never disagree."""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import ENGINES


def _mapping(value) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def flag_data_check(args) -> str:
    """The flag data's check: `passed`, `no data`, `refused`, or `not run` (validation stopped before it)."""
    args = _mapping(args)
    if args.get("failed"):
        return "refused"
    return str(args.get("flag_data") or ("passed" if args.get("argv") else "not run"))


def engine_check(dry_run, args) -> str:
    """The engine's own check: `passed`, `refused`, or `not run: why`."""
    dry_run = _mapping(dry_run)
    if dry_run.get("ran") is True:
        return "passed" if dry_run.get("ok") is True else "refused"
    if "ran" in dry_run:
        return "not run: %s" % (dry_run.get("why_not_run") or "no reason given")
    if dry_run.get("unreachable"):
        return "not run: the host does not answer"
    if dry_run.get("skipped"):
        if "inference_service_user" in str(dry_run.get("false_condition") or ""):
            return ("not run: the server runs as root (inference_service_user is empty) and the engine's code never "
                    "runs as root for a check")
        return "not run: inference_service_engine_dry_run is false"
    if flag_data_check(args) == "refused":
        return "not run: the flag data refused the command line"
    return "not run: validation stopped before it"


def checks(dry_run, args) -> dict:
    """The result's `checks`: {flag_data: ..., engine: ...}."""
    return {"flag_data": flag_data_check(args), "engine": engine_check(dry_run, args)}


def engine_problem(dry_run, args) -> str:
    """Why the engine's check refuses the host, one sentence; "" when it does not. A refusal is the
    engine's own words; a check that could not run refuses only a version without flag data, which
    nothing else checked."""
    dry_run, args = _mapping(dry_run), _mapping(args)
    label = "%s %s" % (ENGINES.get(args.get("engine"), {}).get("label", args.get("engine") or "the engine"),
                       args.get("engine_version") or "")
    verdict = engine_check(dry_run, args)
    if verdict == "refused":
        return "%s refuses the configuration, in its own words: %s" % (label.strip(), dry_run.get("refusal") or "?")
    if verdict.startswith("not run: ") and flag_data_check(args) == "no data":
        return ("%s has no flag data and its own check could not run (%s): nothing checked the command line; "
                "fix the check or give a version with flag data" % (label.strip(), verdict[len("not run: "):]))
    return ""
