"""The engines' registry (plugins/module_utils/_engines.py): every flag it names is one the engine's
own parser has, in every version the role has flag data for; the documented choices, the role's
spec and docs/inference_service.md's table say what it says (tools/gen_engine_docs.py; that they are
current: tests/unit/test_generate.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import ENGINES
from ansible_collections.cleanslate.gpu.plugins.module_utils._settings import MODEL, engine_flags
from tools import gen_engine_docs
from tools.checkout_copy import copy_checkout

REPO = Path(__file__).resolve().parents[2]
FLAGS = REPO / "roles" / "inference_service" / "files" / "flags"
DATA = sorted(FLAGS.glob("*.json"))


def named_dests(name: str) -> set:
    """Every parser dest the registries name for an engine: the command builder writes or refuses each."""
    engine = ENGINES[name]
    return ((set(engine_flags(name).values()) - {MODEL}) | set(engine["always"]) | set(engine["secret_flags"].values())
            | ({engine["stats_off_flag"]} if engine["stats_off_flag"] else set()))


@pytest.mark.parametrize("path", DATA, ids=[path.stem for path in DATA])
def test_every_flag_the_registry_names_is_in_each_version_of_its_engine(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["engine"] in ENGINES, "%s: flag data of an engine the registry does not know" % path.name
    dests = {option["dest"] for option in data["options"]}
    assert named_dests(data["engine"]) - dests == set()
    if ENGINES[data["engine"]]["secret_file_keys"]:  # the secrets' file is given with --config
        assert "config" in dests


def test_every_engine_has_flag_data_and_a_complete_entry():
    for name, engine in ENGINES.items():
        assert any(path.name.startswith(name + "-") for path in DATA), name
        assert {"served_name", "tensor_parallel_size", "gpu_memory_fraction", "max_model_len"} <= set(engine_flags(name))
        assert engine["speculative"] in ("config", "server_args") and engine["metrics"]["kind"] in ("counters", "gauges")
        assert engine["health_paths"][0] == "/health" and engine["health_timeout_s"] > 0


def test_the_roles_engine_choices_are_the_registrys():
    spec = yaml.safe_load((REPO / "roles" / "inference_service" / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
    assert spec["argument_specs"]["main"]["options"]["inference_service_engine"]["choices"] == list(ENGINES)


def test_a_stale_choice_list_or_table_is_named_then_rewritten(tmp_path, capsys):
    root = copy_checkout(REPO, tmp_path / "root")
    stub = root / "plugins" / "modules" / "inference_host.py"
    stub.write_text(stub.read_text(encoding="utf-8").replace(
        "    choices: [%s]" % ", ".join(ENGINES), "    choices: [vllm]"), encoding="utf-8")
    doc = root / gen_engine_docs.DOC
    doc.write_text(doc.read_text(encoding="utf-8").replace("| 30 s |", "| 20 s |"), encoding="utf-8")
    assert gen_engine_docs.main(["--check", "--root", str(root)]) == 1
    said = capsys.readouterr().out
    assert "inference_host.py" in said and "inference_service.md" in said and "inference_args.py" not in said
    assert gen_engine_docs.main(["--root", str(root)]) == 0
    assert stub.read_text(encoding="utf-8") == (REPO / "plugins" / "modules" / "inference_host.py").read_text(encoding="utf-8")
    assert gen_engine_docs.main(["--check", "--root", str(root)]) == 0


def test_the_gate_and_the_builder_take_the_engines_from_the_registry():
    from ansible_collections.cleanslate.gpu.plugins.action import inference_args  # pylint: disable=import-outside-toplevel
    assert inference_args.ARGUMENT_SPEC["engine"]["choices"] == list(ENGINES)
