"""The names and addresses the inference_service role hands to the engine, systemd and the host
(issue 35): the served name (every request, every /metrics line), the unit name (unit file paths,
systemctl, the journal), the listen address (the gate's URL, two instances on one port), the GPUs of
CUDA_VISIBLE_DEVICES, and an option and its value given as one item. Each hostile value is refused
in one sentence that names the variable and shows the value safely (repr, cut, secrets masked), by
the role's first check (the filter) and by the command line's builder alike."""
from __future__ import annotations

import socket

import pytest

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import inference_service_problems
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _serve_command

from tests.unit.test_inference_args import build, refused
from tests.unit.test_inference_service_instances import problems as instance_problems
from tests.unit.test_inference_service_instances import two, variables

FUZZ = ["{{", "{%", "}", "{{ lookup('pipe', 'id') }}", "{% raw %}", "'", '"', "\\", "`", "a b", " a", "a ",
        "a\u2003", "\u2003a", "a\u00a0b", "a\u3000b", "a\u200bb", "a\u202eb", "a\ufeff", "a\nb", "a\rb", "a\tb",
        "a\x00b", "a\x7f", "a\udcff", "\u2028", "x}\u2003999\u2003", "llama}"]


def _one_line(message: str, variable: str) -> None:
    assert message.count("\n") == 0, message
    assert message.count(variable) == 1, message
    assert len(message) < 400, message


# --- the served name ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUZZ + ["-x", "--enforce-eager", "s" * 257, "s" * 10**6])
def test_a_hostile_served_name_is_refused_in_one_sentence_by_both_checks(name):
    message = refused(served_name=name)
    _one_line(message, "inference_service_served_name")
    assert message.startswith("inference_service_served_name is ")
    found = inference_service_problems({"inference_service_served_name": name})
    assert len(found) == 1, found
    _one_line(found[0], "inference_service_served_name")
    # Shown as Python writes it: no raw control character, Unicode space or surrogate in the sentence.
    assert all(char.isprintable() or char == " " for char in found[0]), found[0]


@pytest.mark.parametrize("name", ["llama", "org/model", "meta-llama/Llama-3.1-70B-Instruct", "llama-3.1:8b@q4",
                                  "pct%name", "ft:gpt-3.5:org:id", "model=v2", "модель", "模型", "s" * 256, "-1x"[1:]])
def test_a_served_name_clients_use_is_accepted(name):
    assert build(served_name=name)["served_name"] == name
    assert inference_service_problems({"inference_service_served_name": name}) == []


def test_a_secret_in_a_long_served_name_is_masked_before_the_value_is_cut():
    """Cut first, a key of 60 characters after 40 others would show its first half unmasked."""
    key = "sk-" + "k" * 57
    found = inference_service_problems({"inference_service_served_name": "m" * 40 + " " + key,
                                        "inference_service_secrets": {"api_key": key}})
    assert len(found) == 1 and "kkkkkkkkkk" not in found[0], found
    # The command line's builder alone (cleanslate.gpu.inference_args in a play of one's own, with
    # its `secrets`): its sentence is the name rule's, and the key is masked before the cut too.
    message = refused(served_name="m" * 40 + " " + key, secrets={"api_key": key})
    assert message.startswith("inference_service_served_name is ") and "kkkkkkkkkk" not in message, message


# --- the unit name -------------------------------------------------------------------------------

@pytest.mark.parametrize("unit", [name + ".service" for name in FUZZ] + [
    "a/b.service", "../x.service", "a..b.service", "-x.service", "--help.service", "vllm@.service",
    "vllm@a.service", "vllm", "vllm.service\n", "vllm.service ", " vllm.service", "v" * 248 + ".service",
    "v" * 10**6 + ".service", "vllm.socket", ".service", "vllm\u2003.service", "vllm\uff0eservice"])
def test_a_hostile_unit_name_is_refused_in_one_sentence_by_the_first_check(unit):
    found = inference_service_problems({"inference_service_unit": unit})
    assert len(found) == 1, found
    _one_line(found[0], "inference_service_unit")
    assert found[0].startswith("inference_service_unit is ")
    _one_line(refused(unit=unit), "inference_service_unit")


@pytest.mark.parametrize("unit", ["vllm.service", "vllm-a.service", "a:b_c.d-e.service", "v" * 247 + ".service"])
def test_a_unit_name_systemd_takes_is_accepted(unit):
    assert inference_service_problems({"inference_service_unit": unit}) == []
    build(unit=unit)


@pytest.mark.parametrize("unit, shown", [("{{ lookup('pipe', 'id') }}.service", "lookup"),
                                         ("a\nb.service", "b.service"), ("u" * 10**5 + ".service", "uuuuuuuuuu")])
def test_an_instance_whose_unit_is_no_unit_is_named_by_its_index_and_the_unit_shown_once(unit, shown):
    """The instance's unit named every sentence of the instance, whatever it held."""
    first, second = two(unit=unit, port=8001, prot=1)
    found = instance_problems(first, second)
    assert len(found) == 2, found
    assert found[1].startswith("inference_service_instances[1].unit is "), found
    assert found[0].startswith("inference_service_instances[1].prot: unknown key"), found
    assert sum(shown in line for line in found) == 1 and all("\n" not in line for line in found), found


def test_an_instance_named_by_a_secret_unit_does_not_show_it():
    key = "sk-" + "z" * 30
    first, second = two(unit=key + ".service", prot=1)
    found = instance_problems(first, second, inference_service_secrets={"api_key": key})
    assert found and not any(key in line for line in found), found


# --- the listen address --------------------------------------------------------------------------

AMBIGUOUS = ["0x7f000001", "0X7F000001", "0x7f.1", "1.0x1", "127.0.0.0x1", "0x", "127.1", "127.0.1", "0177.0.0.1",
             "0177.1", "017700000001", "2130706433", "01.2.3.4", "127.000.000.001", "1.2.3.04", "0", "00",
             "gpu.0x1f", "::ffff:127.0.0.1", "::FFFF:7f00:1", "::ffff:0.0.0.0", "::ffff:10.1.2.3"]


@pytest.mark.parametrize("host", AMBIGUOUS)
def test_an_address_in_a_spelling_inet_aton_or_ipv6_mapping_allows_is_refused(host):
    message = refused(host=host)
    _one_line(message, "inference_service_host")
    assert message.startswith("inference_service_host is ")
    assert "write" in message


@pytest.mark.parametrize("host", AMBIGUOUS + ["127.0.0.1", "10.1.2.3", "gpu01", "0x7f.example", "a.b0x1"])
def test_no_host_name_accepted_is_an_address_to_inet_aton(host):
    """The rule, checked against the C library's own reading: a host name the role accepts is never
    one that inet_aton (and so getaddrinfo and every HTTP client) reads as an IPv4 address."""
    try:
        parsed = _serve_command.parse_host(host)
    except ValueError:
        return
    if isinstance(parsed, str):
        with pytest.raises(OSError):
            socket.inet_aton(host)


@pytest.mark.parametrize("one, other, clash", [
    ("127.0.0.1", "localhost", True), ("localhost", "::1", True), ("LOCALHOST", "127.0.0.1", True),
    ("gpu.localhost", "127.0.0.1", True), ("localhost", "127.0.0.2", False),
    ("0.0.0.0", "10.1.2.3", True), ("::", "127.0.0.1", True), ("::", "0.0.0.0", True), ("0:0::0", "gpu01", True),
    ("::ffff:127.0.0.1", "127.0.0.1", True), ("::ffff:0.0.0.0", "10.1.2.3", True),
    ("2001:DB8::1", "2001:db8:0:0::1", True), ("2001:db8::1", "2001:db8::2", False),
    ("GPU01", "gpu01", True), ("gpu01", "10.1.2.3", False), ("127.0.0.1", "127.0.0.2", False),
    ("::1", "127.0.0.1", False),
])
def test_two_instances_on_one_port_clash_when_their_addresses_overlap(one, other, clash):
    first, second = two(port=8001, host=other)
    found = instance_problems(dict(first, host=one), second)
    sentence = ("inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] (vllm-b.service) "
                "share the port 8001: the second server could not listen on it.")
    assert found == ([sentence] if clash else []), found
    assert _serve_command.share_addresses(other, one) is clash  # either way round


# --- CUDA_VISIBLE_DEVICES ------------------------------------------------------------------------

@pytest.mark.parametrize("visible", ["\u0663", "0,\u0661", "\uff11", "\u0967", "1\u0663", "\u00b2"])
def test_a_gpu_index_in_digits_other_than_ascii_is_named_so(visible):
    found = instance_problems(*two(environment={"CUDA_VISIBLE_DEVICES": visible}))
    assert len(found) == 1, found
    assert "not the ASCII digits 0-9" in found[0] and "negative" not in found[0] and "ignores" not in found[0], found
    assert variables(*two())  # the good pair still resolves
    assert inference_service_problems({"inference_service_environment": {"CUDA_VISIBLE_DEVICES": visible}}) == []


# --- an option and its value in one item ---------------------------------------------------------

@pytest.mark.parametrize("flag, engine_settings", [
    ("--max-num-seqs", {}),
    ("--max-running-requests", {"engine": "sglang", "unit": "sglang.service", "port": 30000}),
])
def test_an_option_and_its_value_in_one_item_gets_the_hint_even_beside_other_problems(flag, engine_settings):
    alone = refused(extra_args=[flag + " 64"], **engine_settings)
    assert alone == ("inference_service_extra_args item 1 holds %s and its value in one item, which the engine takes for "
                     "a value and refuses: give them as two items ([%s, VALUE]) or as %s=VALUE" % (flag, flag, flag))
    beside = refused(extra_args=["--bogus", flag + " 64"], environment={"VLLM_PORT": "1"},
                     speculative={"bogus_key": 1}, **engine_settings).split("\n")
    assert any("--bogus is not an option" in line for line in beside), beside
    assert any(line.startswith("inference_service_extra_args item 2 holds %s and its value" % flag) for line in beside)
    assert any("VLLM_PORT" in line for line in beside), beside


@pytest.mark.parametrize("extra, phrase", [
    (["--enforce-eager x"], "item 1 holds --enforce-eager and more after a space"),
    (["--nope 5"], "item 1 starts with '-' and holds a space"),
    (["--max_num_seqs 64"], "item 1 holds --max-num-seqs and its value in one item"),
    (["--port 9000"], "--port is set by the role; use inference_service_port"),
    (["--api-key sk-hidden"], "--api-key would put a secret on the command line"),
])
def test_joined_items_are_named_without_their_value(extra, phrase):
    message = refused(extra_args=extra)
    assert phrase in message and "sk-hidden" not in message and "9000" not in message, message
    assert "64" not in message.replace("--max-num-seqs", "")


def test_a_value_with_a_space_after_its_flag_is_the_flags_value():
    argv = build(extra_args=["--chat-template", "--a b", "--max-num-seqs", "8"])["argv"]
    assert argv[-4:] == ["--chat-template", "--a b", "--max-num-seqs", "8"]
