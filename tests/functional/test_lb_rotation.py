"""Issue 40, 1: cleanslate.gpu.lb_rotation through its real entry point against Debian's HAProxy
(tests/haproxy.py) in front of two local HTTP servers, one of which holds /slow open until the
test lets it answer; what HAProxy did is read from its own `show stat`. The hooks run a real
program and POST to a real local HTTP server."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.haproxy import SLOW_BODY, HAProxy, Upstream
from tests.run_module import run_module

SECRET = "s3cr3t-t0ken-value"


@pytest.fixture
def lb(tmp_path):
    ups = {"node1": Upstream("node1"), "node2": Upstream("node2")}
    box = HAProxy(tmp_path, {name: "127.0.0.1:%d" % up.port for name, up in ups.items()}, checks=False,
                  slow_server="node1")
    box.upstreams = ups
    try:
        yield box
    finally:
        box.stop()
        for up in ups.values():
            up.stop()


def rotate(lb, tmp_path, state, server="node1", check=False, diff=False, **params):
    args = dict({"server": server, "backend": "vllm", "state": state, "socket": lb.socket,
                 "marker_dir": str(tmp_path / "markers")}, **params)
    return run_module("lb_rotation", args, check=check, diff=diff)


def admin(lb, server="node1") -> str:
    status = lb.stat()[server]["status"]
    return "maint" if status.startswith("MAINT") else "drain" if status == "DRAIN" else "ready"


def wait_for(predicate, what):
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def slow_request(lb):
    """Open /slow on node1 in a thread; returns the thread and where its answer lands."""
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(zip(("status", "body"), lb.get("/slow"))), daemon=True)
    thread.start()
    assert lb.upstreams["node1"].entered.wait(60), "the slow request never reached node1"
    return thread, answer


def test_out_drains_until_the_open_request_ends_then_maint_and_in_puts_it_back(lb, tmp_path):
    client, answer = slow_request(lb)
    outcome = {}
    module = threading.Thread(target=lambda: outcome.update(rotate(lb, tmp_path, "out", drain_timeout_s=120)))
    module.start()
    wait_for(lambda: admin(lb) != "ready", "HAProxy never left node1 ready")
    # Drain first: the open request goes on, new requests go to the other server.
    assert admin(lb) == "drain" and lb.stat()["node1"]["scur"] == "1", lb.stat()["node1"]
    assert [lb.get("/")[1] for dummy in range(4)] == ["node2"] * 4
    lb.upstreams["node1"].release()
    module.join(120)
    client.join(60)
    assert outcome["rc"] == 0 and outcome["changed"], outcome
    assert (outcome["state_before"], outcome["state_after"], outcome["sessions_at_maint"]) == ("ready", "maint", 0), outcome
    assert outcome["taken_out_by_us"] is False
    assert answer == {"status": 200, "body": SLOW_BODY}  # the slow client got its whole answer
    assert admin(lb) == "maint"
    assert rotate(lb, tmp_path, "out")["changed"] is False  # a second run changes nothing
    back = rotate(lb, tmp_path, "in", diff=True)
    assert back["changed"] and back["taken_out_by_us"] and back["state_after"] == "ready", back
    assert back["diff"] == {"before": "vllm/node1: maint\n", "after": "vllm/node1: ready\n"}
    assert admin(lb) == "ready"
    again = rotate(lb, tmp_path, "in")
    assert again["rc"] == 0 and again["changed"] is False, again


def test_past_the_drain_timeout_it_goes_to_maint_and_counts_the_sessions_cut(lb, tmp_path):
    client, dummy = slow_request(lb)
    result = rotate(lb, tmp_path, "out", drain_timeout_s=1)
    lb.upstreams["node1"].release()
    client.join(60)
    assert result["rc"] == 0 and result["state_after"] == "maint", result
    assert result["sessions_at_maint"] >= 1 and result["drained_s"] >= 1, result
    assert admin(lb) == "maint"


def test_check_mode_reports_the_change_and_sends_none(lb, tmp_path):
    result = rotate(lb, tmp_path, "out", check=True)
    assert result["rc"] == 0 and result["changed"] and result["state_after"] == "maint", result
    assert admin(lb) == "ready" and not (tmp_path / "markers").exists()
    lb.command("set server vllm/node1 state maint")
    result = rotate(lb, tmp_path, "in", check=True)
    assert result["changed"] and result["state_before"] == "maint" and admin(lb) == "maint", result


def test_restored_puts_back_only_what_it_took_out(lb, tmp_path):
    lb.command("set server vllm/node1 state maint")  # someone else's maintenance
    assert rotate(lb, tmp_path, "out")["changed"] is False  # not ours: no marker
    result = rotate(lb, tmp_path, "restored")
    assert result["rc"] == 0 and result["changed"] is False and result["taken_out_by_us"] is False, result
    assert admin(lb) == "maint"
    lb.command("set server vllm/node1 state ready")
    assert rotate(lb, tmp_path, "out")["changed"] and admin(lb) == "maint"
    result = rotate(lb, tmp_path, "restored")
    assert result["changed"] and result["taken_out_by_us"] and admin(lb) == "ready", result
    assert rotate(lb, tmp_path, "restored")["changed"] is False  # the marker went with it
    # An operator's drain (a server being emptied by hand): taken out for the reset, but not ours
    # to put back.
    lb.command("set server vllm/node1 state drain")
    result = rotate(lb, tmp_path, "out")
    assert result["changed"] and result["taken_out_by_us"] is False and admin(lb) == "maint", result
    result = rotate(lb, tmp_path, "restored")
    assert result["changed"] is False and admin(lb) == "maint", result


def rotate_both(lb, tmp_path, state, servers=("node1", "node2"), check=False, diff=False, **params):
    args = dict({"servers": list(servers), "backend": "vllm", "state": state, "socket": lb.socket,
                 "marker_dir": str(tmp_path / "markers")}, **params)
    return run_module("lb_rotation", args, check=check, diff=diff)


def test_several_servers_drain_side_by_side_each_to_maint_as_its_own_sessions_end(lb, tmp_path):
    client, answer = slow_request(lb)
    outcome = {}
    module = threading.Thread(target=lambda: outcome.update(rotate_both(lb, tmp_path, "out", drain_timeout_s=120)))
    module.start()
    # node2 has no session: it is in maintenance while node1, first in the list, still drains its open request
    # (a drain of one server after the other would hold node2 ready, taking traffic, all that time).
    wait_for(lambda: admin(lb, "node2") == "maint", "node2 never went to maintenance while node1 drained")
    assert admin(lb) == "drain" and lb.stat()["node1"]["scur"] == "1", lb.stat()["node1"]
    assert module.is_alive()
    lb.upstreams["node1"].release()
    module.join(120)
    client.join(60)
    assert outcome["rc"] == 0 and outcome["changed"], outcome
    first, second = outcome["servers"]
    assert (first["server"], first["state_before"], first["state_after"], first["sessions_at_maint"]) == (
        "node1", "ready", "maint", 0), first
    assert (second["server"], second["state_after"], second["drained_s"]) == ("node2", "maint", 0.0), second
    assert first["drained_s"] > second["drained_s"] and answer == {"status": 200, "body": SLOW_BODY}
    assert outcome["msg"] == "vllm/node1 drained in %s s and is in maintenance; vllm/node2 drained in 0.0 s and is in " \
        "maintenance" % first["drained_s"], outcome["msg"]
    again = rotate_both(lb, tmp_path, "out")
    assert again["changed"] is False and [one["changed"] for one in again["servers"]] == [False, False], again
    back = rotate_both(lb, tmp_path, "restored", diff=True)
    assert back["changed"] and [one["taken_out_by_us"] for one in back["servers"]] == [True, True], back
    assert back["diff"] == {"before": "vllm/node1: maint\nvllm/node2: maint\n", "after": "vllm/node1: ready\nvllm/node2: ready\n"}
    assert admin(lb) == admin(lb, "node2") == "ready" and os.listdir(tmp_path / "markers") == []


def test_several_servers_past_the_drain_timeout_go_to_maint_together_after_one_wait(lb, tmp_path):
    client, dummy = slow_request(lb)
    lb.command("set server vllm/node2 state maint")  # an operator's maintenance: left as it is, not marked ours
    result = rotate_both(lb, tmp_path, "out", servers=("node2", "node1"), drain_timeout_s=1)
    lb.upstreams["node1"].release()
    client.join(60)
    kept, cut = result["servers"]
    assert result["rc"] == 0 and (kept["changed"], kept["msg"]) == (False, "vllm/node2 is in maintenance already"), result
    assert cut["sessions_at_maint"] == 1 and cut["drained_s"] >= 1, cut
    assert cut["msg"] == "vllm/node1 still had 1 sessions after 1 s of drain: put in maintenance, cutting them"
    assert os.listdir(tmp_path / "markers") == ["vllm%2Fnode1"]


def test_several_servers_with_one_haproxy_lacks_change_none(lb, tmp_path):
    result = rotate_both(lb, tmp_path, "out", servers=("node1", "node9"))
    assert result["rc"] != 0 and result["msg"] == "HAProxy's backend vllm has no server node9", result
    assert [one["changed"] for one in result["servers"]] == [False, False] and admin(lb) == "ready"
    assert not (tmp_path / "markers").exists()
    would = rotate_both(lb, tmp_path, "out", check=True, diff=True)
    assert would["changed"] and would["diff"]["after"] == "vllm/node1: maint\nvllm/node2: maint\n", would
    assert admin(lb) == admin(lb, "node2") == "ready" and not (tmp_path / "markers").exists()
    for servers, sentence in (([], "servers is empty: name at least one server"),
                              (["node1", "node1"], "servers lists 'node1' twice"),
                              (["node1", "node2;disable frontend api"], "servers[1] 'node2;disable frontend api': it is not a HAProxy name")):
        refused = rotate_both(lb, tmp_path, "out", servers=servers)
        assert refused["rc"] != 0 and refused["msg"].startswith(sentence), refused
    both = run_module("lb_rotation", {"server": "node1", "servers": ["node2"], "backend": "vllm", "state": "out",
                                      "socket": lb.socket, "marker_dir": str(tmp_path / "markers")})
    assert both["rc"] != 0 and "mutually exclusive" in both["msg"], both
    assert admin(lb) == admin(lb, "node2") == "ready" and lb.stat()["fe"]["status"] == "OPEN"


@pytest.mark.parametrize("option, name", [
    ("backend", "vllm;disable frontend fe"), ("backend", "vllm\ndisable frontend fe"),
    ("server", "node1;disable frontend fe"), ("server", "node1\u2003x"), ("server", "{{ lookup('pipe', 'id') }}")])
def test_a_name_that_is_no_haproxy_name_never_reaches_the_socket(lb, tmp_path, option, name):
    result = rotate(lb, tmp_path, "out", **{option: name})
    assert result["rc"] != 0 and "is not a HAProxy name" in result["msg"] and option in result["msg"], result
    assert lb.stat()["fe"]["status"] == "OPEN" and admin(lb) == "ready"


def test_each_failure_is_one_sentence(lb, tmp_path):
    missing = rotate(lb, tmp_path, "out", socket=str(tmp_path / "nothing.sock"))
    assert missing["rc"] != 0 and missing["msg"].startswith("there is no HAProxy socket at"), missing
    (tmp_path / "file").write_text("")
    assert "is not a socket" in rotate(lb, tmp_path, "out", socket=str(tmp_path / "file"))["msg"]
    assert rotate(lb, tmp_path, "out", backend="sglang")["msg"] == "HAProxy has no backend sglang"
    assert rotate(lb, tmp_path, "in", server="node9")["msg"] == "HAProxy's backend vllm has no server node9"
    assert rotate(lb, tmp_path, "restored", backend="sglang")["msg"] == "HAProxy has no backend sglang"
    with socket.socket(socket.AF_UNIX) as mute:  # accepts connections (its backlog) and never answers
        mute.bind(str(tmp_path / "mute.sock"))
        mute.listen(4)
        late = rotate(lb, tmp_path, "out", socket=str(tmp_path / "mute.sock"), timeout_s=0.5)
    assert late["msg"] == "HAProxy did not answer `show servers state vllm` on %s within 0.5 s" % (tmp_path / "mute.sock")
    assert admin(lb) == "ready" and admin(lb, "node2") == "ready"


HOOK = """#!/bin/sh
printf '%s\\n' "$@" > "{record}"
[ "$3" = fail ] || [ "$5" = fail ] || exit 0
echo "the balancer refused $2 for $4" >&2
exit 3
"""


def test_the_command_hook_gets_the_transition_and_server_and_its_failure_is_masked(tmp_path):
    record, hook = tmp_path / "argv", tmp_path / "lb-hook"
    hook.write_text(HOOK.format(record=record))
    hook.chmod(0o755)
    base = {"balancer": "command", "server": "node1-vllm-a", "marker_dir": str(tmp_path / "markers")}
    result = run_module("lb_rotation", dict(base, state="out", command=[str(hook), "--token", SECRET]))
    assert result["rc"] == 0 and result["changed"] and result["state_after"] == "unknown", result
    assert record.read_text().split("\n")[:4] == ["--token", SECRET, "out", "node1-vllm-a"]
    record.unlink()
    assert run_module("lb_rotation", dict(base, state="out", command=[str(hook)]), check=True)["changed"]
    assert not record.exists()  # check mode runs no hook
    restored = run_module("lb_rotation", dict(base, state="restored", command=[str(hook)]))
    assert restored["changed"] and restored["taken_out_by_us"] and record.read_text().split() == ["in", "node1-vllm-a"]
    record.unlink()
    assert run_module("lb_rotation", dict(base, state="restored", command=[str(hook)]))["changed"] is False
    assert not record.exists()  # no marker: nothing run
    failed = run_module("lb_rotation", dict(base, state="in", command=[str(hook), "--token", SECRET, "fail"]))
    assert failed["rc"] != 0 and "exited with 3: the balancer refused ******** for in" in failed["msg"], failed
    assert failed["changed"] is False  # a hook that failed changed nothing this module can vouch for
    # Several servers: the hook once each, in order; the one it refused is not counted as moved.
    several = run_module("lb_rotation", {"balancer": "command", "servers": ["node1-vllm-b", "fail"], "state": "out",
                                         "command": [str(hook), "x"], "marker_dir": base["marker_dir"]})
    assert several["rc"] != 0 and record.read_text().split() == ["x", "out", "fail"], several
    assert [(one["server"], one["changed"]) for one in several["servers"]] == [("node1-vllm-b", True), ("fail", False)]
    assert several["servers"][0]["msg"] == "the command hook took node1-vllm-b out of rotation", several
    # Ansible echoes a module's arguments (invocation); what the module itself says never holds the secret.
    assert SECRET not in json.dumps({key: value for key, value in failed.items() if key != "invocation"})
    (tmp_path / "plain").write_text("")
    plain = run_module("lb_rotation", dict(base, state="in", command=[str(tmp_path / "plain")]))
    assert plain["msg"] == "the hook command %s is not executable" % (tmp_path / "plain")
    gone = run_module("lb_rotation", dict(base, state="in", command=[str(tmp_path / "none")]))
    assert gone["msg"] == "the hook command %s does not exist" % (tmp_path / "none")


@pytest.mark.skipif(os.geteuid() != 0, reason="the rule is root's: as another user the hook runs as that user")
def test_root_never_runs_a_hook_another_user_could_have_replaced(tmp_path):
    record, hook = tmp_path / "argv", tmp_path / "lb-hook"
    hook.write_text(HOOK.format(record=record))
    base = {"balancer": "command", "server": "node1-vllm-a", "state": "out", "marker_dir": str(tmp_path / "markers"),
            "command": [str(hook)]}
    for change in (lambda: hook.chmod(0o777), lambda: (hook.chmod(0o755), os.chown(hook, 65534, 65534))):
        change()
        result = run_module("lb_rotation", base)
        assert result["rc"] != 0 and result["msg"].startswith("the hook command %s is not run as root: " % hook), result
        assert not record.exists()  # never run
    hook.chmod(0o755)
    os.chown(hook, 0, 0)
    assert run_module("lb_rotation", base)["rc"] == 0 and record.exists()


def test_the_http_hook_posts_the_transition_and_never_shows_its_header(tmp_path):
    seen, answers = [], [204, 500]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  # http.server's naming
            seen.append((json.loads(self.rfile.read(int(self.headers["Content-Length"]))), self.headers["Authorization"]))
            self.send_response(answers.pop(0))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        params = {"balancer": "http", "server": "node1-vllm-a", "backend": "vllm", "marker_dir": str(tmp_path / "m"),
                  "url": "http://127.0.0.1:%d/api/rotation" % server.server_address[1],
                  "headers": {"Authorization": "Bearer " + SECRET}}
        done = run_module("lb_rotation", dict(params, state="out"))
        failed = run_module("lb_rotation", dict(params, state="in"))
        numeric = run_module("lb_rotation", dict(params, state="in", headers={"X-Retries": 3}))
    finally:
        server.shutdown()
        server.server_close()
    assert done["rc"] == 0 and done["changed"], done
    assert seen == [({"server": "node1-vllm-a", "state": "out", "backend": "vllm"}, "Bearer " + SECRET),
                    ({"server": "node1-vllm-a", "state": "in", "backend": "vllm"}, "Bearer " + SECRET)]
    assert failed["rc"] != 0 and failed["msg"].endswith("answered HTTP 500"), failed
    assert SECRET not in json.dumps(done) + json.dumps(failed)
    assert numeric["rc"] != 0 and numeric["msg"] == "headers: each value must be a string" and len(seen) == 2, numeric
