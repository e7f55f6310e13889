"""cleanslate.gpu.inference_files through its real entry point, against real files: the unit file
and the secret files of inference_service, compared and written in one run. What a user would
notice: a unit the role did not write is never overwritten (unless adopted, then kept), nothing is
written through a link or into a FIFO, a refusal writes nothing at all, modes and owners as
asked, check mode writes nothing, and no secret's text is ever returned."""
from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from tests.run_module import run_module

MARKER = "# Managed by Ansible (cleanslate.gpu.inference_service); local changes are overwritten."
UNIT_TEXT = MARKER + "\n[Service]\nExecStart=/opt/vllm/bin/vllm serve /models/llama\n"
SECRET = 'VLLM_API_KEY="sk-\\$ecret-42"\n'


@pytest.fixture
def dirs(tmp_path):
    units, config = tmp_path / "system", tmp_path / "inference"
    units.mkdir()
    config.mkdir()
    return units, config


def files(dirs, unit_text=UNIT_TEXT, secret=SECRET, adopt=False, yaml_state="absent", **unit_extra):
    units, config = dirs
    return {"unit": dict({"path": str(units / "vllm.service"), "content": unit_text, "marker": MARKER, "adopt": adopt},
                         **unit_extra),
            "secret_files": [{"path": str(config / "vllm.env"), "content": secret, "owner": "root", "group": "root"},
                             {"path": str(config / "vllm.secrets.yaml"), "state": yaml_state,
                              "content": "api_key: \"sk-yaml-7\"\n" if yaml_state == "present" else ""}]}


def listing(directory):
    return sorted(entry.name for entry in directory.iterdir())


def test_first_run_writes_all_with_their_modes_and_a_second_changes_nothing(dirs):
    units, config = dirs
    first = run_module("inference_files", files(dirs, yaml_state="present"))
    assert first["rc"] == 0 and first["changed"], first
    assert first["unit"] == {"path": str(units / "vllm.service"), "action": "created", "changed": True}
    assert [one["action"] for one in first["secret_files"]] == ["created", "created"]
    assert (units / "vllm.service").read_text() == UNIT_TEXT
    assert (config / "vllm.env").read_text() == SECRET
    assert stat.S_IMODE((units / "vllm.service").stat().st_mode) == 0o644
    assert stat.S_IMODE((config / "vllm.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((config / "vllm.secrets.yaml").stat().st_mode) == 0o600
    # No temporary file left behind, in either directory.
    assert listing(units) == ["vllm.service"] and listing(config) == ["vllm.env", "vllm.secrets.yaml"]
    again = run_module("inference_files", files(dirs, yaml_state="present"))
    assert again["rc"] == 0 and not again["changed"], again
    assert again["unit"]["action"] == "unchanged" and [one["action"] for one in again["secret_files"]] == ["unchanged"] * 2


def test_no_secret_text_is_ever_returned(dirs):
    """The secret files' texts are no_log: not in the result, its invocation or its diff, in any run."""
    for check in (True, False, False):
        result = run_module("inference_files", files(dirs, yaml_state="present"), check=check, diff=True)
        assert result["rc"] == 0, result
        dumped = json.dumps(result)
        assert "sk-" not in dumped and "ecret-42" not in dumped, dumped


def test_a_changed_secret_alone_changes_the_secret_file_only(dirs):
    units, config = dirs
    run_module("inference_files", files(dirs))
    unit_inode = (units / "vllm.service").stat().st_ino
    result = run_module("inference_files", files(dirs, secret='VLLM_API_KEY="rotated"\n'), diff=True)
    assert result["rc"] == 0 and result["changed"], result
    assert result["unit"]["action"] == "unchanged" and not result["unit"]["changed"]
    assert result["secret_files"][0] == {"path": str(config / "vllm.env"), "action": "updated", "changed": True}
    assert (config / "vllm.env").read_text() == 'VLLM_API_KEY="rotated"\n'
    assert (units / "vllm.service").stat().st_ino == unit_inode  # not rewritten
    # The diff is the unit's, unchanged: the secret file's before and after are never shown.
    assert result["diff"]["before"] == result["diff"]["after"] == UNIT_TEXT
    assert "rotated" not in json.dumps(result)


def test_check_mode_writes_nothing_and_diff_shows_the_unit_change(dirs):
    units, config = dirs
    run_module("inference_files", files(dirs))
    before = {path: path.read_bytes() for path in (units / "vllm.service", config / "vllm.env")}
    new_unit = UNIT_TEXT.replace("/models/llama", "/models/llama --max-num-seqs 64")
    result = run_module("inference_files", files(dirs, unit_text=new_unit, secret="OTHER=1\n", yaml_state="present"),
                        check=True, diff=True)
    assert result["rc"] == 0 and result["changed"], result
    assert result["unit"]["action"] == "updated"
    assert [one["action"] for one in result["secret_files"]] == ["updated", "created"]
    assert result["diff"] == {"before": UNIT_TEXT, "after": new_unit, "before_header": str(units / "vllm.service"),
                              "after_header": str(units / "vllm.service")}
    assert {path: path.read_bytes() for path in before} == before
    assert listing(config) == ["vllm.env"]


def test_check_mode_on_a_first_run_before_the_secrets_directory_exists(dirs):
    """--check on a new host: the role's directory task would make the directory, so the files
    would be created; a real run without it is refused (the directory is never made here)."""
    units, config = dirs
    config.rmdir()
    result = run_module("inference_files", files(dirs), check=True)
    assert result["rc"] == 0 and result["changed"], result
    assert [one["action"] for one in result["secret_files"]] == ["created", "absent"]
    assert listing(units) == [] and not config.exists()
    result = run_module("inference_files", files(dirs))
    assert result["rc"] != 0 and "the directory of %s does not exist" % (config / "vllm.env") in result["msg"], result
    assert listing(units) == [] and not config.exists()


def test_a_foreign_unit_is_refused_and_nothing_is_written(dirs):
    """A hand-written unit of the same name: not the role's (no marker), so the whole run is
    refused, the secret files included, before anything is written."""
    units, config = dirs
    foreign = b"[Service]\nExecStart=/usr/bin/billing --port 8000\n"
    (units / "vllm.service").write_bytes(foreign)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] != 0 and result.get("failed"), result
    assert "was not written by this role" in result["msg"] and "inference_service_adopt_unit" in result["msg"]
    assert (units / "vllm.service").read_bytes() == foreign
    assert listing(config) == [] and listing(units) == ["vllm.service"]


def test_a_unit_with_the_marker_on_a_later_line_is_still_foreign(dirs):
    units, _config = dirs
    foreign = ("[Service]\n" + MARKER + "\nExecStart=/usr/bin/billing\n").encode()
    (units / "vllm.service").write_bytes(foreign)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] != 0 and "was not written by this role" in result["msg"], result
    assert (units / "vllm.service").read_bytes() == foreign


def test_an_adopted_unit_is_kept_as_a_backup_beside_the_new_one(dirs):
    units, _config = dirs
    foreign = b"[Service]\nExecStart=/usr/bin/vllm serve old\n"
    (units / "vllm.service").write_bytes(foreign)
    checked = run_module("inference_files", files(dirs, adopt=True), check=True)
    assert checked["rc"] == 0 and checked["unit"]["action"] == "adopted" and "backup" not in checked["unit"], checked
    assert listing(units) == ["vllm.service"]
    result = run_module("inference_files", files(dirs, adopt=True))
    assert result["rc"] == 0 and result["unit"]["action"] == "adopted", result
    backup = result["unit"]["backup"]
    assert os.path.dirname(backup) == str(units) and backup.endswith("~") and backup.startswith(str(units / "vllm.service."))
    assert open(backup, "rb").read() == foreign
    assert (units / "vllm.service").read_text() == UNIT_TEXT
    # Adopted once: the next run finds the role's file, adopt or not, and keeps no second backup.
    again = run_module("inference_files", files(dirs, adopt=True))
    assert again["rc"] == 0 and again["unit"]["action"] == "unchanged", again
    assert len(listing(units)) == 2


@pytest.mark.parametrize("what", ["symlink", "dangling symlink", "directory", "fifo"])
def test_a_unit_path_that_is_no_regular_file_is_refused_and_left(dirs, tmp_path, what):
    units, config = dirs
    path = units / "vllm.service"
    target = tmp_path / "elsewhere.service"
    target.write_text(UNIT_TEXT)  # even a link to a file with the marker: a masked unit is a link too
    if what == "symlink":
        path.symlink_to(target)
    elif what == "dangling symlink":
        path.symlink_to("/dev/null-nothing")
    elif what == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    result = run_module("inference_files", files(dirs, adopt=True), timeout=30)
    assert result["rc"] != 0, result
    assert str(path) in result["msg"] and ("symbolic link" in result["msg"] if "symlink" in what else "is a" in result["msg"])
    assert target.read_text() == UNIT_TEXT and listing(config) == []
    assert path.is_symlink() if "symlink" in what else (path.is_dir() or stat.S_ISFIFO(path.lstat().st_mode))


def test_a_symlink_at_a_secret_path_is_replaced_never_written_through(dirs, tmp_path):
    """A link planted at the environment file's path (to a file others read) must not receive the
    secrets: the link itself is replaced by a 0600 file."""
    _units, config = dirs
    exposed = tmp_path / "world-readable.txt"
    exposed.write_text("public\n")
    exposed.chmod(0o644)
    (config / "vllm.env").symlink_to(exposed)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["secret_files"][0]["action"] == "replaced a symbolic link", result
    assert exposed.read_text() == "public\n" and stat.S_IMODE(exposed.stat().st_mode) == 0o644
    env = config / "vllm.env"
    assert not env.is_symlink() and env.read_text() == SECRET and stat.S_IMODE(env.stat().st_mode) == 0o600


def test_a_stale_secrets_file_is_removed_and_a_link_there_only_unlinked(dirs, tmp_path):
    _units, config = dirs
    (config / "vllm.secrets.yaml").write_text("api_key: old\n")
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["secret_files"][1]["action"] == "removed", result
    assert not (config / "vllm.secrets.yaml").exists()
    kept = tmp_path / "keep.yaml"
    kept.write_text("keep\n")
    (config / "vllm.secrets.yaml").symlink_to(kept)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["secret_files"][1]["action"] == "removed a symbolic link", result
    assert kept.read_text() == "keep\n" and not os.path.lexists(config / "vllm.secrets.yaml")
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and not result["changed"] and result["secret_files"][1]["action"] == "absent", result


def test_a_fifo_at_a_secret_path_is_refused_without_blocking(dirs):
    """Opening a FIFO would block the run forever (no writer): it is seen by lstat and refused."""
    units, config = dirs
    os.mkfifo(config / "vllm.env")
    result = run_module("inference_files", files(dirs), timeout=30)
    assert result["rc"] != 0 and "is a FIFO" in result["msg"] and str(config / "vllm.env") in result["msg"], result
    assert listing(units) == []


def test_a_fifo_swapped_in_after_the_look_never_blocks(dirs):
    """O_NONBLOCK on the read: a FIFO that replaces the file between lstat and open is not read."""
    _units, config = dirs
    run_module("inference_files", files(dirs))
    stop = threading.Event()

    def swap():
        env = str(config / "vllm.env")
        while not stop.is_set():
            try:
                os.unlink(env)
                os.mkfifo(env)
                os.unlink(env)
                with open(env, "w") as handle:
                    handle.write(SECRET)
            except OSError:
                pass
    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        for _round in range(5):
            result = run_module("inference_files", files(dirs), timeout=30)
            assert "rc" in result
    finally:
        stop.set()
        thread.join()


def test_modes_and_owners_are_corrected_without_a_text_change(dirs):
    units, config = dirs
    run_module("inference_files", files(dirs))
    env = config / "vllm.env"
    env.chmod(0o644)  # someone made the secrets readable by all
    (units / "vllm.service").chmod(0o666)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["changed"], result
    assert result["unit"]["action"] == "attributes" and result["secret_files"][0]["action"] == "attributes"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600 and stat.S_IMODE((units / "vllm.service").stat().st_mode) == 0o644
    assert env.read_text() == SECRET
    os.chown(env, 65534, 65534)
    result = run_module("inference_files", files(dirs))
    assert result["rc"] == 0 and result["secret_files"][0]["action"] == "attributes", result
    assert (env.stat().st_uid, env.stat().st_gid) == (0, 0)


def test_a_secret_file_for_the_servers_user_keeps_its_group(dirs):
    """SGLang's file is owned by the server's user; its group (unset) is left as it is."""
    _units, config = dirs
    params = files(dirs, yaml_state="present")
    params["secret_files"][1]["owner"] = "nobody"
    result = run_module("inference_files", params)
    assert result["rc"] == 0, result
    yaml_file = config / "vllm.secrets.yaml"
    assert yaml_file.stat().st_uid == 65534 and stat.S_IMODE(yaml_file.stat().st_mode) == 0o600
    os.chown(yaml_file, 65534, 100)
    assert not run_module("inference_files", params)["changed"]
    assert yaml_file.stat().st_gid == 100


def test_a_non_utf8_unit_file_of_the_role_is_rewritten_and_shown_escaped(dirs):
    units, _config = dirs
    (units / "vllm.service").write_bytes(MARKER.encode() + b"\nExecStart=/opt/\xff\xfe/vllm\n")
    result = run_module("inference_files", files(dirs), diff=True)
    assert result["rc"] == 0 and result["unit"]["action"] == "updated", result
    assert "\\xff\\xfe" in result["diff"]["before"]
    assert (units / "vllm.service").read_text() == UNIT_TEXT


@pytest.mark.parametrize("change, sentence", [
    ({"unit": {"path": "relative/vllm.service"}}, "unit.path must be an absolute file path"),
    ({"unit": {"path": ""}}, "unit.path must be an absolute file path"),
    ({"unit": {"path": "/etc/systemd/system/a\nb.service"}}, "unit.path must be an absolute file path on one line"),
    ({"unit": {"mode": "rw-r--r--"}}, "unit.mode must be octal permissions"),
    ({"unit": {"mode": ""}}, "unit.mode must be octal permissions"),
    ({"unit": {"mode": "0999"}}, "unit.mode must be octal permissions"),
    ({"unit": {"owner": "no-such-user-$%@"}}, "unit.owner: there is no user"),
    ({"unit": {"marker": ""}}, "unit.marker must be one line"),
    ({"unit": {"marker": "a\nb"}}, "unit.marker must be one line"),
    ({"unit": {"content": "[Service]\nExecStart=/bin/true\n"}}, "does not start with the unit.marker line"),
    ({"unit": {"path": "/nonexistent-dir-i26/vllm.service"}}, "the directory of /nonexistent-dir-i26/vllm.service does not exist"),
    ({"secret": {"group": "no-such-group-\"'"}}, "secret_files[0].group: there is no group"),
    ({"secret": {"content": None}}, "secret_files[0].content is required"),
    ({"secret": {"path": "/tmp/"}}, "secret_files[0].path must be an absolute file path"),
    ({"same_path": True}, "name the same path twice"),
])
def test_bad_inputs_are_one_sentence_and_nothing_is_written(dirs, change, sentence):
    units, config = dirs
    params = files(dirs, yaml_state="present")
    params["unit"].update(change.get("unit", {}))
    params["secret_files"][0].update(change.get("secret", {}))
    if change.get("same_path"):
        params["secret_files"][1]["path"] = params["unit"]["path"]
    result = run_module("inference_files", params)
    assert result["rc"] != 0 and result.get("failed"), result
    assert sentence in result["msg"], result["msg"]
    assert "\n" not in result["msg"].replace("a\\nb", "")
    assert listing(units) == [] and listing(config) == []
    assert "sk-" not in json.dumps(result)


def test_hostile_texts_are_written_byte_for_byte(dirs):
    units, config = dirs
    hostile_unit = MARKER + "\nDescription=llama-50%% \"quoted\" $HOME @ / \\ tab\there\n"
    hostile_secret = 'KEY="a\\"b\\$c\\`d @ / % new"\nÜ="ünïcode"\n'
    result = run_module("inference_files", files(dirs, unit_text=hostile_unit, secret=hostile_secret))
    assert result["rc"] == 0, result
    assert (units / "vllm.service").read_text() == hostile_unit and (config / "vllm.env").read_text() == hostile_secret
    assert not run_module("inference_files", files(dirs, unit_text=hostile_unit, secret=hostile_secret))["changed"]


PROGRAMS = {"prestart_clean.py": "import sys\nprint('{{ not a template }}')\n",
            "ansible_collections/cleanslate/gpu/plugins/module_utils/_leftovers.py": "X = 1\n"}


def test_programs_are_root_s_in_directories_made_root_s_and_a_second_run_changes_nothing(dirs, tmp_path):
    """The pre-start cleanup that root runs: written byte for byte (braces never templated), 0644 root's,
    its missing directories made 0755 root's; check mode makes nothing; a second run changes nothing."""
    top = tmp_path / "libexec" / "cleanslate-gpu"
    args = dict(files(dirs), programs={"dir": str(top), "files": PROGRAMS})
    checked = run_module("inference_files", args, check=True)
    assert checked["rc"] == 0 and checked["changed"] and not top.parent.exists(), checked
    first = run_module("inference_files", args)
    assert first["rc"] == 0 and first["changed"], first
    for relative, text in PROGRAMS.items():
        assert (top / relative).read_text() == text
        info = (top / relative).stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o644, 0, 0)
    made = [one["path"] for one in first["programs"] if one["action"] == "made"]
    assert str(top.parent) in made and str(top / "ansible_collections/cleanslate/gpu/plugins/module_utils") in made
    for path in made:
        info = os.stat(path)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o755, 0), path
    again = run_module("inference_files", args)
    assert again["rc"] == 0 and not again["changed"], again
    assert {one["action"] for one in again["programs"]} == {"unchanged"}


@pytest.mark.parametrize("how", ["writable by others", "owned by another user"])
def test_a_program_directory_another_user_could_change_is_refused_and_nothing_is_written(dirs, tmp_path, how):
    """Root would run whatever that user puts there: refused in one sentence, and no file (the unit's
    neither) is written."""
    top = tmp_path / "libexec"
    top.mkdir(mode=0o755)
    if how == "writable by others":
        top.chmod(0o777)
    else:
        os.chown(top, 65534, 65534)
    units, config = dirs
    result = run_module("inference_files", dict(files(dirs), programs={"dir": str(top), "files": PROGRAMS}))
    assert result["rc"] != 0 and "another user could change" in result["msg"] and "\n" not in result["msg"], result
    assert listing(top) == [] and listing(units) == [] and listing(config) == []


def test_a_program_path_that_climbs_out_of_its_directory_is_refused(dirs, tmp_path):
    programs = {"dir": str(tmp_path / "p"), "files": {"../evil.py": "x = 1\n"}}
    result = run_module("inference_files", dict(files(dirs), programs=programs))
    assert result["rc"] != 0 and "not a relative file path" in result["msg"], result
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "p").exists()


def test_a_host_without_systemctl_is_refused_before_any_file_is_written(dirs):
    """prepare_start needs systemctl (it reads the unit's state and clears a failed one): on a host
    without it the unit could not be started, so nothing is written and one sentence says why."""
    units, config = dirs
    result = run_module("inference_files", files(dirs, prepare_start=True), env={"PATH": str(units)})
    assert result["rc"] != 0 and result["failed"], result
    assert result["msg"] == "unit.prepare_start: systemctl is not on this host's PATH: the unit cannot be started here"
    assert listing(units) == [] and listing(config) == []


def test_a_systemd_that_does_not_answer_fails_the_task_in_its_own_words_after_the_files(dirs):
    """This machine's own systemctl, with no systemd running (PID 1 is not systemd here, as in a
    container without it): the task fails with systemctl's sentence, after the files were written
    (a second run would change none of them), and no state is made up."""
    units, _config = dirs
    result = run_module("inference_files", files(dirs, prepare_start=True))
    assert result["rc"] != 0 and result["failed"], result
    assert result["msg"].startswith("systemctl show vllm.service: System has not been booted with systemd"), result["msg"]
    assert "load_state" not in result["unit"] and result["unit"]["action"] == "created", result
    assert (units / "vllm.service").read_text() == UNIT_TEXT
