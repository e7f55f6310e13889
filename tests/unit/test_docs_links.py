"""The documentation points at things that exist: every relative Markdown link of README.md,
CONTRIBUTING.md and docs/*.md resolves to a file (and a #section of a Markdown file to one of
its headings), every repository path a page quotes (`docs/x.md`, `tools/x.py`, ...) exists unless
git ignores it (build output) or it is the reader's copy of an example, and docs/gpu_proof.md names every wheel tools/gpu_wheels.sh fetches
for the GPU machine, through the make target tests/gpu/run.sh names."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md"] + sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
QUOTED_PATH = re.compile(r"`((?:docs|playbooks|inventory|roles|tools|tests|plugins|meta|bench|changelogs|collections)"
                         r"/[^`\s]*)`")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(page: Path) -> str:
    """The page without its code blocks (a shell comment is no link)."""
    return CODE_BLOCK.sub("", page.read_text())


def anchors(page: Path) -> set:
    """GitHub's anchors of the page's headings: lower case, punctuation dropped, spaces as -."""
    found = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", CODE_BLOCK.sub("", page.read_text()), re.M):
        text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
        found.add(text.replace(" ", "-"))
    return found


def _ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO,
                          check=False).returncode == 0


def broken_links(page: Path) -> list:
    """The page's relative links that lead nowhere, each with why."""
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, dummy, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append("%s (no such file)" % target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append("%s (no such heading)" % target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_resolve(page):
    broken = broken_links(page)
    assert not broken, "%s: broken links: %s" % (page.relative_to(REPO), ", ".join(broken))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_quoted_repository_paths_exist(page):
    missing = []
    for quoted in QUOTED_PATH.findall(page.read_text()):
        if re.search(r"[<>*{}]|\.\.\.|…", quoted):
            continue  # a pattern (roles/<role>/..., reports/slice*/...), not a path
        path = quoted.split(":")[0].rstrip(".,")
        example = re.sub(r"(\.ya?ml)$", r".example\1", path)
        if example != path and (REPO / example).exists():
            continue  # the reader's copy of an example (inventory/fleet.yml from fleet.example.yml)
        if not (REPO / path).exists() and not _ignored(path):
            missing.append(quoted)
    assert not missing, "%s names paths that do not exist: %s" % (page.relative_to(REPO), ", ".join(missing))


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `title`, here\n\n[ok](page.md#a-title-here) [gone](missing.md) [bad](#nope) "
                    "[web](https://example.invalid/x)\n\n```sh\n[not a link](nowhere.md)\n```\n")
    assert broken_links(page) == ["missing.md (no such file)", "#nope (no such heading)"]


def test_gpu_proof_names_every_wheel_the_gpu_machine_lacks():
    script = (REPO / "tools" / "gpu_wheels.sh").read_text()
    fetched = re.search(r"^packages=\(([^)]*)\)", script, re.M).group(1).split()
    assert {"ansible-core", "Jinja2", "MarkupSafe", "PyYAML", "packaging"} <= set(fetched), fetched
    constraints = (REPO / "constraints.txt").read_text()
    unpinned = [name for name in fetched if not re.search(r"^%s==" % re.escape(name), constraints, re.M | re.I)]
    assert not unpinned, "tools/gpu_wheels.sh fetches %s, which constraints.txt does not pin" % unpinned
    proof = (REPO / "docs" / "gpu_proof.md").read_text()
    listed = re.search(r"the wheels the GPU machine lacks \(([^;]*);", " ".join(proof.replace("#", " ").split()))
    assert listed, "docs/gpu_proof.md no longer says which wheels the GPU machine lacks"
    named = {name.strip() for name in listed.group(1).split(",")}
    assert named == set(fetched), "docs/gpu_proof.md lists %s, tools/gpu_wheels.sh fetches %s" % (
        sorted(named), sorted(fetched))
    assert "make gpu-wheels" in proof
    assert "make gpu-wheels" in (REPO / "tests" / "gpu" / "run.sh").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^gpu-wheels:[^\n]*\n\ttools/gpu_wheels\.sh$", makefile, re.M), "make gpu-wheels does not run the script"


NAMED_TEST = re.compile(r"`((?:tests/[^`\s:]+\.py)?)::(test_\w+)`")


def missing_tests(text: str) -> list:
    """The `tests/x.py::test_name` (or `::test_name`, of the file named last) that a page quotes
    and that file does not define."""
    missing, last = [], None
    for path, name in NAMED_TEST.findall(text):
        last = path or last
        source = (REPO / last).read_text() if last and (REPO / last).exists() else ""
        if not re.search(r"^(?:async )?def %s\(" % re.escape(name), source, re.M):
            missing.append("%s::%s" % (last, name))
    return missing


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_named_tests_exist(page):
    """docs/security.md names the test that holds each rule: a renamed or removed test fails here."""
    missing = missing_tests(page.read_text())
    assert not missing, "%s names tests that do not exist: %s" % (page.relative_to(REPO), ", ".join(missing))


def test_a_named_test_that_is_gone_is_found():
    text = ("`tests/unit/test_docs_links.py::test_named_tests_exist`, `::test_a_named_test_that_is_gone_is_found`, "
            "`::test_no_such_thing`, `tests/unit/nowhere.py::test_x`")
    assert missing_tests(text) == ["tests/unit/test_docs_links.py::test_no_such_thing", "tests/unit/nowhere.py::test_x"]


# A pointer from the code to a section of a page: `docs/design.md#why-tasks-are-few` in a comment.
SECTION_POINTER = re.compile(r"\b(docs/[\w.-]+\.md)#([\w-]+)")


def broken_section_pointers(texts) -> list:
    """The pointers to a page's section, in (name, text) pairs, whose page or heading is gone."""
    broken = []
    for name, text in texts:
        for page, anchor in SECTION_POINTER.findall(text):
            if not (REPO / page).exists() or anchor not in anchors(REPO / page):
                broken.append("%s: %s#%s" % (name, page, anchor))
    return broken


def test_the_codes_pointers_to_a_section_of_the_docs_resolve():
    files = [path for top in ("plugins", "roles", "playbooks") for path in sorted((REPO / top).rglob("*"))
             if path.suffix in (".py", ".yml", ".j2") and path.is_file()]
    broken = broken_section_pointers((str(path.relative_to(REPO)), path.read_text()) for path in files)
    assert not broken, "pointers to no heading: %s" % ", ".join(broken)


def test_a_pointer_to_a_renamed_section_is_found():
    assert broken_section_pointers([("x.yml", "# fewer tasks: docs/design.md#why-tasks-are-many")]) == [
        "x.yml: docs/design.md#why-tasks-are-many"]
