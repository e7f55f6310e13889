"""Tiny HTTP servers that answer as a slow, broken or odd engine would, each a real process on
127.0.0.1, for the readiness gate's tests (the stand-in engine in tests/sim/engine answers
correctly; these answer what a test asks for).

    with fake_engine({"/health": {"delay": 3}, "/v1/models": {"json": [1, 2]}}) as port:
        ...

A route is the full request path (query left out) and says what to answer: `status` (200),
`json` (a value sent as JSON), `text` (sent as it is), `texts` (one after the other, a request each,
then again from the first) or `body_hex` (bytes, as hex), `content_type`, `headers` (more response
headers, such as a redirect's Location), `delay` (seconds before the answer), `trickle_s` (seconds
between the body's bytes, sent one by one), `ready_at` (CLOCK_MONOTONIC seconds before which the
route answers 503, as a loading engine's /health does), `endless` (the body sent again and again, with no
length, until the client goes), `exit` (the process exits at once, answering nothing, as an
engine that crashes).
Any other path answers 404. The server ends when its stdin closes, which the context
does on the way out: no test signals it. With `tls` ({"cert": path, "key": path}) it serves HTTPS.

    python -m tests.functional.fake_engines ROUTES_JSON [TLS_JSON]
"""
from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# What an SGLang log line looks like when it prints its arguments (repr of a dataclass).
SGLANG_ARGS_LINE = "server_args=ServerArgs(model_path='m', api_key=%r, admin_api_key=%r, port=30000)"


def vllm_metrics(drafts, draft_tokens, accepted_tokens, model="llama") -> str:
    """vLLM's spec decode counters with the given values (any text: "NaN", "+Inf", "-5"), labelled as
    vLLM labels them (model: a served name with no character the format escapes)."""
    return "".join("# TYPE vllm:spec_decode_%s counter\nvllm:spec_decode_%s_total{engine=\"0\",model_name=\"%s\"} %s\n"
                   % (name, name, model, value) for name, value in (("num_drafts", drafts),
                                                                    ("num_draft_tokens", draft_tokens),
                                                                    ("num_accepted_tokens", accepted_tokens)))


def sglang_metrics(rate, length, model="llama") -> str:
    return ("# TYPE sglang:spec_accept_rate gauge\nsglang:spec_accept_rate{model_name=\"%s\"} %s\n"
            "# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name=\"%s\"} %s\n"
            % (model, rate, model, length))


def serving(name="llama", text=" Paris.") -> dict:
    """The routes of an engine that serves correctly (health, models, completions)."""
    return {"/health": {}, "/ready": {},
            "/v1/models": {"json": {"object": "list", "data": [{"id": name, "object": "model"}]}},
            "/v1/completions": {"json": {"object": "text_completion", "choices": [{"index": 0, "text": text}]}}}


@contextmanager
def fake_engine(routes: dict, tls: dict | None = None):
    """Run a server with these routes; yields its port."""
    with fake_engine_process(routes, tls) as (port, dummy):
        yield port


@contextmanager
def fake_engine_process(routes: dict, tls: dict | None = None):
    """Run a server with these routes; yields (its port, its pid)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:  # more than an argument holds
        json.dump(routes, handle)
    argv = [sys.executable, "-m", "tests.functional.fake_engines", "@" + handle.name] + (
        [json.dumps(tls)] if tls else [])
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), "the fake engine did not start"
        yield int(line), proc.pid
    finally:
        proc.stdin.close()  # its watcher thread sees end of file and ends the process
        proc.wait(timeout=30)
        os.unlink(handle.name)


def _handler(routes):
    answered = {}  # path: how many requests it got

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # pylint: disable=redefined-builtin
            pass

        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                route = {"status": 404, "json": {"detail": "Not Found"}}
            if route.get("exit"):
                os._exit(1)
            answered[self.path] = answered.get(self.path, 0) + 1
            # "hang_after": N answers, then no answer for that long (a server that stops answering).
            if route.get("hang_after") is not None and answered[self.path] > route["hang_after"]:
                time.sleep(route.get("hang_s", 60))
            time.sleep(route.get("delay", 0))
            if "text" in route:
                body = route["text"].encode("utf-8")
            elif "texts" in route:
                body = route["texts"][(answered[self.path] - 1) % len(route["texts"])].encode("utf-8")
            elif "body_hex" in route:
                body = bytes.fromhex(route["body_hex"])
            elif "json" in route:
                body = json.dumps(route["json"]).encode()
            else:
                body = b""
            loading = time.monotonic() < route.get("ready_at", 0)
            self.send_response(503 if loading else route.get("status", 200))
            self.send_header("Content-Type", route.get("content_type", "application/json"))
            if route.get("endless"):
                self.send_header("Connection", "close")
            else:
                self.send_header("Content-Length", str(len(body)))
            for name, value in route.get("headers", {}).items():
                self.send_header(name, value)
            self.end_headers()
            if route.get("endless"):
                try:
                    while True:
                        self.wfile.write(body)
                except OSError:  # the client read what it wanted and closed
                    self.close_connection = True
            elif route.get("trickle_s"):
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(route["trickle_s"])
            else:
                self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815  # http.server's naming

    return Handler


def main(argv) -> int:
    if argv[0].startswith("@"):
        with open(argv[0][1:], encoding="utf-8") as handle:
            routes = json.load(handle)
    else:
        routes = json.loads(argv[0])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(routes))
    server.daemon_threads = True
    if len(argv) > 1:
        tls = json.loads(argv[1])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls["cert"], tls["key"])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdout.write("%d\n" % server.server_address[1])
    sys.stdout.flush()
    sys.stdin.read()  # until the test closes our stdin
    os._exit(0)  # a handler may still sleep in its delay: leave without waiting for it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
