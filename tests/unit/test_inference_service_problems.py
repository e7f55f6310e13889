"""inference_service's own check of its variables: one sentence per bad variable, secrets unshown."""
from __future__ import annotations

from pathlib import Path

import yaml

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import inference_service_problems, spec
from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import ENGINES


def _service_values(**changes):
    defaults = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "inference_service" / "defaults"
                               / "main.yml").read_text())
    values = {name: defaults[name] for name in spec()}
    values.update(changes)
    return values


def test_the_defaults_pass_and_each_bad_variable_is_one_sentence_with_its_rule():
    assert inference_service_problems(_service_values()) == []
    problems = inference_service_problems(_service_values(
        inference_service_poll_interval="nan", inference_service_ready_timeout="inf", inference_service_port="abc",
        inference_service_engine="tgi", inference_service_smoke_completions="1.5"))
    assert problems == [
        'inference_service_port is "abc": it must be a TCP port from 1 to 65535.',
        'inference_service_ready_timeout is "inf": it must be a whole number of seconds from 0 to 604800 (a week).',
        'inference_service_poll_interval is "nan": it must be a number of seconds above 0, at most 3600.',
        'inference_service_smoke_completions is "1.5": it must be a whole number of completions from 1 to 100.',
        'inference_service_engine is "tgi": it must be one of %s.' % ", ".join(ENGINES)]


def test_a_secret_of_the_wrong_type_is_named_without_its_value():
    problems = inference_service_problems(_service_values(inference_service_secrets="hunter2"))
    assert problems == ["inference_service_secrets is (hidden): it must be a mapping of names to values."]


def test_each_range_of_the_gate_at_its_edges():
    """The last value on each side of a rule: poll_interval 0 would poll in a busy loop, an
    acceptance rate of 30 meant as 30 % would call every server degraded, and 0 smoke completions
    would call a server that answers none ready."""
    edges_ok = {"inference_service_poll_interval": 0.01, "inference_service_min_acceptance_rate": 1,
                "inference_service_smoke_completions": 1}
    assert inference_service_problems(_service_values(**edges_ok)) == []
    problems = inference_service_problems(_service_values(
        inference_service_poll_interval=0, inference_service_min_acceptance_rate=30,
        inference_service_smoke_completions=0))
    assert problems == [
        "inference_service_poll_interval is 0: it must be a number of seconds above 0, at most 3600.",
        "inference_service_smoke_completions is 0: it must be a whole number of completions from 1 to 100.",
        "inference_service_min_acceptance_rate is 30: it must be a share from 0 to 1 (0.3 is 30%)."]


def test_a_list_refused_as_a_whole_never_shows_a_secret_it_holds():
    """The hostile run: a null item made the whole extra_args list the refused value, --api-key's
    value and all."""
    key = "sk live K3Y"
    found = inference_service_problems({"inference_service_extra_args": ["--api-key", key, None],
                                        "inference_service_secrets": {"api_key": key}})
    assert found and all(key not in sentence for sentence in found), found
    assert any(sentence.startswith("inference_service_extra_args has 1 item(s) that are not texts: item 3 is null")
               for sentence in found), found


def test_a_list_with_an_item_that_is_no_text_shows_only_that_item():
    """The hostile run: ["--api-key", KEY, null] on a host that declares no secret printed the
    whole list, KEY and all."""
    key = "sk live UNDECLARED"
    for bad, shown in ((None, "item 3 is null"), (True, "item 3 is true"), ({"a": 1}, 'item 3 is {"a": 1}')):
        found = inference_service_problems({"inference_service_extra_args": ["--api-key", key, bad]})
        assert len(found) == 1 and shown in found[0] and key not in found[0], found
