"""The stand-in's HTTP API: the endpoints the role's gate and its users call, with the engines'
status codes, auth rules and metric names (serving_facts.md; vLLM's SpecDecodingProm, SGLang's
metrics collector).

    GET  /health          vLLM: 200 once serving. SGLang: 503 while warming up or shutting down.
    GET  /ready           SGLang only: 200 when healthy.
    GET  /v1/models       the served name.
    POST /v1/completions  deterministic text; each decode step drafts k tokens and accepts a
                          fraction of them, which feeds the speculative metrics.
    GET  /metrics         vLLM: vllm:spec_decode_* counters (exposed with _total), the activity
                          (num_requests_running and _waiting, generation_tokens_total,
                          request_success_total). SGLang: only with --enable-metrics;
                          sglang:spec_accept_rate and spec_accept_length gauges, set as SGLang sets
                          them: once every --decode-log-interval decode steps (40), from that window
                          alone, and 0.0 until the first window is logged; the activity
                          (num_running_reqs, num_queue_reqs, gen_throughput, generation_tokens_total,
                          num_requests_total).
    GET  /version         vLLM.
    GET  /sim/state       the stand-in's own: the argv and settings it runs with (tests only).

With an API key, vLLM guards paths under /v1, /v2, /inference and /cohere; SGLang guards every
path except /health*, /ready* and /metrics*.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# SGLang's --decode-log-interval default (sglang/srt/arg_groups/fields/observability.py, 0.5.21 to 0.5.23).
SGLANG_DECODE_LOG_INTERVAL = 40
# The busy fault: how long a completion waits in the queue, and how fast the others generate meanwhile.
BUSY_QUEUE_S = 60
BUSY_TOKENS_PER_S = 50

WORDS = ("Paris. It is the capital and the largest city of France, on the Seine, known for its museums, "
         "its cafes and the tower that Gustave Eiffel built for the fair of 1889.").split()


class State:
    """What the handlers share: counters under a lock, the shutdown flag, in-flight requests."""

    def __init__(self, engine: str, served: str, model: str, api_key: str, spec_tokens: int, acceptance: float,
                 metrics: bool, warmup_s: float, info: dict, health_delay_s: float = 0.0,
                 decode_log_interval: int = SGLANG_DECODE_LOG_INTERVAL, fault: str = "", decode_s: float = 0.0):
        self.engine = engine
        self.served = served
        self.model = model
        self.api_key = api_key
        self.spec_tokens = spec_tokens
        self.acceptance = acceptance
        self.metrics = metrics
        self.info = info
        self.health_delay_s = health_delay_s
        self.decode_s = decode_s
        # hung_engine: completions never answer and nothing is generated, /health stays 200 (vLLM's
        # EngineCore stopped: its API server answers /health alone). busy: completions wait BUSY_QUEUE_S
        # in the queue while other requests generate BUSY_TOKENS_PER_S tokens (a saturated server).
        self.fault = fault
        self.lock = threading.Lock()
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "requests": 0, "generation_tokens": 0}
        self.waiting = 0
        self.owed = 0.0
        # SGLang's metrics reporter: a window of decode steps, logged to the gauges when full.
        self.decode_log_interval = decode_log_interval
        self.window = {"steps": 0, "accept_tokens": 0, "correct_drafts": 0}
        self.gauges = {"spec_accept_rate": 0.0, "spec_accept_length": 0.0}
        self.in_flight = 0
        self.shutting_down = False
        self.listening_at = time.monotonic()
        self.warm_at = self.listening_at + warmup_s

    def decode(self, tokens: int) -> None:
        """vLLM: one draft per generated token (a simplification). SGLang: a decode step yields the
        accepted drafts and the bonus token, as its reporter counts them. Each draft is k tokens,
        acceptance x k accepted, spread exactly over the steps so the read-back rate equals the
        configured one."""
        if not self.spec_tokens:
            return
        with self.lock:
            produced = 0
            while produced < tokens:
                self.counts["drafts"] += 1
                self.counts["draft_tokens"] += self.spec_tokens
                self.owed += self.acceptance * self.spec_tokens
                accepted = min(self.spec_tokens, int(self.owed))
                self.owed -= accepted
                self.counts["accepted_tokens"] += accepted
                if self.engine == "vllm":
                    produced += 1
                else:
                    produced += 1 + accepted
                    self._sglang_step(accepted)

    def _sglang_step(self, accepted: int) -> None:
        """SGLang's report_decode_stats: counts in a window, the gauges set only when the window of
        decode_log_interval steps is full, from that window alone, then the window restarts."""
        window = self.window
        window["steps"] += 1
        window["accept_tokens"] += 1 + accepted
        window["correct_drafts"] += accepted
        if window["steps"] % self.decode_log_interval:
            return
        self.gauges = {"spec_accept_rate": window["correct_drafts"] / (window["steps"] * self.spec_tokens),
                       "spec_accept_length": window["accept_tokens"] / window["steps"]}
        self.window = {"steps": 0, "accept_tokens": 0, "correct_drafts": 0}

    def generated(self) -> int:
        """Tokens generated since start: the completions', and under the busy fault the other
        requests' that keep the server saturated (a steady rate since it listens)."""
        busy = int(BUSY_TOKENS_PER_S * (time.monotonic() - self.listening_at)) if self.fault == "busy" else 0
        return self.counts["generation_tokens"] + busy

    def queued(self, seconds) -> bool:
        """A completion waits in the queue `seconds` (None: for ever), counted as waiting; False when
        the server shuts down meanwhile."""
        deadline = None if seconds is None else time.monotonic() + seconds
        with self.lock:
            self.waiting += 1
        try:
            while deadline is None or time.monotonic() < deadline:
                if self.shutting_down:
                    return False
                time.sleep(0.05)
            return True
        finally:
            with self.lock:
                self.waiting -= 1

    def healthy(self) -> bool:
        return not self.shutting_down and time.monotonic() >= self.warm_at


class Handler(BaseHTTPRequestHandler):
    server_version = "standin/1"
    protocol_version = "HTTP/1.1"
    state: State = None  # set on the subclass the server uses

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass  # the journal gets the engine's own lines, not an access log

    def _send(self, status: int, body=b"", content_type="application/json") -> None:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _guarded(self, path: str) -> bool:
        if self.state.engine == "vllm":
            return path.startswith(("/v1", "/v2", "/inference", "/cohere"))
        return not path.startswith(("/health", "/ready", "/metrics"))

    def _authorised(self, path: str) -> bool:
        if not self.state.api_key or not self._guarded(path):
            return True
        if self.headers.get("Authorization", "") == "Bearer " + self.state.api_key:
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):  # noqa: N802  # http.server's naming
        path = self.path.split("?", 1)[0]
        if not self._authorised(path):
            return
        state = self.state
        if path == "/health":
            time.sleep(state.health_delay_s)  # a slow server, not a dead one
            if state.engine == "vllm":
                self._send(200)
            else:
                self._send(200 if state.healthy() else 503)
        elif path == "/ready" and state.engine == "sglang":
            self._send(200 if state.healthy() else 503, {"status": "ok" if state.healthy() else "starting"})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": state.served, "object": "model", "created": 0,
                                                        "owned_by": state.engine, "root": state.model}]})
        elif path == "/metrics" and (state.engine == "vllm" or state.metrics):
            self._send(200, self._metrics(), "text/plain; version=0.0.4")
        elif path == "/version" and state.engine == "vllm":
            self._send(200, {"version": state.info.get("version")})
        elif path == "/sim/state":
            self._send(200, state.info)
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        if not self._authorised(path):
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "invalid JSON"}})
            return
        if path != "/v1/completions":
            self._send(404, {"detail": "Not Found"})
            return
        state = self.state
        if request.get("model") != state.served:
            self._send(404, {"error": {"message": "The model `%s` does not exist." % request.get("model"),
                                       "type": "NotFoundError", "code": 404}})
            return
        tokens = int(request.get("max_tokens") or 16)
        if state.fault in ("hung_engine", "busy") and not state.queued(None if state.fault == "hung_engine" else BUSY_QUEUE_S):
            self._send(503, {"error": {"message": "shutting down"}})
            return
        with state.lock:
            state.in_flight += 1
        try:
            # Generating takes time (STANDIN_DECODE_S a token): the request is in flight meanwhile.
            time.sleep(state.decode_s * tokens)
            state.decode(tokens)
            text = " " + " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
            with state.lock:
                state.counts["requests"] += 1
                state.counts["generation_tokens"] += tokens
            self._send(200, {"id": "cmpl-standin", "object": "text_completion", "model": state.served,
                             "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                             "usage": {"prompt_tokens": len(str(request.get("prompt", "")).split()),
                                       "completion_tokens": tokens}})
        finally:
            with state.lock:
                state.in_flight -= 1

    def _metrics(self) -> str:
        state = self.state
        with state.lock:
            counts = dict(state.counts)
            gauges = dict(state.gauges)
            waiting = state.waiting
        generated = state.generated()
        throughput = BUSY_TOKENS_PER_S if state.fault == "busy" else 0.0
        lines = []
        if state.engine == "vllm":
            labels = '{engine="0",model_name="%s"}' % label_value(state.served)
            lines += ["# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running%s %d" % (labels, state.in_flight),
                      "# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting%s %d" % (labels, waiting),
                      "# HELP vllm:generation_tokens Number of generation tokens processed.",
                      "# TYPE vllm:generation_tokens counter",
                      "vllm:generation_tokens_total%s %.1f" % (labels, generated),
                      "# TYPE vllm:request_success counter",
                      'vllm:request_success_total{engine="0",finished_reason="length",model_name="%s"} %.1f'
                      % (label_value(state.served), counts["requests"])]
            if state.spec_tokens:
                for key, name in (("drafts", "num_drafts"), ("draft_tokens", "num_draft_tokens"),
                                  ("accepted_tokens", "num_accepted_tokens")):
                    lines += ["# HELP vllm:spec_decode_%s Number of spec decoding %s." % (name, key),
                              "# TYPE vllm:spec_decode_%s counter" % name,
                              "vllm:spec_decode_%s_total%s %.1f" % (name, labels, counts[key])]
        else:
            labels = '{model_name="%s"}' % label_value(state.served)
            lines += ["# TYPE sglang:num_running_reqs gauge", "sglang:num_running_reqs%s %d" % (labels, state.in_flight),
                      "# TYPE sglang:num_queue_reqs gauge", "sglang:num_queue_reqs%s %d" % (labels, waiting),
                      "# TYPE sglang:gen_throughput gauge", "sglang:gen_throughput%s %.1f" % (labels, throughput),
                      "# TYPE sglang:generation_tokens counter",
                      "sglang:generation_tokens_total%s %.1f" % (labels, generated),
                      "# TYPE sglang:num_requests counter",
                      "sglang:num_requests_total%s %.1f" % (labels, counts["requests"])]
            if state.spec_tokens:
                lines += ["# TYPE sglang:spec_accept_rate gauge",
                          "sglang:spec_accept_rate%s %.6f" % (labels, gauges["spec_accept_rate"]),
                          "# TYPE sglang:spec_accept_length gauge",
                          "sglang:spec_accept_length%s %.6f" % (labels, gauges["spec_accept_length"])]
        return "\n".join(lines) + "\n"


def label_value(text: str) -> str:
    """A label value as prometheus_client (which both engines use) writes it: \\, " and the line
    feed escaped, every other character as it is."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def make_server(host: str, port: int, state: State) -> ThreadingHTTPServer:
    """Bound but not listening: until activate(), a connect is refused, as while an engine loads."""
    handler = type("BoundHandler", (Handler,), {"state": state})
    server_class = ThreadingHTTPServer
    if ":" in host:
        server_class = type("ServerV6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
    server = server_class((host or "0.0.0.0", port), handler, bind_and_activate=False)
    server.daemon_threads = True
    server.allow_reuse_address = True
    server.server_bind()
    return server
