"""Generate the inference_service role's flag data from the engines' reference flag lists.

    python tools/gen_flag_data.py /work/shared/reference [--out roles/inference_service/files/flags]

Reads the lists that were extracted from the engines' real argparse parsers (see
serving_facts.md beside them) and writes one JSON file per engine and version:

    vllm-0.33.0.json     every `vllm serve` option, and the SpeculativeConfig keys
    sglang-0.5.23.json   every `sglang serve` option, and the speculative rules

The role validates every rendered flag against that data, and the stand-in engine
(tests/sim/engine) builds its argparse parser from the same files. A new engine version is
one more reference list and one more run of this script; the generated files are committed,
since CI has the repository but not the reference directory. JSON, not YAML, so that the
stand-in engine reads it with the standard library on a bare Debian host.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "roles" / "inference_service" / "files" / "flags"
# The extraction cut long fields at this many characters: such a choices list is incomplete.
TRUNCATED_AT = 300

# argparse `type` callables -> how a value is checked. Anything else (JSON parsers, dataclass
# parsers, _optional_type wrappers whose inner type the lists do not record) takes any string.
VALUE_TYPES = {
    "int": "int",
    "float": "float",
    "str": "str",
    "human_readable_int": "human_int",
    "human_readable_int_or_auto": "human_int_or_auto",
    "loads": "json",
}

# SGLang facts that its flag list cannot carry (serving_facts.md, "SGLang 0.5.23").
SGLANG_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"]
SGLANG_STEP_KEYS = ["speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"]


def header(path: Path) -> list:
    """The extraction's comment lines (its provenance), without the leading '# '."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return lines


def rows(path: Path, width: int) -> list:
    """The TSV's data rows, each padded to `width` fields."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        out.append(fields + [""] * (width - len(fields)))
    return out


def nargs_of(text: str):
    """The nargs column: None (one value), 0 (no value), '?', '*' or '+'."""
    if text in ("None", ""):
        return None
    if text.isdigit():
        return int(text)
    return text


def choices_of(text: str):
    """A complete choices list, or None when there is none or the extraction cut it."""
    if not text or len(text) >= TRUNCATED_AT:
        return None
    return text.split(",")


def option(flags: list, dest: str, type_name: str, choices: str, nargs: str, deprecated: bool = False) -> dict:
    entry = {"flags": flags, "dest": dest, "nargs": nargs_of(nargs),
             "type": VALUE_TYPES.get(type_name, "str")}
    listed = choices_of(choices)
    if listed is not None and entry["nargs"] != 0:
        entry["choices"] = listed
    if choices and listed is None and entry["nargs"] != 0:
        entry["choices_truncated"] = True
    if deprecated:
        entry["deprecated"] = True
    return entry


def vllm_options(path: Path) -> list:
    options = []
    for group, longs, shorts, type_name, choices, nargs, _default in rows(path, 7):
        flags = longs.split() + shorts.split()
        if "--help" in flags:
            continue
        dest = longs.split()[0][2:].replace("-", "_")
        entry = option(flags, dest, type_name, choices, nargs)
        entry["group"] = group
        if flags == ["--model"]:
            # Parsed, but moved to the positional with a warning (serving_facts.md).
            entry["deprecated"] = True
        options.append(entry)
    return options


def sglang_options(path: Path) -> list:
    options = []
    for strings, dest, type_name, choices, nargs, _default, action in rows(path, 7):
        flags = strings.split()
        if "--help" in flags:
            continue
        if action == "DeprecatedStoreConstAction":
            nargs = "0"  # a store_const: the choices column holds its constant, not values
        options.append(option(flags, dest, type_name, choices, nargs, deprecated=action.startswith("Deprecated")))
    return options


SPEC_LINE = re.compile(r"^(?P<key>\w+)\t(?P<type>[^\t]*)\t(?P<default>.*)$")


def spec_key(type_text: str, default_text: str) -> dict:
    """How one SpeculativeConfig key is checked, from its Python type and constraint."""
    entry = {}
    literals = re.findall(r"Literal\[([^\]]*)\]", type_text)
    values = [v.strip().strip("'\"") for block in literals for v in block.split(",") if v.strip()]
    if "SkipValidation" in type_text:
        entry["kind"] = "internal"  # set by vLLM itself, never from the command line
    elif type_text.startswith("list[tuple[int, int, int]]"):
        entry["kind"] = "schedule"
    elif type_text.startswith("list[float]"):
        entry["kind"] = "float_list"
    elif literals and ", str" not in type_text:
        entry["kind"] = "choice"
        entry["choices"] = values
    elif type_text.split(" |")[0] in ("int", "float", "bool", "str"):
        entry["kind"] = type_text.split(" |")[0]
    elif type_text.startswith("vllm.config.") and "Enum" not in type_text:
        entry["kind"] = "dict"
    else:
        entry["kind"] = "str"  # free strings (with known values) and enums given by name
        if values:
            entry["known_values"] = values
    constraint = re.search(r"\(constraint (>=|>)(-?\d+)\)", default_text)
    if constraint:
        entry["min" if constraint.group(1) == ">=" else "above"] = int(constraint.group(2))
    entry["nullable"] = "None" in type_text or "NoneType" in type_text or "Optional[" in type_text
    return entry


def vllm_speculative(path: Path) -> dict:
    keys = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = SPEC_LINE.match(line)
        if match and not line.startswith("#"):
            keys[match.group("key")] = spec_key(match.group("type"), match.group("default"))
    methods = keys["method"]["choices"]
    return {
        "flag": "--speculative-config",
        "keys": keys,
        # Model-specific MTP names are deprecated aliases that vLLM rewrites to mtp.
        "method_aliases": sorted(m for m in methods if m.endswith("_mtp")),
        # Inside the speculative config the draft's TP key is draft_tensor_parallel_size.
        "forbidden": {"tensor_parallel_size": "use draft_tensor_parallel_size (1 or the target's tensor-parallel size)"},
        "method_key": "method",
    }


def sglang_speculative(options: list) -> dict:
    keys = {}
    for entry in options:
        if entry["dest"].startswith("speculative_"):
            keys[entry["dest"]] = entry["flags"][0]
    return {"keys": keys, "method_key": "speculative_algorithm", "algorithms": SGLANG_ALGORITHMS,
            "all_or_none": SGLANG_STEP_KEYS}


def version_of(lines: list, engine: str) -> str:
    for line in lines:
        match = re.search(r"%s (\d+\.\d+\.\d+)" % engine, line, re.IGNORECASE)
        if match:
            return match.group(1)
    raise SystemExit("no %s version in the reference header" % engine)


def build(reference: Path) -> dict:
    """{file name: data} for every engine the reference directory holds."""
    out = {}
    vllm_tsv = reference / "vllm_serve_flags_detailed.tsv"
    if vllm_tsv.exists():
        source = header(reference / "vllm_serve_flags.txt")
        version = version_of(source, "vllm")
        out["vllm-%s.json" % version] = {
            "engine": "vllm", "version": version, "source": source[:3],
            "command": ["serve"], "model": {"positional": True},
            # FlexibleArgumentParser: --a_b == --a-b before the first '.', --flag.key sub-keys of JSON flags.
            "underscores": True, "dotted_keys": True, "abbreviations": True,
            "optimization_shorthand": "--optimization-level",
            "options": vllm_options(vllm_tsv),
            "speculative": vllm_speculative(reference / "vllm_speculative_config_keys.tsv"),
            "api_key_env": "VLLM_API_KEY",
        }
    sglang_tsv = reference / "sglang_server_flags_detailed.tsv"
    if sglang_tsv.exists():
        source = header(reference / "sglang_server_flags.txt")
        version = version_of(source, "sglang")
        options = sglang_options(sglang_tsv)
        out["sglang-%s.json" % version] = {
            "engine": "sglang", "version": version, "source": source[:3],
            "command": ["serve"], "model": {"flag": "--model-path"},
            "underscores": False, "dotted_keys": False, "abbreviations": True,
            "options": options,
            "speculative": sglang_speculative(options),
            # SGLang reads no API key from the environment: it comes from a --config YAML file.
            "api_key_env": None,
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path, help="directory with the engines' reference flag lists")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files differ")
    args = parser.parse_args(argv)
    data = build(args.reference)
    if not data:
        parser.error("no reference flag lists in %s" % args.reference)
    stale = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in sorted(data.items()):
        text = json.dumps(dict(content, generated_by="tools/gen_flag_data.py"), indent=1, sort_keys=True) + "\n"
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        path.write_text(text, encoding="utf-8")
        print("wrote %s (%d options)" % (path, len(content["options"])))
    if stale:
        print("out of date: %s" % ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
