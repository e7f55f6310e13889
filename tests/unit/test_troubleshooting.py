"""docs/troubleshooting.md has a line for every problem sentence the code can emit, every status
and every step a host can fail at, so a new message cannot ship without its runbook line.

The sentences are found in the source by patterns the code keeps, not by a list kept here:
  - a string literal that ends with a full stop (a problem sentence: nvml_verify's per-GPU
    problems, the report's lost GPU, the role's variable checks), docstrings and the
    DOCUMENTATION/EXAMPLES/RETURN blocks left out;
  - a module-level constant named *_ACTION or *_NEEDED (gpu_reset's "what to do" for a process
    it could not stop, its need for root) or NOT_RUN (the report's row without a result);
  - the text of a failure: the `msg=` of a call (fail_json, a result), the argument of a raised
    exception (TypeError, ValueError, KeyError: programming errors, left out), what is
    assigned to a result's "reason" or "msg", and the argument of a `.problem(...)` call (the
    serving configuration's one-sentence problems, plugin_utils/_serve_command.py).
A sentence is identified by its head, its first words (at least four, at least two of them
literal text); a format placeholder (%s, %d, ...) matches any one word. The runbook matches when
it contains the head, ignoring case, backticks and line breaks: reword the rest of a message
freely, but a new head needs a line in docs/troubleshooting.md."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.action.reset_steps import STEPS as RESET_STEPS

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "docs" / "troubleshooting.md"
SOURCES = ("plugins/module_utils/_nvml_verify_module.py", "plugins/module_utils/_gpu_reset_module.py", "plugins/filter/node_reset.py",
           "plugins/action/fleet_report.py", "plugins/plugin_utils/_report_rows.py", "plugins/modules/inference_ready.py",
           "plugins/action/inference_ready.py", "plugins/plugin_utils/_secret_checks.py",
           "plugins/plugin_utils/_serve_command.py", "plugins/plugin_utils/_engine_flags.py",
           "plugins/filter/inference_service.py", "plugins/plugin_utils/_heal_breaker.py",
           "plugins/modules/inference_files.py", "plugins/modules/inference_host.py",
           "plugins/module_utils/_installed_version.py", "plugins/modules/inference_dry_run.py",
           "plugins/plugin_utils/_playbook_variables.py")
DOC_BLOCKS = ("DOCUMENTATION", "EXAMPLES", "RETURN")
CONSTANT = re.compile(r"_(ACTION|NEEDED)$|^NOT_RUN$")
INTERNAL_ERRORS = ("TypeError", "ValueError", "KeyError", "AssertionError")
PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?[sdrgfieEx]|\{[^}]*\}")
HEAD_WORDS, HEAD_LITERAL = 4, 2


def _text(node):
    """The literal text of a message expression: a string, or the format of `format % args`."""
    while isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Mod):
        node = node.left
    if isinstance(node, ast.BinOp):
        node = node.left
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node
    return None


def _excluded(tree) -> set:
    """ids of the docstrings and documentation blocks."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and ast.get_docstring(node, clean=False) is not None:
            out.add(id(node.body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in DOC_BLOCKS for t in node.targets):
            out.add(id(node.value))
    return out


def _failure_texts(node):
    """The message expressions a node hands to the user, by the patterns above."""
    if isinstance(node, ast.Call):
        yield from (keyword.value for keyword in node.keywords if keyword.arg == "msg")
        if isinstance(node.func, ast.Attribute) and node.func.attr == "problem" and node.args:
            yield node.args[0]
    if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
        name = node.exc.func.id if isinstance(node.exc.func, ast.Name) else getattr(node.exc.func, "attr", "")
        if name not in INTERNAL_ERRORS:
            yield node.exc.args[0]
    yield from _assigned(node, ("reason", "msg"))


def _assigned(node, keys):
    """The values an assignment gives to x["key"] for key in keys (tuple assignments paired)."""
    if not isinstance(node, ast.Assign):
        return
    targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
    values = node.value.elts if isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(targets) \
        else [node.value] * len(targets)
    for target, value in zip(targets, values):
        if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and target.slice.value in keys:
            yield value


def messages(path: Path) -> list:
    """Every message of the file, by the patterns of the module docstring."""
    tree = ast.parse(path.read_text())
    excluded = _excluded(tree)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and CONSTANT.search(t.id) for t in node.targets):
            if _text(node.value) is not None:
                found.append(_text(node.value).value)
    for node in ast.walk(tree):
        for expression in _failure_texts(node):
            literal = _text(expression)
            if literal is not None and id(literal) not in excluded:
                found.append(literal.value)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in excluded \
                and node.value.rstrip().endswith("."):
            found.append(node.value)
    return found


def head(message: str):
    """The regular expression of the message's head, or None for one with too little text
    of its own to be told apart ("%s: %s")."""
    words, literal = [], 0
    for word in message.replace("%%", "%").split():
        words.append(word)
        if not PLACEHOLDER.fullmatch(word.strip("().,:;'\"")):
            literal += 1
        if len(words) >= HEAD_WORDS and literal >= HEAD_LITERAL:
            break
    if literal < HEAD_LITERAL:
        return None
    parts = []
    for word in words:
        # A placeholder stands for a value of any length: a name, a number, "(failed, exit status 1)".
        parts.append(r".{0,80}?".join(re.escape(piece) for piece in PLACEHOLDER.split(word)))
    return r"\s+".join(parts)


def _runbook() -> str:
    return " ".join(RUNBOOK.read_text().replace("`", "").split())


HEADS = sorted({(source, head(message), " ".join(message.split())[:90])
                for source in SOURCES for message in messages(REPO / source) if head(message)})


def test_every_source_yields_messages():
    """A pattern that stopped matching (code renamed or moved) fails here, not silently."""
    for source in SOURCES:
        assert [m for m in messages(REPO / source) if head(m)], "no message found in %s" % source
    assert len(HEADS) >= 40


@pytest.mark.parametrize("source,pattern,message", HEADS, ids=[case[2][:60] for case in HEADS])
def test_problem_sentence_has_a_runbook_line(source, pattern, message):
    assert re.search(pattern, _runbook(), re.I), (
        "docs/troubleshooting.md has no line for %s's message %r: quote its first words (placeholders as "
        "N, X, PID) with what to do" % (source, message))


def _statuses() -> set:
    """node_reset's statuses (what its status function returns) and the others a row or a
    result is given (a "status" key)."""
    found = set()
    for source in ("plugins/plugin_utils/_node_reset_result.py", "plugins/action/fleet_report.py", "plugins/plugin_utils/_report_rows.py",
                   "plugins/action/inference_ready.py"):
        tree = ast.parse((REPO / source).read_text())
        values = []
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_").endswith("status"):
                values += [ret.value for ret in ast.walk(node) if isinstance(ret, ast.Return) and ret.value is not None]
            values += list(_assigned(node, ("status",)))
            if isinstance(node, ast.Dict):
                values += [value for key, value in zip(node.keys, node.values)
                           if isinstance(key, ast.Constant) and key.value == "status"]
        found.update(text.replace(" %s", " <step>") for value in values for text in _values(value))
    return found


def _values(node) -> list:
    """The strings an expression can evaluate to: a literal, either branch of `a if c else b`,
    the format of `format % args`."""
    if isinstance(node, ast.IfExp):
        return _values(node.body) + _values(node.orelse)
    literal = _text(node)
    return [literal.value] if literal is not None else []


def test_every_status_has_a_runbook_line():
    statuses = _statuses()
    assert {"ok", "dirty", "invalid", "unreachable", "failed at <step>", "not run", "degraded"} <= statuses, statuses
    text = RUNBOOK.read_text()
    missing = sorted(status for status in statuses if "`%s`" % status not in text)
    assert not missing, "docs/troubleshooting.md has no entry for the status(es) %s" % missing


def test_every_step_a_host_can_fail_at_has_a_runbook_line():
    """The steps are the role's own names: each task's __node_reset_step, and the module steps
    that cleanslate.gpu.reset_steps runs in one task and names when one fails."""
    steps = set(RESET_STEPS)
    for tasks in (REPO / "roles" / "node_reset" / "tasks").glob("*.yml"):
        steps.update(re.findall(r"^\s*__node_reset_step:\s*(\w+)\s*$", tasks.read_text(), re.M))
    assert {"gpu_reset", "shm_clean", "pycache_purge", "nvml_verify"} <= steps, steps
    text = RUNBOOK.read_text()
    missing = sorted(step for step in steps if "`failed at %s`" % step not in text)
    assert not missing, "docs/troubleshooting.md has no `failed at <step>` line for %s" % missing


def test_the_head_of_a_new_message_is_required():
    """The matching itself: a message the runbook does not quote is found missing, one it
    quotes with its placeholders written as words is found."""
    runbook = _runbook()
    assert not re.search(head("Fan stuck at %d RPM: replace the fan."), runbook, re.I)
    assert re.search(head("%d uncorrected volatile ECC errors: drain the GPU."), runbook, re.I)
    assert head("%s: %s") is None
