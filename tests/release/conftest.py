"""Fixtures of the release tests: the tarball built from this checkout, once per session, and that
tarball installed into an empty collections path outside the checkout."""
from __future__ import annotations

import pytest

from tests.release.artifact import build_tarball, install_tarball, isolated_env


@pytest.fixture(scope="session")
def release_tarball(tmp_path_factory):
    """cleanslate-gpu-<version>.tar.gz, built from the checkout as it is (ignored files included)."""
    return build_tarball(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def installed(release_tarball, tmp_path_factory):
    """(collections path, installed collection root, work directory, environment) of the tarball
    installed alone; commands run in the work directory, which holds no ansible.cfg of the checkout."""
    top = tmp_path_factory.mktemp("installed")
    collections, workdir = top / "collections", top / "work"
    workdir.mkdir()
    root = install_tarball(release_tarball, collections, workdir)
    return collections, root, workdir, isolated_env(collections, workdir)
