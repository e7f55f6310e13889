# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""vLLM's SpeculativeConfig rules that cross keys, and the method it will really run.
Private to this collection.

The flag data (files/flags/*.json) say what each key takes; the rules here are what
SpeculativeConfig.__post_init__ and _verify_args (vllm/config/speculative.py) and the scheduler's
schedule check (vllm/v1/spec_decode/dynamic/utils.py) refuse across keys, read in the sources of
vLLM 0.31.0, 0.32.0 and 0.33.0. vLLM checks them after the reset and the model download; here
they are checked before anything is touched, one sentence each with vLLM's own reason.

check(spec, version, target_tp) returns (problems, warnings, running): `running` is what vLLM
will run, for the result and the report: its method after vLLM's guess from the draft's name,
and the draft's tensor-parallel size.
"""

from __future__ import annotations

import math

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._engine_flags import version_key

WHERE = "inference_service_speculative"
# Methods vLLM renames after the draft's repository name. eagle, eagle3, dflash and dspark are kept
# (the `pass` branch of its guess); methods without a draft checkpoint (ngram, suffix, ...) never reach it.
RENAMED = ("draft_model", "mtp")
# vLLM's guess, in its order: the first substring of the lower-cased draft name wins.
NAME_GUESSES = (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))
# Methods whose draft checkpoint can carry its step count (n_predict for MTP layers, block_size for
# DSpark): with a draft `model` given, vLLM reads num_speculative_tokens from it.
COUNT_FROM_CHECKPOINT = ("mtp", "dspark")
# Suffix decoding sets num_speculative_tokens to suffix_decoding_max_tree_depth itself.
COUNT_DEFAULTED = ("suffix",)
# Methods that read prompt_lookup_min/max (every other method sets both to 0).
NGRAM_METHODS = ("ngram", "ngram_gpu")
# draft_lm_head_quantization shares the target's lm_head: only these methods have one to share.
LM_HEAD_METHODS = ("eagle", "eagle3", "mtp")
# vLLM issue 49548 (open): a num_speculative_tokens_per_batch_size schedule collapses aggregate
# throughput under concurrency (8 requests: 232 tok/s with a static k=2, 24 to 157 with the schedule).
# None while no release fixes it: every version is warned about.
SCHEDULE_COLLAPSE_FIXED_IN = None
# Rules that appeared in a later version than the oldest supported one: (rule, first version).
SINCE = {"heterogeneous_local_argmax": "0.33.0"}


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _at_least(version: str, first: str) -> bool:
    return version_key(version) >= version_key(first)


def running_method(method, model, mtp_aliases=(), target_model=None) -> str:
    """The method vLLM will run: an MTP alias becomes mtp, and draft_model or mtp is renamed after
    the draft's repository name (a draft named like an EAGLE repository runs as eagle). mtp
    without a draft model loads the target's own layers, under the target's name. vLLM also
    renames after the draft's config (an MTP model type runs as mtp), which the controller
    cannot read: the warnings say so for draft_model."""
    if method in mtp_aliases:
        method = "mtp"
    if method == "mtp" and not model:
        model = target_model
    if method not in RENAMED or not isinstance(model, str) or not model:
        return method
    name = model.lower()
    for part, guessed in NAME_GUESSES:
        if part in name:
            return guessed
    return method


class _Rules:
    def __init__(self, spec: dict, version: str, target_tp, mtp_aliases, target_model):
        self.spec = spec
        self.version = version
        self.target_tp = target_tp
        self.given = spec.get("method")
        self.model = spec.get("model")
        named = isinstance(self.given, str)
        self.named = ("mtp" if self.given in mtp_aliases else self.given) if named else None
        self.method = running_method(self.given, self.model, mtp_aliases, target_model) if named else None
        self.guessed_from = self.model or (target_model if self.named == "mtp" else None)
        self.problems = []
        self.warnings = []

    def refuse(self, text: str) -> None:
        self.problems.append(text)

    def tokens_required(self) -> None:
        if self.spec.get("num_speculative_tokens") is not None or self.method is None:
            return
        if self.method in COUNT_DEFAULTED:
            return
        if self.method in COUNT_FROM_CHECKPOINT and self.model:
            return
        self.refuse("%s.num_speculative_tokens is required with method %s: vLLM %s refuses it missing "
                    "(num_speculative_tokens must be provided unless the draft's config has n_predict, which only "
                    "an mtp or dspark draft checkpoint given as model carries)" % (WHERE, self.method, self.version))

    def prompt_lookup(self) -> None:
        low, high = self.spec.get("prompt_lookup_min"), self.spec.get("prompt_lookup_max")
        if self.method in NGRAM_METHODS and _int(low) and _int(high) and low > high:
            self.refuse("%s.prompt_lookup_min (%d) must be at most prompt_lookup_max (%d): vLLM refuses it "
                        "(prompt_lookup_min must be <= prompt_lookup_max)" % (WHERE, low, high))

    def heterogeneous_vocab(self) -> None:
        if self.spec.get("use_heterogeneous_vocab") is not True:
            return
        if self.method is not None and self.method != "draft_model":
            self.refuse("%s.use_heterogeneous_vocab needs method draft_model, and vLLM will run %s: vLLM refuses it "
                        "(use_heterogeneous_vocab only works with method='draft_model')" % (WHERE, self.method))
        sampling = self.spec.get("draft_sample_method", "greedy")
        if sampling != "greedy":
            self.refuse("%s.use_heterogeneous_vocab needs draft_sample_method greedy, got %r: vLLM refuses it "
                        "(a heterogeneous vocabulary currently supports greedy draft sampling only)" % (WHERE, sampling))
        if self.spec.get("use_local_argmax_reduction") is True and _at_least(
                self.version, SINCE["heterogeneous_local_argmax"]):
            self.refuse("%s.use_heterogeneous_vocab cannot be combined with use_local_argmax_reduction: vLLM refuses "
                        "it (matching tokens across vocabularies needs the full draft logits)" % WHERE)

    def synthetic(self) -> None:
        rates, length = self.spec.get("synthetic_acceptance_rates"), self.spec.get("synthetic_acceptance_length")
        if self.spec.get("rejection_sample_method", "standard") != "synthetic":
            if rates is not None or length is not None:
                self.refuse("%s.synthetic_acceptance_rates and synthetic_acceptance_length need rejection_sample_method "
                            "synthetic: vLLM refuses them otherwise (they are only valid with "
                            "rejection_sample_method='synthetic')" % WHERE)
            return
        if (rates is None) == (length is None):
            self.refuse("%s: rejection_sample_method synthetic needs exactly one of synthetic_acceptance_rates and "
                        "synthetic_acceptance_length: vLLM refuses it otherwise" % WHERE)
            return
        tokens = self.spec.get("num_speculative_tokens")
        if not _int(tokens) or tokens < 1:
            return  # refused by its own rule
        if length is not None and _number(length) and not 1 <= length <= tokens + 1:
            self.refuse("%s.synthetic_acceptance_length must be from 1 to num_speculative_tokens + 1 (%d), got %r: "
                        "vLLM refuses it" % (WHERE, tokens + 1, length))
        if isinstance(rates, list) and all(_number(rate) for rate in rates):
            if len(rates) != tokens:
                self.refuse("%s.synthetic_acceptance_rates must have one rate per draft token (%d), got %d: vLLM "
                            "refuses it" % (WHERE, tokens, len(rates)))
            elif not all(0 <= rate <= 1 for rate in rates):
                self.refuse("%s.synthetic_acceptance_rates must each be from 0 to 1, got %r: vLLM refuses it"
                            % (WHERE, rates))
            elif any(later > earlier for earlier, later in zip(rates, rates[1:])):
                self.refuse("%s.synthetic_acceptance_rates must not increase from one position to the next, got %r: "
                            "vLLM refuses it" % (WHERE, rates))

    def lm_head_quantization(self) -> None:
        quantization = self.spec.get("draft_lm_head_quantization")
        if quantization is not None and self.method is not None and self.method not in LM_HEAD_METHODS:
            self.refuse("%s.draft_lm_head_quantization works with method %s only, and vLLM will run %s: vLLM refuses "
                        "it (draft_lm_head_quantization is not supported for method %r)"
                        % (WHERE, ", ".join(LM_HEAD_METHODS), self.method, self.method))

    def schedule(self) -> None:
        schedule = self.spec.get("num_speculative_tokens_per_batch_size")
        if not isinstance(schedule, list) or not schedule:
            return
        starts = [entry[0] for entry in schedule if isinstance(entry, list) and entry and _int(entry[0])]
        if len(starts) == len(schedule) and min(starts) != 1:
            self.refuse("%s.num_speculative_tokens_per_batch_size must have a range that starts at batch size 1, "
                        "got its lowest at %d: vLLM's scheduler refuses it at start (the first batch-size range must "
                        "start at 1 so every batch size has a number of draft tokens)" % (WHERE, min(starts)))
        if SCHEDULE_COLLAPSE_FIXED_IN is None or not _at_least(self.version, SCHEDULE_COLLAPSE_FIXED_IN):
            self.warnings.append(
                "%s.num_speculative_tokens_per_batch_size: vLLM %s has the open issue 49548, where this schedule "
                "collapses throughput under concurrency (8 requests: 232 tok/s with a fixed num_speculative_tokens 2, "
                "24 to 157 tok/s with the schedule); measure it against a fixed num_speculative_tokens"
                % (WHERE, self.version))

    def guess(self) -> None:
        if self.method != self.named:
            self.warnings.append("%s.method %s: vLLM %s will run %s, guessed from the repository name %r (naming the "
                                 "method does not stop the guess: only eagle, eagle3, dflash and dspark are never "
                                 "renamed)" % (WHERE, self.given, self.version, self.method, self.guessed_from))
        elif self.given == "draft_model":
            self.warnings.append("%s.method draft_model: vLLM %s still reads the draft's config and runs it as mtp "
                                 "if it is an MTP model type (a DeepSeek-V3 checkpoint, for one)"
                                 % (WHERE, self.version))

    def draft_tensor_parallel_size(self):
        given = self.spec.get("draft_tensor_parallel_size")
        if given is not None:
            return given
        if self.model or self.method in COUNT_FROM_CHECKPOINT:
            return self.target_tp
        return None  # ngram, suffix and the like load no draft


def check(spec: dict, version: str, target_tp, mtp_aliases=(), target_model=None) -> tuple:
    """(problems, warnings, running) of a vLLM speculative config whose keys were checked one by one."""
    rules = _Rules(spec, version, target_tp, tuple(mtp_aliases), target_model)
    rules.tokens_required()
    rules.prompt_lookup()
    rules.heterogeneous_vocab()
    rules.synthetic()
    rules.lm_head_quantization()
    rules.schedule()
    rules.guess()
    running = {"method": rules.method, "method_given": rules.given,
               "draft_tensor_parallel_size": rules.draft_tensor_parallel_size()}
    if spec.get("draft_tensor_parallel_size") is None and running["draft_tensor_parallel_size"] is not None:
        running["note"] = ("the draft runs with the target's tensor-parallel size (%s): "
                           "draft_tensor_parallel_size is not set" % target_tp)
        if target_tp != 1:
            # Said in the result's warnings too, where the report shows it: the draft is split over every GPU.
            rules.warnings.append("%s: %s (1 is the other size vLLM takes)" % (WHERE, running["note"]))
    return rules.problems, rules.warnings, running
