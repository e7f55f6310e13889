"""vLLM's SpeculativeConfig rules across keys (plugin_utils/_speculative_rules.py, issue 25): each is
refused on the controller with vLLM's own reason, the boundary is accepted, and the result names
the method vLLM will really run. Conditions read in vllm/config/speculative.py of 0.31.0, 0.32.0
and 0.33.0 and vllm/v1/spec_decode/dynamic/utils.py."""
from __future__ import annotations

import math

import pytest

from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _serve_command
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _speculative_rules as rules
from tests.unit.test_inference_args import build, refused

W = "inference_service_speculative"
EAGLE3 = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-70B", "num_speculative_tokens": 3}
VERSIONS = ("0.31.0", "0.32.0", "0.33.0")


def problems(spec, version="0.33.0", tp=4, target="meta-llama/Llama-3.1-70B-Instruct"):
    return rules.check(spec, version, tp, ("deepseek_mtp", "mimo_mtp"), target)[0]


def warnings(spec, version="0.33.0", tp=4, target="meta-llama/Llama-3.1-70B-Instruct"):
    return rules.check(spec, version, tp, ("deepseek_mtp", "mimo_mtp"), target)[1]


# --- point 1: num_speculative_tokens ----------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("spec", [
    {"method": "mtp"}, {"method": "deepseek_mtp"}, {"method": "ngram"}, {"method": "ngram_gpu"},
    {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-70B"}, {"method": "eagle", "model": "d"},
    {"method": "dflash", "model": "z-lab/Qwen3-8B-DFlash"}, {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B"},
    {"method": "dspark"}, {"method": "extract_hidden_states"},
])
def test_vllm_without_a_draft_count_it_cannot_read_is_refused(spec, version):
    found = problems(spec, version)
    assert any(p.startswith("%s.num_speculative_tokens is required with method" % W) for p in found), found
    # One more key and the same configuration passes this rule.
    assert not problems(dict(spec, num_speculative_tokens=1), version)


@pytest.mark.parametrize("spec", [
    {"method": "suffix"},                                          # defaults to suffix_decoding_max_tree_depth
    {"method": "mtp", "model": "deepseek-ai/DeepSeek-V3-0324"},    # n_predict from num_nextn_predict_layers
    {"method": "dspark", "model": "deepseek-ai/dspark_qwen3_8b_block7"},  # block_size
])
def test_vllm_reads_the_draft_count_from_a_checkpoint_given_as_model(spec):
    assert not [p for p in problems(spec) if "num_speculative_tokens is required" in p]


def test_the_role_refuses_mtp_without_a_draft_count_before_anything_runs():
    message = refused(speculative={"method": "mtp"})
    assert "inference_service_speculative.num_speculative_tokens is required with method mtp: vLLM 0.33.0 refuses" \
        in message


# --- point 2: rules across keys ---------------------------------------------------------------

def test_prompt_lookup_min_above_max_is_refused_and_equal_is_accepted():
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    assert not problems(dict(ngram, prompt_lookup_min=4, prompt_lookup_max=4))
    assert problems(dict(ngram, prompt_lookup_min=5, prompt_lookup_max=4)) == [
        "%s.prompt_lookup_min (5) must be at most prompt_lookup_max (4): vLLM refuses it "
        "(prompt_lookup_min must be <= prompt_lookup_max)" % W]
    assert problems(dict(ngram, method="ngram_gpu", prompt_lookup_min=5, prompt_lookup_max=4))
    # Only the ngram methods read them: vLLM sets both to 0 for every other method.
    assert not problems(dict(EAGLE3, prompt_lookup_min=5, prompt_lookup_max=4))


@pytest.mark.parametrize("bad", [None, "5", math.nan, True, [5]])
def test_prompt_lookup_of_the_wrong_type_is_left_to_the_key_check(bad):
    assert not [p for p in problems({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": bad,
                                     "prompt_lookup_max": 4}) if "prompt_lookup_min (" in p]


DRAFT = {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4, "use_heterogeneous_vocab": True}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_heterogeneous_vocabulary_needs_greedy_draft_sampling(version):
    assert not problems(DRAFT, version)
    assert not problems(dict(DRAFT, draft_sample_method="greedy"), version)
    assert problems(dict(DRAFT, draft_sample_method="probabilistic"), version) == [
        "%s.use_heterogeneous_vocab needs draft_sample_method greedy, got 'probabilistic': vLLM refuses it "
        "(a heterogeneous vocabulary currently supports greedy draft sampling only)" % W]


def test_a_heterogeneous_vocabulary_needs_the_draft_model_method_after_the_guess():
    assert "use_heterogeneous_vocab needs method draft_model, and vLLM will run eagle3" in problems(
        dict(EAGLE3, use_heterogeneous_vocab=True))[0]
    # draft_model named like an EAGLE-3 repository runs as eagle3, which vLLM then refuses.
    assert "vLLM will run eagle3" in problems(dict(DRAFT, model="AngelSlim/Qwen3-8B_eagle3"))[0]


def test_a_heterogeneous_vocabulary_with_local_argmax_is_refused_from_the_version_that_refuses_it():
    spec = dict(DRAFT, use_local_argmax_reduction=True)
    assert "cannot be combined with use_local_argmax_reduction" in problems(spec, "0.33.0")[0]
    assert not problems(spec, "0.32.0")


SYNTH = dict(EAGLE3, rejection_sample_method="synthetic")


def test_a_synthetic_acceptance_without_synthetic_sampling_is_refused():
    for key, value in (("synthetic_acceptance_length", 2.0), ("synthetic_acceptance_rates", [0.8, 0.6, 0.4])):
        assert problems(dict(EAGLE3, **{key: value})) == [
            "%s.synthetic_acceptance_rates and synthetic_acceptance_length need rejection_sample_method synthetic: "
            "vLLM refuses them otherwise (they are only valid with rejection_sample_method='synthetic')" % W]
        assert problems(dict(EAGLE3, rejection_sample_method="standard", **{key: value}))
        assert not problems(dict(SYNTH, **{key: value}))


@pytest.mark.parametrize("extra, message", [
    ({}, "needs exactly one of"),
    ({"synthetic_acceptance_length": 2.0, "synthetic_acceptance_rates": [0.5, 0.5, 0.5]}, "needs exactly one of"),
    ({"synthetic_acceptance_length": 4.0001}, "must be from 1 to num_speculative_tokens + 1 (4), got 4.0001"),
    ({"synthetic_acceptance_length": 0.999}, "must be from 1 to num_speculative_tokens + 1 (4), got 0.999"),
    ({"synthetic_acceptance_rates": [0.5, 0.5]}, "must have one rate per draft token (3), got 2"),
    ({"synthetic_acceptance_rates": [1.5, 0.5, 0.5]}, "must each be from 0 to 1"),
    ({"synthetic_acceptance_rates": [-0.1, -0.1, -0.1]}, "must each be from 0 to 1"),
    ({"synthetic_acceptance_rates": [0.4, 0.5, 0.3]}, "must not increase"),
])
def test_synthetic_sampling_values_are_refused_as_vllm_refuses_them(extra, message):
    found = problems(dict(SYNTH, **extra))
    assert len(found) == 1 and message in found[0], found


@pytest.mark.parametrize("extra", [{"synthetic_acceptance_length": 1}, {"synthetic_acceptance_length": 4},
                                   {"synthetic_acceptance_rates": [1, 1, 1]}, {"synthetic_acceptance_rates": [0, 0, 0]},
                                   {"synthetic_acceptance_rates": [0.9, 0.5, 0.1]}])
def test_synthetic_sampling_boundaries_are_accepted(extra):
    assert not problems(dict(SYNTH, **extra))


def test_lm_head_quantization_is_refused_with_ngram_and_accepted_with_eagle3_and_mtp():
    assert problems({"method": "ngram", "num_speculative_tokens": 3, "draft_lm_head_quantization": "fp8"}) == [
        "%s.draft_lm_head_quantization works with method eagle, eagle3, mtp only, and vLLM will run ngram: vLLM "
        "refuses it (draft_lm_head_quantization is not supported for method 'ngram')" % W]
    assert not problems(dict(EAGLE3, draft_lm_head_quantization="fp8"))
    assert not problems({"method": "deepseek_mtp", "num_speculative_tokens": 1, "draft_lm_head_quantization": "nvfp4"})
    assert problems({"method": "draft_model", "model": "d", "num_speculative_tokens": 1, "draft_lm_head_quantization": "fp8"})


def test_the_role_refuses_lm_head_quantization_with_ngram_before_anything_runs():
    assert "vLLM refuses it (draft_lm_head_quantization is not supported for method 'ngram')" in refused(
        speculative={"method": "ngram", "num_speculative_tokens": 3, "draft_lm_head_quantization": "fp8"})


# --- point 3 and "Also": the batch-size schedule ----------------------------------------------

def test_a_schedule_that_does_not_start_at_batch_size_1_is_refused():
    assert not problems(dict(EAGLE3, num_speculative_tokens_per_batch_size=[[1, 8, 3], [9, 64, 1]]))
    assert not problems(dict(EAGLE3, num_speculative_tokens_per_batch_size=[[9, 64, 1], [1, 8, 3]]))  # vLLM sorts
    assert problems(dict(EAGLE3, num_speculative_tokens_per_batch_size=[[9, 64, 1], [2, 8, 3]])) == [
        "%s.num_speculative_tokens_per_batch_size must have a range that starts at batch size 1, got its lowest at 2: "
        "vLLM's scheduler refuses it at start (the first batch-size range must start at 1 so every batch size has a "
        "number of draft tokens)" % W]
    message = refused(speculative=dict(EAGLE3, num_speculative_tokens_per_batch_size=[[2, 64, 3]]))
    assert "must have a range that starts at batch size 1, got its lowest at 2" in message


@pytest.mark.parametrize("version", VERSIONS)
def test_a_schedule_is_warned_about_on_every_version_with_the_open_throughput_issue(version):
    found = warnings(dict(EAGLE3, num_speculative_tokens_per_batch_size=[[1, 8, 3]]), version)
    assert any("open issue 49548" in w and "232 tok/s" in w for w in found), found
    assert not [w for w in warnings(EAGLE3, version) if "49548" in w]


def test_the_schedule_warning_reaches_the_result():
    built = build(speculative=dict(EAGLE3, num_speculative_tokens_per_batch_size=[[1, 8, 3], [9, 64, 1]]))
    assert any("49548" in w for w in built["warnings"])


# --- point 6: the method vLLM really runs -----------------------------------------------------

@pytest.mark.parametrize("method, model, runs", [
    ("draft_model", "yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle"),
    ("draft_model", "AngelSlim/Qwen3-8B_eagle3", "eagle3"),
    ("draft_model", "z-lab/Qwen3-8B-DFlash-b16", "dflash"),
    ("draft_model", "deepseek-ai/dspark_qwen3_8b_block7", "dspark"),
    ("draft_model", "meta-llama/Llama-3.2-1B-Instruct", "draft_model"),
    ("mtp", "someone/EAGLE-mtp-head", "eagle"),
    ("deepseek_mtp", "", "mtp"),
    ("eagle3", "yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle3"),     # exempt: named methods are kept
    ("eagle", "AngelSlim/Qwen3-8B_eagle3", "eagle"),
    ("dflash", "x/eagle-dflash", "dflash"),
    ("dspark", "x/eagle-y", "dspark"),
    ("ngram", "", "ngram"),
])
def test_the_method_vllm_runs_after_its_name_guess(method, model, runs):
    assert rules.running_method(method, model, ("deepseek_mtp",)) == runs


def test_the_result_names_the_method_vllm_runs_and_warns_where_it_differs():
    spec = {"method": "draft_model", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3}
    built = build(speculative=spec)
    assert built["speculative"]["method"] == "eagle"
    assert built["speculative"]["method_given"] == "draft_model"
    assert any("method draft_model: vLLM 0.33.0 will run eagle, guessed from the repository name" in w
               for w in built["warnings"]), built["warnings"]
    built = build(speculative=EAGLE3)
    assert built["speculative"]["method"] == "eagle3"
    assert not [w for w in built["warnings"] if "will run" in w]
    # An MTP alias is only renamed mtp (its own deprecation warning), not guessed.
    built = build(speculative={"method": "deepseek_mtp", "num_speculative_tokens": 1})
    assert built["speculative"]["method"] == "mtp" and built["speculative"]["method_given"] == "deepseek_mtp"
    assert not [w for w in built["warnings"] if "will run" in w]


def test_mtp_without_a_draft_is_guessed_from_the_target_name():
    found = warnings({"method": "mtp", "num_speculative_tokens": 1}, target="org/EAGLE-named-target")
    assert any("will run eagle, guessed from the repository name 'org/EAGLE-named-target'" in w for w in found)


def test_a_draft_model_is_told_that_its_config_can_make_it_mtp():
    found = warnings({"method": "draft_model", "model": "deepseek-ai/DeepSeek-V3-0324", "num_speculative_tokens": 1})
    assert any("runs it as mtp if it is an MTP model type" in w for w in found)


def test_without_draft_tensor_parallel_size_the_draft_gets_the_targets():
    built = build(speculative=EAGLE3, tensor_parallel_size=8)
    assert built["speculative"]["draft_tensor_parallel_size"] == 8
    assert "the draft runs with the target's tensor-parallel size (8)" in built["speculative"]["note"]
    assert "%s: the draft runs with the target's tensor-parallel size (8): draft_tensor_parallel_size is not set " \
        "(1 is the other size vLLM takes)" % W in built["warnings"]
    # With a target on one GPU the draft's size is 1 either way: nothing to warn about.
    built = build(speculative=EAGLE3, tensor_parallel_size=1)
    assert built["speculative"]["draft_tensor_parallel_size"] == 1
    assert not [w for w in built["warnings"] if "tensor-parallel" in w]
    built = build(speculative=dict(EAGLE3, draft_tensor_parallel_size=1), tensor_parallel_size=8)
    assert built["speculative"]["draft_tensor_parallel_size"] == 1
    assert "note" not in built["speculative"]
    # mtp without a draft model loads the target's own layers, with the target's size.
    built = build(speculative={"method": "mtp", "num_speculative_tokens": 1}, tensor_parallel_size=8)
    assert built["speculative"]["draft_tensor_parallel_size"] == 8
    # ngram loads no draft: nothing to say.
    built = build(speculative={"method": "ngram", "num_speculative_tokens": 3})
    assert built["speculative"]["draft_tensor_parallel_size"] is None


# --- hostile values never crash a rule --------------------------------------------------------

HOSTILE = [None, "", 0, -1, math.nan, math.inf, 10**30, True, [], {}, "'\"@/%$\n", "\udcff", [[None]], [["a", 1, 2]]]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("key", ["method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                                 "use_heterogeneous_vocab", "draft_sample_method", "rejection_sample_method",
                                 "synthetic_acceptance_length", "synthetic_acceptance_rates",
                                 "draft_lm_head_quantization", "num_speculative_tokens_per_batch_size",
                                 "draft_tensor_parallel_size"])
def test_hostile_values_give_sentences_not_exceptions(key, value):
    spec = dict(SYNTH, synthetic_acceptance_length=2.0, **{key: value}) if key != "synthetic_acceptance_length" \
        else dict(SYNTH, synthetic_acceptance_length=value)
    try:
        build(speculative=spec)
    except _serve_command.ServeConfigError as exc:
        assert all(problem.startswith("inference_service_") and "\n" not in problem for problem in exc.problems)
