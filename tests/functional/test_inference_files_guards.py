"""cleanslate.gpu.inference_files' guards at their edges, through the real entry point: whose unit
file it is (the marker is the whole first line, not its start), and each attribute it compares on
its own (group alone, owner alone, the set-id bits of the mode), so that a file left wrong is never
reported unchanged."""
from __future__ import annotations

import os
import stat

import pytest

from tests.functional.test_inference_files import MARKER, SECRET, UNIT_TEXT, dirs, files, listing  # noqa: F401  # pylint: disable=unused-import
from tests.run_module import run_module

# A group the files are not asked for: any number works, a group need not exist to own a file.
OTHER_GID = 4242


@pytest.mark.parametrize("first_line", [MARKER + " (kept by hand)", MARKER + "#", MARKER + "\r"])
def test_a_unit_whose_first_line_only_begins_with_the_marker_is_foreign(dirs, first_line):
    units, config = dirs
    foreign = (first_line + "\n[Service]\nExecStart=/usr/bin/billing\n").encode()
    (units / "vllm.service").write_bytes(foreign)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] != 0 and "was not written by this role" in result["msg"], result
    assert (units / "vllm.service").read_bytes() == foreign
    assert listing(units) == ["vllm.service"] and listing(config) == []
    # Adopted, it is kept as a backup, not overwritten in place.
    adopted = run_module("inference_files", files(dirs, adopt=True))
    assert adopted["rc"] == 0 and adopted["unit"]["action"] == "adopted", adopted
    assert open(adopted["unit"]["backup"], "rb").read() == foreign


def test_a_unit_text_whose_first_line_only_begins_with_the_marker_is_refused(dirs):
    """The next run would not find the marker line in what this one wrote, and refuse its own file."""
    units, config = dirs
    result = run_module("inference_files", files(dirs, unit_text=MARKER + " v2\n[Service]\n"))
    assert result["rc"] != 0 and "does not start with the unit.marker line" in result["msg"], result
    assert listing(units) == [] and listing(config) == []


@pytest.mark.parametrize("which", ["unit", "secret"])
def test_a_file_whose_group_alone_differs_is_given_back_its_group(dirs, which):
    units, config = dirs
    assert run_module("inference_files", files(dirs))["rc"] == 0
    path = units / "vllm.service" if which == "unit" else config / "vllm.env"
    os.chown(path, 0, OTHER_GID)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["changed"], result
    done = result["unit"] if which == "unit" else result["secret_files"][0]
    assert done["action"] == "attributes", result
    assert (path.stat().st_uid, path.stat().st_gid) == (0, 0)
    assert not run_module("inference_files", files(dirs))["changed"]


def test_a_secret_file_whose_owner_alone_differs_is_given_back_its_owner(dirs):
    _units, config = dirs
    run_module("inference_files", files(dirs))
    env = config / "vllm.env"
    os.chown(env, 65534, 0)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["secret_files"][0]["action"] == "attributes", result
    assert (env.stat().st_uid, env.stat().st_gid) == (0, 0) and env.read_text() == SECRET


def test_set_id_bits_on_a_file_are_taken_off(dirs):
    """A mode compared on its permission bits alone would leave a set-group-id unit or secret file."""
    units, config = dirs
    run_module("inference_files", files(dirs))
    unit, env = units / "vllm.service", config / "vllm.env"
    unit.chmod(0o2644)
    env.chmod(0o4600)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["unit"]["action"] == "attributes", result
    assert result["secret_files"][0]["action"] == "attributes"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644 and stat.S_IMODE(env.stat().st_mode) == 0o600
    assert unit.read_text() == UNIT_TEXT


def test_a_group_fixed_in_check_mode_is_reported_and_left(dirs):
    _units, config = dirs
    run_module("inference_files", files(dirs))
    env = config / "vllm.env"
    os.chown(env, 0, OTHER_GID)
    result = run_module("inference_files", files(dirs), check=True)
    assert result["rc"] == 0 and result["changed"] and result["secret_files"][0]["action"] == "attributes", result
    assert env.stat().st_gid == OTHER_GID
