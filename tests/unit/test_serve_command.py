"""The engine's command line and environment at the edges (plugin_utils/_serve_command.py,
issue 24): the last valid value of each range is accepted, the user's own settings are kept, and
the readiness gate reads the CA the engine reads."""
from __future__ import annotations

from tests.unit.test_inference_args import build, refused

SGLANG = {"engine": "sglang", "unit": "sglang.service", "port": 30000}


def test_the_highest_port_is_a_port():
    built = build(port=65535)
    assert built["url"] == "http://127.0.0.1:65535"
    assert built["argv"][built["argv"].index("--port") + 1] == "65535"
    assert "inference_service_port is 65536: it must be a TCP port from 1 to 65535." in refused(port=65536)


def test_the_largest_number_of_draft_tokens_is_accepted_and_one_more_is_refused():
    spec = {"method": "ngram", "num_speculative_tokens": 256, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    assert build(speculative=spec)["speculative"]["enabled"]
    assert "num_speculative_tokens must be at most 256" in refused(speculative=dict(spec, num_speculative_tokens=257))


def test_a_relative_ca_is_the_engines_which_runs_in_the_root_directory():
    built = build(extra_args=["--ssl-certfile", "/etc/tls/server.pem", "--ssl-ca-certs", "tls/ca.pem"])
    assert built["url"] == "https://127.0.0.1:8000"
    assert built["ca_path"] == "/tls/ca.pem" and built["validate_certs"]


def test_the_users_cuda_device_order_is_kept_with_a_warning():
    built = build(environment={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert built["environment"]["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert '"CUDA_DEVICE_ORDER=FASTEST_FIRST"' in built["environment_lines"]
    assert any("CUDA_DEVICE_ORDER is FASTEST_FIRST" in warning for warning in built["warnings"])


def test_an_sglang_speculative_switch_set_false_is_written_off_whatever_the_engines_default():
    spec = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "lmsys/EAGLE3-llama",
            "speculative_enable_w4a4_mxfp4_megamoe": False}
    argv = build(speculative=spec, **SGLANG)["argv"]
    assert "--no-speculative-enable-w4a4-mxfp4-megamoe" in argv
    assert "--speculative-enable-w4a4-mxfp4-megamoe" not in argv
