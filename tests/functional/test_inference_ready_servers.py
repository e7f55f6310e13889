"""Issue 42: the several servers of one node looked at in one host contact. inference_ready's probe
takes `servers`, each one more server's options, and answers each in `servers`, in their order, as
its own task would have: each judged by its own look, a look that fails that server's answer alone,
every server's secrets hidden in every answer, and an entry it cannot use refused by its place
before any server is asked."""
from __future__ import annotations

from tests.functional.standin import engine, free_port, node  # noqa: F401  # pylint: disable=unused-import
from tests.run_module import run_module


def server(port, **params):
    return dict({"engine": "vllm", "url": "http://127.0.0.1:%d" % port, "served_name": "llama",
                 "poll_interval": 0.1, "hung_after": 1.5}, **params)


def probe(own, servers, **params):
    return run_module("inference_ready", dict(own, mode="probe", servers=servers, **params))


def finished(served) -> list:
    """The engine's count of requests finished, from its /metrics."""
    return [line for line in served.get("/metrics")[1].decode().splitlines() if line.startswith("vllm:request_success_total")]


def test_each_server_is_judged_by_its_own_look_and_answered_in_its_place(node):  # noqa: F811
    hung_node = dict(node, state=node["tmp"] / "hung.json")  # its own state file, and GPU (below)
    with engine(node, "vllm", ["--served-model-name", "llama"], VLLM_API_KEY="k3y-a") as healthy, \
            engine(hung_node, "vllm", ["--served-model-name", "llama"], STANDIN_FAULT="hung_engine",
                   CUDA_VISIBLE_DEVICES="1") as hung:
        healthy.wait_ready()
        hung.wait_ready()
        refused = free_port()
        others = [server(hung.port), server(refused), server(healthy.port, api_key="k3y-a")]
        result = probe(server(healthy.port, api_key="k3y-a"), others)
    assert result["rc"] == 0 and result["verdict"] == "healthy" and result["needs_reset"] is False, result
    answers = result["servers"]
    assert [answer["verdict"] for answer in answers] == ["hung", "unhealthy", "healthy"], answers
    assert [answer["needs_reset"] for answer in answers] == [True, True, False], answers
    assert answers[0]["last_seen"].startswith("hung: /health answered 200"), answers[0]
    assert "refused" in answers[1]["last_seen"], answers[1]
    # Each look made its own 1-token completion: the hung one's was sent there, not to the healthy one.
    assert answers[0]["generation"]["answered"] is False and answers[2]["generation"]["answered"] is True
    assert "k3y-a" not in str(result)


def test_a_look_that_fails_is_that_servers_answer_and_the_others_are_still_looked_at(node, tmp_path):  # noqa: F811
    # systemctl that cannot answer: the unit's state cannot be read for the server that names one.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    (bin_dir / "systemctl").chmod(0o755)
    with engine(node, "vllm", ["--served-model-name", "llama"]) as healthy:
        healthy.wait_ready()
        result = run_module("inference_ready", dict(server(healthy.port), mode="probe", servers=[
            server(healthy.port, unit="vllm-b.service"), server(healthy.port)]),
            env={"PATH": "%s:/usr/bin:/bin" % bin_dir})
        # The task's own server's look fails too: the task fails, with the others' answers.
        own_failed = run_module("inference_ready", dict(server(healthy.port, unit="vllm-a.service"), mode="probe",
                                                        servers=[server(healthy.port)]),
                                env={"PATH": "%s:/usr/bin:/bin" % bin_dir})
    assert result["rc"] == 0 and result["verdict"] == "healthy", result
    failed, other = result["servers"]
    assert failed["failed"] is True and failed["msg"] == "systemctl show vllm-b.service failed: Failed to connect to bus", failed
    assert "verdict" not in failed
    assert other["verdict"] == "healthy" and not other.get("failed"), other
    assert own_failed["rc"] == 1 and own_failed["msg"].startswith("systemctl show vllm-a.service failed"), own_failed
    assert [answer["verdict"] for answer in own_failed["servers"]] == ["healthy"], own_failed


def test_every_servers_secrets_are_hidden_in_every_answer(node):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"]) as served:
        served.wait_ready()
        # The other server's URL holds its secret; its refusal quotes the URL, and the task's own server
        # (whose secrets it is not) is looked at with it.
        refused = free_port()
        other = dict(server(refused), url="http://127.0.0.1:%d/sEcr3t-b" % refused, secrets=["sEcr3t-b"])
        result = probe(server(served.port), [other])
    assert result["rc"] == 0 and result["servers"][0]["verdict"] == "unhealthy", result
    assert "sEcr3t-b" not in str(result), result


def test_an_entry_it_cannot_use_is_refused_by_its_place_before_any_server_is_asked(node):  # noqa: F811
    with engine(node, "vllm", ["--served-model-name", "llama"]) as served:
        served.wait_ready()
        asked_before = finished(served)
        result = probe(server(served.port), [server(served.port, url="ftp://127.0.0.1:1"),
                                             {"engine": "vllm", "served_name": "llama"},
                                             server(served.port, unit="vllm-d.service", poll_interval=-1),
                                             server(served.port, mode="gate", xid={}), server(served.port, bogus=1)])
        asked_after = finished(served)
    assert result["rc"] == 1 and result["failed"] is True, result
    msg = result["msg"]
    assert "servers[0]: url must be http(s)://host[:port][/root/path]" in msg, msg
    assert "servers[1]: missing required arguments: url" in msg, msg
    assert "servers[2] (vllm-d.service): poll_interval" in msg, msg
    assert "servers[3]: mode, xid are the task's alone, not a server's" in msg, msg
    assert "servers[4]: no such option: bogus" in msg, msg
    assert "servers" not in result and asked_after == asked_before
