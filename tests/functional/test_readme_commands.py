"""The shell commands of README.md and docs/getting_started.md work as written, copied in order.

Every command of their shell blocks marked `not run` (tests/doc_blocks.py; the blocks marked `run`,
tests/integration/test_doc_commands.py runs for real), and every inline `ansible-playbook ...`, `ansible-galaxy ...`
or `make ...`, is checked against the checkout: a make target exists in the Makefile, a file
copied or sourced exists, a collection or package installed is one the project names, and each
ansible-playbook command names a playbook that exists and an inventory that exists, that an
earlier `cp` of the same page makes, or that the page shows as a YAML block introduced by the
file's name. Each ansible-playbook command then runs as written, with `--list-hosts` added (it
parses the playbook and the inventory and applies the limit, and connects to nothing), through
the venv's ansible-playbook, and must name at least one host. A command the test does not know
how to check fails, so a new kind of command needs a check here."""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.doc_blocks import PAGES, shell_blocks

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
MAKEFILE = (REPO / "Makefile").read_text()
INLINE = re.compile(r"`((?:ansible-playbook|ansible-galaxy|make)\s[^`]+)`")
# "`inventory.yml`:" (or "... `pve.yml`:") at the end of a line, then a YAML block: the page's file.
NAMED_YAML = re.compile(r"`([\w.-]+\.ya?ml)`:\n\n```ya?ml\n(.*?)^```", re.S | re.M)


def page_commands(doc: str) -> list:
    """[(argv, line)] in the page's order: the lines of the shell blocks marked not run (those marked
    run, tests/integration/test_doc_commands.py runs), then inline commands."""
    text = (REPO / doc).read_text()
    found = []
    for block in shell_blocks(doc):
        assert block.marker, "%s: the shell block has no doc-commands marker before it (tests/doc_blocks.py)" % block.where
        for number, line in [] if block.run else block.lines:
            argv = shlex.split(line, comments=True)
            if argv:
                found.append((argv, number))
    for span in INLINE.finditer(text):
        found.append((shlex.split(" ".join(span.group(1).split())), text[:span.start()].count("\n") + 1))
    return sorted(found, key=lambda item: item[1])


CASES = [(doc, argv, line) for doc in PAGES for argv, line in page_commands(doc)]


def _copies_before(doc: str, line: int) -> dict:
    """{destination: source} of the `cp` commands above `line` in the page."""
    return {argv[-1]: argv[-2] for argv, at in page_commands(doc) if argv[0] == "cp" and at < line}


def _make_targets() -> set:
    return set(re.findall(r"^([a-z][\w-]*):", MAKEFILE, re.M))


def _pinned(name: str) -> bool:
    pins = (REPO / "requirements.txt").read_text() + (REPO / "constraints.txt").read_text()
    return re.search(r"^%s==" % re.escape(name), pins, re.M | re.I) is not None


def _playbook(name: str) -> Path:
    fqcn = "%s.%s." % (GALAXY["namespace"], GALAXY["name"])
    path = REPO / "playbooks" / (name[len(fqcn):] + ".yml") if name.startswith(fqcn) else REPO / name
    assert path.is_file(), "playbook %s does not exist (%s)" % (name, path.relative_to(REPO))
    return path


def _inventory(doc: str, line: int, name: str, tmp_path: Path) -> Path:
    """The inventory a reader has at that point: a file of the checkout, one an earlier `cp`
    made, or one the page shows."""
    if (REPO / name).is_file():
        return REPO / name
    copies = _copies_before(doc, line)
    if name in copies:
        assert not (REPO / name).exists()
        return REPO / copies[name]
    shown = dict(NAMED_YAML.findall((REPO / doc).read_text()))
    assert name in shown, "inventory %s does not exist, and %s neither copies it nor shows it" % (name, doc)
    path = tmp_path / Path(name).name
    path.write_text(shown[name])
    return path


def check_make(argv, doc, line, tmp_path):
    targets = [arg for arg in argv[1:] if not arg.startswith("-") and "=" not in arg]
    assert targets, "make without a target"
    missing = [target for target in targets if target not in _make_targets()]
    assert not missing, "no make target %s" % ", ".join(missing)


def check_source(argv, doc, line, tmp_path):
    assert argv[1] == ".venv/bin/activate", argv
    assert re.search(r"^VENV := \.venv$", MAKEFILE, re.M), "make setup no longer makes .venv"
    assert (REPO / argv[1]).is_file(), "%s does not exist after make setup" % argv[1]


def check_cp(argv, doc, line, tmp_path):
    assert len(argv) == 3, argv
    assert (REPO / argv[1]).is_file(), "%s does not exist" % argv[1]


def check_galaxy(argv, doc, line, tmp_path):
    assert argv[1:3] == ["collection", "install"], argv
    args = argv[3:]
    if args[0] == "-r":
        requirements = yaml.safe_load((REPO / args[1]).read_text())
        names = [entry["name"] for entry in requirements["collections"]]
        assert "%s.%s" % (GALAXY["namespace"], GALAXY["name"]) in names, names
        return
    (name,) = args
    if name.endswith(".tar.gz"):
        expected = "%s-%s-%s.tar.gz" % (GALAXY["namespace"], GALAXY["name"], GALAXY["version"])
        assert Path(name).name == expected, "the tarball is %s, not %s" % (expected, name)
        dist = re.search(r"^dist:.*\n\t.*tools/dist\.py \S+ \$\(BUILD\)/(\S+)$", MAKEFILE, re.M)
        assert dist and str(Path(name).parent) == "build/" + dist.group(1), "make dist does not write %s" % name
        return
    known = ["%s.%s" % (GALAXY["namespace"], GALAXY["name"])] + [
        entry["name"] for entry in yaml.safe_load((REPO / "collections/requirements.yml").read_text())["collections"]]
    assert name in known, "%s is not a collection the project names" % name


def check_pip(argv, doc, line, tmp_path):
    assert argv[1] == "install", argv
    for name in argv[2:]:
        if not name.startswith("-"):
            assert _pinned(name), "%s is not pinned in requirements.txt or constraints.txt" % name


def check_playbook(argv, doc, line, tmp_path):
    args = list(argv[1:])
    positional = [arg for index, arg in enumerate(args)
                  if not arg.startswith("-") and (index == 0 or args[index - 1] not in ("-i", "-l", "-e", "--forks"))]
    assert len(positional) == 1, "one playbook per command: %s" % positional
    _playbook(positional[0])
    assert "-i" in args, "no inventory (-i): ansible.cfg names none, on purpose"
    where = args.index("-i") + 1
    args[where] = str(_inventory(doc, line, args[where], tmp_path))
    # An extra-vars file that a make target writes under build/ (make sim-node's variables): a
    # target of the Makefile must name it; listing the hosts needs none of its values.
    for index in [index for index, arg in enumerate(args) if arg == "-e" and args[index + 1].startswith("@")][::-1]:
        path = args[index + 1][1:]
        if not (REPO / path).is_file():
            writer = r"^\t(?!rm ).*\$\(BUILD\)/%s\b" % re.escape(path[len("build/"):])
            assert path.startswith("build/") and re.search(writer, MAKEFILE, re.M), \
                "%s: no make target writes %s" % (doc, path)
            del args[index:index + 2]
    run = subprocess.run([str(ANSIBLE_PLAYBOOK), *args, "--list-hosts"], cwd=REPO, capture_output=True,
                         text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    counts = [int(count) for count in re.findall(r"hosts \((\d+)\):", run.stdout)]
    assert counts and counts[0] > 0, "the command matches no host:\n" + run.stdout


CHECKS = {"make": check_make, ".": check_source, "source": check_source, "cp": check_cp,
          "ansible-galaxy": check_galaxy, "pip": check_pip, "ansible-playbook": check_playbook}


def test_the_pages_have_commands():
    programs = {argv[0] for doc, argv, line in CASES}
    assert {"make", "ansible-playbook", "ansible-galaxy", "cp", "."} <= programs, programs
    readme = [argv for doc, argv, line in CASES if doc == "README.md"]
    assert readme[:2] == [["make", "demo"], ["make", "test"]], "README.md must open with make demo and make test"
    ci = (REPO / ".ci" / "run").read_text()
    assert "exec make test" in ci, "CI no longer runs make test: README's test command must follow it"


@pytest.mark.parametrize("doc,argv,line", CASES, ids=["%s:%d" % (doc, line) for doc, argv, line in CASES])
def test_command_works_as_written(doc, argv, line, tmp_path):
    check = CHECKS.get(argv[0])
    assert check, "%s:%d: the test does not know how to check `%s`; add a check" % (doc, line, argv[0])
    check(argv, doc, line, tmp_path)
