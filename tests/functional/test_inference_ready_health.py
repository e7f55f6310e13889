"""The gate's look at the health endpoint, against fake engines (tests/functional/fake_engines.py)
run as real processes on 127.0.0.1: a slow answer is not a dead server, and the URL it is given
is the only place a request goes."""
from __future__ import annotations

import socket
import subprocess
import threading

import pytest

from tests.functional.fake_engines import fake_engine, serving
from tests.run_module import run_module


def look(port, **params):
    args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "mode": "probe",
            "poll_interval": 0.1}
    args.update(params)
    return run_module("inference_ready", args)


def test_a_health_endpoint_slower_than_health_timeout_is_slow_not_unhealthy():
    with fake_engine({"/health": {"delay": 3}}) as port:
        result = look(port, health_timeout=0.5)
    assert result["rc"] == 0 and result["verdict"] == "slow" and result["healthy"] is False, result
    assert result["last_seen"] == "/health accepted the connection but gave no answer within 0.5 s"
    assert result["polls"] == 2  # a second look before the verdict


def test_a_closed_port_is_unhealthy_and_says_connection_refused():
    with fake_engine({}) as port:
        pass  # the port is closed again
    result = look(port, health_timeout=0.5)
    assert result["rc"] == 0 and result["verdict"] == "unhealthy" and result["last_seen"] == "connection refused"
    assert result["polls"] == 2


def test_vllm_answering_health_in_6_s_is_healthy_with_the_default_timeout():
    with fake_engine({"/health": {"delay": 6}}) as port:
        result = look(port)
    assert result["rc"] == 0 and result["verdict"] == "healthy" and result["healthy"] is True, result
    # Then one real 1-token completion (issue 37: a hung engine keeps /health at 200); this fake has none.
    assert result["last_seen"].startswith("HTTP 200; a 1-token completion answered HTTP 404 in ") and result["polls"] == 1


def test_gate_mode_waits_through_a_slow_health_answer():
    with fake_engine(dict(serving(), **{"/health": {"delay": 1}})) as port:
        # Gate mode: a slow health answer is "not ready yet", polled again, never a failure.
        result = look(port, mode="gate", health_timeout=0.2, wait=0.5)
    assert result["rc"] == 0 and result["state"] == "waiting" and result["verdict"] == "slow", result


@pytest.fixture
def recorder():
    """A listening socket on 127.0.0.1 that nothing should reach; yields (port, connections)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)

        def connections():
            listener.setblocking(False)
            found = 0
            while True:  # every connection the kernel completed for us, whether accepted or not
                try:
                    listener.accept()[0].close()
                except BlockingIOError:
                    return found
                found += 1
        yield listener.getsockname()[1], connections


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:1@127.0.0.1:{port}",  # the Bearer key would go to the host after @
    "http://user:pass@127.0.0.1:{port}",
    "http://127.0.0.1:{port}#frag",
    "http://127.0.0.1:{port}/root?x=1",
    "http://127.0.0.1:{port}/ root",
    "http://127.0.0.1:{port}\\@127.0.0.1",
    "http://127.0.0.1_x:{port}",
    "http://127.0.0.1:{port}:{port}",
    "ftp://127.0.0.1:{port}",
])
def test_a_url_that_does_not_parse_as_host_port_and_path_sends_nothing(recorder, url):
    port, connections = recorder
    url = url.format(port=port)
    for mode in ("gate", "probe"):
        result = look(port, url=url, mode=mode, api_key="k3y", wait=0.3)
        assert result["rc"] == 1 and result["msg"].startswith("url must be http(s)://host[:port][/root/path]"), result
        assert "pass" not in result["msg"] and "k3y" not in str(result)
    assert connections() == 0


def test_a_server_under_a_root_path_is_gated_there():
    routes = {"/serve/llama" + path: route for path, route in serving().items()}
    with fake_engine(routes) as port:
        result = look(port, url="http://127.0.0.1:%d/serve/llama/" % port, mode="gate", wait=5, completions=1)
    assert result["rc"] == 0 and result["state"] == "ready" and result["models"] == ["llama"], result


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (cert, key)."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def test_https_checks_the_certificate_unless_told_which_ca_or_not_to(certificate):
    cert, key = certificate
    with fake_engine(serving(), tls={"cert": cert, "key": key}) as port:
        url = "https://127.0.0.1:%d" % port
        refused = look(port, url=url)
        trusted = look(port, url=url, ca_path=cert)
        unchecked = look(port, url=url, validate_certs=False)
    assert refused["rc"] == 0 and refused["verdict"] == "unhealthy", refused
    assert "CERTIFICATE_VERIFY_FAILED" in refused["last_seen"] or "certificate" in refused["last_seen"]
    assert trusted["verdict"] == "healthy" and unchecked["verdict"] == "healthy", (trusted, unchecked)


def test_sglang_answering_health_in_12_s_is_healthy_with_its_default_timeout():
    # SGLang's /health runs a one-token generation, up to 20 s under load: not a slow server.
    with fake_engine({"/health": {"delay": 12}, "/ready": {}}) as port:
        result = look(port, engine="sglang")
    assert result["rc"] == 0 and result["verdict"] == "healthy" and result["polls"] == 1, result


def test_a_redirect_is_not_health_and_is_never_followed_with_the_key(recorder):
    # A proxy or another service answering the port with a redirect: not the engine; the Bearer
    # key must not follow the redirect to where it points.
    elsewhere, connections = recorder
    away = {"status": 302, "headers": {"Location": "http://127.0.0.1:%d/health" % elsewhere}}
    with fake_engine({"/health": away}) as port:
        probe = look(port, api_key="k3y", health_timeout=1)
    with fake_engine(dict(serving(), **{"/v1/models": away})) as port:
        gated = look(port, api_key="k3y", mode="gate", wait=5, request_timeout=1)
    assert probe["rc"] == 0 and probe["verdict"] == "unhealthy" and probe["last_seen"] == "/health HTTP 302", probe
    assert gated["rc"] == 1 and gated["msg"].startswith("GET /v1/models answered HTTP 302"), gated
    assert connections() == 0


def test_a_proxy_in_the_hosts_environment_is_never_used(recorder):
    # http_proxy set on the host (for pip, say): the probes and the key still go straight to the server.
    proxy, connections = recorder
    env = {name: "http://127.0.0.1:%d" % proxy for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY")}
    env.update(no_proxy="", NO_PROXY="")
    with fake_engine(serving()) as port:
        args = {"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama", "api_key": "k3y",
                "health_timeout": 1, "request_timeout": 1, "wait": 5, "completions": 1}
        probe = run_module("inference_ready", dict(args, mode="probe"), env=env)
        gated = run_module("inference_ready", args, env=env)
    assert probe["verdict"] == "healthy" and gated["rc"] == 0 and gated["state"] == "ready", (probe, gated)
    assert connections() == 0


@pytest.fixture
def fails_then_hangs():
    """A server on 127.0.0.1 whose first answer is HTTP 503 and which then accepts connections and
    never answers (an engine that errored, then wedged); yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []

    def serve():
        first = True
        while True:
            try:
                conn = listener.accept()[0]
            except OSError:
                return  # closed by the test
            if first:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
                first = False
            else:
                held.append(conn)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_a_server_that_failed_then_stopped_answering_is_unhealthy_not_slow(fails_then_hangs):
    # Slow means slow on both looks; a server that just answered 503 and now hangs is broken.
    result = look(fails_then_hangs, health_timeout=0.5, poll_interval=0.5)
    assert result["rc"] == 0 and result["verdict"] == "unhealthy" and result["polls"] == 2, result
    assert result["healthy"] is False
