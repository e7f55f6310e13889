#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_ready
short_description: Wait until a vLLM or SGLang server answers a real completion, and read its speculation metrics
version_added: 0.1.0
description:
  - Polls the server's health endpoint until it answers (vLLM C(/health) 200; SGLang C(/health) 200, then C(/ready)
    200). Connection refused is normal while a model loads, since neither engine listens before it is ready.
  - With O(unit), reads the unit's state on every poll and fails at once, with the unit's last journal lines, when it
    dies, stops or restarts (C(NRestarts) or C(InvocationID) changes) instead of waiting for the deadline.
  - With O(unit), an answer counts only when every process listening on the O(url)'s port (read from C(/proc/net/tcp),
    C(/proc/net/tcp6) and the processes' descriptors) belongs to the unit's control group or one below it. Another
    server on the port fails the gate, naming it (RV(port_holder)), and so does a listener whose process cannot be
    seen. O(url) must then reach the server on this host.
  - A listener that may belong to a process whose descriptors cannot be read (the module runs as a root without
    C(CAP_SYS_PTRACE), in a container that drops it) is not proven foreign either - RV(verdict) V(unproven). A probe
    says so (the server is not to be reset for it); for a server this run did not start (O(started) false) the gate
    ends at once with RV(state) V(unproven), and for one it started it fails.
  - With O(unit) and O(started) false, a server that accepts the connection but does not answer within
    O(health_timeout) ends the gate at once with RV(state) V(slow), since no restart is coming that could change it, and
    waiting for O(timeout) would only report it failed.
  - With O(unit), after the smoke test the unit must still run the same invocation, active, at least O(stable_s)
    seconds after the server first answered. Every failure with O(unit) returns the journal lines of the invocation
    that was gated only (its C(InvocationID)), not of earlier runs.
  - A failure names the cause first - the error lines among the invocation's last 2000 journal lines (RV(journal_errors)),
    then its last O(journal_lines) lines (RV(journal)), since an engine that dies at start logs its cause above a
    traceback of its own API server that fills the tail.
  - Once healthy, checks that C(/v1/models) lists O(served_name), sends O(completions) real completions (with
    O(api_key) when set) and, with O(speculative), reads the acceptance rate and mean acceptance length from
    C(/metrics) (vLLM C(vllm:spec_decode_num_accepted_tokens_total) / C(vllm:spec_decode_num_draft_tokens_total);
    SGLang C(sglang:spec_accept_rate) and C(sglang:spec_accept_length), which need C(--enable-metrics) and read 0,
    unknown here, until C(--decode-log-interval) decode steps have run). Only the samples labelled with O(served_name)
    (C(model_name), as both engines label them) are read. C(/metrics) is read strictly as the Prometheus text format;
    an answer that breaks the format anywhere, is not UTF-8, holds more than 8 MiB or 100000 samples, or repeats a
    series leaves the acceptance unknown, with a note.
  - The engine's other answers are read to a bound each, the whole answer within its request's timeout (O(health_timeout),
    O(request_timeout)) - a health answer 16 KiB (longer is RV(verdict) V(unhealthy); one begun but not ended in time
    V(slow)), the model list and each completion 1 MiB (longer, or not ended in time, fails the gate), an HTTP error's
    body alike. A failure quotes at most 12 of the models listed, each cut to 100 characters, and journal lines cut
    to 2000 characters, each masked before it is cut.
  - The action plugin of the same name calls this module in bounded rounds of at most O(progress_interval) seconds
    until O(timeout), printing a progress line after each round, since Ansible shows nothing while a module runs.
  - Changes nothing on the host. C(changed) is always false.
requirements:
  - systemd (C(systemctl), C(journalctl)) on the host when O(unit) is set
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - cleanslate.gpu.attributes
  - cleanslate.gpu.attributes.action
attributes:
  check_mode:
    details: Read-only; check mode polls the same way.
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
options:
  settings:
    description:
      - The options that come from the C(cleanslate.gpu.inference_service) role's variables, as one mapping
        (C(cleanslate.gpu.inference_service_plugin_args)); the action plugin spreads them into options of their own.
        An option given both here and on its own is refused.
    type: dict
    default: {}
    version_added: 0.3.0
  url:
    description:
      - The server's base URL as the host reaches it, C(http(s\)://host[:port][/root/path]), for example
        C(http://127.0.0.1:8000); with a root path (an engine served under one) the gate requests C(<url>/health) and
        so on.
      - The host must be a host name or an IP address (IPv6 in brackets). A URL with a user name (C(user@host)), a
        query, a fragment, spaces or backslashes is refused before any request, so the API key goes nowhere else.
    type: str
    required: true
  validate_certs:
    description: With an C(https) O(url), whether the server's certificate must be valid for its host name.
    type: bool
    default: true
    version_added: 0.2.0
  ca_path:
    description: With an C(https) O(url), a file of CA certificates to trust instead of the system's. Empty means the system's.
    type: str
    default: ""
    version_added: 0.2.0
  served_name:
    description: The model name C(/v1/models) must list, used in the completions.
    type: str
    required: true
  mode:
    description:
      - V(gate) waits for readiness, then runs the smoke test. V(probe) looks at the unit state and the health
        endpoints, and never fails for an unhealthy server; when the first look is not healthy it looks again after
        O(poll_interval) before it reports RV(verdict) and RV(healthy).
      - Once the health endpoints answered 200, V(probe) asks whether the engine generates - C(/metrics) read, one
        real 1-token completion within O(hung_after), C(/metrics) read again - and reports V(healthy) (answered),
        V(busy) (no answer, but tokens were generated or requests finished meanwhile) or V(hung) (no answer and nothing
        generated; a server without those metrics is judged by the deadline alone). A probe takes at most twice
        (once per look) the health requests' time (O(health_timeout) per endpoint) plus O(poll_interval), then
        O(hung_after) plus two C(/metrics) reads of at most the lesser of O(hung_after) and the health timeout each -
        some 62 s with vLLM's defaults (10 s health, 1 s poll, 20 s hung_after).
    type: str
    default: gate
    choices: [gate, probe]
  request_timeout:
    description: Seconds one completion, C(/v1/models) or C(/metrics) request may take, its whole answer included.
    type: float
    default: 120
  speculative:
    description: Whether speculative decoding is configured, so that its metrics are read back.
    type: bool
    default: false
  started:
    description:
      - Whether the server was (re)started by this run. Only then is RV(ready_s), the time from the unit's start
        to readiness, reported.
    type: bool
    default: false
  healthy_seen:
    description:
      - What an earlier look of this run saw - C(invocation_id), the unit's C(InvocationID), and C(monotonic), the
        moment it answered healthy (a probe's RV(healthy_monotonic), or another gate's watch, RV(servers)). Used only
        with O(unit), while the unit still runs that invocation (systemd gives every start a new one), and when that
        moment is after the invocation started and not after the gate's own first answer; else ignored.
      - Empty, the window counts from the gate's own first answer. C(reset_and_serve.yml) passes the assessment's,
        so that a healthy neighbour it left running is not held O(stable_s) again, and for a server it started, the
        watch of the gate before it (O(servers)), so that the windows of the servers it started together overlap.
    type: dict
    default: {}
    version_added: 0.3.0
  journal_lines:
    description: How many of the unit's last journal lines a failure shows (each cut to 2000 characters).
    type: int
    default: 20
  wait:
    description:
      - Internal, set by the action plugin - seconds this call polls before it returns with RV(state) V(waiting).
    type: float
    default: 0
  baseline:
    description:
      - Internal, set by the action plugin - the unit's C(InvocationID) and C(NRestarts) when the wait began.
      - C(gate.yml) passes the assessment's invocation of a server the look saw V(loading) and this run did not
        restart, so that the gate waits for that very load (a new invocation fails it).
    type: dict
    default: {}
  with_journal:
    description: Internal, set by the action plugin - return the journal lines with RV(state) V(waiting).
    type: bool
    default: false
  xid:
    description:
      - With O(mode=probe), the arguments of M(cleanslate.gpu.nvml_verify) for a second look in the same host contact,
        made before the first, so that a probe that fails still returns it. C(reset_and_serve.yml) reads the kernel
        log's Xid records (O(cleanslate.gpu.nvml_verify#module:checks=[xid])) with it before it decides whether to
        reset. Its answer is RV(xid_look), as that module's own; it fails nothing here, whatever it found.
      - It runs in a child process of this module, as a task of its own would (check mode included), with the task's
        environment (the NVML library's path).
    type: dict
    version_added: 0.3.0
  servers:
    description:
      - With O(mode=probe), more servers of the same host to look at in the same host contact, besides the task's own
        one (the several servers of one node, C(inference_service_instances)), each as the task's own is looked at. A
        look that fails (systemd does not answer) is that server's answer (C(failed) and C(msg)), not the task's.
      - Each is a mapping of this module's options for that server (O(url), O(served_name), O(unit), O(engine), ...,
        and O(settings)), checked as the task's own are; an option it does not give takes this module's default, not
        the task's value. It may not give O(mode), O(servers) or O(xid).
      - Their answers are RV(servers), in the same order. The secrets of every server are hidden in every answer.
      - With O(mode=gate) and O(unit), servers this run started with the gated one, that the gate watches while it
        holds its own server's stability window (O(stable_s)), a time it would otherwise sleep. Each is polled, every
        O(poll_interval), until its health endpoints answer 200 from its own unit's processes. RV(servers) gives when
        each did, as O(healthy_seen) takes it, so that its own gate counts its window from that moment. A poll is cut
        at the window's end, so the gate ends when its window does, and a server not seen answering by then is held
        its own whole window. The watch fails nothing; what a server does there is its own gate's to judge.
    type: list
    elements: dict
    default: []
    version_added: 0.3.0
  # BEGIN generated by tools/gen_serve_settings.py
  engine:
    description:
      - The engine, which decides the health endpoints and the metric names.
    type: str
    choices: [vllm, sglang]
    required: true
  api_key:
    description:
      - "The API key, sent as C(Authorization: Bearer <key>). Empty means none."
      - Hidden, like O(secrets), in every form, in everything the module returns.
    type: str
    default: ""
  secrets:
    description:
      - More secrets (an admin key, a token in the environment) to hide, like O(api_key), in everything the module returns
        (messages, journal lines, quoted answers, RV(last_seen)).
      - Each is hidden as it is and in the forms engines and tools print it, a Python repr (SGLang logs its arguments so),
        JSON, shell quoting and URL encoding, replaced by C(********).
    type: list
    elements: str
    default: []
    version_added: 0.2.0
  unit:
    description:
      - The server's systemd unit, watched while waiting. Empty means none (a server started some other way).
    type: str
    default: ""
  timeout:
    description:
      - Seconds to wait for readiness in all. The action plugin keeps calling the module until then; the module itself
        waits at most O(progress_interval) per call.
      - With O(mode=probe), the start deadline of a loading server - a unit whose current invocation started less than
        this ago, whose main process lives, whose port refuses connections and which never logged the engine's ready line
        is RV(verdict) V(loading), not V(unhealthy).
    type: int
    default: 3600
  health_timeout:
    description:
      - Seconds one health request may take; a server that accepts the connection but answers later is RV(verdict)
        V(slow), not V(unhealthy).
      - V(0) means the engine's own default (docs/inference_service.md's engine table; SGLang's C(/health) runs a
        one-token generation, up to 20 s under load).
    type: float
    default: 0
    version_added: 0.2.0
  stable_s:
    description:
      - With O(unit), seconds after the server first answered at which the unit is read again, after the smoke test; a
        unit that died, restarted or is not active then fails the gate.
      - A server that an earlier look saw answering (O(healthy_seen)), in the invocation it still runs, has been answering
        since that look; the window counts from it.
    type: float
    default: 5
    version_added: 0.2.0
  poll_interval:
    description:
      - Seconds between two health polls.
    type: float
    default: 1
  progress_interval:
    description:
      - Longest time, in seconds, one module call waits before it returns to print progress.
    type: int
    default: 30
  prompt:
    description:
      - The prompt of the smoke completions, and of the 1-token completion of O(mode=probe).
    type: str
    default: The capital of France is
  max_tokens:
    description:
      - Tokens each smoke completion generates.
    type: int
    default: 16
  completions:
    description:
      - How many smoke completions to send; the first one's latency is reported.
    type: int
    default: 3
  min_acceptance_rate:
    description:
      - With O(speculative), an acceptance rate below this makes RV(status) V(degraded) (a warning); 0 means no floor.
    type: float
    default: 0
  fail_on_degraded:
    description:
      - Fail when RV(status) is V(degraded).
    type: bool
    default: false
  hung_after:
    description:
      - With O(mode=probe), once the health endpoints answered 200 - seconds one real 1-token completion (of
        O(served_name), with O(api_key)) may take before the server is told apart as V(busy) or V(hung). C(/metrics) is
        read before and after it (each read within the lesser of this and the health timeout); no answer in time and no
        token generated (nor request finished) between the two reads is RV(verdict) V(hung), tokens generated meanwhile
        V(busy). A server without those metrics is judged by the deadline alone, and RV(last_seen) says so.
    type: float
    default: 20
    version_added: 0.3.0
  # END generated by tools/gen_serve_settings.py
notes:
  - The requests go straight to O(url), never through a proxy from the host's environment.
seealso:
  - name: vLLM metrics
    description: The spec decode counters and how vLLM derives the acceptance rate from them.
    link: https://docs.vllm.ai/en/latest/design/metrics.html
"""

EXAMPLES = r"""
- name: Wait up to an hour for the server to answer a completion
  cleanslate.gpu.inference_ready:
    engine: vllm
    url: http://127.0.0.1:8000
    unit: vllm.service
    served_name: llama-70b
    speculative: true
    min_acceptance_rate: 0.3
    timeout: 3600
  register: gate

- name: Is the server healthy now? (one look, never fails)
  cleanslate.gpu.inference_ready:
    engine: sglang
    url: http://127.0.0.1:30000
    unit: sglang.service
    served_name: deepseek
    mode: probe
  register: probe
"""

RETURN = r"""
state:
  description:
    - V(ready), V(waiting) (one call's wait ran out; the action plugin calls again), V(unhealthy) or V(unproven)
      (probe), or, for a server this run did not start (O(started) false), V(slow) or V(unproven) (the gate ended
      at once and left it running; RV(reason) says why).
  returned: always
  type: str
  sample: ready
status:
  description:
    - V(ready), or V(degraded) when the acceptance rate is below O(min_acceptance_rate); V(slow) or V(unproven) for a
      server this run did not start and the gate left running (RV(state)). Set by the action.
  returned: when the gate passed, or ended with RV(state) V(slow) or V(unproven)
  type: str
  sample: ready
reason:
  description: Why RV(status) is not V(ready), or a note about the acceptance rate.
  returned: when the gate passed, or ended with RV(state) V(slow) or V(unproven)
  type: str
  sample: "acceptance rate 0.15 below inference_service_min_acceptance_rate 0.3"
healthy:
  description: Whether the health endpoints answered (and, with O(unit), the unit is active).
  returned: always
  type: bool
  sample: true
verdict:
  description:
    - What the last look found. V(healthy) (the health endpoints answered 200), V(slow) (the server accepted the
      connection but did not answer within O(health_timeout); in probe mode, on both looks), V(unproven) (it
      answered, healthy or slow, but the listener cannot be attributed to O(unit), since the descriptors of a
      process that may hold it cannot be read; no holder is proven foreign) or V(unhealthy) (connection refused,
      an HTTP error status, the unit down, another process on the port). Only an unhealthy server needs a reset.
    - With O(mode=probe), V(busy) or V(hung) for a server whose health endpoints answered 200 but whose real 1-token
      completion got no answer within O(hung_after) - V(busy) when the engine's C(/metrics) show tokens generated (or
      requests finished) between a read before and one after it (the counters of docs/inference_service.md's engine
      table, labelled with O(served_name); with no counter, a throughput gauge above 0), V(hung) when they show none or
      the server exposes none of them (RV(last_seen) says so). V(busy) is healthy; V(hung) is not, and needs a reset (RV(needs_reset)) - a vLLM whose EngineCore
      process is stopped keeps C(/health) at 200 while no completion returns.
    - With O(mode=probe) and O(unit), also V(loading) - the unit's current invocation started less than O(timeout)
      seconds ago (C(ExecMainStartTimestampMonotonic)), its main process lives (C(MainPID) not 0, the process there),
      it is active or activating but not waiting to restart (C(auto-restart)), its port refused the connection on
      both looks, and that invocation never logged the engine's ready line (vLLM's C(Application startup complete.),
      SGLang's C(The server is fired up and ready to roll!), found by C(journalctl --grep); a server that logged it
      and refuses now has lost its API, and is V(unhealthy)) - neither engine listens before its model is loaded, so
      this is a load in progress (systemd's own
      C(Restart=always) after a crash), not a dead server. RV(healthy) is false, RV(needs_reset) false. Past
      O(timeout), or with its main process gone, the same refusals are V(unhealthy).
  returned: always
  type: str
  sample: healthy
  version_added: 0.2.0
needs_reset:
  description:
    - Whether the server needs a reset (O(mode=probe)) - true for RV(verdict) V(unhealthy) and V(hung), false for
      every other verdict, V(loading) and V(busy) included. C(reset_and_serve.yml) resets only a server whose look says true (the role's
      assessment's C(healthy) is its negation).
  returned: in probe mode
  type: bool
  sample: false
  version_added: 0.3.0
xid_look:
  description:
    - The answer of M(cleanslate.gpu.nvml_verify) to O(xid), as that module returns it (its RV(cleanslate.gpu.nvml_verify#module:xid_action)
      among it); its C(failed) is its own verdict, not this task's.
  returned: when O(mode=probe) and O(xid) are given, also when the probe fails
  type: dict
  sample: {"xid_action": null, "gpus": []}
  version_added: 0.3.0
servers:
  description:
    - The look at each server of O(servers), in their order, each answer as the task's own (RV(verdict), RV(healthy),
      RV(needs_reset), RV(last_seen), RV(unit), ...).
    - With O(mode=gate), what the watch saw of each, in their order - C(unit); C(healthy_seen), the record for that
      server's own gate (C(invocation_id), C(monotonic)), empty when it was not seen answering from its unit; and
      C(last_seen), its last poll's answer in words (C(not looked at) when the window left no time for one).
  returned: when O(servers) are given, in O(mode=gate) once the server's window began
  type: list
  elements: dict
  sample: [{"verdict": "healthy", "healthy": true, "needs_reset": false, "last_seen": "HTTP 200; a 1-token completion answered in 41 ms"}]
  version_added: 0.3.0
generation:
  description:
    - The probe's check that the engine generates, once the health endpoints answered 200 - C(answered) (the
      1-token completion got an HTTP answer, any status), C(completion_ms), C(hung_after), and when it got none,
      C(metrics) (V(read), or why not) with C(before) and C(after), the engine's activity for O(served_name) at each
      read (C(tokens) generated and C(finished) requests, counters since start; C(running), C(waiting) and C(throughput)
      gauges; null when not exposed).
  returned: in probe mode, when the health endpoints answered 200
  type: dict
  sample: {"answered": false, "completion_ms": 20003.1, "hung_after": 20, "metrics": "read",
           "before": {"tokens": 1200, "finished": 40, "running": 1, "waiting": 0, "throughput": null},
           "after": {"tokens": 1200, "finished": 40, "running": 1, "waiting": 1, "throughput": null}}
  version_added: 0.3.0
loading_s:
  description: Seconds since the loading unit's current invocation started (RV(verdict) V(loading)).
  returned: when the probe's verdict is V(loading)
  type: float
  sample: 14.2
  version_added: 0.3.0
last_seen:
  description:
    - What the last look saw, in words, for example C(connection refused), C(/health HTTP 503), C(HTTP 200) or
      C(/health accepted the connection but gave no answer within 10 s); in probe mode C(HTTP 200; a 1-token
      completion answered in 85 ms), a sentence that starts with the verdict for V(busy) and V(hung) (the completion's
      deadline, the tokens generated between the two reads of C(/metrics)), and one that starts with C(started 14 s
      ago, main pid 4242 alive) for V(loading).
  returned: always
  type: str
  sample: connection refused
unit:
  description: The unit's state at the last poll (C(systemctl show) properties).
  returned: when O(unit) is set
  type: dict
  sample: {"ActiveState": "active", "SubState": "running", "MainPID": "4242", "NRestarts": "0",
           "ControlGroup": "/system.slice/vllm.service"}
baseline:
  description: The unit's C(InvocationID) and C(NRestarts) when the wait began.
  returned: when O(unit) is set
  type: dict
  sample: {"invocation_id": "4b3c0f0e2b8a4c1d9f7e6a5b4c3d2e1f", "n_restarts": 0}
polls:
  description: Health polls made.
  returned: always
  type: int
  sample: 12
ready_monotonic:
  description: The host's CLOCK_MONOTONIC, in seconds, when the health endpoints first answered.
  returned: when the server is ready
  type: float
  sample: 18234.51
healthy_monotonic:
  description: The host's CLOCK_MONOTONIC, in seconds, when the look found the server healthy (O(mode=probe)).
  returned: when a probe finds the server healthy
  type: float
  sample: 18230.02
  version_added: 0.3.0
stable_since:
  description:
    - What the stability window (O(stable_s)) counted from - V(first answer) (the gate's) or V(earlier look)
      (O(healthy_seen), the same invocation answering earlier in the run, seen by the assessment's look or by the
      watch of the gate before).
  returned: when the gate passed with O(unit)
  type: str
  sample: earlier look
  version_added: 0.3.0
ready_s:
  description: Seconds from the unit's start to readiness; only when O(started) and O(unit) are set.
  returned: when the server is ready
  type: float
  sample: 412.7
gate_s:
  description: Seconds the whole wait took, all calls together. Set by the action.
  returned: when the gate passed
  type: float
  sample: 413.2
models:
  description: The model ids C(/v1/models) lists.
  returned: when the server is ready in gate mode
  type: list
  elements: str
  sample: ["llama-70b"]
first_completion_ms:
  description: Milliseconds the first smoke completion took.
  returned: when the server is ready in gate mode
  type: float
  sample: 842.1
completions_ms:
  description: Milliseconds of every smoke completion.
  returned: when the server is ready in gate mode
  type: list
  elements: float
  sample: [842.1, 310.4, 298.8]
completion:
  description: The first completion's text (at most 200 characters).
  returned: when the server is ready in gate mode
  type: str
  sample: " Paris. It is also the largest city"
speculation:
  description:
    - The acceptance read back from C(/metrics). C(acceptance_rate) is accepted / drafted tokens, C(mean_acceptance_length)
      includes the bonus token (1 + accepted / drafts); both null when nothing was drafted or the metrics are missing
      (C(available) false, with C(note)).
    - SGLang's gauges cover the last window of C(--decode-log-interval) decode steps (40 by default) and read 0 until the
      first window is logged; a gauge that reads 0 leaves the acceptance unknown (C(available) false, with C(note)), never
      V(degraded).
  returned: when O(speculative) and the server is ready in gate mode
  type: dict
  sample: {"available": true, "acceptance_rate": 0.71, "mean_acceptance_length": 3.13, "drafts": 120,
           "draft_tokens": 360, "accepted_tokens": 255, "source": "vllm:spec_decode_* counters"}
port_holder:
  description: The process that listens on the O(url)'s port and is not a process of O(unit) (its C(pid), C(name), C(cgroup)).
  returned: when O(unit) is set and another process listens on the port
  type: dict
  sample: {"pid": 123, "name": "python3 foreign.py", "cgroup": "/user.slice/user-1000.slice/session-3.scope"}
  version_added: 0.2.0
journal:
  description:
    - The last journal lines of the invocation of the unit that was gated (C(journalctl _SYSTEMD_INVOCATION_ID=<id> +
      INVOCATION_ID=<id>); the unit's when it had none), on a failure or when the wait ran out.
  returned: when the unit died, or on request
  type: list
  elements: str
  sample: ["torch.OutOfMemoryError: CUDA out of memory.", "inference-server.service: Main process exited, code=exited, status=1/FAILURE"]
journal_errors:
  description:
    - The error lines of the same invocation, among its last 2000 journal lines, in their order, each once (compared
      without the process, level and time prefixes), at most 10, each masked, then cut to 500 characters - vLLM's
      C(ERROR) records (C(\(EngineCore_DP0 pid=123\) ERROR 12-05 09:41:02 [core.py:700] ...)) without the traceback
      frames they carry, uvicorn's C(ERROR:), the exception line that ends each traceback (C(SomethingError) and its
      message), SGLang's C(Scheduler hit an exception) line. A failure's message puts them first (after C(the cause,
      from the journal)), the tail (RV(journal)) after. Only matched, never run or templated.
  returned: with RV(journal)
  type: list
  elements: str
  sample: ["(EngineCore_DP0 pid=2345) ERROR 12-05 09:41:02 [core.py:708] RuntimeError: No working C++ compiler found",
           "(APIServer pid=2300) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
  version_added: 0.3.0
"""

import errno
import ipaddress
import json
import math
import re
import socket
import time
from http.client import HTTPException
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule, _load_params
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.urls import open_url
from ansible_collections.cleanslate.gpu.plugins.module_utils import _procs, _settings
from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import ENGINES
from ansible_collections.cleanslate.gpu.plugins.module_utils._exposition import ExpositionError, parse as parse_exposition
from ansible_collections.cleanslate.gpu.plugins.module_utils._listeners import listeners
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import Range
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker
from ansible_collections.cleanslate.gpu.plugins.module_utils._step_process import internal_settings, run_module_main

# The options that are no role setting (those are the table's, module_utils/_settings.py), then the
# ranges of the numbers among them.
ARGUMENT_SPEC = dict(_settings.argument_spec(_settings.GATE, _settings.PROBE), **{
    _settings.SETTINGS_OPTION: {"type": "dict", "default": {}},
    "url": {"type": "str", "required": True},
    "served_name": {"type": "str", "required": True},
    "mode": {"type": "str", "default": "gate", "choices": ["gate", "probe"]},
    "request_timeout": {"type": "float", "default": 120},
    "speculative": {"type": "bool", "default": False},
    "started": {"type": "bool", "default": False},
    "journal_lines": {"type": "int", "default": 20},
    "wait": {"type": "float", "default": 0},
    "baseline": {"type": "dict", "default": {}},
    "healthy_seen": {"type": "dict", "default": {}},
    "with_journal": {"type": "bool", "default": False},
    "validate_certs": {"type": "bool", "default": True},
    "ca_path": {"type": "str", "default": ""},
    "xid": {"type": "dict"},
    "servers": {"type": "list", "elements": "dict", "default": []},
})
# What one server of `servers` may give: any option of the task's but these, which are the task's alone.
SERVER_SPEC = {name: spec for name, spec in ARGUMENT_SPEC.items() if name not in ("mode", "servers", "xid")}
OWN_RANGES = {
    # A completion of max_tokens on a loaded server; a day is a typo.
    "request_timeout": Range(minimum=0.1, maximum=86400, unit="seconds"),
    # The action plugin's round: at most its progress interval.
    "wait": Range(minimum=0, maximum=86400, unit="seconds"),
    "journal_lines": Range(minimum=1, maximum=10000, unit="lines", whole=True),
}
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "MainPID", "NRestarts", "InvocationID",
                   "ExecMainStatus", "ExecMainStartTimestampMonotonic", "ControlGroup")
INVOCATION_ID = re.compile(r"^[0-9a-f]{32}$")
SGLANG_WINDOW_NOTE = ("SGLang has not logged a window of decode steps yet: its sglang:spec_accept_rate and "
                      "spec_accept_length gauges read 0 until --decode-log-interval decode steps (40 by default) have run, "
                      "more than the smoke completions make; lower --decode-log-interval to have them read")
# /metrics is the engine's answer, not ours: read this much of it at most. vLLM's holds some
# hundreds of samples (a few hundred KiB with its histograms).
METRICS_MAX_BYTES = 8 * 1024 * 1024
METRICS_MAX_SAMPLES = 100000
# The engine's other answers, read as far as these at most, each within its request's timeout:
# a health answer is empty or a word (an error page a few KiB); a model list or a completion of
# a few tokens is some KiB. An endless or trickling body must not hold the gate, or the host's memory.
HEALTH_MAX_BYTES = 16 * 1024
ANSWER_MAX_BYTES = 1024 * 1024
# What a failure quotes of the engine's words: so many of the models it lists, so many characters
# of each, and of each journal line (the service writes them; journald keeps lines of 48 KiB and more).
SHOWN_MODELS = 12
SHOWN_MODEL_CHARS = 100
JOURNAL_LINE_CHARS = 2000
# The error lines a failure names first: read among the invocation's last JOURNAL_READ_LINES lines
# (a traceback of the API server alone is some 60 lines), at most JOURNAL_ERRORS of them, each cut
# to JOURNAL_ERROR_CHARS; a line is matched on its first JOURNAL_MATCH_CHARS characters.
JOURNAL_READ_LINES = 2000
JOURNAL_ERRORS = 10
JOURNAL_ERROR_CHARS = 500
JOURNAL_MATCH_CHARS = 4096
# What comes before a log record's message: vLLM's child process ("(EngineCore_DP0 pid=123) "),
# SGLang's time and rank ("[2025-12-05 09:41:02 TP0] "); then vLLM's level, date, time and place.
LOG_PREFIX = re.compile(r"^(?:\([^()\s]{1,100} pid=\d{1,10}\)\s*|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]{0,100}\]\s*)")
VLLM_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?"
                        r"(?: \[[^\]]{0,200}\])? ?")
# A traceback's own lines, which vLLM's ERROR records carry one a line: no cause in them.
TRACEBACK_FRAME = re.compile(r"^(?:\s|$|\^|~|Traceback \(most recent call last\)|During handling of the above "
                             r"exception|The above exception was the direct cause)")
# A traceback's last line: the exception's (dotted) class name and its message.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")
UVICORN_ERROR = re.compile(r"^(?:ERROR|CRITICAL):\s")
# SGLang's processes' last words ("Scheduler hit an exception: Traceback ...", the detokenizer's alike).
CAUSE_MARKERS = ("hit an exception",)
COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")
# How many unreadable pids a sentence names before it says "and N more".
SHOWN_PIDS = 12
# Between two polls of a server that refuses connections, how often its port is tried (until_accepting).
ACCEPT_STEP = 0.05
# What a server this run did not start may be, besides healthy, and be left running (never reset
# for it, reset_and_serve.yml): the gate reports it at once rather than waiting for the deadline.
LEFT_RUNNING = ("slow", "unproven")
# The probe's verdicts that reset_and_serve.yml resets (RV(needs_reset)); every other one is left running.
NEEDS_RESET = ("unhealthy", "hung")
# The probe's activity of the engine (ENGINES' `activity`): counters, then gauges.
ACTIVITY_KEYS = ("tokens", "finished", "running", "waiting", "throughput")


HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
ROOT_PATH = re.compile(r"^(/[A-Za-z0-9._~%+-]+)*/?$")
URL_FORM = "url must be http(s)://host[:port][/root/path]"


class SlowAnswer(HTTPException):
    """An answer whose body trickles in for longer than the request's timeout."""


class GateError(Exception):
    """The server or its unit failed; the message is for the user."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result


def parse_url(url):
    """(base URL with no trailing slash, port) or raise ValueError with the sentence.

    The host must be an IP literal or a host name, with no user information: in
    http://127.0.0.1@node2:18000 the host is node2, which would receive the API key."""
    shown = re.sub(r"//[^/]*@", "//...@", url)  # a password before @ is not echoed
    if re.search(r"[\s\x00-\x1f\x7f\\]", url) or "@" in url.partition("://")[2].split("/", 1)[0]:
        raise ValueError("%s with no user name, spaces or backslashes, got %r" % (URL_FORM, shown))
    refused = ValueError("%s (a host name or IP address, no query), got %r" % (URL_FORM, shown))
    try:
        parts = urlsplit(url)
        port = parts.port if parts.port is not None else (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port that is not a number from 0 to 65535, an unclosed [
        raise refused from None
    host = parts.hostname or ""
    try:  # an IP literal: IPv6 in brackets, IPv4 without
        good_host = ipaddress.ip_address(host).version == (6 if "[" in parts.netloc else 4)
    except ValueError:
        good_host = bool(HOST_NAME.match(host)) and "[" not in parts.netloc
    if not good_host or parts.scheme not in ("http", "https") or not port or "?" in url or "#" in url \
            or not ROOT_PATH.match(parts.path):
        raise refused
    return "%s://%s%s" % (parts.scheme, parts.netloc, parts.path.rstrip("/")), port


def unit_state(module, unit):
    argv = ["systemctl", "show", "--property=" + ",".join(UNIT_PROPERTIES), "--", unit]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        raise GateError("systemctl show %s failed: %s" % (unit, (err or out).strip()))
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {key: state.get(key, "") for key in UNIT_PROPERTIES}


def invocation_start(state):
    """When the unit's current invocation started (CLOCK_MONOTONIC seconds), 0 where systemd does not say."""
    started_us = state.get("ExecMainStartTimestampMonotonic") or "0"
    return int(started_us) / 1e6 if started_us.isdigit() else 0.0


def journal_argv(unit, invocation_id, lines):
    """journalctl's command for the lines of one invocation of the unit: the service's own lines
    carry _SYSTEMD_INVOCATION_ID=, PID 1's messages about it INVOCATION_ID=. Lines of earlier runs
    would mislead, so the whole unit only when there is no invocation id."""
    argv = ["journalctl", "--no-pager", "--output", "cat", "--lines", str(lines)]
    if INVOCATION_ID.match(invocation_id or ""):
        return argv + ["_SYSTEMD_INVOCATION_ID=" + invocation_id, "+", "INVOCATION_ID=" + invocation_id]
    return argv + ["--unit", unit]


def journal(module, params, invocation_id, mask):
    """{"journal": the gated invocation's last journal_lines lines, "journal_errors": its error lines
    (error_lines) among its last JOURNAL_READ_LINES}, masked, each cut (JOURNAL_LINE_CHARS,
    JOURNAL_ERROR_CHARS; masked before it is cut, so that no piece of a secret is left at the cut)."""
    # The engine's last words (its traceback, on stderr) travel through a stdout stream that
    # journald may not have read yet when PID 1's "Main process exited" is already there: a sync
    # waits for the streams' data written before it (systemd 246+). Best effort: root only.
    module.run_command(["journalctl", "--sync"])
    lines = params["journal_lines"]
    # The cause is often far above the tail: vLLM's API server prints its own traceback after the
    # EngineCore process's error. At most JOURNAL_READ_LINES lines are read, each at most journald's
    # LineMax (48 KiB by default: it splits longer ones).
    read = max(lines, JOURNAL_READ_LINES)
    rc, out, dummy = module.run_command(journal_argv(params["unit"], invocation_id, read))
    if rc != 0:
        return {"journal": [], "journal_errors": []}
    read_lines = out.splitlines()[-read:]
    return {"journal": [cut(mask(line), JOURNAL_LINE_CHARS) for line in read_lines[-lines:]],
            "journal_errors": [cut(mask(line), JOURNAL_ERROR_CHARS) for line in error_lines(read_lines)]}


def error_lines(lines, limit=None):
    """The lines of an engine's log that name an error, in their order, each once (its message
    without the process, level and time prefixes compared), at most `limit` (JOURNAL_ERRORS):
    vLLM's ERROR records (``(EngineCore_DP0 pid=123) ERROR 12-05 09:41:02 [core.py:700] ...``,
    ``ERROR 12-05 ...``) but the traceback frames they carry, uvicorn's ``ERROR:``, every
    exception line of a traceback (``SomethingError: message``, ``Exception: ...``: the last line
    of each block), and SGLang's ``Scheduler hit an exception: ...``. The lines are the engine's
    words, untrusted: only matched, never run or templated."""
    limit = JOURNAL_ERRORS if limit is None else limit
    picked, seen = [], set()
    for line in lines:
        message = LOG_PREFIX.sub("", line[:JOURNAL_MATCH_CHARS], count=1)
        level = VLLM_LEVEL.match(message)
        if level:
            message = message[level.end():]
        if level:  # a record of a level: an error record but the traceback frames it carries
            error = level.group("level") in ("ERROR", "CRITICAL") and not TRACEBACK_FRAME.match(message)
        else:
            error = bool(EXCEPTION_LINE.match(message) or UVICORN_ERROR.match(message)
                         or any(marker in message for marker in CAUSE_MARKERS))
        key = message.strip()
        if error and key and key not in seen:
            seen.add(key)
            picked.append(line)
            if len(picked) >= limit:
                break
    return picked


def journal_text(found, heading):
    """A failure's journal part: the error lines first (the cause), then the tail under heading."""
    cause = "the cause, from the journal:\n%s\n" % "\n".join(found["journal_errors"]) if found["journal_errors"] else ""
    return "%s%s:\n%s" % (cause, heading, "\n".join(found["journal"]) or "(none)")


def cut(text, limit):
    """text, or its first limit characters and how many more there were."""
    return text if len(text) <= limit else "%s... (%d more characters)" % (text[:limit], len(text) - limit)


def death(state, baseline):
    """Why the unit is no longer the one that was started, or None while it lives."""
    if state["LoadState"] == "not-found":
        return "is not installed"
    if state["ActiveState"] in ("failed", "inactive", "deactivating") or state["SubState"] == "auto-restart":
        return "died (%s, %s, result %s, exit status %s)" % (
            state["ActiveState"], state["SubState"], state["Result"], state["ExecMainStatus"] or "-")
    if baseline.get("invocation_id") and state["InvocationID"] != baseline["invocation_id"]:
        return "restarted (a new invocation, main pid %s)" % state["MainPID"]
    if int(state["NRestarts"] or 0) > int(baseline.get("n_restarts", 0)):
        return "restarted (NRestarts %s)" % state["NRestarts"]
    return None


def unstable(state, baseline):
    """Why the unit, once ready, is no longer the same running invocation, or None."""
    why = death(state, baseline)
    if why is None and state["ActiveState"] != "active":
        why = "is %s (%s), not active" % (state["ActiveState"], state["SubState"])
    return why


def within(cgroup, unit_cgroup):
    return cgroup == unit_cgroup or cgroup.startswith(unit_cgroup.rstrip("/") + "/")


def shown_pids(pids):
    """The first SHOWN_PIDS pids, and how many more: a root without CAP_SYS_PTRACE may not read
    most of the host's processes."""
    shown = ", ".join(str(pid) for pid in pids[:SHOWN_PIDS])
    return shown + (" and %d more" % (len(pids) - SHOWN_PIDS) if len(pids) > SHOWN_PIDS else "")


def port_problem(port, unit, unit_cgroup, found):
    """(sentence, the foreign holder or None, unproven) when the answer on port is not proven to
    come from the unit, else (None, None, False). found is _listeners.listeners(port): every
    process that holds a listening socket of the port must be in the unit's control group or one
    below it; a socket no process is seen holding proves nothing. unproven: no holder is proven
    foreign, and the holder may be a process whose descriptors could not be read (the reader
    lacks CAP_SYS_PTRACE): the answer may well be the unit's, so nothing is to be reset for it."""
    cannot = "cannot prove that unit %s answers on port %d: %%s" % (unit, port)
    if not unit_cgroup:
        return cannot % "systemd gives the unit no control group", None, False
    for holders in found["sockets"].values():
        for holder in holders:
            if not within(holder["cgroup"], unit_cgroup):
                return ("port %d is held by pid %d (%s), which is not a process of unit %s (its control group is %s, "
                        "the unit's is %s): another server answers in its place"
                        % (port, holder["pid"], holder["name"], unit, holder["cgroup"] or "unknown", unit_cgroup),
                        holder, False)
    if not found["sockets"]:
        return cannot % "no process is seen listening on it", None, False
    if not all(found["sockets"].values()):
        if found["unreadable"]:
            return cannot % (
                "the descriptors of %d process%s (pid %s) cannot be read, and no other process is seen holding its "
                "socket (do the modules run without CAP_SYS_PTRACE, in a container that drops it?); give the modules' "
                "root CAP_SYS_PTRACE, or see who holds the port with `ss -ltnp 'sport = :%d'` as a root that has it"
                % (len(found["unreadable"]), "" if len(found["unreadable"]) == 1 else "es",
                   shown_pids(found["unreadable"]), port)), None, True
        return cannot % "no process is seen holding its socket", None, False
    return None, None, False


def request(params, path, timeout, limit, data=None):
    """(HTTP status, body) of path under the base URL, or raises URLError/socket errors; HTTP
    errors return their status (and their body, bounded alike). At most limit + 1 bytes of the
    body are read, all within timeout: a longer body is cut there (the caller sees it is too
    long), and one that trickles in slower raises SlowAnswer."""
    headers = {"Accept": "application/json"}
    if params["api_key"]:
        headers["Authorization"] = "Bearer " + params["api_key"]
    if data is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(data)
    try:
        response = open_url(params["base"] + path, method="POST" if data is not None else "GET", data=data,
                            headers=headers, timeout=timeout, use_proxy=False, follow_redirects="none",
                            validate_certs=params["validate_certs"], ca_path=params["ca_path"] or None)
        return response.getcode(), read_body(response, limit, timeout)
    except HTTPError as exc:
        return exc.code, read_body(exc, limit, timeout) if hasattr(exc, "read") else b""


def read_body(response, limit, timeout):
    deadline, chunks, size = time.monotonic() + timeout, [], 0
    while size <= limit:
        if time.monotonic() > deadline:
            raise SlowAnswer("the answer did not end within %g s" % timeout)
        # read1: one read of the socket at most, so that the deadline is looked at between them.
        chunk = response.read1(min(65536, limit + 1 - size)) if hasattr(response, "read1") else \
            response.read(min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def seen_error(exc, timeout):
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "no connection within %s s" % timeout
    return str(reason) or type(reason).__name__


def health_timeout(params):
    return params["health_timeout"] or ENGINES[params["engine"]]["health_timeout_s"]


def probe(params, timeout):
    """(verdict, what was seen): healthy (every health endpoint answered 200), slow (one
    accepted the connection but gave no answer within timeout) or unhealthy."""
    for path in ENGINES[params["engine"]]["health_paths"]:
        try:
            status, body = request(params, path, timeout, HEALTH_MAX_BYTES)
        except URLError as exc:  # urllib wraps what happens before the request is sent: no connection
            return "unhealthy", seen_error(exc, timeout)
        except (socket.timeout, TimeoutError):  # raised bare while waiting for the answer
            return "slow", "%s accepted the connection but gave no answer within %s s" % (path, timeout)
        except SlowAnswer:  # its body trickles: as busy as no answer at all, and no proof of a hang
            return "slow", "%s began its answer but did not end it within %g s" % (path, timeout)
        except (OSError, HTTPException) as exc:
            return "unhealthy", seen_error(exc, timeout)
        if status != 200:
            return "unhealthy", "%s HTTP %d" % (path, status)
        if len(body) > HEALTH_MAX_BYTES:
            return "unhealthy", "%s answered more than %d KiB, more than a health answer" % (
                path, HEALTH_MAX_BYTES // 1024)
    return "healthy", "HTTP 200"


def left_running(params, verdict):
    """Whether the gate ends at once with this verdict (LEFT_RUNNING), for a unit's server this run
    did not start: no restart is coming to change a busy or an unattributable server, and waiting
    for the deadline (an hour) would only report it failed."""
    return verdict in LEFT_RUNNING and bool(params["unit"]) and not params["started"]


def wait_healthy(module, params, baseline, mask):
    """Poll until healthy or the call's wait runs out; raise GateError when the unit dies.

    The health probe comes first and its answer is timed before the unit is read, and polls
    keep a fixed cadence (the time a poll takes is not added to the interval): readiness is
    seen within one poll interval, and within ACCEPT_STEP of the port's opening for a server
    that refused connections until then (until_accepting)."""
    started = time.monotonic()
    deadline = started + max(0.0, params["wait"])
    polls = 0
    state = {}
    while True:
        verdict, seen = probe(params, health_timeout(params))
        healthy = verdict == "healthy"
        seen_at = time.monotonic()
        polls += 1
        if params["unit"]:
            state = unit_state(module, params["unit"])
            if not baseline:
                baseline = {"invocation_id": state["InvocationID"], "n_restarts": int(state["NRestarts"] or 0)}
            died = death(state, baseline)
            if died:
                found = journal(module, params, baseline.get("invocation_id", ""), mask)
                raise GateError("unit %s %s while waiting for the server; %s"
                                % (params["unit"], died, journal_text(found, "its last journal lines")),
                                unit=state, baseline=baseline, polls=polls, **found)
            if healthy:  # the answer counts only if it comes from the unit
                foreign, holder, unproven = port_problem(params["port"], params["unit"], state["ControlGroup"],
                                                         listeners(params["port"]))
                if unproven and left_running(params, "unproven"):
                    return "unproven", "%s, but %s" % (seen, foreign), state, baseline, polls, seen_at
                if foreign:
                    raise GateError(foreign, port_holder=holder, unit=state, baseline=baseline, polls=polls)
            elif seen != "connection refused":
                # Something listens but does not answer 200: still loading if it is the unit's, but a
                # proven foreign program (garbage, 404, a hang) is named now, not after the deadline.
                foreign, holder, unproven = port_problem(params["port"], params["unit"], state["ControlGroup"],
                                                         listeners(params["port"]))
                if holder:
                    raise GateError(foreign, port_holder=holder, unit=state, baseline=baseline, polls=polls)
                if verdict == "slow" and unproven and left_running(params, "unproven"):
                    return "unproven", "%s, but %s" % (seen, foreign), state, baseline, polls, seen_at
        if healthy or seen_at >= deadline or left_running(params, verdict):
            return verdict, seen, state, baseline, polls, seen_at
        next_poll = min(started + polls * params["poll_interval"], deadline)
        if seen == "connection refused":
            until_accepting(params, next_poll)
        else:
            time.sleep(max(0.0, next_poll - time.monotonic()))


def until_accepting(params, until):
    """Sleep until `until` (monotonic), or less: until the server's port no longer refuses a bare TCP
    connection. A server starting after a reset listens within a second of its start, when its
    model is small, and the gate polls it then, not up to a poll interval later. A refused
    connection costs the server nothing; the one accepted is closed before any request (no request
    the server logs or answers). Anything but a refusal ends the wait: the poll judges it."""
    host = urlsplit(params["base"]).hostname
    try:
        addresses = socket.getaddrinfo(host, params["port"], type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # a name that does not resolve now: the poll says so
        addresses = []
    while addresses:
        left = until - time.monotonic()
        if left <= 0:
            return
        for family, kind, proto, _name, address in addresses:
            try:
                with socket.socket(family, kind, proto) as attempt:
                    attempt.settimeout(min(ACCEPT_STEP, left))
                    if attempt.connect_ex(address) != errno.ECONNREFUSED:
                        return
            except OSError:  # no socket to be had (out of descriptors): the poll's own try says what
                return
        time.sleep(max(0.0, min(ACCEPT_STEP, until - time.monotonic())))
    time.sleep(max(0.0, until - time.monotonic()))


def left_running_reason(params, verdict, seen):
    """The sentence of a server left running that the gate reports at once (LEFT_RUNNING)."""
    if verdict == "slow":
        return ("%s: this run did not start unit %s, which still runs and accepts connections, and left it running; "
                "raise inference_service_health_timeout if the server is only busy, or restart it (fleet_force_reset"
                "=true) if it hangs" % (seen, params["unit"]))
    return "%s; this run did not start unit %s and left it running" % (seen, params["unit"])


def main_pid_alive(state):
    """The unit's main pid, when systemd names one (not 0) and that process lives; else None."""
    pid = int(state.get("MainPID") or 0) if (state.get("MainPID") or "0").isdigit() else 0
    return pid if pid > 0 and _procs.alive(pid, unreadable=True) else None


def loading(params, state, now):
    """(seconds since the unit's current invocation started, its main pid) when it may be loading
    the model: its main process lives (MainPID not 0, alive), it is active or activating but not
    waiting to restart (auto-restart), and it started less than `timeout` (the gate's own start
    deadline, inference_service_ready_timeout) ago; else None. Neither engine listens before its
    model is loaded, so such a unit refuses connections for minutes: that is no crash."""
    if not params["unit"] or state.get("ActiveState") not in ("active", "activating") \
            or state.get("SubState") == "auto-restart":
        return None
    pid = main_pid_alive(state)
    started = invocation_start(state)
    if pid is None or started <= 0:
        return None
    age = now - started
    return (age, pid) if 0 <= age < params["timeout"] else None


def ready_once(module, params, state):
    """The engine's ready line (ENGINES' ready_log) when the unit's current invocation logged it,
    else "": a server that was ready once and refuses now has lost its API (its listener died),
    however recently it started. journald finds the line (--grep, the whole invocation, however
    long it served); a journalctl without PCRE2 finds none, and the rule falls back to the start
    time alone. Only a fixed text is looked for in the engine's lines; none of them is returned."""
    marker = ENGINES[params["engine"]]["ready_log"]
    invocation = state.get("InvocationID") or ""
    if not INVOCATION_ID.match(invocation):
        return ""
    rc, out, dummy = module.run_command(["journalctl", "--no-pager", "--output", "cat", "--lines", "1",
                                         "--grep", re.escape(marker), "_SYSTEMD_INVOCATION_ID=" + invocation])
    return marker if rc == 0 and any(marker in line for line in out.splitlines()) else ""


def loading_seen(params, age, pid, seen):
    """last_seen of a loading server: how long ago its invocation started, first (the report's note
    reads "server loading (started N s ago, ...)")."""
    return ("started %d s ago, main pid %d alive, %s: the model is loading (the unit started within "
            "inference_service_ready_timeout, %d s)" % (age, pid, seen, params["timeout"]))


def activity(params, timeout):
    """What /metrics says the engine is doing for the served name: {"tokens": generated tokens,
    "finished": finished requests (counters, None when not exposed), "running", "waiting",
    "throughput" (gauges, None when not exposed)}, or (None, why not) when it exposes none of the
    counters nor the throughput (ENGINES' `activity` names). Values that are not finite numbers of
    0 or more count as not exposed: the engine's answer is untrusted."""
    samples, note = read_metrics(params, timeout)
    if samples is None:
        return None, note
    names = ENGINES[params["engine"]]["activity"]
    values, dummy = served_values(samples, ENGINES[params["engine"]]["metrics"]["model_label"], params["served_name"])
    found = {}
    for key in ACTIVITY_KEYS:
        name = names[key]
        value = (counter(values, name) if key in ("tokens", "finished") else
                 sum(values[name]) if name and values.get(name) else None) if name else None
        found[key] = value if value is not None and math.isfinite(value) and value >= 0 else None
    if found["tokens"] is None and found["finished"] is None and found["throughput"] is None:
        return None, "/metrics has none of %s for %s=%r" % (
            ", ".join(names[key] for key in ("tokens", "finished", "throughput") if names[key]),
            ENGINES[params["engine"]]["metrics"]["model_label"], params["served_name"])
    return found, None


def advanced(before, after):
    """Whether the engine generated between two reads of activity: a token or a finished request
    more (counters), or, with no counter on both, a throughput above 0 on the second read."""
    for key in ("tokens", "finished"):
        if before[key] is not None and after[key] is not None:
            if after[key] > before[key]:
                return True
    if any(before[key] is not None and after[key] is not None for key in ("tokens", "finished")):
        return False
    return bool(after["throughput"])


def generates(params, mask):
    """Probe mode, once /health answered 200: does the engine generate? (verdict, what was seen,
    what to return under `generation`). /metrics, one real 1-token completion within hung_after,
    /metrics again: answered is healthy; no answer and tokens (or finished requests) advanced is
    busy; no answer and nothing advanced is hung (a hung engine core keeps /health at 200). A server
    without the metrics is judged by the deadline alone. At most 2 x the metrics' timeout (the lesser
    of hung_after and the health timeout) + hung_after."""
    wait = params["hung_after"]
    metrics_timeout = min(wait, health_timeout(params))
    before, note = activity(params, metrics_timeout)
    started = time.monotonic()
    answered, failure = None, None
    try:
        status, dummy = request(params, "/v1/completions", wait, ANSWER_MAX_BYTES, data={
            "model": params["served_name"], "prompt": params["prompt"], "max_tokens": 1, "temperature": 0})
        answered = status
    except (socket.timeout, TimeoutError, SlowAnswer):
        failure = "no answer in %g s" % wait
    except (URLError, OSError, HTTPException) as exc:  # refused, reset, closed: no answer either
        failure = "no answer (%s)" % seen_error(exc, wait)
    took = round((time.monotonic() - started) * 1000, 1)
    generation = {"completion_ms": took, "answered": answered is not None, "hung_after": wait}
    if answered is not None:
        # Any HTTP answer is the server's: a 200 proves generation; an error status (a key or a name the
        # server refuses) proves the server answers, which is what the look asks.
        seen = "HTTP 200; a 1-token completion answered%s in %d ms" % (
            "" if answered == 200 else " HTTP %d" % answered, took)
        return "healthy", seen, generation
    after, after_note = activity(params, metrics_timeout) if before is not None else (None, None)
    if before is None or after is None:
        generation["metrics"] = mask(note or after_note)
        return "hung", ("hung: /health answered 200 but a 1-token completion got %s; the server exposes no generation "
                        "metrics (%s), so the completion's deadline alone decided" % (failure, note or after_note)), generation
    generation.update(metrics="read", before=before, after=after)
    if advanced(before, after):
        return "busy", ("busy: /health answered 200 and a 1-token completion got %s, but the engine generated meanwhile "
                        "(%s)" % (failure, progress_words(before, after))), generation
    return "hung", ("hung: /health answered 200 but a 1-token completion got %s and no token was generated (%s)"
                    % (failure, progress_words(before, after))), generation


def progress_words(before, after):
    """The activity between two reads, in words: the counters' increase, the gauges' last values."""
    words = []
    for key, what in (("tokens", "tokens generated"), ("finished", "requests finished")):
        if before[key] is not None and after[key] is not None:
            words.append("%d %s" % (after[key] - before[key], what))
    for key, what in (("running", "running"), ("waiting", "waiting"), ("throughput", "tokens/s")):
        if after[key] is not None:
            words.append("%g %s" % (after[key], what))
    return ", ".join(words)


def look(module, params, mask=None):
    """Probe mode: is the unit running and does the server answer? A second look, after
    poll_interval, before any verdict but healthy: slow means slow on both looks. A unit whose
    current invocation started within `timeout` and whose main process lives, refusing
    connections on both looks, is loading (LOADING_REFUSALS), not unhealthy."""
    result = {"changed": False, "polls": 0}
    if params["unit"]:
        state = unit_state(module, params["unit"])
        result["unit"] = state
        if state["ActiveState"] != "active" and loading(params, state, time.monotonic()) is None:
            died = death(state, {}) or "is %s (%s)" % (state["ActiveState"], state["SubState"])
            return dict(result, state="unhealthy", healthy=False, verdict="unhealthy", needs_reset=True,
                        last_seen="unit %s %s" % (params["unit"], died))
    looks = []
    while len(looks) < 2 and (not looks or looks[-1][0] != "healthy"):
        if looks:
            time.sleep(params["poll_interval"])
        looks.append(probe(params, health_timeout(params)))
        seen_at = time.monotonic()
    verdict, seen = looks[-1]
    if verdict == "slow" and looks[0][0] != "slow":
        verdict = "unhealthy"  # it refused or failed a moment ago: not a server that is merely busy
    if params["unit"] and all(one == ("unhealthy", "connection refused") for one in looks):
        # Read again: the unit may have died between the first read and the refusals.
        state = unit_state(module, params["unit"])
        result["unit"] = state
        since = loading(params, state, time.monotonic())
        was_ready = ready_once(module, params, state) if since is not None else ""
        if was_ready:
            seen = "%s, though this invocation logged %r: its API died after it was ready" % (seen, was_ready)
        elif since is not None:
            return dict(result, polls=len(looks), state="unhealthy", healthy=False, verdict="loading",
                        needs_reset=False, last_seen=loading_seen(params, since[0], since[1], seen),
                        loading_s=round(since[0], 1))
    if verdict != "unhealthy" and params["unit"]:  # something answers: is it the unit?
        foreign, holder, unproven = port_problem(params["port"], params["unit"], result["unit"]["ControlGroup"],
                                                 listeners(params["port"]))
        if foreign:
            # An answer that may be the unit's (its holder cannot be read) is no reason to stop the unit.
            verdict, seen = ("unproven", "%s, but %s" % (seen, foreign)) if unproven else ("unhealthy", foreign)
            if holder:
                result["port_holder"] = holder
    if verdict == "healthy":
        # /health at 200 is the API server's word; the engine behind it may have stopped (issue 37).
        verdict, seen, result["generation"] = generates(params, mask or (lambda text: text))
    healthy = verdict in ("healthy", "busy")
    if healthy:
        result["healthy_monotonic"] = round(seen_at, 3)
    return dict(result, polls=len(looks), state="ready" if healthy else "unhealthy", healthy=healthy,
                verdict=verdict, last_seen=seen, needs_reset=verdict in NEEDS_RESET)


def excerpt(body, mask, limit=300):
    """The start of an answer's body, to quote in a message; masked before it is cut, so that
    no piece of a secret is left at the cut."""
    return mask(body.decode("utf-8", "replace"))[:limit]


def model_ids(document):
    """The ids of an OpenAI model list ({"data": [{"id": ...}, ...]}), or None when it is not one."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list) or not all(isinstance(entry, dict) and isinstance(entry.get("id"), str)
                                             for entry in data):
        return None
    return [entry["id"] for entry in data]


def completion_text(document):
    """The first choice's text of an OpenAI completion, or None when the answer has none."""
    choices = document.get("choices") if isinstance(document, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    text = choices[0].get("text")
    return text if isinstance(text, str) else None


def answer(params, asked, path, data=None):
    """(status, body) of one smoke request (asked: its method and path, as a sentence names it),
    its body at most ANSWER_MAX_BYTES, all within request_timeout; GateError when a 200's is longer
    (an error's is only quoted, cut: its first bytes are enough)."""
    status, body = request(params, path, params["request_timeout"], ANSWER_MAX_BYTES, data=data)
    if status == 200 and len(body) > ANSWER_MAX_BYTES:
        raise GateError("%s answered more than %d MiB, more than an engine's answer"
                        % (asked, ANSWER_MAX_BYTES // (1024 * 1024)))
    return status, body


def listed(models, mask):
    """The models a failure quotes: the first SHOWN_MODELS, each masked and cut, and how many more."""
    shown = [cut(mask(model), SHOWN_MODEL_CHARS) for model in models[:SHOWN_MODELS]]
    return "%r%s" % (shown, " and %d more" % (len(models) - SHOWN_MODELS) if len(models) > SHOWN_MODELS else "")


def smoke(params, mask):
    """/v1/models lists the served name; real completions return text."""
    timeout = params["request_timeout"]
    asked = "GET /v1/models"
    try:
        status, body = answer(params, asked, "/v1/models")
        if status != 200:
            raise GateError("GET /v1/models answered HTTP %d: %s" % (status, excerpt(body, mask)))
        models = model_ids(json.loads(body))
        if models is None:
            raise GateError("GET /v1/models answered JSON that is not a list of models: %s" % excerpt(body, mask))
        if params["served_name"] not in models:
            raise GateError("GET /v1/models does not list %r (it lists %s)" % (params["served_name"], listed(models, mask)),
                            models=models)
        times, texts = [], []
        asked = "POST /v1/completions"
        for dummy in range(params["completions"]):
            started = time.monotonic()
            status, body = answer(params, asked, "/v1/completions", data={
                "model": params["served_name"], "prompt": params["prompt"], "max_tokens": params["max_tokens"],
                "temperature": 0})
            times.append(round((time.monotonic() - started) * 1000, 1))
            if status != 200:
                raise GateError("POST /v1/completions answered HTTP %d: %s" % (status, excerpt(body, mask)), models=models)
            text = completion_text(json.loads(body))
            if text is None:
                raise GateError("POST /v1/completions answered JSON without a text choice: %s" % excerpt(body, mask),
                                models=models)
            if not text.strip():
                raise GateError("POST /v1/completions returned no text: %s" % excerpt(body, mask), models=models)
            texts.append(text)
    except SlowAnswer as exc:
        raise GateError("%s: %s" % (asked, exc))
    except (URLError, OSError, HTTPException) as exc:
        raise GateError("the server stopped answering during the smoke test: %s" % seen_error(exc, timeout))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested deeper than the parser goes
        raise GateError("the server answered something that is not the OpenAI JSON: %s" % str(exc)[:300])
    return {"models": models, "first_completion_ms": times[0] if times else None, "completions_ms": times,
            "completion": mask(texts[0])[:200] if texts else ""}


def served_values(samples, label, served_name):
    """({metric name: [value, ...]} over the samples whose `label` is the served name, the names
    of every sample): the served name is compared with the label's value, as data."""
    values = {}
    for sample in samples:
        if sample.labels.get(label) == served_name:
            values.setdefault(sample.name, []).append(sample.value)
    return values, {sample.name for sample in samples}


def counter(values, name):
    """A counter summed over its label sets (engines, data-parallel ranks); exposed with _total."""
    found = values.get(name + "_total", values.get(name))
    return sum(found) if found else None


def other_models_note(seen, bases, shown, label, served_name):
    """The note for metrics that /metrics has for other model names only; None when it has none
    of them at all."""
    if any(base in seen or base + "_total" in seen for base in bases):
        return "/metrics has %s, but none with %s=%r, the served name" % (shown, label, served_name)
    return None


def impossible_counts(counts, names):
    """Why the spec decode counters (vLLM's) cannot be true, or None: each must be a finite count
    of at least 0, no more tokens accepted than drafted, and each draft at least one token."""
    for key, value in counts.items():
        if value is not None and not math.isfinite(value):
            return "/metrics reports %s as %s, not a finite number" % (names[key], value)
        if value is not None and value < 0:
            return "/metrics reports a negative %s (%s)" % (names[key], value)
    if counts["accepted_tokens"] > counts["draft_tokens"]:
        return "/metrics reports more accepted than drafted tokens (%s accepted of %s), which cannot be" % (
            counts["accepted_tokens"], counts["draft_tokens"])
    if counts["drafts"] is not None and counts["drafts"] > counts["draft_tokens"]:
        return "/metrics reports fewer drafted tokens than drafts (%s tokens in %s drafts), which cannot be" % (
            counts["draft_tokens"], counts["drafts"])
    return None


def impossible_gauges(rates, lengths, names):
    """Why the acceptance gauges (SGLang's) cannot be true, or None: a rate is from 0 to 1, a mean
    acceptance length (with the bonus token) at least 1."""
    for rate in rates:
        if not (math.isfinite(rate) and 0 <= rate <= 1):
            return "/metrics reports %s %s, not a rate from 0 to 1" % (names["rate"], rate)
    for length in lengths:
        if not (math.isfinite(length) and length >= 1):
            return "/metrics reports %s %s, not a length of 1 or more" % (names["length"], length)
    return None


def from_counters(values, names, stats_off_flag, elsewhere=None):
    """Acceptance from counters since the start (drafts, drafted and accepted tokens), as vLLM exposes
    it: (what to return, acceptance rate, mean acceptance length); unavailable: available false, with a note
    (`elsewhere` when the counters are there for another model name)."""
    counts = {key: counter(values, names[key]) for key in COUNTERS}
    if counts["draft_tokens"] is None or counts["accepted_tokens"] is None:
        return {"available": False, "note": elsewhere or "/metrics has no %s counters%s" % (
            names["shown"], " (is --%s set?)" % (stats_off_flag.replace("_", "-")) if stats_off_flag else "")}, None, None
    impossible = impossible_counts(counts, names)
    if impossible:
        return {"available": False, "note": impossible}, None, None
    rate = counts["accepted_tokens"] / counts["draft_tokens"] if counts["draft_tokens"] else None
    length = 1 + counts["accepted_tokens"] / counts["drafts"] if counts["drafts"] else None
    return dict({key: int(value or 0) for key, value in counts.items()}, source="%s counters" % names["shown"]), rate, length


def from_gauges(values, names, elsewhere=None):
    """Acceptance from the last logged window's gauges (rate, mean length), as SGLang exposes it:
    (what to return, acceptance rate, mean acceptance length); unavailable: available false, with a note
    (`elsewhere` when the gauges are there for another model name)."""
    if names["rate"] not in values:
        return {"available": False, "note": elsewhere or "/metrics has no %s" % names["rate"]}, None, None
    rates = values[names["rate"]]
    lengths = values.get(names["length"], [])
    if any(length == 0 for length in lengths):
        # SGLang sets both gauges once every --decode-log-interval decode steps, from that window
        # alone; until the first window their value is 0. A logged window's length counts the
        # bonus token of every step, so it is at least 1: a 0 is a window not logged yet.
        return {"available": False, "note": SGLANG_WINDOW_NOTE}, None, None
    impossible = impossible_gauges(rates, lengths, names)
    if impossible:
        return {"available": False, "note": impossible}, None, None
    return ({"source": "%s and %s gauges" % (names["rate"], names["length"])},
            sum(rates) / len(rates), sum(lengths) / len(lengths) if lengths else None)


def read_metrics(params, timeout):
    """(the samples of /metrics, None), or (None, why not): the engine's answer, read to
    METRICS_MAX_BYTES within timeout and parsed strictly."""
    try:
        status, body = request(params, "/metrics", timeout, METRICS_MAX_BYTES)
    except (URLError, OSError, HTTPException) as exc:
        return None, "/metrics: %s" % seen_error(exc, timeout)
    if status != 200:
        return None, "/metrics answered HTTP %d" % status
    if len(body) > METRICS_MAX_BYTES:
        return None, "/metrics answered more than %d MiB, more than an engine's metrics" % (METRICS_MAX_BYTES // (1024 * 1024))
    try:
        samples, dummy = parse_exposition(body, METRICS_MAX_SAMPLES)
    except ExpositionError as exc:
        return None, "/metrics is not the Prometheus text format (%s)" % exc
    return samples, None


def speculation(params):
    """The acceptance read back from /metrics; unknown (available false, with a note) rather
    than a figure the metrics cannot support."""
    samples, note = read_metrics(params, params["request_timeout"])
    if samples is None:
        return {"available": False, "note": note}
    engine = ENGINES[params["engine"]]
    names = engine["metrics"]
    values, seen = served_values(samples, names["model_label"], params["served_name"])
    if names["kind"] == "counters":
        elsewhere = other_models_note(seen, (names["draft_tokens"], names["accepted_tokens"]),
                                      "%s counters" % names["shown"], names["model_label"], params["served_name"])
        result, rate, length = from_counters(values, names, engine["stats_off_flag"], elsewhere)
    else:
        elsewhere = other_models_note(seen, (names["rate"],), names["rate"], names["model_label"], params["served_name"])
        result, rate, length = from_gauges(values, names, elsewhere)
    if result.get("available") is False:
        return result
    result.update(available=True, acceptance_rate=None if rate is None else round(rate, 4),
                  mean_acceptance_length=None if length is None else round(length, 3))
    if rate is None:
        result["note"] = "nothing was drafted yet"
    return result


def answering_since(params, state, ready_at):
    """(since when the unit's invocation is known to answer, what that moment is): the gate's first
    answer, or an earlier look's (healthy_seen) at the invocation the unit still runs - the assessment's
    at a server this run left running, another gate's watch (watch) at one it started. A restart makes
    a new InvocationID, so a match means no restart in between; a moment before the invocation started
    (a look that raced a restart) or after the gate's own answer (a clock from another boot, a made-up
    value) is not used."""
    seen = params["healthy_seen"]
    if (params["unit"] and seen and seen["invocation_id"] == state.get("InvocationID")
            and invocation_start(state) <= seen["monotonic"] <= ready_at):
        return seen["monotonic"], "earlier look"
    return ready_at, "first answer"


def answering(module, server, timeout):
    """(healthy_seen's record, what was seen): the record of one poll of a watched server whose health
    endpoints answer 200 from its active unit's processes, else {} - the gate's own test of a first
    answer (wait_healthy), without the smoke test its own gate makes."""
    verdict, seen = probe(server, timeout)
    seen_at = time.monotonic()
    if verdict != "healthy":
        return {}, seen
    try:
        state = unit_state(module, server["unit"])
    except GateError as exc:
        return {}, "%s, but %s" % (seen, exc)
    if state["ActiveState"] != "active" or not INVOCATION_ID.match(state["InvocationID"]):
        return {}, "%s, but unit %s is %s (%s)" % (seen, server["unit"], state["ActiveState"], state["SubState"])
    foreign, dummy_holder, dummy_unproven = port_problem(server["port"], server["unit"], state["ControlGroup"],
                                                         listeners(server["port"]))
    if foreign:
        return {}, "%s, but %s" % (seen, foreign)
    return {"invocation_id": state["InvocationID"], "monotonic": round(seen_at, 3)}, seen


def watch(module, servers, until, interval):
    """RV(servers) of the gate: each server polled (answering) every interval until it answered from
    its unit or `until` (the gated server's window's end) came; a poll's requests cut at `until`."""
    answers = [{"unit": server["unit"], "healthy_seen": {}, "last_seen": "not looked at"} for server in servers]
    while True:
        round_start = time.monotonic()
        for server, answer in zip(servers, answers):
            left = until - time.monotonic()
            if not answer["healthy_seen"] and left > 0:
                answer["healthy_seen"], answer["last_seen"] = answering(module, server, min(health_timeout(server), left))
        if all(answer["healthy_seen"] for answer in answers) or time.monotonic() >= until:
            return answers
        time.sleep(max(0.0, min(round_start + interval, until) - time.monotonic()))


def stay(module, params, baseline, since, result, mask, servers=()):
    """The unit must still run the invocation that answered, stable_s after it first did: an
    engine that crashes under its first requests is not ready. The servers to watch are watched
    meanwhile (watch), in a time the gate would sleep."""
    until = since + params["stable_s"]
    if servers:
        result["servers"] = watch(module, servers, until, params["poll_interval"])
    time.sleep(max(0.0, until - time.monotonic()))
    state = unit_state(module, params["unit"])
    result["unit"] = state
    why = unstable(state, baseline)
    if not why:
        # Alive to systemd is not answering: a hung engine (stopped, deadlocked) stays "active".
        verdict, seen = probe(params, health_timeout(params))
        if verdict != "healthy":
            why = "stopped answering after it first did (%s)" % seen
    if why:
        found = journal(module, params, baseline.get("invocation_id", ""), mask)
        raise GateError("unit %s %s after the server answered; %s"
                        % (params["unit"], why, journal_text(found, "the journal lines of the invocation that answered")),
                        **found)


def unit_after_failure(module, params, result, mask):
    """What the unit did, for a failure that is not about the unit (a completion that got no
    answer): its state, into the message, and the gated invocation's journal, into result."""
    baseline = result.get("baseline") or params["baseline"] or {}
    found = journal(module, params, baseline.get("invocation_id", ""), mask)
    result.update(found)
    said = ""
    try:
        state = unit_state(module, params["unit"])
        result["unit"] = state
        why = unstable(state, baseline)
        if why:
            said = "; unit %s %s" % (params["unit"], why)
    except GateError:
        pass  # systemd does not answer: the failure already says what the server did
    return said + ("; " + journal_text(found, "the journal lines of the gated invocation")
                   if found["journal"] or found["journal_errors"] else "")


def healthy_seen_problems(seen):
    """Why healthy_seen is not an earlier look's record ({} or invocation_id and monotonic), as a list."""
    if not seen:
        return []
    invocation, moment = seen.get("invocation_id"), seen.get("monotonic")
    invocation_ok = isinstance(invocation, str) and INVOCATION_ID.fullmatch(invocation)
    moment_ok = isinstance(moment, (int, float)) and not isinstance(moment, bool) and math.isfinite(moment) and moment >= 0
    if set(seen) != {"invocation_id", "monotonic"} or not invocation_ok or not moment_ok:
        return ["healthy_seen must be empty or an earlier look's record: invocation_id (32 hexadecimal digits) and "
                "monotonic (a finite number of seconds, 0 or more), got %r" % (seen,)]
    return []


def xid_look(args):
    """nvml_verify's answer to args, from a child of this process: the look's second half in its
    host contact (issue 42). Imported here, not above: the gate and the probe without it do not
    load the NVML code."""
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.cleanslate.gpu.plugins.module_utils import _nvml_verify_module
    return run_module_main(_nvml_verify_module.main, "cleanslate.gpu.nvml_verify", args, internal_settings(_load_params()))


def input_problems(params):
    """One sentence per number outside its range: a role setting's from the table of settings, this
    module's own from OWN_RANGES."""
    ranges = dict(_settings.option_ranges(_settings.GATE, _settings.PROBE), **OWN_RANGES)
    problems = [sentence for sentence in (rule.sentence(name, params[name]) for name, rule in ranges.items()) if sentence]
    if params["xid"] is not None and params["mode"] != "probe":
        problems.append("xid is a second look of mode=probe; the gate (mode=gate) reads no Xid records")
    if params[_settings.SETTINGS_OPTION]:
        problems.append("%s is spread into options by the action plugin cleanslate.gpu.inference_ready; give its "
                        "options themselves" % _settings.SETTINGS_OPTION)
    return problems


def option_problems(params):
    """input_problems, and the url, the key and healthy_seen checked; params gains the url's base and port."""
    problems = input_problems(params)
    try:
        params["base"], params["port"] = parse_url(params["url"])
    except ValueError as exc:
        problems.append(str(exc))
    if not params["api_key"].isascii():
        # http.client encodes headers as Latin-1 and raised mid-probe, naming the character and its
        # place; no client could send such a key anyway.
        problems.append("api_key holds a character outside ASCII, which no HTTP Authorization header can carry")
    problems.extend(healthy_seen_problems(params["healthy_seen"]))
    return problems


def look_answer(module, params, mask):
    """look() of one server of `servers`, its failure its own answer: the others are still looked at,
    and each is judged by its own look, as its own task would judge it."""
    try:
        return look(module, params, mask)
    except GateError as exc:
        return dict(exc.result, failed=True, msg=str(exc))


def server_params(index, given):
    """(the options of servers[index] (a mapping: AnsibleModule refused any other), checked as the
    task's own are, or None; its problems, each naming it)."""
    name = "servers[%d]" % index
    own = sorted(set(given) & {"mode", "servers", "xid"})
    unknown = sorted(set(given) - set(ARGUMENT_SPEC))
    problems = (["%s: %s %s the task's alone, not a server's" % (name, ", ".join(own), "is" if len(own) == 1 else "are")]
                if own else []) + (["%s: no such option: %s" % (name, ", ".join(unknown))] if unknown else [])
    if problems:
        return None, problems
    validated = ArgumentSpecValidator(SERVER_SPEC).validate(given)
    if validated.error_messages:
        return None, ["%s: %s" % (name, message) for message in validated.error_messages]
    params = dict(validated.validated_parameters, mode="probe", servers=[], xid=None)
    if params["unit"]:
        name = "%s (%s)" % (name, params["unit"])
    return params, ["%s: %s" % (name, problem) for problem in option_problems(params)]


def server_secrets(servers):
    """The secrets `servers` give (each server's api_key and secrets; the action plugin spread their
    settings), whatever their form: none of them is an option of this module's spec, whose no_log
    hides them."""
    found = set()
    for server in servers if isinstance(servers, list) else []:
        if isinstance(server, dict):
            values = server.get("secrets") if isinstance(server.get("secrets"), list) else [server.get("secrets")]
            found.update(str(value) for value in values + [server.get("api_key")] if value not in (None, ""))
    return found


class ReadyModule(AnsibleModule):
    """The secrets of `servers` hidden as the task's own api_key and secrets are: in the line of its
    invocation this module writes to the host's journal, and in everything it returns."""

    def _log_invocation(self):
        self.no_log_values.update(server_secrets(self.params.get("servers")))
        super()._log_invocation()


def main():
    module = ReadyModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    problems = option_problems(params)
    servers = []
    if params["servers"] and params["mode"] == "gate" and not params["unit"]:
        # What the watch records is an invocation's: without its own unit the gate holds no window to watch in.
        problems.append("servers are watched by the gate (mode=gate) while it holds its unit's stability window: "
                        "give unit, or look at them with mode=probe")
    elif params["servers"]:
        for index, given in enumerate(params["servers"]):
            server, server_problems = server_params(index, given)
            servers.append(server)
            problems.extend(server_problems)
            if params["mode"] == "gate" and server is not None and not server["unit"]:
                problems.append("servers[%d]: the gate watches a server's unit, whose invocation its record names: "
                                "give unit" % index)
    # Every server's secrets hidden in every answer: one server's error may quote another's URL or key.
    mask = Masker(list(params["secrets"]) + [params["api_key"]] + sorted(server_secrets(params["servers"])))
    if problems:
        module.fail_json(msg=mask("; ".join(problem.rstrip(".") for problem in problems)))
    result = {"changed": False}
    try:
        if params["mode"] == "probe":
            if params["xid"] is not None:
                # Before the first: a look that fails (systemd does not answer) still returns it.
                result["xid_look"] = xid_look(params["xid"])
            if servers:
                result["servers"] = [look_answer(module, server, mask) for server in servers]
            module.exit_json(**mask(dict(result, **look(module, params, mask))))
        verdict, seen, state, baseline, polls, ready_at = wait_healthy(module, params, dict(params["baseline"]), mask)
        healthy = verdict == "healthy"
        result.update(healthy=healthy, verdict=verdict, last_seen=seen, polls=polls)
        if params["unit"]:
            result.update(unit=state, baseline=baseline)
        if left_running(params, verdict):
            result.update(state=verdict, reason=left_running_reason(params, verdict, seen))
            module.exit_json(**mask(result))
        if not healthy:
            result["state"] = "waiting"
            if params["with_journal"] and params["unit"]:
                result.update(journal(module, params, baseline.get("invocation_id", ""), mask))
            module.exit_json(**mask(result))
        result.update(state="ready", ready_monotonic=round(ready_at, 3))
        started = invocation_start(state) if state else 0
        if params["started"] and started > 0:
            result["ready_s"] = round(ready_at - started, 2)
        result.update(smoke(params, mask))
        if params["speculative"]:
            result["speculation"] = speculation(params)
        if params["unit"]:
            since, result["stable_since"] = answering_since(params, state, ready_at)
            stay(module, params, baseline, since, result, mask, servers)
    except GateError as exc:
        result.update(exc.result)
        msg = str(exc)
        if params["unit"] and "journal" not in result:
            msg += unit_after_failure(module, params, result, mask)
        module.fail_json(msg=mask(msg), **mask(result))
    module.exit_json(**mask(result))


if __name__ == "__main__":
    main()
