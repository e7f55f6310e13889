"""The changelog, the version and the docs agree. CHANGELOG.rst is what antsibull-changelog generates
from changelogs/changelog.yaml; galaxy.yml's version is the newest release there or, while
fragments wait for the next release, a version above every release; the waiting fragments can be
released under galaxy.yml's version (tools/changelog_release.py, `make changelog-release`, in a
scratch copy) with every entry reaching CHANGELOG.rst, the checkout untouched; and the docs name
galaxy.yml's version where they name one."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.release.artifact import REPO

GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
FRAGMENTS = sorted((REPO / "changelogs" / "fragments").glob("*.y*ml"))
CONFIG = yaml.safe_load((REPO / "changelogs" / "config.yaml").read_text())
CHANGES = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())
# The sections CHANGELOG.rst shows; `trivial` entries are recorded in changelog.yaml only.
SHOWN = {name for name, _title in CONFIG["sections"]} | {CONFIG["prelude_section_name"]}
# Where the docs name a release: the tarball, the EE image tag, the AWX project's requirement.
VERSION_MENTIONS = re.compile(r"cleanslate-gpu-(\d+\.\d+\.\d+)\.tar\.gz|cleanslate-gpu-ee:(\d+\.\d+\.\d+)"
                              r"|^\s*version: (\d+\.\d+\.\d+)", re.M)


def _words(text: str) -> str:
    """Text as RST and YAML both keep it: words only, one space apart."""
    return " ".join(re.findall(r"\w+", text))


def _version(text: str) -> tuple:
    return tuple(int(part) for part in text.split("."))


def _rehearse(tmp_path, *options):
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "changelog_release.py"), *options, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    changelog = tmp_path / "ansible_collections" / "cleanslate" / "gpu" / "CHANGELOG.rst"
    assert proc.stdout.strip() == str(changelog)
    return changelog


def test_galaxy_version_is_the_newest_release_or_the_next_one_while_fragments_wait():
    released = sorted(CHANGES["releases"], key=_version)
    version = GALAXY["version"]
    if FRAGMENTS:
        assert version not in released, "fragments wait, but galaxy.yml names the released %s: bump it" % version
        assert not released or _version(version) > _version(released[-1])
    else:
        assert released and version == released[-1], (version, released)


def test_the_committed_changelog_is_what_changelog_yaml_generates(tmp_path):
    committed = (REPO / "CHANGELOG.rst").read_text()
    assert _rehearse(tmp_path, "--generate").read_text() == committed
    for release in CHANGES["releases"]:
        assert re.search(r"^v%s\n=+$" % re.escape(release), committed, re.M), release


def test_the_waiting_fragments_are_released_under_galaxy_version_in_a_scratch_copy(tmp_path):
    before = sorted(path.name for path in FRAGMENTS)
    kept = [(REPO / name).read_bytes() for name in ("CHANGELOG.rst", "changelogs/changelog.yaml")]
    changelog = _rehearse(tmp_path)
    text = changelog.read_text()
    version = GALAXY["version"]
    assert re.search(r"^v%s\n=+$" % re.escape(version), text, re.M), text[:500]
    flat = _words(text)
    for fragment in FRAGMENTS:
        for section, entries in yaml.safe_load(fragment.read_text()).items():
            assert section in SHOWN or section == CONFIG["trivial_section_name"], (fragment.name, section)
            if section not in SHOWN:
                continue
            for entry in entries if isinstance(entries, list) else [entries]:
                assert _words(entry) in flat, (fragment.name, section, entry[:80])
    release = yaml.safe_load((changelog.parent / "changelogs" / "changelog.yaml").read_text())["releases"][version]
    assert set(before) <= set(release.get("fragments") or [])
    if version == sorted(CHANGES["releases"], key=_version)[0]:
        for module in (REPO / "plugins" / "modules").glob("*.py"):
            assert "cleanslate.gpu.%s - " % module.stem in text, module.stem  # listed as new
    # The rehearsal consumed the copy's fragments (keep_fragments: false), never the checkout's.
    assert not list((changelog.parent / "changelogs" / "fragments").glob("*.yml"))
    assert sorted(path.name for path in (REPO / "changelogs" / "fragments").glob("*.y*ml")) == before
    assert [(REPO / name).read_bytes() for name in ("CHANGELOG.rst", "changelogs/changelog.yaml")] == kept


@pytest.mark.parametrize("page", ["README.md", "docs/awx.md", "docs/getting_started.md"])
def test_the_docs_name_galaxy_version_where_they_name_a_release(page):
    mentions = [next(filter(None, match.groups())) for match in VERSION_MENTIONS.finditer((REPO / page).read_text())]
    assert mentions, "%s names no release any more: drop it from this test" % page
    assert set(mentions) == {GALAXY["version"]}, (page, mentions)
