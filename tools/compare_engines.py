"""Compare the role's verdicts with the real engines' on the same command lines (issue 25).

    .venv/bin/python tools/compare_engines.py [--engines build/engines] [--out docs/engine_comparison.md]

For each engine venv that `make engine-venvs` built, the role's command builder
(plugins/plugin_utils/_serve_command.py, the path the inference_args action takes) renders
  - the configurations of tests/fixtures/engine_corpus.json, and
  - edge cases from that version's flag data: every option the role does not own, once with a
    value its parser takes and once with one it refuses (a non-choice, a word for a number, a
    value given to a switch, a value option left bare);
and the engine judges the same command lines in its venv (tools/dump_engine_parser.py --verdicts:
its real parser, and for vLLM a SpeculativeConfig built with the real class against a local
config.json, offline). Each configuration of the corpus is judged by the engine's whole
configuration build instead (issue 37: the program cleanslate.gpu.inference_dry_run sends the host,
plugins/module_utils/_engine_dry_run.py: vLLM's serve parser, its validation and
create_engine_config; SGLang's ServerArgs and check_server_args), one engine process per
configuration, offline; --no-dry-run keeps the parser's verdict for them. Where the role refused a line, the engine is given the line the builder
rendered before refusing it. The output lists, per engine version, the lines the engine takes and
the role refuses, and the reverse.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".ansible" / "collections"))

from ansible_collections.cleanslate.gpu.plugins.module_utils._engine_dry_run import MARKER  # noqa: E402
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_flags, _serve_command  # noqa: E402

FLAGS = REPO / "roles" / "inference_service" / "files" / "flags"
CORPUS = REPO / "tests" / "fixtures" / "engine_corpus.json"
DUMP = REPO / "tools" / "dump_engine_parser.py"
DRY_RUN = REPO / "plugins" / "module_utils" / "_engine_dry_run.py"
DRY_RUN_TIMEOUT = 600
OWNED = "is set by the role"


def settings(engine: str, version: str, models: dict, **overrides) -> dict:
    """The role's settings (names without the role prefix), as the inference_args action gets them."""
    base = {
        "engine": engine, "engine_version": version, "model": models["target"], "served_name": "m",
        "tensor_parallel_size": 1, "host": "127.0.0.1", "port": 8000 if engine == "vllm" else 30000,
        "gpu_memory_fraction": 0, "max_model_len": 0, "speculative": {}, "extra_args": [], "environment": {},
        "secrets_set": {"api_key": False, "hf_token": False, "admin_api_key": False, "environment": []},
        "executable": "", "venv": "", "unit": engine + ".service", "user": "", "drain_timeout": 30,
        "config_dir": "/etc/cleanslate/inference",
    }
    base.update(overrides)
    if isinstance(base["speculative"], dict) and base["speculative"].get("model") == "{draft}":
        base["speculative"] = dict(base["speculative"], model=models["draft"])
    if isinstance(base["speculative"], dict) and base["speculative"].get("speculative_draft_model_path") == "{draft}":
        base["speculative"] = dict(base["speculative"], speculative_draft_model_path=models["draft"])
    return base


def role_verdict(values: dict, flags) -> tuple:
    """(accepted, problems, the arguments after `serve`): what the role's builder made of it."""
    try:
        built = _serve_command.build(values, flags)
    except (_serve_command.ServeConfigError, _engine_flags.FlagError) as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        builder = _serve_command._Builder(values, flags)  # noqa: SLF001 - the line it rendered before refusing
        args = builder.core_args() + builder.speculative_args() + list(values["extra_args"])
        return False, problems, args[len(flags.data.get("command", [])):]
    return True, [], built["argv"][1 + len(flags.data.get("command", [])):]


def valid_and_invalid(entry: dict) -> list:
    """[(label, extra args)] for one option: a value its parser takes, then one it refuses."""
    flag = entry["flags"][0]
    if entry["nargs"] == 0:
        return [("switch", [flag]), ("switch given a value", [flag + "=1"])]
    kind = entry.get("type", "str")
    good = {"int": "1", "float": "0.5", "json": "{}", "json_object": "{}", "human_int": "32k",
            "human_int_lower": "32k", "human_int_or_auto": "auto"}.get(kind, "x")
    if entry.get("choices"):
        good = entry["choices"][0]
    cases = [("valid value %s" % good, [flag] if entry["nargs"] == "?" else [flag, good])]
    if entry.get("choices"):
        cases.append(("non-choice", [flag, "no-such-choice"]))
    elif kind in ("int", "float", "human_int", "human_int_lower", "human_int_or_auto"):
        cases.append(("word for a %s" % kind, [flag, "abc"]))
    elif kind in ("json", "json_object"):
        cases.append(("not JSON", [flag, "{abc"]))
    if entry["nargs"] in (None, "+"):
        cases.append(("bare", [flag]))
    return cases


def cases_for(engine: str, version: str, corpus: list, models: dict, flags) -> list:
    out = []
    for config in corpus:
        values = settings(engine, version, models, **config["settings"])
        out.append(dict(zip(("role", "problems", "args"), role_verdict(values, flags)), name=config["name"],
                        kind="configuration", spec=values["speculative"] if engine == "vllm" else None))
    base = settings(engine, version, models)
    for entry in flags.options:
        for label, extra in valid_and_invalid(entry):
            accepted, problems, args = role_verdict(dict(base, extra_args=extra), flags)
            if any(OWNED in problem for problem in problems):
                continue  # the role's own option: refused in extra_args by design, whatever the value
            out.append({"name": "%s (%s)" % (" ".join(extra), label), "kind": "edge", "role": accepted,
                        "problems": problems, "args": args, "spec": None})
    return out


def engine_verdicts(venv: Path, engine: str, cases: list, models: dict) -> list:
    request = [{"args": case["args"], "spec": case["spec"], "target": models["target"]} for case in cases]
    env = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(venv / "bin" / "python"), str(DUMP), engine, "--verdicts"], input=json.dumps(request),
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit("%s: the verdicts failed:\n%s" % (venv, proc.stderr[-3000:]))
    return json.loads(proc.stdout)


def dry_run_verdict(venv: Path, engine: str, args: list) -> tuple:
    """(accepted, message) of the engine's own configuration build on `serve` + args, as the module's
    program answers it (its marker line); a run without an answer raises SystemExit."""
    request = {"engine": engine, "argv": list(args) if engine == "sglang" else ["serve"] + list(args)}
    program = DRY_RUN.read_text(encoding="utf-8") + "\nmain(__import__('json').loads(%r))\n" % json.dumps(request)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "HOME": tempfile.gettempdir()}
    proc = subprocess.run([str(venv / "bin" / "python"), "-I", "-"], input=program, capture_output=True, text=True,
                          env=env, timeout=DRY_RUN_TIMEOUT, check=False, cwd="/")
    answers = [line[len(MARKER):] for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if len(answers) != 1:
        raise SystemExit("%s: the dry run of %s gave no answer:\n%s" % (venv, " ".join(args), proc.stderr[-3000:]))
    verdict = json.loads(answers[0])
    return verdict["ok"], "%s: %s" % (verdict["error_type"], verdict["error"]) if not verdict["ok"] else ""


def write_models(directory: Path, corpus_models: dict) -> dict:
    """The corpus's config.json files as local model directories (no download: HF_HUB_OFFLINE)."""
    paths = {}
    for name, config in corpus_models.items():
        path = directory / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config))
        paths[name] = str(path)
    return paths


def compare(venv: Path, corpus: dict, models: dict, dry_run: bool = True) -> dict:
    engine, version = venv.name.split("-", 1)
    flags = _engine_flags.EngineFlags(_engine_flags.load([str(FLAGS)], engine, version))
    cases = cases_for(engine, version, corpus[engine], models, flags)
    verdicts = engine_verdicts(venv, engine, cases, models)
    if dry_run:
        verdicts = [dry_run_verdict(venv, engine, case["args"]) if case["kind"] == "configuration" else verdict
                    for case, verdict in zip(cases, verdicts)]
    rows = {"label": "%s %s" % (engine, version), "cases": len(cases), "configurations": 0,
            "agree": 0, "engine_only": [], "role_only": []}
    for case, (accepted, message) in zip(cases, verdicts):
        rows["configurations"] += case["kind"] == "configuration"
        if accepted == case["role"]:
            rows["agree"] += 1
        elif accepted:
            rows["engine_only"].append(one_line("%s: %s" % (case["name"], "; ".join(case["problems"]))))
        else:
            rows["role_only"].append(one_line("%s: %s" % (case["name"], message)))
    return rows


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def render(results: list) -> str:
    lines = ["# The role against the real engines", "",
             "Made by `tools/compare_engines.py` (after `make engine-venvs`): the role's command builder renders each",
             "configuration of `tests/fixtures/engine_corpus.json` and, for every option the role does not own, a",
             "valid and an invalid value; the installed engine judges the same command line (its real parser, and",
             "for vLLM its SpeculativeConfig class; each configuration by the engine's whole configuration build,",
             "the check cleanslate.gpu.inference_dry_run runs on the host: vLLM's create_engine_config, SGLang's",
             "ServerArgs). Do not edit: run the tool.", "",
             "| engine | lines | configurations | agree | engine takes, role refuses | role takes, engine refuses |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in results:
        counts = (row["cases"], row["configurations"], row["agree"], len(row["engine_only"]), len(row["role_only"]))
        lines.append("| %s | %d | %d | %d | %d | %d |" % ((row["label"],) + counts))
    for row in results:
        lines += ["", "## %s" % row["label"], "", "Engine takes, role refuses:", ""]
        lines += ["- `%s`" % item.replace("`", "'") for item in row["engine_only"]] or ["- none"]
        lines += ["", "Role takes, engine refuses:", ""]
        lines += ["- `%s`" % item.replace("`", "'") for item in row["role_only"]] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=Path, default=REPO / "build" / "engines")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "engine_comparison.md")
    parser.add_argument("--no-dry-run", action="store_true",
                        help="judge the configurations by the parser and SpeculativeConfig only (no config build)")
    args = parser.parse_args(argv)
    venvs = sorted(path for path in args.engines.glob("*-*") if (path / "bin" / "python").exists()
                   and path.name.split("-")[0] in ("vllm", "sglang"))
    if not venvs:
        parser.error("no engine venvs in %s: run make engine-venvs" % args.engines)
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        models = write_models(Path(tmp), corpus["models"])
        results = [compare(venv, corpus, models, dry_run=not args.no_dry_run) for venv in venvs]
    args.out.write_text(render(results), encoding="utf-8")
    for row in results:
        print("%s: %d lines, %d agree, engine-only %d, role-only %d" % (
            row["label"], row["cases"], row["agree"], len(row["engine_only"]), len(row["role_only"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
