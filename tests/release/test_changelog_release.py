"""The release's changelog can be generated from the fragments as they are: `antsibull-changelog
release` in a scratch copy (tools/changelog_release.py, `make changelog-release`) succeeds, every
fragment's entries reach CHANGELOG.rst under galaxy.yml's version, and the checkout is untouched."""
from __future__ import annotations

import re
import subprocess
import sys

import yaml

from tests.release.artifact import REPO

GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
FRAGMENTS = sorted((REPO / "changelogs" / "fragments").glob("*.y*ml"))
CONFIG = yaml.safe_load((REPO / "changelogs" / "config.yaml").read_text())
# The sections CHANGELOG.rst shows; `trivial` entries are recorded in changelog.yaml only.
SHOWN = {name for name, _title in CONFIG["sections"]} | {CONFIG["prelude_section_name"]}


def _words(text: str) -> str:
    """Text as RST and YAML both keep it: words only, one space apart."""
    return " ".join(re.findall(r"\w+", text))


def test_the_release_changelog_is_generated_from_every_fragment_in_a_scratch_copy(tmp_path):
    before = sorted(path.name for path in FRAGMENTS)
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "changelog_release.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    changelog = tmp_path / "ansible_collections" / "cleanslate" / "gpu" / "CHANGELOG.rst"
    assert proc.stdout.strip() == str(changelog)
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
    for module in (REPO / "plugins" / "modules").glob("*.py"):
        assert "cleanslate.gpu.%s - " % module.stem in text, module.stem  # listed as new
    release = yaml.safe_load((changelog.parent / "changelogs" / "changelog.yaml").read_text())["releases"][version]
    assert sorted(release["fragments"]) == before
    # The rehearsal consumed the copy's fragments (keep_fragments: false), never the checkout's.
    assert not list((changelog.parent / "changelogs" / "fragments").glob("*.yml"))
    assert sorted(path.name for path in (REPO / "changelogs" / "fragments").glob("*.y*ml")) == before
    assert not (REPO / "CHANGELOG.rst").exists() or (REPO / "CHANGELOG.rst").read_text() != text
