"""The role's flag data against the records of the engines' real parsers (issue 25): the data is
what tools/gen_flag_data.py derives from each record, and the validator (_engine_flags) gives
the real parser's verdict on every command line the record holds: each option with each sample
value, a choice and a non-choice, bare, and a switch given a value. The records were dumped from
the installed engines (`make engine-venvs`, tools/dump_engine_parser.py), so a regression in the
data or the validator shows here without the 10 GB installs."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_flags

REPO = Path(__file__).resolve().parents[2]
FLAGS = REPO / "roles" / "inference_service" / "files" / "flags"
RECORDS = REPO / "tests" / "fixtures" / "engine_parsers"
VERSIONS = sorted(path.stem for path in RECORDS.glob("*.json"))

_spec = importlib.util.spec_from_file_location("gen_flag_data", REPO / "tools" / "gen_flag_data.py")
gen_flag_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_flag_data)

# Where the validator is knowingly looser than the real parser: the keys inside a vLLM config
# class's JSON object (--compilation-config '{"a": 1}') are the class's business, checked when
# vLLM builds the config; the role checks that the value is a JSON object. An engine's own
# action class (vLLM --lora-modules, SGLang --lora-paths) parses its values its own way.
LOOSER = {"json_object": {'{"a": 1}'}}


def record(name: str) -> dict:
    return gen_flag_data.read_record(RECORDS / (name + ".json"))


def test_every_engine_has_three_versions_of_records_and_data():
    engines = {}
    for name in VERSIONS:
        engine, version = name.split("-", 1)
        engines.setdefault(engine, []).append(version)
    assert {engine: len(versions) for engine, versions in engines.items()} == {"sglang": 3, "vllm": 3}
    assert sorted(path.stem for path in FLAGS.glob("*.json")) == VERSIONS


@pytest.mark.parametrize("name", VERSIONS)
def test_the_shipped_data_is_what_the_generator_derives_from_the_record(name):
    shipped = (FLAGS / (name + ".json")).read_text(encoding="utf-8")
    assert shipped == gen_flag_data.data_text(record(name)), "run tools/gen_flag_data.py"


def _verdict(flags: _engine_flags.EngineFlags, argv: list):
    try:
        flags.parse(argv)
    except _engine_flags.FlagError as exc:
        return False, str(exc)
    return True, ""


def disagreements(name: str) -> list:
    """[(argv, the real parser's verdict, the validator's, its message)] where they differ."""
    rec = record(name)
    data = gen_flag_data.derive(rec)
    flags = _engine_flags.EngineFlags(data)
    model = ["org/model"] if rec["engine"] == "vllm" else ["--model-path", "org/model"]
    types = {entry["dest"] + " ".join(entry["flags"]): entry.get("type") for entry in data["options"]}
    out = []
    for action in rec["actions"]:
        kind = types[action["dest"] + " ".join(sorted(action["option_strings"], key=lambda f: not f.startswith("--")))]
        for argv, accepted, _message in action["probes"]:
            if action["dest"] == "config" or (rec["engine"] == "vllm" and action["dest"] == "model"):
                # --config reads a file: the role warns that its flags are not checked. vLLM refuses
                # --model beside the positional model, and the role owns the model (extra_args refuse it).
                continue
            if action["action"] not in gen_flag_data.ACTIONS and action["nargs"] != 0:
                continue  # an engine's own action class (LoRA modules): the role passes it, the engine checks it
            ours, why = _verdict(flags, model + argv)
            if ours != accepted and not (ours and argv[-1] in LOOSER.get(kind, ())):
                out.append((argv, accepted, ours, why))
    return out


@pytest.mark.parametrize("name", VERSIONS)
def test_the_validator_gives_the_real_parsers_verdict_on_every_recorded_line(name):
    found = disagreements(name)
    assert not found, "%d lines judged otherwise than %s's parser, e.g. %s" % (len(found), name, found[:5])


def test_the_records_hold_what_issue_25_found_missing():
    """Point 4: types and choices the reference lists did not carry."""
    vllm = _engine_flags.EngineFlags(gen_flag_data.derive(record("vllm-0.33.0")))
    assert vllm.by_dest("num_gpu_blocks_override")["type"] == "int"
    assert vllm.by_dest("compilation_config")["type"] == "json_object"
    assert "triton" in vllm.by_dest("moe_backend")["choices"]
    sglang = _engine_flags.EngineFlags(gen_flag_data.derive(record("sglang-0.5.23")))
    for dest in ("quantization", "tool_call_parser", "reasoning_parser", "speculative_draft_model_quantization"):
        assert sglang.by_dest(dest).get("choices"), dest
    monokernel = sglang.resolve("--monokernel-backend")
    assert monokernel["nargs"] is None and monokernel["choices"] == ["amd"] and monokernel["deprecated"]
    spec = gen_flag_data.derive(record("sglang-0.5.23"))["speculative"]
    assert spec["algorithm_aliases"] == {"NEXTN": "EAGLE"}
    assert {"MTP", "MEDUSA"} <= set(spec["refused_algorithms"])


def test_the_speculative_config_keys_carry_their_types_and_bounds():
    keys = gen_flag_data.derive(record("vllm-0.33.0"))["speculative"]["keys"]
    assert keys["num_speculative_tokens"]["kind"] == "int" and keys["num_speculative_tokens"]["above"] == 0
    assert keys["num_speculative_tokens_per_batch_size"]["kind"] == "schedule"
    assert keys["target_model_config"]["kind"] == "internal"
    assert keys["prompt_lookup_min"] == {"kind": "int", "min": 1, "nullable": True, "python_type": "int | None"}
    assert "eagle3" in keys["method"]["choices"] and "medusa" not in keys["method"]["choices"]


def test_a_record_bug_shows_as_a_disagreement(monkeypatch):
    """The agreement test can fail: a choice list the generator drops lets a non-choice through."""
    real = gen_flag_data.option

    def dropping(action):
        entry = real(action)
        entry.pop("choices", None)
        return entry

    monkeypatch.setattr(gen_flag_data, "option", dropping)
    found = disagreements("sglang-0.5.23")
    assert any(argv == ["--quantization", "no-such-choice"] for argv, *_rest in found)
