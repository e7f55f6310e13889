"""A hostile run across the serve layer: every case tries to break one promise of
docs/inference_service.md ("What the serve layer promises") on the real systemd fleet of
test_inference_service_fleet.py, and asserts the promise, so that a broken promise is a red test.

Most cases are refusals that end in the validation play: they are batched, one case per host
(node1 vLLM with an API key and a HF token, node2 SGLang with an API key, node3 vLLM without
secrets), each batch one ansible-playbook run with -vv, once for real and once under
--check --diff. For each case: the host is `invalid` with the expected sentence, its running
server is untouched (MainPID, InvocationID, NRestarts, unit and secret files' hashes), and no
secret of the case appears in Ansible's output, the report, the unit file or any /proc/*/cmdline.

The server cases (a slow /health, a crash after readiness, a foreign or garbled server, a
SIGSTOPped engine, the unit stopped during the gate) each run their own play and heal the host.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest

from tests.integration.fleet.reports import REPO, clear_reports, newest_report, playbook_command
from tests.integration.test_inference_service_fleet import (  # noqa: F401 pylint: disable=unused-import
    API_KEY, HF_TOKEN, HOSTS, SGLANG_KEY, SPEC_VLLM, UNIT, base_vars, served)
from tests.integration.test_serve_safety_fleet import FOREIGN, main_pid

pytestmark = [pytest.mark.fleet, pytest.mark.hostile]

DELETE = object()
MODES = ("run", "check")
TATTLE_PORT = 8000  # node2 serves on 30000: anything that reaches node2:8000 was sent to the wrong host


# --------------------------------------------------------------------------------------------
# Host-side helpers (each bounded)

def snapshot(served_fleet, name) -> dict:
    """What must not change on a host that was refused: the unit's process and invocation, and
    every file the role writes."""
    out = served_fleet.fleet.run(name, ["sh", "-c",
                                        f"systemctl show --property=MainPID --property=InvocationID "
                                        f"--property=NRestarts --property=ActiveState {UNIT}; "
                                        f"sha256sum /etc/systemd/system/*.service /etc/cleanslate/inference/* "
                                        f"2>/dev/null; true"], timeout=60).stdout
    facts = {}
    for line in out.splitlines():
        if re.match(r"^[0-9a-f]{64} ", line):
            facts[line.split()[-1]] = line.split()[0]
        elif "=" in line:
            key, value = line.split("=", 1)
            facts[key] = value
    return facts


def cmdlines(served_fleet, name) -> str:
    return served_fleet.fleet.run(name, ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; true"],
                                  timeout=60).stdout


def unit_texts(served_fleet, name) -> str:
    root = served_fleet.fleet.hosts[name].root / "etc/systemd/system"
    return "".join(p.read_text(errors="replace") for p in root.glob("*.service") if p.is_file())


def healthy(served_fleet, name) -> bool:
    try:
        return served_fleet.get(name, "/health")[0] == 200
    except OSError:
        return False


def host_file(served_fleet, name, path, text, mode=0o644) -> None:
    target = served_fleet.fleet.hosts[name].root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


# A listener that records every connection: started on node2:8000 while node1's host is
# "127.0.0.1@node2" and friends, so that a probe sent to node2 would be seen.
TATTLE = r'''#!/usr/bin/python3
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
while True:
    c, a = s.accept()
    with open("/run/tattle.log", "a") as f:
        f.write("%s %r\n" % (a[0], c.recv(4096)[:200]))
    c.close()
'''

# Answers garbage on the port while the engine imports: not HTTP at all.
GARBAGE_FOREIGN = r'''#!/usr/bin/python3
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
while True:
    c, a = s.accept()
    try:
        c.recv(4096); c.sendall(b"\xff\xfe\x00garbage\r\n\r\nHTTP/9.9 999 \x00\x01")
    except OSError:
        pass
    c.close()
'''

# The unit's own executable answering garbled HTTP (in the unit's control group: it passes the
# socket-ownership check). Its mode comes from /etc/garbled-mode at each start.
GARBLED_ENGINE = r'''#!/usr/bin/python3
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv
port = int(argv[argv.index("--port") + 1])
served = argv[argv.index("--served-model-name") + 1]
mode = open("/etc/garbled-mode").read().strip()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, body, kind="application/json", status=200):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status); self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        if self.path.startswith("/metrics"):
            if mode == "metrics_nan":
                self._send(b"vllm:spec_decode_num_drafts_total NaN\nvllm:spec_decode_num_draft_tokens_total +Inf\n"
                           b"vllm:spec_decode_num_accepted_tokens_total NaN\n", "text/plain")
            else:
                self._send(b"vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 20\n"
                           b"vllm:spec_decode_num_accepted_tokens_total 50\n", "text/plain")
        elif self.path.startswith("/v1/models"):
            if mode == "models_not_json":
                self._send(b"\xff\xfe<html>not json", "text/html")
            else:
                self._send({"data": [{"id": served}]})
        else:
            self._send({})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if mode == "completion_not_text":
            self._send({"choices": [{"text": None}], "usage": "lots"})
        else:
            self._send({"choices": [{"text": " Paris"}]})
HTTPServer(("0.0.0.0", port), H).serve_forever()
'''


# --------------------------------------------------------------------------------------------
# Cases

@dataclass
class Case:
    """A refusal: `vars` merged into the host's variables (DELETE removes one), `extra` -e
    arguments (then the case covers every host), `expect` sentences the host's problems must
    hold, `secrets` values that must appear nowhere."""
    id: str
    host: str
    vars: dict = field(default_factory=dict)
    expect: tuple = ()
    secrets: tuple = ()
    extra: tuple = ()
    setup: Optional[Callable] = None
    teardown: Optional[Callable] = None


def vllm_spec_with(**more) -> dict:
    return dict(SPEC_VLLM, **more)


def tattle_setup(s):
    host_file(s, "node2", "/usr/local/bin/tattle", TATTLE, 0o755)
    s.fleet.run("node2", ["sh", "-c", "rm -f /run/tattle.log; systemctl stop tattle.service 2>/dev/null; true"])
    s.fleet.run("node2", ["systemd-run", "--unit=tattle", "--collect", "--quiet", "--", "/usr/local/bin/tattle",
                          str(TATTLE_PORT)])


def tattle_teardown(s):
    s.fleet.run("node2", ["systemctl", "stop", "tattle.service"], check=False)
    s.tattled = s.fleet.run("node2", ["sh", "-c", "cat /run/tattle.log 2>/dev/null; true"]).stdout


def unit_setup(name, unit, *, link=None, text=None, where="/etc/systemd/system"):
    def setup(s):
        root = s.fleet.hosts[name].root
        path = root / where.lstrip("/") / unit
        path.parent.mkdir(parents=True, exist_ok=True)
        if link:
            path.unlink(missing_ok=True)
            path.symlink_to(link)
        else:
            path.write_text(text)
        s.fleet.run(name, ["systemctl", "daemon-reload"])

    def teardown(s):
        root = s.fleet.hosts[name].root
        (root / where.lstrip("/") / unit).unlink(missing_ok=True)
        s.fleet.run(name, ["systemctl", "daemon-reload"])
    return setup, teardown


HAND_UNIT = "[Unit]\nDescription=hand-written llm\n[Service]\nExecStart=/bin/sleep infinity\n"
HOST_BAD = "must be an IP address or a DNS host name"
PLAIN_KEY = "sk-plainKEY0123456789"       # no space: the secret checks, not the served-name check, must catch it
SPACED_KEY = "sk live KEY 98765"         # a key with spaces (SGLang's fleet key has them too)
ENV_SECRET = "wandb-SeCrEt-4242-zz"


def key(tag: str) -> str:
    """A key of its own for each case: a batch runs three cases, and one's leak must not be blamed on another."""
    return "sk-plainKEY%s-0123456789" % tag


def env_secret(tag: str) -> str:
    return "wandb-SeCrEt-%s-4242-zz" % tag


QUOTED_KEY = 'sk-"quoted"\\back$DOLLAR%pct'

CASES = [
    # --- inference_service_host: refused, nothing touched, nothing sent elsewhere ---------------
    Case("host_userinfo_127.0.0.1@node2", "node1", {"inference_service_host": "127.0.0.1@node2"}, (HOST_BAD,),
         setup=tattle_setup, teardown=tattle_teardown),
    Case("host_path_node2/x", "node3", {"inference_service_host": "node2/x"}, (HOST_BAD,)),
    Case("host_brackets_[::1]", "node2", {"inference_service_host": "[::1]"}, (HOST_BAD,)),
    Case("host_trailing_space", "node1", {"inference_service_host": "0.0.0.0 "}, (HOST_BAD,)),
    Case("host_zone_index", "node3", {"inference_service_host": "host%eth0"}, ("has a zone index",)),
    Case("host_option_-h", "node2", {"inference_service_host": "-h"}, (HOST_BAD,)),
    Case("host_empty", "node1", {"inference_service_host": ""}, (HOST_BAD,)),
    Case("host_very_long", "node3", {"inference_service_host": ("a" * 63 + ".") * 5 + "com"}, (HOST_BAD,)),
    # A raw non-UTF-8 byte cannot pass through YAML host_vars (Ansible's loader refuses the file):
    # it comes as a -e argument instead, for every host.
    Case("host_unicode_zero_width", "node2", {"inference_service_host": "nöde\u200b2"}, (HOST_BAD,)),
    Case("host_non_utf8_byte_via_e", "*", extra=("-e", "inference_service_host=node\udcff2"),
         expect=("inference_service_host",)),
    Case("host_port_in_host", "node1", {"inference_service_host": "127.0.0.1:8001"}, (HOST_BAD,)),
    Case("host_all_digits_label", "node3", {"inference_service_host": "127.1"}, ()),  # an address to inet_aton
    # --- secrets -----------------------------------------------------------------------------------
    Case("secret_api_key_newline", "node1",
         {"inference_service_secrets": {"api_key": "sk-line1\nline2-NEWLINE", "hf_token": HF_TOKEN}},
         ("inference_service_secrets.api_key holds a control character",), ("sk-line1", "line2-NEWLINE")),
    Case("secret_api_key_equals_served_name_plain", "node3",
         {"inference_service_secrets": {"api_key": key("13")}, "inference_service_served_name": key("13")},
         ("inference_service_served_name holds the value of inference_service_secrets.api_key",), (key("13"),)),
    Case("secret_api_key_with_spaces_equals_served_name", "node2",
         {"inference_service_served_name": SGLANG_KEY},
         ("inference_service_served_name",), (SGLANG_KEY, "sg key")),
    Case("secret_api_key_inside_model", "node1",
         {"inference_service_secrets": {"api_key": key("15")}, "inference_service_model": "sim/" + key("15")},
         ("inference_service_model holds the value of inference_service_secrets.api_key",), (key("15"),)),
    Case("secret_api_key_inside_extra_arg", "node3",
         {"inference_service_secrets": {"api_key": key("16")},
          "inference_service_extra_args": ["--revision", "rev-" + key("16")]},
         ("inference_service_secrets.api_key is in the command line",), (key("16"),)),
    Case("secret_quoted_api_key_inside_speculative_json", "node1",
         {"inference_service_secrets": {"api_key": QUOTED_KEY},
          "inference_service_speculative": vllm_spec_with(model="sim/" + QUOTED_KEY)},
         ("inference_service_secrets.api_key is in the command line",),
         (QUOTED_KEY, json.dumps(QUOTED_KEY)[1:-1], "quoted")),
    Case("secret_api_key_in_innocent_environment_value", "node3",
         {"inference_service_secrets": {"api_key": key("18")},
          "inference_service_environment": dict(base_vars("node3")["inference_service_environment"],
                                                MODEL_NOTE="note " + key("18"))},
         ("inference_service_environment.MODEL_NOTE holds the value of inference_service_secrets.api_key",),
         (key("18"),)),
    Case("secret_hf_token_in_innocent_environment_value", "node1",
         {"inference_service_environment": dict(base_vars("node1")["inference_service_environment"],
                                                HF_HUB_CACHE_TAG=HF_TOKEN)},
         ("inference_service_environment.HF_HUB_CACHE_TAG holds the value of inference_service_secrets.hf_token",),
         (HF_TOKEN, "SeCrEtToKeN")),
    Case("secret_hf_token_inside_served_name", "node1",
         {"inference_service_served_name": "llama-" + HF_TOKEN},
         ("inference_service_served_name holds the value of inference_service_secrets.hf_token",), (HF_TOKEN,)),
    Case("secret_environment_value_in_plain_environment", "node3",
         {"inference_service_secrets": {"environment": {"WANDB_KEY": env_secret("21")}},
          "inference_service_environment": dict(base_vars("node3")["inference_service_environment"],
                                                RUN_LABEL=env_secret("21"))},
         ("inference_service_environment.RUN_LABEL holds the value of inference_service_secrets.environment.WANDB_KEY",),
         (env_secret("21"),)),
    Case("secret_environment_value_in_extra_arg", "node1",
         {"inference_service_secrets": {"api_key": API_KEY, "hf_token": HF_TOKEN,
                                        "environment": {"WANDB_KEY": env_secret("22")}},
          "inference_service_extra_args": ["--revision", env_secret("22")]},
         ("inference_service_secrets.environment.WANDB_KEY is in the command line",), (env_secret("22"),)),
    Case("secret_looking_plain_environment_name", "node2",
         {"inference_service_environment": {"MY_API_KEY": env_secret("23"), "CUDA_VISIBLE_DEVICES": "0,1"}},
         ("inference_service_environment.MY_API_KEY looks like a secret",), (env_secret("23"),)),
    Case("secret_admin_api_key_on_vllm", "node3",
         {"inference_service_secrets": {"admin_api_key": env_secret("24")}},
         ("inference_service_secrets.admin_api_key: vllm", "has no admin API key"), (env_secret("24"),)),
    Case("secret_environment_also_plain", "node2",
         {"inference_service_secrets": {"api_key": SGLANG_KEY, "environment": {"CUDA_VISIBLE_DEVICES": env_secret("25")}}},
         ("inference_service_secrets.environment.CUDA_VISIBLE_DEVICES is also in inference_service_environment",),
         (env_secret("25"),)),
    Case("secret_api_key_with_spaces_in_extra_args_with_a_null_item", "node3",
         {"inference_service_extra_args": ["--api-key", SPACED_KEY, None]},
         ("inference_service_extra_args",), (SPACED_KEY,)),
    Case("secret_api_key_in_extra_args_with_a_bool_item", "node1",
         {"inference_service_extra_args": ["--api-key", key("27"), True]},
         ("inference_service_extra_args",), (key("27"),)),
    # --- extra_args ------------------------------------------------------------------------------------
    Case("extra_api_key_equals", "node3", {"inference_service_extra_args": ["--api-key=" + key("28")]},
         ("--api-key would put a secret on the command line",), (key("28"),)),
    Case("extra_api_key_separate", "node1", {"inference_service_extra_args": ["--api-key", key("29")]},
         ("--api-key would put a secret on the command line",), (key("29"),)),
    Case("extra_api_key_abbreviated", "node3", {"inference_service_extra_args": ["--api-k", key("30")]},
         ("would put a secret on the command line",), (key("30"),)),
    Case("extra_api_key_abbreviated_equals_dash_value", "node1",
         {"inference_service_extra_args": ["--api-ke=-" + key("31")]},
         ("would put a secret on the command line",), (key("31"),)),
    Case("extra_sglang_api_key", "node2", {"inference_service_extra_args": ["--api-key", key("32")]},
         ("would put a secret on the command line",), (key("32"),)),
    Case("extra_sglang_admin_api_key_abbrev", "node2", {"inference_service_extra_args": ["--admin-api", key("33")]},
         ("would put a secret on the command line",), (key("33"),)),
    Case("extra_hf_token", "node3", {"inference_service_extra_args": ["--hf-token", key("34")]},
         ("would put a secret on the command line",), (key("34"),)),
    Case("extra_port_equals_1", "node1", {"inference_service_extra_args": ["--port=1"]},
         ("--port is set by the role; use inference_service_port",)),
    Case("extra_tp_equals_8", "node3", {"inference_service_extra_args": ["-tp=8"]},
         ("-tp is set by the role; use inference_service_tensor_parallel_size",)),
    Case("extra_host", "node1", {"inference_service_extra_args": ["--host", "10.0.0.9"]},
         ("--host is set by the role; use inference_service_host",)),
    Case("extra_uds", "node3", {"inference_service_extra_args": ["--uds", "/tmp/s"]},
         ("--uds makes the server listen on a Unix socket",)),
    Case("extra_headless", "node1", {"inference_service_extra_args": ["--headless"]},
         ("--headless runs the engine without an API server",)),
    Case("extra_ssl_keyfile_alone", "node3", {"inference_service_extra_args": ["--ssl-keyfile", "/etc/k.pem"]},
         ("--ssl-keyfile without --ssl-certfile",)),
    Case("extra_api_server_count_0", "node1", {"inference_service_extra_args": ["--api-server-count", "0"]},
         ("--api-server-count 0 runs the engine without an API server",)),
    Case("extra_double_dash", "node3", {"inference_service_extra_args": ["--", "x"]}, ("inference_service_extra_args",)),
    Case("extra_item_with_newline", "node1", {"inference_service_extra_args": ["--revision", "main\nExecStartPre=/bin/sh"]},
         ("inference_service_extra_args item 2 holds a control character",), ("ExecStartPre=/bin/sh",)),
    Case("extra_null_item", "node3", {"inference_service_extra_args": ["--max-num-seqs", None]},
         ("inference_service_extra_args",)),
    Case("extra_5000_items", "node1", {"inference_service_extra_args": ["--max-num-seqs", "64"] * 2500},
         ("inference_service_extra_args has 5000 items: at most 1024",)),
    Case("extra_sglang_config_with_api_key", "node2", {"inference_service_extra_args": ["--config", "/etc/x.yaml"]},
         ("cannot be given with an API key",)),
    Case("extra_sglang_grpc", "node2", {"inference_service_extra_args": ["--grpc-mode"]},
         ("serves gRPC instead of HTTP",)),
    # --- numbers as YAML values ---------------------------------------------------------------------------
    Case("number_port_0", "node3", {"inference_service_port": 0}, ("inference_service_port",)),
    Case("number_port_negative", "node1", {"inference_service_port": -1}, ("inference_service_port",)),
    Case("number_port_65536", "node2", {"inference_service_port": 65536}, ("inference_service_port",)),
    Case("number_port_float", "node3", {"inference_service_port": 8000.5}, ("inference_service_port",)),
    Case("number_gpu_fraction_nan", "node1", {"inference_service_gpu_memory_fraction": float("nan")},
         ("inference_service_gpu_memory_fraction",)),
    Case("number_gpu_fraction_inf", "node2", {"inference_service_gpu_memory_fraction": float("inf")},
         ("inference_service_gpu_memory_fraction",)),
    Case("number_ready_timeout_nan", "node3", {"inference_service_ready_timeout": float("nan")},
         ("inference_service_ready_timeout is",)),
    Case("number_poll_interval_zero", "node1", {"inference_service_poll_interval": 0},
         ("inference_service_poll_interval is 0",)),
    Case("number_health_timeout_inf", "node2", {"inference_service_health_timeout": float("inf")},
         ("inference_service_health_timeout is",)),
    Case("number_stable_s_negative", "node3", {"inference_service_stable_s": -1},
         ("inference_service_stable_s is -1",)),
    Case("number_min_acceptance_rate_above_1", "node1", {"inference_service_min_acceptance_rate": 30},
         ("inference_service_min_acceptance_rate is 30",)),
    Case("number_min_acceptance_rate_nan", "node2", {"inference_service_min_acceptance_rate": float("nan")},
         ("inference_service_min_acceptance_rate is",)),
    # --- numbers as -e strings (every host of the run) ----------------------------------------------
    Case("e_strings_gate_numbers_nan_inf_zero", "*",
         extra=("-e", "inference_service_ready_timeout=nan", "-e", "inference_service_poll_interval=0",
                "-e", "inference_service_health_timeout=inf", "-e", "inference_service_stable_s=-1",
                "-e", "inference_service_min_acceptance_rate=NaN"),
         expect=("inference_service_ready_timeout is", "inference_service_poll_interval is",
                 "inference_service_health_timeout is", "inference_service_stable_s is",
                 "inference_service_min_acceptance_rate is")),
    Case("e_strings_port_0_and_fraction_nan", "*",
         extra=("-e", "inference_service_port=0", "-e", "inference_service_gpu_memory_fraction=nan"),
         expect=("inference_service_port",)),
    # --- units --------------------------------------------------------------------------------------------
    Case("unit_ssh", "node3", {"inference_service_unit": "ssh.service", "inference_service_adopt_unit": True},
         ("inference_service_unit ssh.service is a system unit",)),
    Case("unit_dotdot", "node1", {"inference_service_unit": "../x.service"},
         ("it must be a service unit name such as vllm.service",)),
    Case("unit_trailing_newline", "node2", {"inference_service_unit": "x.service\n"},
         ("it must be a service unit name such as vllm.service",)),
    Case("unit_template_instance", "node3", {"inference_service_unit": "foo@bar.service"},
         ("it must be a service unit name such as vllm.service",)),
    Case("unit_socket", "node1", {"inference_service_unit": "x.socket"},
         ("it must be a service unit name such as vllm.service",)),
    Case("unit_hand_written", "node3", {"inference_service_unit": "hand-llm.service"},
         ("/etc/systemd/system/hand-llm.service exists and this role did not write it",),
         setup=unit_setup("node3", "hand-llm.service", text=HAND_UNIT)[0],
         teardown=unit_setup("node3", "hand-llm.service", text=HAND_UNIT)[1]),
    Case("unit_masked_symlink_dev_null", "node1",
         {"inference_service_unit": "masked-llm.service", "inference_service_adopt_unit": True},
         ("/etc/systemd/system/masked-llm.service is a symbolic link (to /dev/null)",),
         setup=unit_setup("node1", "masked-llm.service", link="/dev/null")[0],
         teardown=unit_setup("node1", "masked-llm.service", link="/dev/null")[1]),
    Case("unit_vendor_file_in_lib", "node2",
         {"inference_service_unit": "vendor-llm.service", "inference_service_adopt_unit": True},
         ("inference_service_unit vendor-llm.service has a unit file outside /etc/systemd/system",),
         setup=unit_setup("node2", "vendor-llm.service", text=HAND_UNIT, where="/lib/systemd/system")[0],
         teardown=unit_setup("node2", "vendor-llm.service", text=HAND_UNIT, where="/lib/systemd/system")[1]),
]
BY_ID = {case.id: case for case in CASES}
assert len(BY_ID) == len(CASES)


def batches() -> list:
    """Cases grouped one per host; a -e case is a batch of its own."""
    out = []
    for case in CASES:
        if case.host == "*":
            out.append([case])
            continue
        for batch in out:
            if batch[0].host != "*" and all(other.host != case.host for other in batch) and len(batch) < 3:
                batch.append(case)
                break
        else:
            out.append([case])
    return out


BATCHES = batches()
BATCH_OF = {case.id: index for index, batch in enumerate(BATCHES) for case in batch}


@dataclass
class Outcome:
    proc: subprocess.CompletedProcess
    report: Optional[dict]
    before: dict
    after: dict
    texts: dict
    tattled: str
    seconds: float


class Hostile:
    """Runs each batch once per mode, on first use, and keeps what it saw."""

    def __init__(self, served_fleet):
        self.s = served_fleet
        self.done = {}

    def outcome(self, case: Case, mode: str) -> Outcome:
        key = (BATCH_OF[case.id], mode)
        if key not in self.done:
            self.done[key] = self._run(BATCHES[key[0]], mode == "check")
        return self.done[key]

    def _run(self, batch, check) -> Outcome:
        s = self.s
        s.tattled = ""
        for case in batch:
            if case.setup:
                case.setup(s)
        try:
            before = {name: snapshot(s, name) for name in HOSTS}
            extra = ["-vv"]
            for case in batch:
                extra += list(case.extra)
                if case.host != "*":
                    for key, value in case.vars.items():
                        if value is DELETE:
                            s.vars[case.host].pop(key, None)
                        else:
                            s.vars[case.host][key] = value
            start = time.monotonic()
            proc, report = s.play(extra=extra, check=check)
            seconds = time.monotonic() - start
            after = {name: snapshot(s, name) for name in HOSTS}
            texts = {"ansible output": proc.stdout + proc.stderr,
                     "report": json.dumps(report) + "".join(
                         p.read_text() for p in (s.workdir / "reports").glob("*.md"))}
            for name in HOSTS:
                texts[f"{name} unit files"] = unit_texts(s, name)
                texts[f"{name} /proc/*/cmdline"] = cmdlines(s, name)
        finally:
            for name in HOSTS:
                s.vars[name] = base_vars(name)
            for case in batch:
                if case.teardown:
                    case.teardown(s)
        sick = [name for name in HOSTS if not healthy(s, name)]
        if sick:
            s.heal(*sick)
        return Outcome(proc, report, before, after, texts, s.tattled, seconds)


@pytest.fixture(scope="module")
def hostile(served):
    proc, dummy = served.first
    assert proc.returncode == 0, proc.stdout[-4000:]
    return Hostile(served)


def problems_of(outcome, name) -> str:
    assert outcome.report is not None, (outcome.proc.stdout[-2000:], outcome.proc.stderr[-3000:])
    row = {r["host"]: r for r in outcome.report["hosts"]}[name]
    return row, "\n".join(row.get("problems") or [])


def leaks(outcome, secrets) -> list:
    """Where each secret shows, with the line around it (the secret itself cut out)."""
    found = []
    for secret in secrets:
        for where, text in outcome.texts.items():
            at = text.find(secret)
            if at >= 0:
                line_start = text.rfind("\n", 0, at) + 1
                context = text[max(line_start, at - 100):at] + "<SECRET>" + text[at + len(secret):at + len(secret) + 60]
                found.append(f"{secret[:6]}... in the {where}: {context!r}")
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case_id", [case.id for case in CASES])
def test_refused_untouched_and_silent(hostile, case_id, mode):
    """The configuration is refused (`invalid`, the sentence naming the variable), before
    anything is touched: on every host of the run the unit's process, invocation, restarts and
    files are what they were, and no secret of the case is shown anywhere."""
    case = BY_ID[case_id]
    outcome = hostile.outcome(case, mode)
    assert "Traceback" not in outcome.proc.stdout + outcome.proc.stderr, outcome.proc.stdout[-3000:]
    for name in (HOSTS if case.host == "*" else (case.host,)):
        row, problems = problems_of(outcome, name)
        assert row["status"] == "invalid", (row, outcome.proc.stdout[-3000:])
        assert row["service"]["stage"] == "validate", row["service"]
        assert row["killed"] == 0 and row["seconds_per_step"] == {}, row
        for sentence in case.expect:
            assert sentence in problems, problems
    assert outcome.after == outcome.before, "a host changed"
    assert leaks(outcome, case.secrets) == []
    if case.setup is tattle_setup:
        assert outcome.tattled == "", f"node2:{TATTLE_PORT} was reached: {outcome.tattled}"
    if mode == "check":
        assert outcome.proc.returncode in (0, 2), outcome.proc.stdout[-3000:]
    else:
        assert outcome.proc.returncode == 2, outcome.proc.stdout[-3000:]


# --------------------------------------------------------------------------------------------
# Accepted configurations under --check --diff: what the role would do, nothing done.

ACCEPTED = {
    "tls_certfile_and_keyfile_gate_uses_https": (
        "node3", {"inference_service_extra_args": ["--ssl-certfile", "/etc/c.pem", "--ssl-keyfile", "/etc/k.pem"]},
        lambda svc: svc["url"] == "https://127.0.0.1:8000"),
    "tls_ca_certs_relative_path": (
        "node1", {"inference_service_extra_args": ["--ssl-certfile", "/etc/c.pem", "--ssl-ca-certs", "ca.pem"]},
        lambda svc: svc["url"] == "https://127.0.0.1:8000"),
    "api_server_count_4": (
        "node1", {"inference_service_extra_args": ["--api-server-count", "4"]},
        lambda svc: "--api-server-count" in svc["argv"]),
    "host_ipv6_loopback_is_an_address": (
        "node3", {"inference_service_host": "::1"}, lambda svc: svc["url"] == "http://[::1]:8000"),
    "extra_int_item_becomes_text": (
        "node1", {"inference_service_extra_args": ["--max-num-seqs", 64]},
        lambda svc: svc["argv"][-2:] == ["--max-num-seqs", "64"]),
    "extra_repeated_flag_kept_as_given": (
        "node3", {"inference_service_extra_args": ["--max-num-seqs", "64", "--max-num-seqs", "32"]},
        lambda svc: svc["argv"][-4:] == ["--max-num-seqs", "64", "--max-num-seqs", "32"]),
    "port_as_yaml_string": (
        "node2", {"inference_service_port": "30000"}, lambda svc: svc["url"] == "http://127.0.0.1:30000"),
    "host_uppercase_name": (
        "node2", {"inference_service_host": "LOCALHOST"}, lambda svc: svc["url"].lower() == "http://localhost:30000"),
    "root_path_gate_url_unchanged": (
        "node1", {"inference_service_extra_args": ["--root-path", "/x"]},
        lambda svc: svc["url"] == "http://127.0.0.1:8000"),
}


def accepted_batches() -> list:
    out = []
    for key, (name, dummy, dummy2) in ACCEPTED.items():
        for batch in out:
            if all(ACCEPTED[k][0] != name for k in batch):
                batch.append(key)
                break
        else:
            out.append([key])
    return out


ACCEPTED_BATCHES = accepted_batches()


@pytest.fixture(scope="module")
def accepted_runs(hostile):
    return {}


@pytest.mark.parametrize("case_id", list(ACCEPTED))
def test_accepted_under_check_changes_nothing(hostile, accepted_runs, case_id):
    s = hostile.s
    batch = next(b for b in ACCEPTED_BATCHES if case_id in b)
    key = tuple(batch)
    if key not in accepted_runs:
        before = {name: snapshot(s, name) for name in HOSTS}
        try:
            for k in batch:
                name, values, dummy = ACCEPTED[k]
                s.vars[name].update(values)
            proc, report = s.play(check=True, extra=["-vv"])
        finally:
            for name in HOSTS:
                s.vars[name] = base_vars(name)
        accepted_runs[key] = (proc, report, before, {name: snapshot(s, name) for name in HOSTS})
    proc, report, before, after = accepted_runs[key]
    name, dummy, check = ACCEPTED[case_id]
    assert report is not None, proc.stdout[-4000:]
    row = {r["host"]: r for r in report["hosts"]}[name]
    assert row["status"] != "invalid", row.get("problems")
    assert row["service"]["status"] == "check", row["service"]
    assert check(row["service"]), (row["service"]["url"], row["service"]["argv"])
    assert after == before


# --------------------------------------------------------------------------------------------
# Accepted for real: odd but legal secrets reach the engine intact and are shown nowhere.

def _gate_ran(served_fleet, names, **overrides):
    for name, values in overrides.items():
        served_fleet.vars[name].update(values)
    try:
        return served_fleet.play(limit=",".join(names), extra=["-vv"])
    finally:
        for name in names:
            served_fleet.vars[name] = base_vars(name)


@pytest.mark.parametrize("case_id", ["ascii_specials_api_key_end_to_end", "unicode_api_key_end_to_end"])
def test_odd_api_keys_work_and_are_shown_nowhere(hostile, case_id):
    s = hostile.s
    key = 'k\'"$HOME%n\\`x` ;|&<>' if case_id.startswith("ascii") else "clé-€-😀-ключ"
    proc = report = None
    try:
        proc, report = _gate_ran(s, ["node1"], node1={"inference_service_secrets": {"api_key": key, "hf_token": HF_TOKEN}})
        (s.workdir / f"{case_id}.log").write_text(proc.stdout + proc.stderr, errors="replace")
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
        assert report is not None, ("no report", str(s.workdir / f"{case_id}.log"), proc.returncode, proc.stdout[-3000:], proc.stderr[-2000:])
        texts = proc.stdout + proc.stderr + json.dumps(report) + unit_texts(s, "node1") + cmdlines(s, "node1")
        assert key not in texts and key.encode("unicode_escape").decode() not in texts
        service = {r["host"]: r for r in report["hosts"]}["node1"]["service"]
        if case_id.startswith("ascii"):
            assert proc.returncode == 0 and service["status"] == "ready", service
            assert s.get("node1", "/v1/models", key)[0] == 200
        else:
            # A key no HTTP client can send as a header (not Latin-1): refused at validation, or a
            # failure in a sentence; never `ready` with a key the clients cannot use.
            assert service["status"] != "ready" or s.get("node1", "/v1/models", "wrong")[0] == 401, service
            if service["status"] != "ready":
                assert service["reason"] and "Traceback" not in service["reason"]
    finally:
        s.heal("node1", force=False)


def test_root_path_end_to_end_gate_passes(hostile):
    s = hostile.s
    try:
        proc, report = _gate_ran(s, ["node3"], node3={"inference_service_extra_args": ["--root-path", "/x"]})
        service = {r["host"]: r for r in report["hosts"]}["node3"]["service"]
        assert proc.returncode == 0 and service["status"] == "ready", service
        argv = s.cmdline("node3", s.main_pid("node3"))
        assert argv[-2:] == ["--root-path", "/x"]
    finally:
        s.heal("node3", force=False)


# --------------------------------------------------------------------------------------------
# Servers that misbehave.

def _background_play(served_fleet, limit, extra=()):
    """ansible-playbook in the background (the caller interferes with the gate meanwhile)."""
    served_fleet.write_vars()
    reports = served_fleet.workdir / "reports"
    clear_reports(reports)
    return subprocess.Popen(playbook_command(served_fleet.fleet, reports, limit, extra), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _end_and_heal(served_fleet, popen) -> None:
    """After a background play: end it if it still runs, and serve node3 again (heal() clears the
    fault and puts its base variables back)."""
    if popen.poll() is None:
        popen.kill()
        popen.wait(timeout=30)
    served_fleet.heal("node3")


def _finish(served_fleet, popen, timeout=300):
    out, dummy = popen.communicate(timeout=timeout)
    return out, popen.returncode, newest_report(served_fleet.workdir / "reports")


def _wait(predicate, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


@pytest.mark.parametrize("mode", MODES)
def test_slow_health_is_never_reset_nor_restarted(hostile, mode):
    """/health takes 4 s with a 1 s timeout: `slow`, not reset, not restarted, in either mode."""
    s = hostile.s
    s.fault("node3", health_delay_s=4)
    s.fleet.run("node3", ["systemctl", "restart", UNIT])
    try:
        s.wait_health("node3", timeout=60)
        pid = main_pid(s, "node3", UNIT)
        before = snapshot(s, "node3")
        s.vars["node3"].update(inference_service_health_timeout=1, inference_service_ready_timeout=6)
        proc, report = s.play(limit="node3", check=mode == "check")
        row = {r["host"]: r for r in report["hosts"]}["node3"]
        assert row["killed"] == 0 and row["seconds_per_step"] == {}, row
        assert "slow" in row.get("note", ""), row
        assert main_pid(s, "node3", UNIT) == pid and snapshot(s, "node3") == before
        if mode == "run":
            # The server the run left running is reported `slow` at once (docs/security.md, section 5), not failed.
            assert row["service"]["status"] == "slow", row["service"]
    finally:
        s.fault("node3")
        s.vars["node3"] = base_vars("node3")
        s.heal("node3")


@pytest.mark.parametrize("mode", MODES)
def test_crash_after_readiness_and_quick_restart_is_not_ready(hostile, mode):
    """The engine crashes 3 s after readiness, systemd restarts it within 1 s and the new one
    answers again before the gate's last read (stable_s 8): a restart, so not ready."""
    s = hostile.s
    s.fault("node3", crash_after_s=3)
    s.vars["node3"].update(inference_service_stable_s=8, inference_service_max_model_len=4096)
    try:
        before = snapshot(s, "node3")
        proc, report = s.play(limit="node3", check=mode == "check")
        service = {r["host"]: r for r in report["hosts"]}["node3"]["service"]
        if mode == "check":
            assert snapshot(s, "node3") == before
            assert service["status"] == "check"
        else:
            assert proc.returncode == 2, proc.stdout[-4000:]
            assert service["status"] == "failed", service
            assert "died" in service["reason"] or "restart" in service["reason"], service["reason"]
    finally:
        s.fault("node3")
        s.vars["node3"] = base_vars("node3")
        s.heal("node3")


@pytest.mark.parametrize("kind", ["http_foreign", "garbage_foreign"])
def test_foreign_server_on_the_port_while_the_engine_imports(hostile, kind):
    s = hostile.s
    fleet = s.fleet
    script = FOREIGN if kind == "http_foreign" else GARBAGE_FOREIGN
    host_file(s, "node3", "/usr/local/bin/foreign-llm", script, 0o755)
    fleet.run("node3", ["systemctl", "stop", UNIT])
    s.fault("node3", import_s=60)
    fleet.run("node3", ["systemd-run", "--unit=foreign-llm", "--collect", "--quiet", "--",
                        "/usr/local/bin/foreign-llm", "8000", "sim/Llama-3.1-8B-Instruct"])
    s.vars["node3"]["inference_service_ready_timeout"] = 30
    try:
        foreign = main_pid(s, "node3", "foreign-llm.service")
        start = time.monotonic()
        proc, report = s.play(limit="node3")
        assert "Traceback" not in proc.stdout + proc.stderr
        service = {r["host"]: r for r in report["hosts"]}["node3"]["service"]
        assert proc.returncode == 2 and service["status"] == "failed", service
        assert f"port 8000 is held by pid {foreign}" in service["reason"], service["reason"]
        assert service["acceptance_rate"] is None
        assert main_pid(s, "node3", "foreign-llm.service") == foreign
        assert time.monotonic() - start < 120
    finally:
        fleet.run("node3", ["systemctl", "stop", "foreign-llm.service"], check=False)
        s.fault("node3")
        s.vars["node3"] = base_vars("node3")
        s.heal("node3")


@pytest.mark.parametrize("garble", ["models_not_json", "metrics_nan", "more_accepted_than_drafted",
                                    "completion_not_text"])
def test_the_units_own_server_answering_garbage_is_a_sentence(hostile, garble):
    """The unit's own process (it passes the port-ownership check) answers garbled HTTP: the
    host fails, or the acceptance is unknown with the reason; never a traceback or a made-up figure."""
    s = hostile.s
    host_file(s, "node3", "/usr/local/bin/garbled-llm", GARBLED_ENGINE, 0o755)
    host_file(s, "node3", "/etc/garbled-mode", garble)
    s.vars["node3"].update(inference_service_executable="/usr/local/bin/garbled-llm", inference_service_ready_timeout=30,
                           inference_service_stable_s=1)
    try:
        proc, report = s.play(limit="node3")
        out = proc.stdout + proc.stderr
        assert "Traceback" not in out, out[-4000:]
        service = {r["host"]: r for r in report["hosts"]}["node3"]["service"]
        assert service["reason"] is not None
        if garble in ("models_not_json", "completion_not_text"):
            assert service["status"] == "failed", service
            # One sentence, then (by design) the journal lines of the gated invocation.
            first = service["reason"].split("; the journal lines", 1)[0]
            assert "\n" not in first and len(first) < 1000, service["reason"]
        else:
            assert service["acceptance_rate"] is None, service
            assert service["status"] == "failed" or "unknown" in json.dumps(service), service
    finally:
        s.vars["node3"] = base_vars("node3")
        s.heal("node3")


def test_sigstopped_engine_during_the_gate_fails_in_bounded_time(hostile):
    """The engine answers /health once, then hangs (SIGSTOP): the gate must not call it ready and
    must end by its deadline."""
    s = hostile.s
    s.vars["node3"].update(inference_service_max_model_len=4096, inference_service_ready_timeout=20,
                           inference_service_stable_s=8, inference_service_health_timeout=2)
    old = main_pid(s, "node3", UNIT)
    popen = _background_play(s, "node3")
    stopped = None
    try:
        assert _wait(lambda: main_pid(s, "node3", UNIT) not in (0, old) and healthy(s, "node3"), 120)
        stopped = main_pid(s, "node3", UNIT)
        s.fleet.run("node3", ["kill", "-STOP", str(stopped)])
        start = time.monotonic()
        out, rc, report = _finish(s, popen, timeout=240)
        assert time.monotonic() - start < 90, "the gate did not end near its deadline"
        service = {r["host"]: r for r in report["hosts"]}["node3"]["service"]
        assert rc == 2 and service["status"] == "failed", service
        assert "Traceback" not in out
    finally:
        if stopped:
            s.fleet.run("node3", ["kill", "-CONT", str(stopped)], check=False)
        _end_and_heal(s, popen)


def test_unit_stopped_by_hand_during_the_gate_fails_at_once(hostile):
    s = hostile.s
    s.fault("node3", import_s=20)
    s.vars["node3"].update(inference_service_max_model_len=4096, inference_service_ready_timeout=120)
    old = main_pid(s, "node3", UNIT)
    popen = _background_play(s, "node3")
    try:
        assert _wait(lambda: main_pid(s, "node3", UNIT) not in (0, old), 120)
        time.sleep(1)
        s.fleet.run("node3", ["systemctl", "stop", UNIT])
        stopped_at = time.monotonic()
        out, rc, report = _finish(s, popen, timeout=240)
        assert time.monotonic() - stopped_at < 45, "the gate waited after the unit stopped"
        service = {r["host"]: r for r in report["hosts"]}["node3"]["service"]
        assert rc == 2 and service["status"] == "failed", service
        assert "Traceback" not in out
    finally:
        _end_and_heal(s, popen)
