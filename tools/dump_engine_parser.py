"""Dump an installed engine's real `serve` parser as a JSON record (run with the engine venv's python).

    build/engines/vllm-0.33.0/bin/python tools/dump_engine_parser.py vllm > record.json

tools/gen_flag_data.py runs this in each venv that `make engine-venvs` built and commits the
record (tests/fixtures/engine_parsers/<engine>-<version>.json); the role's flag data is derived
from the record alone, so CI checks data and validator against the real parser without the
engine installed. Standard library and the engine only: this runs in the engine's venv.

What the record holds, per argparse action: its option strings, dest, action class, nargs,
choices and default (as text), the type callable's name, which sample values the type callable
takes (the type of a wrapped or closure-built callable shows only in what it accepts), and the
real parser's verdict on a command line per probe: a valid and an invalid value, a bare option,
a switch given a value. For vLLM also SpeculativeConfig's fields; for SGLang its speculative
algorithm names.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import sys

# Values each type callable is tried with: their verdicts tell int, float, human-readable int,
# JSON and free strings apart, whatever the callable is called.
TYPE_SAMPLES = ["1", "-1", "0", "1.5", "abc", "{}", '{"a": 1}', "[1]", "32k", "32K", "auto", "true", "", "nan", "Ab-C"]
# A refusal's text is kept to this length: enough to see why, small enough to commit.
MESSAGE_CHARS = 120
# The model argument every probe carries, so that only the probed option decides the verdict.
MODEL = "org/model"


def text(value, limit=200):
    """A JSON-safe text of any value (enum members by value, long ones cut)."""
    value = getattr(value, "value", value)
    out = value if isinstance(value, str) else repr(value)
    return out if len(out) <= limit else out[:limit] + "..."


def type_name(kind) -> str:
    if kind is None:
        return ""
    name = getattr(kind, "__qualname__", None) or getattr(kind, "__name__", None) or type(kind).__name__
    return "%s.%s" % (getattr(kind, "__module__", "") or "", name)


def type_accepts(kind) -> dict:
    """{sample: what the action's type callable makes of it} for the TYPE_SAMPLES it takes (a
    callable that rewrites its value, e.g. lower case and '_' for '-', shows it here)."""
    if kind is None:
        return {}
    accepted = {}
    for sample in TYPE_SAMPLES:
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                value = kind(sample)
        except Exception:  # noqa: BLE001 - any refusal is a refusal, as argparse sees it
            continue
        accepted[sample] = text(value, 40)
    return accepted


def choices_of(action):
    if action.choices is None:
        return None
    try:
        return [text(choice) for choice in action.choices]
    except TypeError:
        return None  # a container that answers `in` but cannot be listed


class Refused(Exception):
    pass


def verdict(parse, argv: list) -> list:
    """[argv, accepted, the parser's error text]: the real parser's answer to one command line."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(argv)
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return [argv, exc.code in (0, None), text(lines[-1] if lines else "exit %s" % exc.code, MESSAGE_CHARS)]
    except Exception as exc:  # noqa: BLE001 - a parser raising is a refusal too
        return [argv, False, text("%s: %s" % (type(exc).__name__, exc), MESSAGE_CHARS)]
    return [argv, True, ""]


def probes_of(action, parse) -> list:
    """Command lines for one option: each sample value, a non-choice, bare, and a switch's value."""
    flag = next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
    lines = [[flag]]
    if action.nargs == 0:
        lines.append([flag + "=1"])
    else:
        values = list(TYPE_SAMPLES)
        choices = choices_of(action) or []
        values += choices[:1] + choices[-1:] + (["no-such-choice"] if choices else [])
        lines += [[flag, value] for value in dict.fromkeys(values)]
    return [verdict(parse, line) for line in lines]


def groups_of(parser) -> dict:
    """{id(action): its argument group's title} (vLLM groups options by config class)."""
    return {id(action): group.title for group in parser._action_groups  # noqa: SLF001
            for action in group._group_actions}  # noqa: SLF001


def actions_of(parser, parse) -> list:
    out = []
    groups = groups_of(parser)
    for action in parser._actions:  # noqa: SLF001 - argparse keeps no public list
        if not action.option_strings or isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        out.append({
            "group": groups.get(id(action), ""),
            "option_strings": list(action.option_strings),
            "dest": action.dest,
            "action": type(action).__name__,
            "nargs": action.nargs,
            "choices": choices_of(action),
            "default": text(action.default),
            "type": type_name(action.type),
            "type_accepts": type_accepts(action.type),
            "deprecated": bool(getattr(action, "deprecated", False)) or "Deprecated" in type(action).__name__,
            "help_deprecated": "deprecated" in (action.help or "").lower(),
            "probes": probes_of(action, parse),
        })
    return out


def vllm_record() -> dict:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    subparsers = top.add_subparsers(dest="subparser")
    serve = ServeSubcommand().subparser_init(subparsers)

    def parse(argv):
        return top.parse_args(["serve", MODEL] + argv)

    return {"engine": "vllm", "actions": actions_of(serve, parse),
            "allow_abbrev": serve.allow_abbrev, "speculative": vllm_speculative()}


def annotation_text(annotation) -> str:
    out = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return out or str(annotation).replace("typing.", "")


def vllm_speculative() -> dict:
    from vllm.config.speculative import SpeculativeConfig

    fields = getattr(SpeculativeConfig, "__pydantic_fields__", {})
    keys = {}
    for field in dataclasses.fields(SpeculativeConfig):
        info = fields.get(field.name)
        metadata = [text(item) for item in getattr(info, "metadata", []) or []]
        default = field.default if field.default is not dataclasses.MISSING else (
            "<factory>" if field.default_factory is not dataclasses.MISSING else "<required>")
        keys[field.name] = {"type": annotation_text(field.type if not isinstance(field.type, str) else
                                                    getattr(info, "annotation", field.type)),
                            "metadata": metadata, "default": text(default), "init": field.init}
    return {"class": "vllm.config.speculative.SpeculativeConfig", "keys": keys}


def sglang_record() -> dict:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)

    def parse(argv):
        return parser.parse_args(["--model-path", MODEL] + argv)

    record = {"engine": "sglang", "actions": actions_of(parser, parse), "allow_abbrev": parser.allow_abbrev}
    algorithm = next((a for a in parser._actions if a.dest == "speculative_algorithm"), None)  # noqa: SLF001
    record["speculative"] = {"algorithm_choices": choices_of(algorithm) if algorithm else None,
                             "algorithms": sglang_algorithms()}
    return record


# Names tried with SpeculativeAlgorithm.from_string: SGLang's parser takes any text for
# --speculative-algorithm and refuses an unknown name only at start.
ALGORITHM_SAMPLES = ["EAGLE", "EAGLE3", "NEXTN", "MTP", "MEDUSA", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO",
                     "FROZEN_KV_MTP", "LOOKAHEAD", "eagle3", "nextn", "NONE", ""]


def sglang_algorithms():
    """{name: the algorithm SGLang makes of it, or None where it refuses it}; the enum's members too."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except ImportError:
        return None
    names = list(dict.fromkeys(ALGORITHM_SAMPLES + [member.name for member in SpeculativeAlgorithm]))
    out = {}
    for name in names:
        try:
            out[name] = text(getattr(SpeculativeAlgorithm.from_string(name), "name", "custom"))
        except Exception:  # noqa: BLE001 - a refusal, whatever its class
            out[name] = None
    return out


def _spec_check(target: str, tensor_parallel_size):
    """vLLM: a function that builds SpeculativeConfig with the real class, against the target's
    local config.json (offline), as EngineArgs does before anything is loaded."""
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.config.speculative import SpeculativeConfig

    model = ModelConfig(model=target, tokenizer=target, skip_tokenizer_init=True)

    def check(spec: dict):
        keys = {key.replace("-", "_"): value for key, value in spec.items()}
        SpeculativeConfig(target_model_config=model, target_parallel_config=ParallelConfig(
            tensor_parallel_size=tensor_parallel_size or 1), **keys)

    return check


def verdicts(engine: str, request: list) -> list:
    """[[accepted, why]] for each {"args": the arguments after `serve`, "target": a local model
    directory}: the real parser, then vLLM's SpeculativeConfig or SGLang's algorithm name."""
    if engine == "vllm":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        top = FlexibleArgumentParser(prog="vllm")
        ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))

        def parse(argv):
            return top.parse_args(["serve"] + argv)
    else:
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        parse = parser.parse_args
    out = []
    holder = {}

    def keep(argv):
        holder["ns"] = parse(argv)

    for case in request:
        holder.clear()
        _argv, accepted, why = verdict(keep, case["args"])
        if accepted and engine == "vllm" and getattr(holder["ns"], "speculative_config", None):
            try:
                with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                    _spec_check(case["target"], holder["ns"].tensor_parallel_size)(holder["ns"].speculative_config)
            except Exception as exc:  # noqa: BLE001 - pydantic's and vLLM's own refusals alike
                accepted, why = False, text("SpeculativeConfig: %s: %s" % (type(exc).__name__, exc), 300)
        if accepted and engine == "sglang" and getattr(holder["ns"], "speculative_algorithm", None):
            try:
                SpeculativeAlgorithm.from_string(holder["ns"].speculative_algorithm)
            except ValueError as exc:
                accepted, why = False, text(str(exc), 300)
        out.append([accepted, why])
    return out


def main() -> int:
    engine = sys.argv[1]
    if sys.argv[2:] == ["--verdicts"]:
        json.dump(verdicts(engine, json.load(sys.stdin)), sys.stdout)
        return 0
    record = vllm_record() if engine == "vllm" else sglang_record()
    record["version"] = importlib.metadata.version(engine)
    record["python"] = "%d.%d" % sys.version_info[:2]
    record["type_samples"] = TYPE_SAMPLES
    record["probe_model"] = MODEL
    json.dump(record, sys.stdout, indent=None, sort_keys=True, separators=(",", ":"))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
