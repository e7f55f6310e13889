"""The role's validation with the engine's own check (issue 37, point 3), through ansible-playbook on
this machine (tasks_from: validate, check mode): a version without flag data is served when the
engine's check passes and `invalid` in the engine's own words when it refuses; a version with data
that the engine refuses is refused too, after the flag data passed it. The engine is the fake vLLM of
tests/functional/test_inference_dry_run.py (the real one: test_engine_dry_run_real.py), in a venv
with the dist-info pip leaves, owned by `nobody`, the server's user."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.functional.test_inference_dry_run import FAKE_VLLM, NOBODY, SYSTEM_PY, write_tree
from tests.integration.test_engine_version_probe import validate
from tests.readable_copy import readable_dir

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="starting the check as another user needs root"),
    pytest.mark.skipif(not os.path.exists(SYSTEM_PY), reason="no system Python that every user can run"),
]


@pytest.fixture(scope="module")
def engine():
    """{version: venv} of the fake vLLM at 0.34.0 (no flag data) and 0.33.0 (flag data)."""
    top = readable_dir("cleanslate-dry-run-play-")
    venvs = {}
    for version in ("0.34.0", "0.33.0"):
        venv = top / version
        subprocess.run([SYSTEM_PY, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = Path(glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0])
        write_tree(site, FAKE_VLLM)
        write_tree(site, {"vllm-%s.dist-info/METADATA" % version: "Metadata-Version: 2.1\nName: vllm\nVersion: %s\n"
                          % version})
        launcher = venv / "bin" / "vllm"
        launcher.write_text("#!%s\n" % (venv / "bin" / "python3"))
        launcher.chmod(0o755)
        venvs[version] = str(venv)
    for path in [top, *top.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    yield venvs
    shutil.rmtree(top)


def run(tmp_path, venv, **variables):
    return validate(tmp_path, "--check", inference_service_venv=venv, inference_service_user="nobody",
                    inference_service_model="/srv/models/tiny", **variables)


def test_a_version_without_flag_data_is_served_when_the_engines_check_passes(tmp_path, engine):
    proc = run(tmp_path, engine["0.34.0"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "checked with 0.34.0" in proc.stdout, proc.stdout[-3000:]
    assert ("vllm 0.34.0 has no flag data: its command line is built with vllm 0.33.0's flag names and not checked on "
            "the controller; the engine's own check on the host decides") in proc.stdout.replace("\n", " ") \
        or "has no flag data" in proc.stderr, proc.stdout[-3000:]


def test_a_version_without_flag_data_is_invalid_in_the_engines_own_words(tmp_path, engine):
    proc = run(tmp_path, engine["0.34.0"], inference_service_extra_args=["--max-num-seqs", "0"])
    assert proc.returncode == 2 and "checked with" not in proc.stdout, proc.stdout[-3000:]
    assert ("inference_service: on localhost, vLLM 0.34.0 refuses the configuration, in its own words: max_num_seqs "
            "must be at least 1, got 0") in proc.stdout, proc.stdout[-3000:]


def test_what_the_flag_data_passes_and_the_engine_refuses_is_invalid_before_anything_is_touched(tmp_path, engine):
    proc = run(tmp_path, engine["0.33.0"], inference_service_extra_args=["--enable-auto-tool-choice"])
    assert proc.returncode == 2 and "checked with" not in proc.stdout, proc.stdout[-3000:]
    assert ("inference_service: on localhost, vLLM 0.33.0 refuses the configuration, in its own words: Error: "
            "--enable-auto-tool-choice requires --tool-call-parser") in proc.stdout, proc.stdout[-3000:]


def test_the_engines_check_turned_off_leaves_the_flag_datas_verdict(tmp_path, engine):
    proc = run(tmp_path, engine["0.33.0"], inference_service_extra_args=["--enable-auto-tool-choice"],
               inference_service_engine_dry_run=False)
    assert proc.returncode == 0 and "checked with 0.33.0" in proc.stdout, proc.stdout[-3000:]


def test_the_engines_words_are_never_templated(tmp_path, engine):
    """The service user's venv is another user's: what its engine says is data. A refusal made of
    Jinja reaches the message as written, and nothing it asks for runs on the controller."""
    marker = Path("/tmp/cleanslate-dry-run-templated")
    marker.unlink(missing_ok=True)
    proc = run(tmp_path, engine["0.34.0"], inference_service_extra_args=["--behave", "template"])
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "{{ lookup('pipe', 'touch /tmp/cleanslate-dry-run-templated') }}" in proc.stdout, proc.stdout[-3000:]
    assert "{{ 7 * 7 }}" in proc.stdout and " 49" not in proc.stdout, proc.stdout[-3000:]
    assert not marker.exists()
