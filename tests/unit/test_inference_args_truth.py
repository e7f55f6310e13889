"""The serve layer tells the truth about where its API is and refuses what it cannot follow
(issue 23): the gate's URL from a checked host, flags that move the API, secret and role-owned
flags however they are spelled, one problem per line, bounds on absurd values, SGLang's
algorithm spellings, and a shared server user. Each case is what a hostile or careless user
would give, with the sentence they read."""
from __future__ import annotations

import math
from urllib.parse import urlsplit

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.cleanslate.gpu.plugins.action.fleet_report import host_row, render_markdown
from ansible_collections.cleanslate.gpu.plugins.action.inference_args import ActionModule
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _serve_command
from tests.unit.test_inference_args import FLAGS, build, refused, settings

SECRET = "sk-Zq9SECRETvalue"
SGLANG = {"engine": "sglang", "unit": "sglang.service", "port": 30000}


# --- 1. the host: an IP address or a DNS name, and the gate's URL built from its parts ----------

@pytest.mark.parametrize("host", [
    "127.0.0.1@node2", "user@127.0.0.1", "node2@", "@node2", "127.0.0.1/admin", "node2/", "127.0.0.1:9000",
    "node2:8000", "[::1]", "[::1]:8000", "[127.0.0.1]", "::1]", "[::1", "http://127.0.0.1", "127.0.0.1#x",
    "127.0.0.1?x", "node 2", " node2", "node2\n", "node2\t", "no\x00de", "node_2", "-node2", "node2-", "a..b",
    ".node2", "node2.", "*", "node$2", "node%2", "no'de", 'no"de', "no\\de", "ex\u00e4mple.org", "\udcff",
    "a" * 64, ".".join(["a" * 63] * 4) + ".a", "127.1", "1.2.3", "0", "0x7f.0.0.1", "256.1.1.1",
    "01.2.3.4", "1.2.3.4.5", "fe80::1%eth0", "fe80::1%25eth0", "::1%lo", "1::2::3", ":::", "",
])
def test_a_host_that_is_not_an_address_or_a_host_name_is_refused(host):
    message = refused(host=host)
    assert "inference_service_host" in message
    assert message.count("\n") == 0  # one sentence


@pytest.mark.parametrize("host", [None, 8000, ["127.0.0.1"], {"a": 1}, True])
def test_a_host_of_the_wrong_type_is_refused(host):
    assert "inference_service_host must be" in refused(host=host)


def test_the_readiness_probe_cannot_be_sent_to_another_machine_through_userinfo():
    """127.0.0.1@node2 made the gate's URL http://127.0.0.1@node2:18000: the probe (with the
    API key) went to node2."""
    message = refused(host="127.0.0.1@node2", port=18000)
    assert "inference_service_host must be an IP address or a DNS host name" in message


@pytest.mark.parametrize("host, url", [
    ("0.0.0.0", "http://127.0.0.1:8000"),
    ("::", "http://[::1]:8000"),
    ("10.1.2.3", "http://10.1.2.3:8000"),
    ("127.0.0.1", "http://127.0.0.1:8000"),
    ("2001:DB8::1", "http://[2001:db8::1]:8000"),
    ("::1", "http://[::1]:8000"),
    ("node-2.example.com", "http://node-2.example.com:8000"),
    ("localhost", "http://localhost:8000"),
    ("gpu01", "http://gpu01:8000"),
    ("9gpu.example", "http://9gpu.example:8000"),
])
def test_the_gate_url_is_built_from_the_parsed_host(host, url):
    built = build(host=host)
    assert built["url"] == url
    parts = urlsplit(built["url"])
    assert parts.port == 8000 and parts.path == "" and parts.username is None


def test_the_fully_qualified_maximum_host_name_is_accepted():
    host = ".".join(["a" * 63] * 3 + ["a" * 61])  # 253 characters
    assert build(host=host)["url"] == "http://%s:8000" % host


def test_the_engine_listens_on_the_host_as_given():
    argv = build(host="2001:db8::1")["argv"]
    assert argv[argv.index("--host") + 1] == "2001:db8::1"


# --- 3. flags that move the API away from the gate --------------------------------------------

@pytest.mark.parametrize("extra", [
    ["--ssl-certfile", "/etc/tls/cert.pem", "--ssl-keyfile", "/etc/tls/key.pem"],
    ["--ssl-certfile=/etc/tls/cert.pem", "--ssl-keyfile=/etc/tls/key.pem"],
    ["--ssl_certfile", "/etc/tls/cert.pem", "--ssl_keyfile", "/etc/tls/key.pem"],
    ["--ssl-certf", "/etc/tls/cert.pem", "--ssl-keyf", "/etc/tls/key.pem"],       # unique prefixes
    ["--ssl-certfile", "/etc/tls/old.pem", "--ssl-certfile", "/etc/tls/cert.pem", "--ssl-keyfile", "/k"],
    ["--ssl-certfile", "/etc/tls/both.pem"],                       # uvicorn reads the key from the same file
])
def test_tls_makes_the_gate_url_https_without_a_ca_to_verify_against(extra):
    built = build(extra_args=extra)
    assert built["url"] == "https://127.0.0.1:8000"
    assert built["validate_certs"] is False and built["ca_path"] == ""


def test_tls_with_a_ca_gives_the_gate_that_ca():
    built = build(extra_args=["--ssl-certfile", "/c.pem", "--ssl-keyfile", "/k.pem", "--ssl-ca-certs=/etc/tls/ca.pem"])
    assert (built["url"], built["validate_certs"], built["ca_path"]) == (
        "https://127.0.0.1:8000", True, "/etc/tls/ca.pem")


def test_sglang_tls_makes_the_gate_url_https():
    built = build(extra_args=["--ssl-certfile", "/c.pem", "--ssl-keyfile", "/k.pem"], **SGLANG)
    assert built["url"] == "https://127.0.0.1:30000" and built["validate_certs"] is False


def test_plain_http_has_nothing_to_verify():
    built = build()
    assert (built["url"], built["validate_certs"], built["ca_path"]) == ("http://127.0.0.1:8000", True, "")


@pytest.mark.parametrize("extra", [["--root-path", "/api"], ["--root-path=/v1/proxy"], ["--root_path", "/api"]])
def test_vllm_root_path_leaves_the_api_where_the_gate_looks(extra):
    """vLLM sets FastAPI's root_path, and Starlette routes a path that does not start with it
    unchanged: /health and /v1/models still answer at the root."""
    built = build(extra_args=extra)
    assert built["url"] == "http://127.0.0.1:8000"


def test_sglang_fastapi_root_path_leaves_the_api_where_the_gate_looks():
    """SGLang gives uvicorn root_path, which prefixes the path it hands the app: a request to
    /v1/models still routes to /v1/models (and one under the prefix would not)."""
    built = build(extra_args=["--fastapi-root-path", "/api"], **SGLANG)
    assert built["url"] == "http://127.0.0.1:30000"


@pytest.mark.parametrize("extra, message", [
    (["--uds", "/run/vllm.sock"], "--uds makes the server listen on a Unix socket instead of"),
    (["--uds=/run/vllm.sock"], "--uds makes the server listen on a Unix socket instead of"),
    (["--headless"], "--headless runs the engine without an API server"),
    (["--api-server-count", "0"], "--api-server-count 0 runs the engine without an API server"),
    (["-asc", "0"], "--api-server-count 0 runs the engine without an API server"),
    (["--api-server-count=-1"], "--api-server-count -1 runs the engine without an API server"),
    (["--api-server-co", "0"], "--api-server-count 0 runs the engine without an API server"),
    (["--grpc"], "--grpc serves gRPC instead of HTTP"),
    (["--ssl-keyfile", "/k.pem"], "--ssl-keyfile without --ssl-certfile"),
    (["--ssl-certfile", "/c.pem", "--ssl-cert-reqs", "2"], "--ssl-cert-reqs 2 requires a client certificate"),
])
def test_vllm_flags_that_hide_the_api_from_the_gate_are_refused(extra, message):
    text = refused(extra_args=extra)
    assert message in text and "readiness gate" in text


def test_more_api_servers_still_answer_on_the_port():
    assert build(extra_args=["--api-server-count", "4"])["url"] == "http://127.0.0.1:8000"


@pytest.mark.parametrize("extra, message", [
    (["--grpc-mode"], "--grpc-mode serves gRPC instead of HTTP"),
    (["--ssl-keyfile", "/k.pem"], "--ssl-keyfile without --ssl-certfile"),
])
def test_sglang_flags_that_hide_the_api_from_the_gate_are_refused(extra, message):
    text = refused(extra_args=extra, **SGLANG)
    assert message in text and "readiness gate" in text


def test_sglang_key_file_password_is_a_secret_on_the_command_line():
    text = refused(extra_args=["--ssl-certfile", "/c", "--ssl-keyfile", "/k", "--ssl-keyfile-password", SECRET],
                   **SGLANG)
    assert "--ssl-keyfile-password would put a secret on the command line" in text
    assert SECRET not in text


# --- 4. flag pairing: secret and role-owned flags however they are spelled ---------------------

@pytest.mark.parametrize("extra, flag", [
    (["--api-key=" + SECRET], "--api-key"),
    (["--api-key", SECRET], "--api-key"),
    (["--api-k", SECRET], "--api-k"),
    (["--api-k=" + SECRET], "--api-k"),
    (["--api_key=" + SECRET], "--api-key"),
    (["--api-key="], "--api-key"),
    (["--enforce-eager", "--api-key", SECRET], "--api-key"),
    (["--enable-prefix-caching", "--api-key=" + SECRET], "--api-key"),
    (["--api-key", SECRET, "--api-key", SECRET + "2"], "--api-key"),
    (["--api-key", "first", SECRET], "--api-key"),                 # nargs '+': both values consumed
    (["--max-num-seqs", "8", "--api-key", SECRET], "--api-key"),
    (["--chat-template", "--api-key=" + SECRET], "--api-key"),    # argparse reads it as an option, not a value
    (["--api-key", SECRET + "\nExecStartPre=/bin/sh"], "--api-key"),
])
def test_vllm_api_key_in_extra_args_is_refused_without_echoing_it(extra, flag):
    text = refused(extra_args=extra)
    assert "%s would put a secret on the command line" % flag in text
    assert "inference_service_secrets.api_key" in text
    assert SECRET not in text and "first" not in text


@pytest.mark.parametrize("extra", [
    ["--hf-token", SECRET], ["--hf-token=" + SECRET], ["--hf-tok", SECRET], ["--hf_token=" + SECRET],
])
def test_vllm_hf_token_in_extra_args_is_refused_without_echoing_it(extra):
    text = refused(extra_args=extra)
    assert "would put a secret on the command line" in text and "inference_service_secrets.hf_token" in text
    assert SECRET not in text


@pytest.mark.parametrize("extra", [
    ["--api=" + SECRET], ["--api-kez=" + SECRET], ["--api-key.x=" + SECRET], ["--a=" + SECRET],
    ["--api-key", "-" + SECRET], ["--api-key", "--" + SECRET], ["--api-key", "-" + SECRET + "=x"],
    ["--api", "-" + SECRET], ["--api-kez", "--" + SECRET],
])
def test_a_misspelled_secret_flag_does_not_echo_its_value(extra):
    text = refused(extra_args=extra)
    assert SECRET not in text and SECRET[3:] not in text


@pytest.mark.parametrize("extra, secret", [
    (["--api-key=" + SECRET], "api_key"), (["--admin-api-key", SECRET], "admin_api_key"),
    (["--admin-api-key=" + SECRET], "admin_api_key"), (["--admin-api", SECRET], "admin_api_key"),
])
def test_sglang_secret_flags_are_refused_without_echoing_them(extra, secret):
    text = refused(extra_args=extra, **SGLANG)
    assert "inference_service_secrets.%s" % secret in text and SECRET not in text


@pytest.mark.parametrize("extra, owner", [
    (["--port=1"], "inference_service_port"),
    (["--port="], "inference_service_port"),
    (["--enforce-eager", "--port", "1"], "inference_service_port"),
    (["--enable-prefix-caching", "--port=1"], "inference_service_port"),
    (["--port", "1", "--port", "2"], "inference_service_port"),
    (["--ho", "0.0.0.0"], "inference_service_host"),
    (["--host=10.0.0.1"], "inference_service_host"),
    (["--served-model-name=other"], "inference_service_served_name"),
    (["--speculative-config={\"method\": \"ngram\"}"], "inference_service_speculative"),
    (["--speculative_config.method=ngram"], "inference_service_speculative"),
    (["-tp=8"], "inference_service_tensor_parallel_size"),
])
def test_vllm_role_owned_flags_are_refused_however_spelled(extra, owner):
    text = refused(extra_args=extra)
    assert "is set by the role; use %s" % owner in text


def test_a_role_owned_flag_given_twice_is_one_sentence():
    text = refused(extra_args=["--port", "1", "--port", "2"])
    assert text.count("--port is set by the role") == 1


def test_a_role_owned_flag_names_the_flag_not_its_value():
    text = refused(extra_args=["--speculative-config={\"model\": \"" + SECRET + "\"}"])
    assert SECRET not in text


def test_an_item_with_a_control_character_is_named_by_position_not_value():
    text = refused(extra_args=["--max-num-seqs", "8", "--chat-template", SECRET + "\r"])
    assert "inference_service_extra_args item 4 holds a control character" in text and SECRET not in text


@pytest.mark.parametrize("extra, owner", [
    (["--port=1"], "inference_service_port"), (["--tp=2"], "inference_service_tensor_parallel_size"),
    (["--enable-metrics", "--port", "1"], "inference_service_port"), (["--model-path=x"], "inference_service_model"),
])
def test_sglang_role_owned_flags_are_refused_however_spelled(extra, owner):
    assert "is set by the role; use %s" % owner in refused(extra_args=extra, **SGLANG)


def test_a_repeated_engine_option_is_accepted_as_the_engine_accepts_it():
    argv = build(extra_args=["--max-num-seqs", "8", "--max-num-seqs=16"])["argv"]
    assert argv[-3:] == ["--max-num-seqs", "8", "--max-num-seqs=16"]


# --- 5. one problem per line ------------------------------------------------------------------

THREE_PROBLEMS = {"speculative": {"model": "d"}, "extra_args": ["--bogus"], "environment": {"VLLM_PORT": "1"}}


def test_every_problem_is_on_its_own_line():
    lines = refused(**THREE_PROBLEMS).split("\n")
    assert len(lines) == 3
    assert [line for line in lines if "method is required" in line]
    assert [line for line in lines if "--bogus" in line] and [line for line in lines if "VLLM_PORT" in line]


class _Display:
    def __init__(self):
        self.warnings = []

    def warning(self, text):
        self.warnings.append(text)


def _act(**overrides):
    action = ActionModule.__new__(ActionModule)
    action._display = _Display()
    values = settings(**overrides)
    values["flag_dirs"] = [FLAGS]
    values["secrets_set"] = {}
    return action, action.act(values, {}, {})


def test_the_action_fails_with_one_problem_per_line_and_the_report_shows_one_bullet_each():
    with pytest.raises(AnsibleActionFail) as caught:
        _act(**THREE_PROBLEMS)
    reason = str(caught.value.message)
    lines = reason.split("\n")
    assert len(lines) == 3 and lines[0].startswith("inference_service: ")
    # reset_and_serve.yml splits the reason on newlines into the host's problems.
    row = host_row("node1", {"status": "invalid", "ok": False, "problems": reason.split("\n")})
    markdown = render_markdown("reset", "20261129T101500Z", [row]).splitlines()
    bullets = markdown[markdown.index("- node1 (invalid):") + 1:]
    assert len([line for line in bullets if line.startswith("  - ")]) == 3


def test_the_action_returns_the_gate_url_and_its_tls_settings():
    action, result = _act(extra_args=["--ssl-certfile", "/c.pem"])
    assert (result["url"], result["validate_certs"], result["ca_path"]) == ("https://127.0.0.1:8000", False, "")


# --- 6. bounds on absurd values ---------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 10**9}},
     "inference_service_speculative.num_speculative_tokens must be at most 256"),
    ({"model": "m" * 200000}, "inference_service_model is 200000 characters long: at most 4096"),
    ({"served_name": "s" * 100000}, "it is 100000 characters long, at most 256"),
    ({"extra_args": ["--enforce-eager"] * 5000}, "inference_service_extra_args has 5000 items: at most 1024"),
    ({"extra_args": ["--chat-template", "x" * 131072]},
     "inference_service_extra_args item 2 is 131072 bytes long: the kernel refuses"),
    ({"extra_args": ["--chat-template", "\u00e9" * 70000]},
     "inference_service_extra_args item 2 is 140000 bytes long: the kernel refuses"),
    ({"extra_args": ["--enforce-eager"] + ["--chat-template", "x" * 120000] * 10},
     "the command line is 1"),
    ({"environment": {"NCCL_DEBUG": "x" * 200000}}, "inference_service_environment.NCCL_DEBUG is 200000 bytes"),
    ({"max_model_len": 10**12}, "inference_service_max_model_len is 1000000000000: it must be"),
])
def test_absurd_values_are_refused_with_one_short_sentence_each(overrides, message):
    text = refused(**overrides)
    assert message in text
    assert len(text) < 600  # the value is not echoed whole


@pytest.mark.parametrize("spec", [
    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 10**9, "speculative_eagle_topk": 1,
     "speculative_num_draft_tokens": 4},
    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 10**6,
     "speculative_num_draft_tokens": 4},
    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
     "speculative_num_draft_tokens": 2**40},
])
def test_sglang_absurd_draft_sizes_are_refused(spec):
    assert "must be an integer from 1 to 256" in refused(speculative=spec, **SGLANG)


def test_the_largest_published_sglang_tree_is_accepted():
    """SGLang's EAGLE example for Llama: 5 steps, top-8, 64 draft tokens."""
    build(speculative={"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "d",
                       "speculative_num_steps": 5, "speculative_eagle_topk": 8,
                       "speculative_num_draft_tokens": 64}, **SGLANG)


@pytest.mark.parametrize("model", ["m\udcff", "bad\udc80name"])
def test_text_that_is_not_utf8_is_refused(model):
    assert "inference_service_model" in refused(model=model)
    assert "inference_service_extra_args item 2 is not UTF-8 text" in refused(extra_args=["--chat-template", model])


def test_hostile_numbers_in_the_speculative_config_are_refused():
    for value in (math.nan, math.inf, -math.inf, -1, 0):
        assert "num_speculative_tokens" in refused(speculative={"method": "ngram", "num_speculative_tokens": value})


# --- 7. SGLang's algorithm names, as SGLang spells them -------------------------------------------

@pytest.mark.parametrize("given, right", [("eagle3", "EAGLE3"), ("Eagle", "EAGLE"), ("nextn", "NEXTN"),
                                          ("ngram", "NGRAM")])
def test_sglang_algorithm_in_the_wrong_case_is_refused_with_the_right_spelling(given, right):
    text = refused(speculative={"speculative_algorithm": given}, **SGLANG)
    assert "inference_service_speculative.speculative_algorithm %s must be spelled %s" % (given, right) in text


@pytest.mark.parametrize("given", ["MTP", "mtp", "MEDUSA", "medusa"])
def test_sglang_refuses_mtp_and_medusa_and_its_mtp_is_nextn(given):
    text = refused(speculative={"speculative_algorithm": given}, **SGLANG)
    assert "speculative_algorithm %s is not an algorithm of SGLang 0.5.23" % given in text
    assert "NEXTN" in text


def test_sglang_plugin_algorithm_is_still_only_a_warning():
    built = build(speculative={"speculative_algorithm": "MY_PLUGIN_ALGO"}, **SGLANG)
    assert any("must come from a plugin" in warning for warning in built["warnings"])


# --- 8. a server user that others share -----------------------------------------------------------

@pytest.mark.parametrize("user", ["nobody", "nfsnobody"])
def test_running_as_nobody_warns_that_other_daemons_could_read_the_secrets(user):
    warnings = build(user=user)["warnings"]
    assert any(w.startswith("inference_service_user %s is shared" % user) for w in warnings)


def test_a_user_of_its_own_gives_no_warning():
    assert build(user="vllm")["warnings"] == []


def test_serve_config_error_joins_with_newlines():
    assert str(_serve_command.ServeConfigError(["a", "b"])) == "a\nb"


# --- names that ended in a newline passed a `$` anchored check -----------------------------------

@pytest.mark.parametrize("overrides, message", [
    ({"unit": "vllm.service\n"}, "inference_service_unit is 'vllm.service\\n': it must be a service unit name"),
    ({"user": "vllm\n"}, "inference_service_user must be a user name"),
    ({"environment": {"NCCL_DEBUG\n": "WARN"}}, "is not an environment variable name"),
    ({"secrets_set": {"environment": ["WANDB_API_KEY\n"]}}, "is not an environment variable name"),
])
def test_a_name_with_a_trailing_newline_is_refused(overrides, message):
    assert message in refused(**overrides)


@pytest.mark.parametrize("path", ["d\n--port 1", "d\ud800", "d\udcff"])
def test_sglang_speculative_text_with_a_control_character_or_not_utf8_is_refused(path):
    text = refused(speculative={"speculative_algorithm": "EAGLE", "speculative_draft_model_path": path}, **SGLANG)
    assert "speculative_draft_model_path holds a control character or text that is not UTF-8" in text
