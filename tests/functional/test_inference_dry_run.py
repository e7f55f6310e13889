"""cleanslate.gpu.inference_dry_run against a fake engine venv (issue 37, point 3).

The engine's side is a test double at the engine boundary: a real venv of the system Python (every
user can run it; root's pyenv Python lies in /root) holding a tiny package named `vllm` with the
module paths the check imports, whose configuration code raises ValueError for some command lines
and reports who and where it runs for others. The real vLLM runs in
tests/integration/test_engine_dry_run_real.py. Where the module must read an answer that lies, the
"Python" the executable names is a shell script printing that answer. The module runs as root
through run_module; the check runs as `nobody`. Signals only its own process group.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.readable_copy import readable_dir
from tests.run_module import run_module

SYSTEM_PY = "/usr/bin/python3"
NOBODY = 65534
SECRET = "sk-dryrun/canary+4f9a1c77"
SECRET_URL = "sk-dryrun%2Fcanary%2B4f9a1c77"
MARKER = "CLEANSLATE_ENGINE_DRY_RUN "

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="starting the check as another user needs root"),
    pytest.mark.skipif(not os.path.exists(SYSTEM_PY), reason="no system Python that every user can run"),
]

# The fake engine: the module paths of vLLM 0.32's serve command, its parser and its config build.
FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": "from argparse import ArgumentParser as FlexibleArgumentParser\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/serve.py": """
        class ServeSubcommand:
            name = "serve"

            def subparser_init(self, subparsers):
                parser = subparsers.add_parser("serve")
                parser.add_argument("model_tag", nargs="?")
                parser.add_argument("--max-num-seqs", type=int, default=256)
                parser.add_argument("--enable-auto-tool-choice", action="store_true")
                parser.add_argument("--tool-call-parser")
                parser.add_argument("--behave", default="")
                # What the role renders by default (tests/integration/test_engine_dry_run_play.py).
                parser.add_argument("--served-model-name")
                parser.add_argument("--tensor-parallel-size", type=int, default=1)
                parser.add_argument("--host")
                parser.add_argument("--port", type=int)
                parser.add_argument("--shutdown-timeout", type=int)
                return parser

            def validate(self, args):
                if args.enable_auto_tool_choice and not args.tool_call_parser:
                    raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")


        def cmd_init():
            return [ServeSubcommand()]
        """,
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
        import json
        import os
        import sys
        import time


        class AsyncEngineArgs:
            def __init__(self, args):
                self.args = args

            @classmethod
            def from_cli_args(cls, args):
                return cls(args)

            def create_engine_config(self, **kwargs):
                args = self.args
                if args.max_num_seqs < 1:
                    raise ValueError("max_num_seqs must be at least 1, got %d" % args.max_num_seqs)
                behave = args.behave
                if behave == "who":
                    raise ValueError(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
                                                 "groups": os.getgroups(), "cwd": os.getcwd(), "pgid": os.getpgid(0),
                                                 "sid": os.getsid(0), "model": args.model}))
                if behave == "env":
                    raise ValueError(json.dumps(dict(os.environ)))
                if behave == "leak":
                    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                    with open(os.path.join(here, "token.txt")) as handle:
                        token = handle.read().strip()
                    # As engines print it: raw, and URL-encoded in a URL (which Ansible's own no_log misses).
                    from urllib.parse import quote
                    raise ValueError("cannot reach https://hub.example/?token=%s with token %s" % (quote(token, safe=""), token))
                if behave == "chatty":
                    for dummy in range(20000):
                        print("x" * 100)
                    sys.stderr.write("y" * 400000)
                if behave == "multiline":
                    raise ValueError("1 validation error for SpeculativeConfig\\n  num_speculative_tokens\\n"
                                     "    must be provided\\n    For further information visit https://errors.example")
                if behave == "long":
                    raise ValueError("z" * 5000)
                if behave == "template":
                    # What a hostile venv could make its engine say: Jinja that would run a command.
                    raise ValueError("{{ lookup('pipe', 'touch /tmp/cleanslate-dry-run-templated') }} {%% raw %%} }} %s"
                                     % "{{ 7 * 7 }}")
                if behave == "exit":
                    sys.exit(3)
                if behave == "offline":
                    class LocalEntryNotFoundError(OSError):
                        pass
                    try:
                        raise LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder")
                    except OSError as exc:
                        raise ValueError("Invalid repository ID or local directory specified") from exc
        """,
}

# "Pythons" that print what a lying or broken engine would: each a shell script, stdin read and dropped.
LIARS = {
    "no-marker": "echo all fine\necho 'some progress' >&2",
    "two-markers": "echo '%s{\"ok\": true, \"error_type\": \"\", \"error\": \"\"}'\n"
                   "echo '%s{\"ok\": false, \"error_type\": \"X\", \"error\": \"no\"}'" % (MARKER, MARKER),
    "wrong-types": "echo '%s{\"ok\": \"yes\", \"error_type\": 1, \"error\": []}'" % MARKER,
    "ok-not-bool": "echo '%s{\"ok\": \"yes\", \"error_type\": \"\", \"error\": \"\"}'" % MARKER,
    "not-json": "echo '%s{ok: true'" % MARKER,
    "non-utf8": "printf '%s{\"ok\": false, \"error_type\": \"ValueError\", \"error\": \"bad \\\\udcff byte\"}\\n'\n"
                "printf 'last \\377\\376 words\\n' >&2" % MARKER,
    "non-utf8-no-marker": "printf 'last \\377\\376 words\\n' >&2\nexit 4",
    "huge": "head -c 20000000 /dev/zero | tr '\\0' 'a'\nhead -c 20000000 /dev/zero | tr '\\0' 'b' >&2",
    "tree": "echo $$ > \"$(dirname \"$0\")/group.pid\"\nsleep 300 &\necho $! > \"$(dirname \"$0\")/child.pid\"\n"
            "sleep 300",
    "secret-said": "echo 'failed with token %s' >&2\nexit 1" % SECRET,
    # An engine that dies of a signal (a segfault in a native extension), its last words said first.
    "killed": "echo 'Fatal Python error: Segmentation fault' >&2\nkill -SEGV $$",
}


def write_tree(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def fake():
    """A directory every user can reach: venv/ (with the fake vllm, its bin/vllm), bare/ (no vllm),
    and liar-NAME/bin/{python3,vllm} for each of LIARS; nobody owns it all."""
    top = readable_dir("cleanslate-dry-run-")
    venv = top / "venv"
    subprocess.run([SYSTEM_PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0])
    write_tree(site, FAKE_VLLM)
    (site / "token.txt").write_text(SECRET + "\n")
    subprocess.run([SYSTEM_PY, "-m", "venv", "--without-pip", str(top / "bare")], check=True)
    for prefix in ("venv", "bare"):
        launcher = top / prefix / "bin" / "vllm"
        launcher.write_text("#!%s\nfrom vllm.entrypoints.cli.main import main\nmain()\n" % (top / prefix / "bin" / "python3"))
        launcher.chmod(0o755)
    for name, script in LIARS.items():
        bin_dir = top / ("liar-" + name) / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python3").write_text("#!/bin/sh\ncat >/dev/null\n" + script + "\n")
        (bin_dir / "vllm").write_text("#!%s\n" % (bin_dir / "python3"))
        for each in ("python3", "vllm"):
            (bin_dir / each).chmod(0o755)
    for path in [top, *top.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    yield top
    shutil.rmtree(top)


def dry_run(executable, *args, check=False, **params):
    params = dict({"engine": "vllm", "argv": [str(executable), "serve", "/srv/models/tiny", *args],
                   "user": "nobody", "secrets": [SECRET]}, **params)
    return run_module("inference_dry_run", params, check=check, timeout=120)


def vllm(fake):
    return fake / "venv" / "bin" / "vllm"


def liar(fake, name):
    return fake / ("liar-" + name) / "bin" / "vllm"


def test_a_configuration_the_engine_takes_passes_in_check_mode_too(fake):
    for check in (False, True):
        result = dry_run(vllm(fake), "--max-num-seqs", "64", check=check)
        assert result["rc"] == 0 and not result["changed"]
        assert (result["ran"], result["ok"], result["refusal"], result["why_not_run"]) == (True, True, "", "")
        assert result["interpreter"] == str(fake / "venv" / "bin" / "python3")
        assert result["seconds"] > 0


@pytest.mark.parametrize("args, error_type, words", [
    (["--max-num-seqs", "0"], "ValueError", "max_num_seqs must be at least 1, got 0"),
    (["--enable-auto-tool-choice"], "TypeError", "Error: --enable-auto-tool-choice requires --tool-call-parser"),
    (["--no-such-flag"], "ParserError", "vllm: error: unrecognized arguments: --no-such-flag"),
    (["--max-num-seqs", "many"], "ParserError", "argument --max-num-seqs: invalid int value: 'many'"),
    (["--behave", "exit"], "SystemExit", "3"),
])
def test_a_refusal_is_the_engines_own_words(fake, args, error_type, words):
    result = dry_run(vllm(fake), *args)
    assert result["rc"] == 0 and not result["changed"]
    assert (result["ran"], result["ok"], result["error_type"], result["why_not_run"]) == (True, False, error_type, "")
    assert words in result["refusal"]


def test_a_refusal_of_several_lines_is_one_line_without_the_link_and_a_long_one_is_cut(fake):
    result = dry_run(vllm(fake), "--behave", "multiline")
    assert result["refusal"] == "1 validation error for SpeculativeConfig num_speculative_tokens must be provided"
    long = dry_run(vllm(fake), "--behave", "long")
    assert len(long["refusal"]) == 1000 and long["refusal"].endswith("...")


def test_the_check_runs_as_the_service_user_in_a_session_of_its_own_never_as_root(fake):
    # The module's root has supplementary groups (disk, shadow), which the check must not keep.
    groups = os.getgroups()
    os.setgroups([0, 6, 42])
    try:
        seen = json.loads(dry_run(vllm(fake), "--behave", "who")["refusal"])
    finally:
        os.setgroups(groups)
    assert (seen["uid"], seen["euid"], seen["gid"]) == (NOBODY, NOBODY, NOBODY)
    assert 0 not in seen["groups"] and set(seen["groups"]) <= {NOBODY}
    # nobody's home (/nonexistent) is not there: the check runs in /.
    assert seen["cwd"] == "/" and seen["sid"] == seen["pgid"] != os.getsid(0)
    assert seen["model"] == "/srv/models/tiny"


@pytest.mark.parametrize("user, sentence", [
    ("root", 'user "root" is root (uid 0): the engine\'s Python never runs as root, even for a check'),
    ("no-such-user-37", 'user "no-such-user-37" does not exist on the host: the check runs only as the server\'s user'),
])
def test_root_and_a_missing_user_are_refused_in_one_sentence_before_anything_runs(fake, user, sentence):
    result = dry_run(liar(fake, "tree"), user=user, timeout=3)
    assert result["rc"] == 1 and result["failed"] and result["msg"] == sentence and not result["ran"]
    assert not (fake / "liar-tree" / "bin" / "child.pid").exists()


def test_the_environment_is_the_checks_own_and_no_secret_reaches_it(fake):
    env = json.loads(dry_run(vllm(fake), "--behave", "env",
                             environment={"HF_HOME": "/srv/hf", "HF_HUB_OFFLINE": "0"})["refusal"])
    assert env == {"PATH": "%s:/usr/local/bin:/usr/bin:/bin" % (fake / "venv" / "bin"), "HOME": "/nonexistent",
                   "USER": "nobody", "LOGNAME": "nobody", "LANG": "C.UTF-8", "HF_HOME": "/srv/hf",
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    assert SECRET not in json.dumps(env)


@pytest.mark.parametrize("where", ["argv", "environment"])
def test_a_secret_on_the_command_line_or_in_the_environment_is_refused_unshown(fake, where):
    if where == "argv":
        result = dry_run(vllm(fake), "--api-key", SECRET)
    else:
        result = dry_run(vllm(fake), environment={"SOME_SETTING": SECRET})
    assert result["rc"] == 1 and result["msg"] == "%s holds a value of secrets: a secret never reaches the check" % where
    assert SECRET not in json.dumps(result)


@pytest.mark.parametrize("how", ["leak", "secret-said"])
def test_a_secret_the_engine_prints_is_hidden(fake, how):
    result = dry_run(vllm(fake), "--behave", "leak") if how == "leak" else dry_run(liar(fake, how))
    assert SECRET not in json.dumps(result) and SECRET_URL not in json.dumps(result)
    assert "********" in (result["refusal"] or result["why_not_run"])


def test_the_timeout_kills_the_checks_whole_process_group(fake):
    pid_file = fake / "liar-tree" / "bin" / "child.pid"
    started = time.monotonic()
    result = dry_run(liar(fake, "tree"), timeout=2)
    assert time.monotonic() - started < 30
    assert result["rc"] == 0 and (result["ran"], result["ok"]) == (False, False)
    assert result["why_not_run"] == "the check ran past its timeout of 2 seconds and its process group was killed"
    child = int(pid_file.read_text())
    # Killed and reaped by its new parent (init, or a subreaper): gone, or a zombie at most.
    for dummy in range(50):
        try:
            state = Path("/proc/%d/stat" % child).read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the check's child %d outlived the timeout" % child)


@pytest.mark.parametrize("name, said", [
    ("no-marker", "the engine's Python exited with status 0 and its answer line is missing; its last words: some progress"),
    ("two-markers", "the engine's Python exited with status 0 and it printed 2 answer lines, not one"),
    ("wrong-types", "the engine's Python exited with status 0 and its answer line is not "
                    "{ok: true or false, error_type: text, error: text}"),
    ("ok-not-bool", "the engine's Python exited with status 0 and its answer line is not "
                    "{ok: true or false, error_type: text, error: text}"),
    ("not-json", "the engine's Python exited with status 0 and its answer line is not JSON"),
    ("non-utf8-no-marker", "the engine's Python exited with status 4 and its answer line is missing; "
                           "its last words: last \\xff\\xfe words"),
    ("huge", "the engine's Python exited with status 0 and its answer line is missing; its last words: bbbb"),
    ("killed", "the engine's Python was killed by signal 11 and its answer line is missing; "
               "its last words: Fatal Python error: Segmentation fault"),
])
def test_an_answer_that_lies_or_floods_is_one_sentence(fake, name, said):
    result = dry_run(liar(fake, name))
    assert result["rc"] == 0 and (result["ran"], result["ok"], result["refusal"]) == (False, False, "")
    if name == "huge":  # 256 KiB read of a line of 20 MB, cut to 1000 characters
        assert result["why_not_run"].startswith(said) and result["why_not_run"].endswith("b...")
        assert len(result["why_not_run"]) == 1000
    else:
        assert result["why_not_run"] == said


def test_a_refusal_with_a_byte_that_is_not_utf8_is_printable(fake):
    result = dry_run(liar(fake, "non-utf8"))
    assert (result["ran"], result["ok"]) == (True, False)
    assert result["refusal"] == "bad \\xed\\xb3\\xbf byte"


def test_an_engine_that_floods_its_output_still_answers(fake):
    result = dry_run(vllm(fake), "--behave", "chatty")
    assert (result["ran"], result["ok"], result["why_not_run"]) == (True, True, "")


def test_an_engine_that_is_not_installed_or_a_python_that_is_not_there_did_not_run(fake, tmp_path):
    bare = dry_run(fake / "bare" / "bin" / "vllm")
    assert (bare["ran"], bare["ok"]) == (False, False)
    assert bare["why_not_run"] == "the engine's import failed: No module named 'vllm'"
    missing = readable_dir("cleanslate-dry-run-missing-")
    try:
        (missing / "vllm").write_text("#!/opt/nowhere/bin/python3\n")
        gone = dry_run(missing / "vllm")
        assert (gone["ran"], gone["ok"]) == (False, False)
        assert gone["why_not_run"].startswith("/opt/nowhere/bin/python3 could not be started as nobody: ")
        absent = dry_run(missing / "none")
        assert absent["why_not_run"] == "the engine's Python cannot be found: there is no %s" % (missing / "none")
    finally:
        shutil.rmtree(missing)


@pytest.mark.parametrize("params, sentence", [
    ({"argv": []}, "argv must start with the engine's executable, an absolute path, got an empty list"),
    ({"argv": ["vllm", "serve"]}, 'argv must start with the engine\'s executable, an absolute path, got "vllm"'),
    ({"timeout": 0}, "timeout is 0: it must be a whole number of seconds from 1 to 3600."),
    ({"environment": {"1BAD": "x"}}, 'environment: "1BAD" is not a variable name (letters, digits and _, not first a digit)'),
])
def test_a_bad_input_is_one_sentence(fake, params, sentence):
    result = run_module("inference_dry_run", dict({"engine": "vllm", "argv": [str(vllm(fake)), "serve", "m"],
                                                   "user": "nobody"}, **params))
    assert result["rc"] == 1 and result["msg"] == sentence


def test_a_model_whose_files_are_not_on_the_host_is_no_verdict(fake):
    result = dry_run(vllm(fake), "--behave", "offline")
    assert (result["ran"], result["ok"], result["refusal"]) == (False, False, "")
    assert result["why_not_run"] == ("the model's files are not on the host (not a directory, not in the Hugging Face "
                                     "cache) and the check downloads nothing: Invalid repository ID or local directory "
                                     "specified")


def test_the_check_dies_with_the_module(fake):
    """A module killed by a signal it cannot catch (SIGKILL: a timeout of its caller) takes the
    engine's Python with it: the check never runs on unbounded."""
    params = {"engine": "vllm", "argv": [str(liar(fake, "tree")), "serve", "m"], "user": "nobody", "timeout": 300}
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("inference_dry_run", params, timeout=3)
    leader = None
    for dummy in range(50):
        leaders = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(
            "/bin/sh %s" % (fake / "liar-tree" / "bin" / "python3"))]
        leader = leaders[0] if leaders else None
        if leader is None:
            break
        time.sleep(0.1)
    assert leader is None, "the check %d outlived the module" % leader
    # What the check started itself is left to the timeout of a module that lives: killed here.
    try:
        os.killpg(int((fake / "liar-tree" / "bin" / "group.pid").read_text()), 9)
    except ProcessLookupError:
        pass


def _cmdline(proc_dir):
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""
