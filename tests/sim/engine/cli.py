"""The stand-in's command line: an argparse parser built from the engine version's flag data
(roles/inference_service/files/flags, generated from the engines' real parsers), so it accepts
exactly the options that version accepts and exits 2 on any other, as the engine does.

This is the stand-in's own reading of the data, written apart from the role's validator
(plugins/plugin_utils/_engine_flags.py): the fleet tests prove the two agree by running the
command lines the role renders.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path

DEFAULT_FLAGS_DIR = Path(__file__).resolve().parents[3] / "roles" / "inference_service" / "files" / "flags"
HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")


class UsageError(Exception):
    """What argparse would print before exiting 2."""


def installed_version(engine: str) -> str:
    """The version an installed package of the engine's name reports (engines.py writes one on
    the fleet's hosts, as pip would): what the role's version probe reads."""
    try:
        return importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        return ""


def flags_file(engine: str, version: str, flags_dir: Path) -> Path:
    version = version or installed_version(engine)
    if version:
        path = flags_dir / ("%s-%s.json" % (engine, version))
        if not path.exists():
            raise UsageError("no flag data for %s %s in %s" % (engine, version, flags_dir))
        return path
    candidates = sorted(flags_dir.glob("%s-*.json" % engine),
                        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.stem.split("-", 1)[1].split(".")])
    if not candidates:
        raise UsageError("no flag data for %s in %s" % (engine, flags_dir))
    return candidates[-1]


def _human(value: str) -> int:
    match = HUMAN.match(value)
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)


def _json_object(value: str) -> dict:
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise ValueError("not a JSON object")
    return parsed


def _human_lower(value: str) -> int:
    match = HUMAN.match(value)
    if match and not match.group(2).islower():
        raise ValueError(value)
    return _human(value)


TYPES = {"int": int, "float": float, "human_int": _human, "json": json.loads, "json_object": _json_object,
         "human_int_lower": _human_lower,
         "human_int_or_auto": lambda v: -1 if v in ("-1", "auto") else _human(v)}


def _type(option: dict):
    """The option's value as the engine reads it: its type; '' as None where the engine's
    optional types take it; vLLM's choices in lower case with '_' for '-'."""
    kind = TYPES.get(option.get("type"), str)
    spelling = option.get("choice_spelling")

    def read(value: str):
        if option.get("empty") and value == "":
            return None
        if spelling:
            value = value.lower().replace("-", "_") if spelling == "lower_underscore" else value.lower()
        return kind(value)

    read.__name__ = getattr(kind, "__name__", "value")
    return read


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser(data: dict) -> argparse.ArgumentParser:
    parser = Parser(prog="%s serve" % data["engine"], add_help=False,
                    allow_abbrev=bool(data.get("abbreviations")))
    if data.get("model", {}).get("positional"):
        parser.add_argument("model_tag", nargs="?")
    for option in data["options"]:
        if option["nargs"] == 0:
            parser.add_argument(*option["flags"], dest=option["dest"], action="store_true")
            continue
        kwargs = {"dest": option["dest"], "type": _type(option)}
        if option["nargs"] is not None:
            kwargs["nargs"] = option["nargs"]
        if option.get("choices"):
            kwargs["choices"] = [TYPES[option["type"]](c) if option["type"] in ("int", "float") else c
                                 for c in option["choices"]]
            if option.get("empty") and "None" in option["choices"]:
                kwargs["choices"].append(None)
        parser.add_argument(*option["flags"], **kwargs)
    return parser


def vllm_rewrite(args: list) -> tuple:
    """FlexibleArgumentParser's rewriting: --a_b -> --a-b; -O3 -> --optimization-level 3;
    --json-flag.key value -> merged into that flag's JSON. Returns (args, {flag: {key: value}})."""
    out, dotted = [], {}
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            base, dot, key = name.partition(".")
            base = "--" + base[2:].replace("_", "-")
            if dot:
                if not sep:
                    if index >= len(args):
                        raise UsageError("argument %s: expected one argument" % name)
                    value = args[index]
                    index += 1
                try:
                    parsed = json.loads(value)
                except ValueError:
                    parsed = value
                dotted.setdefault(base, {})[key.replace("-", "_")] = parsed
                continue
            out.append(base + sep + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[2:].lstrip("=")]
        else:
            out.append(arg)
    return out, dotted


def sglang_config(args: list) -> list:
    """SGLang's --config FILE.yaml: its keys become flags placed before the command line's.
    The stand-in reads the flat `key: value` files the role writes (values as JSON scalars)."""
    indices = [i for i, arg in enumerate(args) if arg == "--config"]
    if not indices:
        return args
    if len(indices) > 1:
        raise UsageError("Multiple config files specified! Only one allowed.")
    index = indices[0]
    if index + 1 >= len(args):
        raise UsageError("No config file specified after --config flag!")
    path = args[index + 1]
    if not path.endswith((".yaml", ".yml")):
        raise UsageError("Config file must be YAML format, got: %s" % os.path.splitext(path)[1])
    from_file = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, raw = line.partition(":")
            if not sep:
                raise UsageError("%s: not a flat key: value line: %r" % (path, line))
            raw = raw.strip()
            value = json.loads(raw) if raw[:1] in ('"', "[", "{") or raw in ("true", "false") else raw
            if value is True:
                from_file.append("--" + key.strip())
            elif value is not False:
                from_file += ["--" + key.strip(), str(value)]
    return from_file + args[:index] + args[index + 2:]


def parse(engine: str, argv: list, flags_dir: Path, version: str = "") -> tuple:
    """(data, namespace, extra) for `<engine> serve ...`; UsageError when the engine would refuse it."""
    data = json.loads(flags_file(engine, version, flags_dir).read_text(encoding="utf-8"))
    if not argv or argv[0] != "serve":
        raise UsageError("the stand-in knows only `%s serve`" % engine)
    args = list(argv[1:])
    dotted = {}
    if engine == "vllm":
        args, dotted = vllm_rewrite(args)
    else:
        args = sglang_config(args)
    namespace = build_parser(data).parse_args(args)
    if engine == "vllm":
        spec = namespace.speculative_config
        if isinstance(spec, str):  # flag data of a parser whose type callable was not recorded
            try:
                spec = json.loads(spec)
            except ValueError as exc:
                raise UsageError("argument --speculative-config: invalid loads value: %r (%s)" % (spec, exc)) from exc
        if "--speculative-config" in dotted:
            spec = dict(spec or {}, **dotted["--speculative-config"])
        namespace.speculative_config = spec
        if not namespace.model_tag and getattr(namespace, "model", None):
            namespace.model_tag = namespace.model
    return data, namespace


def check_speculative(data: dict, spec) -> None:
    """vLLM's SpeculativeConfig is a pydantic dataclass with extra='forbid'."""
    if not spec:
        return
    if not isinstance(spec, dict):
        raise ValueError("speculative_config must be a JSON object")
    keys = data["speculative"]["keys"]
    if "tensor_parallel_size" in spec:
        raise ValueError("tensor_parallel_size is not a valid argument of SpeculativeConfig; "
                         "use draft_tensor_parallel_size")
    unknown = sorted(set(spec) - set(keys))
    if unknown:
        raise ValueError("1 validation error for SpeculativeConfig\n%s\n  Extra inputs are not permitted"
                         % unknown[0])


def fail_usage(engine: str, message: str) -> int:
    sys.stderr.write("usage: %s serve [options]\n%s serve: error: %s\n" % (engine, engine, message))
    return 2
