# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The engine's own configuration code run on a command line, nothing started. Private to this
collection.

This file is a program, not a library: the module inference_dry_run sends its text on the stdin
of the engine's own Python (as the service user), followed by one line that calls main() with the
request. It imports nothing of the collection and only the standard library before the engine.

vLLM: the exact argv parsed by the parser `vllm serve` builds (its serve subcommand's
subparser_init, on vLLM's FlexibleArgumentParser), the subcommand's own validate() (vLLM's
validate_parsed_serve_args), then AsyncEngineArgs.from_cli_args(args).create_engine_config(): the
VllmConfig, which reads the model's config.json (model, cache, scheduler, speculative and
compilation configs). No weights are loaded, no engine process, no port.
SGLang: ServerArgs from the argv (prepare_server_args, whose __post_init__ runs its checks) and
check_server_args() where it exists.

It prints one line on its standard output, MARKER followed by JSON {ok, error_type, error}: error
is the exception's own words, on one line, cut to ERROR_MAX characters; model_missing: true when the
model's files are not on the host (not a directory, not in the Hugging Face cache, downloads off),
which is no verdict on the configuration. Everything the engine
prints goes to standard error (standard output is pointed there while the engine runs), so the
marker line is the only one on standard output.
"""

from __future__ import annotations

MARKER = "CLEANSLATE_ENGINE_DRY_RUN "
ERROR_MAX = 1000
# pydantic's link line, which says where to read more, not why.
NOT_WHY = ("For further information visit",)
# Raised (or chained) when the model is neither a local directory nor in the Hugging Face cache and
# downloads are off: the check did not reach the configuration, which is not a refusal.
NOT_ON_HOST = ("LocalEntryNotFoundError", "OfflineModeIsEnabled")


class ParserError(Exception):
    """argparse refused the command line (it would print usage and exit 2)."""


def words(exc) -> str:
    """The exception's own words on one line: its lines stripped, without pydantic's links."""
    text = str(exc) or type(exc).__name__
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(NOT_WHY)]
    joined = " ".join(lines)
    return joined if len(joined) <= ERROR_MAX else joined[:ERROR_MAX - 3] + "..."


def model_missing(exc) -> bool:
    """Whether exc, or an exception it was raised from, says the model files are not on the host."""
    seen = 0
    while exc is not None and seen < 8:
        if any(type(exc).__name__ == name or name in [base.__name__ for base in type(exc).__mro__]
               for name in NOT_ON_HOST):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _parser_raises():
    import argparse

    def error(self, message):
        raise ParserError("%s: error: %s" % (self.prog, message))

    argparse.ArgumentParser.error = error


def check_vllm(argv):
    """vLLM's serve parser, its validation and its VllmConfig for argv (the words after the executable)."""
    _parser_raises()
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # before vLLM 0.11
        from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.cli import serve
    from vllm.engine.arg_utils import AsyncEngineArgs
    try:
        from vllm.usage.usage_lib import UsageContext
        usage = {"usage_context": UsageContext.OPENAI_API_SERVER}
    except ImportError:
        usage = {}
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    commands = {}
    for command in serve.cmd_init():
        command.subparser_init(subparsers)
        commands[command.name] = command
    args = parser.parse_args(list(argv))
    if args.subparser != "serve":
        raise ValueError("the command line is not `vllm serve` (%s)" % args.subparser)
    commands["serve"].validate(args)
    # What ServeSubcommand.cmd does first: the positional model wins.
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    AsyncEngineArgs.from_cli_args(args).create_engine_config(**usage)


def check_sglang(argv):
    """SGLang's ServerArgs from argv (the words after the executable, `serve` first) and its checks."""
    _parser_raises()
    from sglang.srt.server_args import prepare_server_args
    argv = list(argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    # The role's --config file holds the API keys only (written by the serve step, after this
    # check): the keys decide nothing the check reads.
    while "--config" in argv:
        at = argv.index("--config")
        del argv[at:at + 2]
    server_args = prepare_server_args(argv)
    # SGLang 0.5.21 and later build ServerArgs unresolved (__post_init__ does nothing): the engine
    # resolves it (defaults that depend on the model and the device, and their checks) with
    # resolve_once() before check_server_args(), which reads the resolved fields and fails on the
    # unresolved ones (a TypeError on every line).
    resolve = getattr(server_args, "resolve_once", None)
    if resolve is not None:
        resolve()
    check = getattr(server_args, "check_server_args", None)
    if check is not None:
        check()


CHECKS = {"vllm": check_vllm, "sglang": check_sglang}


def main(request):
    import json
    import os
    import sys

    answer = os.dup(1)
    os.dup2(2, 1)  # the engine's prints go to standard error
    sys.stdout = sys.stderr
    try:
        CHECKS[request["engine"]](request["argv"])
        verdict = {"ok": True, "error_type": "", "error": ""}
    except BaseException as exc:  # pylint: disable=broad-except
        # SystemExit too: a parser or a check that exits instead of raising refused the line.
        verdict = {"ok": False, "error_type": type(exc).__name__, "error": words(exc)}
        if model_missing(exc):
            verdict["model_missing"] = True
    sys.stderr.flush()
    os.write(answer, (MARKER + json.dumps(verdict) + "\n").encode("utf-8"))
    os.close(answer)
    # The engine may have started threads (a tokenizer pool) that would keep the process alive.
    os._exit(0)
