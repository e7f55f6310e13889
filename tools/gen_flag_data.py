"""Generate the inference_service role's flag data from records of the engines' real parsers.

    python tools/gen_flag_data.py                     # data from the committed records
    python tools/gen_flag_data.py --check             # exit 1 if the committed data differs
    python tools/gen_flag_data.py --dump build/engines/vllm-0.33.0 ...   # new records first

A record (tests/fixtures/engine_parsers/<engine>-<version>.json) is what
tools/dump_engine_parser.py read from an installed engine's own argparse parser (and vLLM's
SpeculativeConfig class): `make engine-venvs` installs the engines under build/engines, --dump
runs the dump in each venv and writes the record. The data (roles/inference_service/files/flags/
<engine>-<version>.json) is a pure function of its record, so CI checks both without the engines
(tests/unit/test_flag_data.py). JSON, not YAML, so that the stand-in engine reads it with the
standard library on a bare Debian host.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "roles" / "inference_service" / "files" / "flags"
RECORDS = REPO / "tests" / "fixtures" / "engine_parsers"
DUMP = REPO / "tools" / "dump_engine_parser.py"

# SGLang's three step keys: ServerArgs picks all three itself when none is given, and takes a
# partial set without complaint (its __post_init__; no parser can show it).
SGLANG_STEP_KEYS = ["speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"]
# argparse action classes -> what the option does with the command line.
ACTIONS = {"_StoreAction": "value", "_AppendAction": "append", "_StoreTrueAction": "switch",
           "_StoreFalseAction": "switch", "_StoreConstAction": "switch", "BooleanOptionalAction": "switch",
           "EnableDisableAction": "switch", "_CountAction": "switch"}


def value_type(accepts: dict) -> str:
    """How a value is checked, from what the real type callable took of the dump's samples
    (tools/dump_engine_parser.py TYPE_SAMPLES): the callables are closures and wrappers whose
    names say little, their answers say what they are."""
    if not accepts or "abc" in accepts:
        return "str"  # no type callable, or one that takes any text
    if "{}" in accepts and "1" not in accepts:
        return "json_object"  # vLLM's config-dataclass parsers: a JSON object of the class's keys
    if "{}" in accepts:
        return "json"
    if "1.5" in accepts:
        return "float"
    if "32k" in accepts and "32K" not in accepts:
        return "human_int_lower"  # SGLang's: 32k is 32000, and there is no binary 32K
    if "32k" in accepts:
        return "human_int_or_auto" if "auto" in accepts else "human_int"
    if "1" in accepts:
        return "int"
    raise SystemExit("a type callable that takes %s: add its kind to tools/gen_flag_data.py" % sorted(accepts))


def choice_spelling(accepts: dict):
    """vLLM's choice options read 'Ab-C' as 'ab_c' before the choice is checked."""
    seen = accepts.get("Ab-C")
    return {"ab_c": "lower_underscore", "ab-c": "lower"}.get(seen)


def option(action: dict) -> dict:
    flags = sorted(action["option_strings"], key=lambda flag: not flag.startswith("--"))
    # An action class of the engine's own (LoRA modules) checks its values itself: "custom".
    kind = ACTIONS.get(action["action"], "switch" if action["nargs"] == 0 else "custom")
    entry = {"flags": flags, "dest": action["dest"], "action": kind,
             "nargs": 0 if kind == "switch" else action["nargs"], "default": action["default"]}
    if entry["nargs"] != 0:
        entry["type"] = value_type(action["type_accepts"])
        if action["type_accepts"].get("") == "None":
            entry["empty"] = True  # '' is taken as None (vLLM's optional types)
        if action["choices"]:
            entry["choices"] = action["choices"]
            spelling = choice_spelling(action["type_accepts"])
            if spelling:
                entry["choice_spelling"] = spelling
    if action["deprecated"]:
        entry["deprecated"] = True
    if action.get("group") and action["group"] not in ("options", "optional arguments"):
        entry["group"] = action["group"]
    return entry


LITERAL = re.compile(r"Literal\[([^\]]*)\]")


def spec_key(field: dict) -> dict:
    """How one SpeculativeConfig key is checked, from its annotation and pydantic constraints."""
    type_text = field["type"]
    literals = [v.strip().strip("'\"") for block in LITERAL.findall(type_text) for v in block.split(",") if v.strip()]
    base = re.sub(r"^Optional\[(.*)\]$", r"\1", type_text).split(" |")[0]
    entry = {"python_type": type_text}
    if any("SkipValidation" in item for item in field["metadata"]) or "SkipValidation" in type_text:
        entry["kind"] = "internal"  # set by vLLM itself, never from the command line
    elif base.startswith("list[tuple[int, int, int]]"):
        entry["kind"] = "schedule"
    elif base.startswith("list[float]"):
        entry["kind"] = "float_list"
    elif literals and ", str" not in type_text:
        entry["kind"] = "choice"
        entry["choices"] = literals
    elif base in ("int", "float", "bool", "str"):
        entry["kind"] = base
    elif base.startswith("vllm.config.") and "Enum" not in base:
        entry["kind"] = "dict"
    else:
        entry["kind"] = "str"  # free strings (with known values) and enums given by name
        if literals:
            entry["known_values"] = literals
    for item in field["metadata"]:
        bound = re.match(r"^(Ge|Gt)\((?:ge|gt)=(-?\d+(?:\.\d+)?)\)$", item)
        if bound:
            number = float(bound.group(2)) if "." in bound.group(2) else int(bound.group(2))
            entry["min" if bound.group(1) == "Ge" else "above"] = number
    entry["nullable"] = "None" in type_text or "Optional[" in type_text
    return entry


def vllm_speculative(record: dict) -> dict:
    keys = {name: spec_key(field) for name, field in record["speculative"]["keys"].items() if field["init"]}
    methods = keys["method"]["choices"]
    return {
        "flag": "--speculative-config",
        "keys": keys,
        # Model-specific MTP names are deprecated aliases that vLLM rewrites to mtp.
        "method_aliases": sorted(m for m in methods if m.endswith("_mtp")),
        # SpeculativeConfig has the key, and refuses it: the draft's is draft_tensor_parallel_size.
        "forbidden": {"tensor_parallel_size": "use draft_tensor_parallel_size (1 or the target's tensor-parallel size)"},
        "method_key": "method",
    }


def sglang_speculative(record: dict, options: list) -> dict:
    keys = {entry["dest"]: entry["flags"][0] for entry in options if entry["dest"].startswith("speculative_")}
    names = record["speculative"]["algorithms"]
    # The names SGLang sets up (upper case, as ServerArgs compares them) and what each becomes.
    algorithms = sorted(name for name, becomes in names.items() if becomes and name == name.upper() and name != "NONE")
    return {"keys": keys, "method_key": "speculative_algorithm", "algorithms": algorithms,
            "algorithm_aliases": {name: names[name] for name in algorithms if names[name] != name},
            "refused_algorithms": sorted(name for name, becomes in names.items() if name and becomes is None),
            "all_or_none": SGLANG_STEP_KEYS}


def record_name(record: dict) -> str:
    return "%s-%s.json" % (record["engine"], record["version"])


def derive(record: dict) -> dict:
    """The flag data of one engine version: a pure function of its parser record."""
    options = [option(action) for action in record["actions"]]
    common = {"engine": record["engine"], "version": record["version"],
              "source": "tests/fixtures/engine_parsers/" + record_name(record),
              "command": ["serve"], "abbreviations": bool(record["allow_abbrev"]), "options": options}
    if record["engine"] == "vllm":
        for entry in options:
            if entry["dest"] == "model":
                entry["deprecated"] = True  # parsed, but `vllm serve` moves it to the positional with a warning
        return dict(common, model={"positional": True},
                    # FlexibleArgumentParser: --a_b == --a-b before the first '.', --flag.key sub-keys of JSON flags.
                    underscores=True, dotted_keys=True, optimization_shorthand="--optimization-level",
                    speculative=vllm_speculative(record), api_key_env="VLLM_API_KEY")
    # SGLang reads no API key from the environment: it comes from a --config YAML file.
    return dict(common, model={"flag": "--model-path"}, underscores=False, dotted_keys=False,
                speculative=sglang_speculative(record, options), api_key_env=None)


def record_text(record: dict) -> str:
    """The record as committed: one action a line, so that a new version's diff reads per option."""
    head = {key: value for key, value in record.items() if key != "actions"}
    lines = [json.dumps(action, sort_keys=True, ensure_ascii=True) for action in record["actions"]]
    return ('{"head": %s,\n"actions": [\n%s\n]}\n'
            % (json.dumps(head, sort_keys=True, indent=1, ensure_ascii=True), ",\n".join(lines)))


def read_record(path: Path) -> dict:
    stored = json.loads(path.read_text(encoding="utf-8"))
    return dict(stored["head"], actions=stored["actions"])


def dump(venv: Path) -> dict:
    """Run tools/dump_engine_parser.py with the venv's python; the engine is named by the venv."""
    engine = venv.name.split("-")[0]
    if engine not in ("vllm", "sglang"):
        raise SystemExit("%s: the venv's name starts with vllm- or sglang-" % venv)
    env = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(venv / "bin" / "python"), str(DUMP), engine], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode:
        raise SystemExit("%s: the dump failed:\n%s" % (venv, proc.stderr[-3000:]))
    return json.loads(proc.stdout)


def data_text(record: dict) -> str:
    return json.dumps(dict(derive(record), generated_by="tools/gen_flag_data.py"), indent=1, sort_keys=True) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", type=Path, nargs="+", default=[], metavar="VENV",
                        help="engine venvs (build/engines/<engine>-<version>) to record first")
    parser.add_argument("--records", type=Path, default=RECORDS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed data differs")
    args = parser.parse_args(argv)
    args.records.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for venv in args.dump:
        record = dump(venv)
        path = args.records / record_name(record)
        path.write_text(record_text(record), encoding="utf-8")
        print("recorded %s (%d options)" % (path, len(record["actions"])))
    records = sorted(args.records.glob("*.json"))
    if not records:
        parser.error("no parser records in %s" % args.records)
    stale = []
    for path in records:
        record = read_record(path)
        target = args.out / record_name(record)
        text = data_text(record)
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(str(target))
            continue
        target.write_text(text, encoding="utf-8")
        print("wrote %s" % target)
    if stale:
        print("out of date: %s (run tools/gen_flag_data.py)" % ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
