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
config.json, offline). Where the role refused a line, the engine is given the line the builder
rendered before refusing it.

Issue 37: the engine's own check (the program cleanslate.gpu.inference_dry_run sends the host,
plugins/module_utils/_engine_dry_run.py: vLLM's serve parser, its validation and
create_engine_config; SGLang's ServerArgs, resolve_once and check_server_args) runs on each
configuration (one engine process each, as on the host) and on each edge case whose count it could
change (one engine process per version, a forked child per line), offline. It counts twice: in the
role's verdict, as on the host (flag data first, then the check on what the flag data took), and in
the engine's. A line the check could not judge here (a model or tokenizer not on this machine, a GPU
needed, the engine's import, no answer) is listed on its own, never counted as agreement.
--no-dry-run gives the parser's verdicts alone; --no-edge-checks runs the check on the configurations
only. The rows are kept in build/engine_comparison.json (--results); --render-only writes the
document from kept rows (--results A.json B.json: runs split over several processes).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
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


# What the comparison adds for the machine it runs on, never the role: this machine has no GPU.
# SGLang's ServerArgs picks its device from the GPU it finds (none here: it stops), so its check is
# given `--device cpu` first (a case's own --device comes after it and wins); vLLM's platform is
# picked the same way (none here), so its check runs with VLLM_TARGET_DEVICE=cpu, its CPU platform.
SGLANG_CPU = ["--device", "cpu"]
VLLM_CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu"}
# A refusal in these words is the machine's (no GPU), not the configuration's: the check could not
# judge the line here, which is neither agreement nor refusal.
# So is one that names what this machine's CPU device picked instead of a GPU's (SGLang's CPU
# attention backends torch_native and intel_amx, its device cpu; vLLM's CPU platform) or a GPU
# this machine lacks.
NEEDS_GPU = re.compile(r"Failed to infer device type|Torch not compiled with CUDA|No CUDA GPUs|"
                       r"CUDA driver|NVML|nvidia-smi|no GPU|not supported on CPU|CPU backend does not support|"
                       r"is not supported on the CPU|not supported by the CPU|requires --device cuda|got 'cpu'|"
                       r"torch_native|intel_amx|requires SM\d+|not supported on current platform|"
                       r"is not supported by cpu|only supported on CUDA devices|CUDA-alike device")
BATCH_MARKER = "CLEANSLATE_COMPARE_BATCH "
# The edge cases' checks run in one engine process per version: the engine is imported once, and
# each line gets a fresh forked child that runs the same program (main) and exits; its answer comes
# back on a pipe. The configurations get one whole process each, as on the host.
BATCH = r'''
def _batch(engine, requests, timeout):
    import json, os, select, sys, time
    keep = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import importlib
    # Warm-up: a child checks the first line and names the modules it had then, in their import
    # order; the parent imports them, so that each line's child does not import them again.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            CHECKS[engine](requests[0]["argv"])
        except BaseException:  # noqa: BLE001 - only the modules matter here
            pass
        os.write(write, json.dumps(list(sys.modules)).encode("utf-8"))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        names = json.loads(pipe.read() or b"[]")
    os.waitpid(pid, 0)
    for name in names:
        if name not in sys.modules and not name.startswith("__"):
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a module the child had, that the parent cannot
                pass
    for request in requests:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.dup2(write, 1)
            main(request)  # prints its answer on fd 1 and exits
        os.close(write)
        chunks, deadline = [], time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read], [], [], left)[0]:
                break
            chunk = os.read(read, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(read)
        late = time.monotonic() >= deadline
        if late:
            os.kill(pid, 9)
        status = os.waitpid(pid, 0)[1]
        lines = [line for line in b"".join(chunks).decode("utf-8", "replace").splitlines() if line.startswith(MARKER)]
        if lines:
            answer = lines[0][len(MARKER):]
        else:
            answer = json.dumps({"not_run": "no answer in %d s (killed)" % timeout if late else
                                 "the check's process ended without an answer (wait status %d)" % status})
        os.write(keep, (BATCH_MARKER + answer + "\n").encode("utf-8"))
    os._exit(0)
'''


def dry_run_env(engine: str) -> dict:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "HOME": tempfile.gettempdir()}
    return dict(env, **VLLM_CPU_ENV) if engine == "vllm" else env


def dry_run_request(engine: str, args: list) -> dict:
    return {"engine": engine, "argv": SGLANG_CPU + list(args) if engine == "sglang" else ["serve"] + list(args)}


def check_of(answer: dict) -> dict:
    """{ran, ok, why}: the engine's check on one line as the comparison counts it. ran is False where
    the check could not judge the line on this machine (the model's files are not here, it needs a
    GPU, it gave no answer): such a line is neither agreement nor refusal, whatever the role said."""
    if "not_run" in answer:
        return {"ran": False, "ok": None, "why": answer["not_run"]}
    words = "%s: %s" % (answer["error_type"], answer["error"]) if not answer["ok"] else ""
    if answer.get("model_missing"):
        return {"ran": False, "ok": None, "why": "a model the line names is not on this machine (downloads off): "
                + words}
    if not answer["ok"] and answer["error_type"] in ("ImportError", "ModuleNotFoundError"):
        return {"ran": False, "ok": None, "why": "the engine's import failed on this machine: " + words}
    if not answer["ok"] and NEEDS_GPU.search(words):
        return {"ran": False, "ok": None, "why": "needs a GPU: " + words}
    return {"ran": True, "ok": bool(answer["ok"]), "why": words}


def dry_run_verdict(venv: Path, engine: str, args: list) -> dict:
    """The engine's own configuration build on `serve` + args in a process of its own, as the
    module's program answers it on the host (its marker line), as check_of counts it."""
    program = DRY_RUN.read_text(encoding="utf-8") + "\nmain(__import__('json').loads(%r))\n" % json.dumps(
        dry_run_request(engine, args))
    try:
        proc = subprocess.run([str(venv / "bin" / "python"), "-I", "-"], input=program, capture_output=True,
                              text=True, env=dry_run_env(engine), timeout=DRY_RUN_TIMEOUT, check=False, cwd="/")
    except subprocess.TimeoutExpired:
        return check_of({"not_run": "no answer in %d s" % DRY_RUN_TIMEOUT})
    answers = [line[len(MARKER):] for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if len(answers) != 1:
        return check_of({"not_run": "no answer (exit %s): %s" % (proc.returncode, one_line(proc.stderr[-500:]))})
    return check_of(json.loads(answers[0]))


def dry_run_batch(venv: Path, engine: str, lines: list, timeout: int = 120) -> list:
    """check_of for each line, in one engine process (BATCH): the edge cases."""
    if not lines:
        return []
    requests = [dry_run_request(engine, args) for args in lines]
    program = "%s\nBATCH_MARKER = %r\n%s\n_batch(%r, __import__('json').loads(%r), %d)\n" % (
        DRY_RUN.read_text(encoding="utf-8"), BATCH_MARKER, BATCH, engine, json.dumps(requests), timeout)
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.run([str(venv / "bin" / "python"), "-I", "-"], input=program, stdout=subprocess.PIPE,
                              stderr=err, text=True, env=dry_run_env(engine), check=False, cwd="/")
        answers = [json.loads(line[len(BATCH_MARKER):]) for line in proc.stdout.splitlines()
                   if line.startswith(BATCH_MARKER)]
        if len(answers) != len(lines):
            err.seek(0)
            raise SystemExit("%s: the batch of checks gave %d answers for %d lines:\n%s" % (
                venv, len(answers), len(lines), err.read()[-3000:]))
    return [check_of(answer) for answer in answers]


def write_models(directory: Path, corpus_models: dict) -> dict:
    """The corpus's config.json files as local model directories (no download: HF_HUB_OFFLINE)."""
    paths = {}
    for name, config in corpus_models.items():
        path = directory / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config))
        paths[name] = str(path)
    return paths


def needs_check(case: dict, parser: tuple) -> bool:
    """Whether the engine's check could change the count of a case: every configuration, and an edge
    case unless the role and the engine's parser both refuse it (the check parses first)."""
    return case["kind"] == "configuration" or case["role"] or parser[0]


def tally(label: str, cases: list, parser_verdicts: list, checks: list) -> dict:
    """The table's row. The role's verdict is the host's: its flag data, then (where it took the line)
    the engine's own check; the engine's is its parser's (and SpeculativeConfig's) and its check's.
    A case whose check could not run on this machine goes to not_run, never to agree."""
    rows = {"label": label, "cases": len(cases), "configurations": 0, "agree": 0, "engine_only": [],
            "role_only": [], "not_run": [], "flag_data_role_only": 0, "checked": 0, "check_only": []}
    for case, (parsed, message), check in zip(cases, parser_verdicts, checks):
        rows["configurations"] += case["kind"] == "configuration"
        if check is not None and not check["ran"]:
            rows["not_run"].append(one_line("%s: %s" % (case["name"], check["why"])))
            continue
        engine = parsed and (check is None or check["ok"])
        why = message if not parsed else (check or {}).get("why", "")
        role = case["role"] and (check is None or check["ok"])
        rows["checked"] += check is not None
        rows["flag_data_role_only"] += case["role"] and not engine
        if check is not None and case["role"] and parsed and not check["ok"]:
            rows["check_only"].append(one_line("%s: %s" % (case["name"], why)))
        if role == engine:
            rows["agree"] += 1
        elif engine:
            rows["engine_only"].append(one_line("%s: %s" % (case["name"], "; ".join(case["problems"]))))
        else:
            rows["role_only"].append(one_line("%s: %s" % (case["name"], why)))
    return rows


def compare(venv: Path, corpus: dict, models: dict, dry_run: bool = True, edges: bool = True) -> dict:
    engine, version = venv.name.split("-", 1)
    flags = _engine_flags.EngineFlags(_engine_flags.load([str(FLAGS)], engine, version))
    cases = cases_for(engine, version, corpus[engine], models, flags)
    verdicts = engine_verdicts(venv, engine, cases, models)
    checks = [None] * len(cases)
    if dry_run:
        for at, case in enumerate(cases):
            if case["kind"] == "configuration":
                checks[at] = dry_run_verdict(venv, engine, case["args"])
        todo = [at for at, case in enumerate(cases) if edges and case["kind"] == "edge"
                and needs_check(case, verdicts[at])]
        for at, check in zip(todo, dry_run_batch(venv, engine, [cases[at]["args"] for at in todo])):
            checks[at] = check
    return tally("%s %s" % (engine, version), cases, verdicts, checks)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


HEADER = """\
# The role against the real engines

Made by `tools/compare_engines.py` (after `make engine-venvs`): the role's command builder renders each
configuration of `tests/fixtures/engine_corpus.json` and, for every option the role does not own, a
valid and an invalid value; each installed engine judges the same command line. Do not edit: run the tool.

- **The role's verdict is the host's** (issue 37): its flag data and rules first; a line they take then
  goes to the engine's own check, the one `cleanslate.gpu.inference_dry_run` runs on the host before
  anything is stopped (`plugins/module_utils/_engine_dry_run.py`: vLLM's `vllm serve` parser, its
  validation and `create_engine_config()`; SGLang's `prepare_server_args` and `check_server_args`), and a
  refusal there is the role's refusal. *Flag data alone* counts the role's verdict without that check.
- **The engine's verdict** is its real parser's (and for vLLM its SpeculativeConfig's, for SGLang its
  speculative algorithm's name) and that same check's. The check runs on every configuration (one engine
  process each, as on the host) and on every edge case unless the role and the engine's parser both
  refuse it (the edge cases share one engine process per version: the engine imported once, each line
  checked in a forked child of its own).
- **Engine's check could not run**: lines the check could not judge on this machine: a model or
  tokenizer the line names is not here (downloads off), the check needs a GPU, the engine's import
  failed, or no answer came. They are listed with the reason and counted neither as agreement nor as
  disagreement; on the host the role takes such a line when its flag data does.
- This machine has no GPU, so the comparison (never the role) runs SGLang's check with `--device cpu`
  put first on the line (a line's own `--device` comes after it and wins) and vLLM's with
  `VLLM_TARGET_DEVICE=cpu` (its CPU platform); a refusal that says the machine has no GPU is "could
  not run". Models: the corpus's tiny Llama `config.json` files, written to local directories (no
  weights, no tokenizer files).
- What the engine checks only when its scheduler or workers start is in neither verdict: see
  [What the engine's check does not see](#what-the-engines-check-does-not-see).
"""

NOT_SEEN = """\
## What the engine's check does not see

The check builds the engine's configuration; it starts no scheduler, no worker and loads no weights.
What the engine checks only there is in neither verdict above:

- vLLM: `num_speculative_tokens_per_batch_size` whose first range starts above batch size 1 builds a
  configuration and is refused when the scheduler starts (issue 25 point 3). The role's own rule
  refuses it before the check: "engine takes, role refuses" on the corpus's "schedule from batch size 2".
- A line agreed on here is agreed on this machine's CPU device: defaults that depend on the GPU (the
  attention backend, memory fractions, CUDA graphs) resolve differently on a GPU host, where the same
  check runs with the host's GPU and so still decides the role's verdict; the lines whose refusal
  here only says this machine has no GPU (or not that GPU) are "could not run".
- A refusal that names a package or plugin missing here (SGLang's `--enable-http2` without
  `granian`, `--enable-nvidia-megakernel` without its plugin) is this machine's install's: on a host,
  the check runs in the host's engine install and judges it there.
- The lines the role refuses because the readiness gate could not reach the API (`--headless`,
  `--grpc`, `--uds`, SGLang's `--grpc-mode`), or because a secret would be on the command line, build
  a valid configuration: "engine takes, role refuses" by design.
"""


def bullets(items: list) -> list:
    return ["- `%s`" % item.replace("`", "'") for item in items] or ["- none"]


def render(results: list) -> str:
    lines = [HEADER, "| engine | lines | configurations | engine's check ran | agree | engine takes, role refuses "
             "| role takes, engine refuses | engine's check could not run | role takes, engine refuses: flag data "
             "alone |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in results:
        counts = (row["cases"], row["configurations"], row["checked"], row["agree"], len(row["engine_only"]),
                  len(row["role_only"]), len(row["not_run"]), row["flag_data_role_only"])
        lines.append("| %s | %d | %d | %d | %d | %d | %d | %d | %d |" % ((row["label"],) + counts))
    for row in results:
        lines += ["", "## %s" % row["label"], "", "Engine takes, role refuses:", ""] + bullets(row["engine_only"])
        lines += ["", "Role takes, engine refuses:", ""] + bullets(row["role_only"])
        lines += ["", "Engine's check could not run:", ""] + bullets(row["not_run"])
        lines += ["", "Role takes by its flag data, refuses by the engine's check (the engine's parser takes it):",
                  ""] + bullets(row.get("check_only", []))
        parsed_too = row["flag_data_role_only"] - len(row.get("check_only", []))
        if parsed_too:
            lines.append("- and %d line(s) the engine's parser refuses too (\"flag data alone\" counts them; the "
                         "check parses first, so the host refuses them)" % parsed_too)
    lines += ["", NOT_SEEN.rstrip("\n")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=Path, default=REPO / "build" / "engines")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "engine_comparison.md")
    parser.add_argument("--no-dry-run", action="store_true",
                        help="judge the configurations by the parser and SpeculativeConfig only (no config build)")
    parser.add_argument("--no-edge-checks", action="store_true",
                        help="run the engine's check on the configurations only, not on the edge cases")
    parser.add_argument("--only", nargs="+", metavar="VENV", help="these venvs of --engines only (vllm-0.33.0 ...)")
    parser.add_argument("--results", type=Path, nargs="+", default=[REPO / "build" / "engine_comparison.json"],
                        help="where the rows are kept as JSON (the first); --render-only renders them all")
    parser.add_argument("--render-only", action="store_true", help="render --out from --results, run nothing")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.render_only:
        rows = [row for path in args.results for row in json.loads(path.read_text(encoding="utf-8"))]
        args.out.write_text(render(sorted(rows, key=lambda row: row["label"])), encoding="utf-8")
        return 0
    venvs = sorted(path for path in args.engines.resolve().glob("*-*") if (path / "bin" / "python").exists()
                   and path.name.split("-")[0] in ("vllm", "sglang"))
    if args.only:
        venvs = [path for path in venvs if path.name in args.only]
    if not venvs:
        parser.error("no engine venvs in %s: run make engine-venvs" % args.engines)
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        models = write_models(Path(tmp), corpus["models"])
        results = [compare(venv, corpus, models, dry_run=not args.no_dry_run, edges=not args.no_edge_checks)
                   for venv in venvs]
    args.results[0].parent.mkdir(parents=True, exist_ok=True)
    args.results[0].write_text(json.dumps(results, indent=1), encoding="utf-8")
    args.out.write_text(render(results), encoding="utf-8")
    for row in results:
        print("%s: %d lines, %d checked, %d agree, engine-only %d, role-only %d, not run %d, role-only with flag "
              "data alone %d" % (row["label"], row["cases"], row["checked"], row["agree"], len(row["engine_only"]),
                                 len(row["role_only"]), len(row["not_run"]), row["flag_data_role_only"]))
    print("%.0f s" % (time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
