"""The load balancer settings (inference_service_rotation, issue 40), checked before any host is
touched: every fault one sentence, a name that would carry another command over HAProxy's line
protocol refused before the reset stops anything; the servers a transition applies to; and what
the result and report say of a server taken out and not put back."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import inference_service_problems, spec
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_instances import inference_service_instances
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_result import (inference_service_report_row,
                                                                                        inference_service_result)
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_rotation import (
    inference_service_rotation_by_balancer, inference_service_rotation_servers, inference_service_rotation_steps)
from ansible_collections.cleanslate.gpu.plugins.module_utils._rotation_names import name_fault

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = {"host": "lb1", "backend": "vllm"}


def problems(rotation, server=""):
    found = inference_service_problems({"inference_service_rotation": rotation, "inference_service_rotation_server": server})
    return [line for line in found if "rotation" in line]


def test_no_balancer_and_a_whole_one_pass():
    assert problems({}) == []
    assert problems(dict(HAPROXY, socket="/run/haproxy/admin.sock", drain_timeout_s=0, timeout_s=5,
                         marker_dir="/var/lib/x"), "node1-a") == []
    assert problems({"balancer": "command", "host": "localhost", "command": ["/usr/local/bin/lb", "--pool", "a"]}) == []
    assert problems({"balancer": "http", "host": "lb1", "url": "https://lb/api", "headers": {"X-Token": "t"}}) == []


@pytest.mark.parametrize("name", [
    "a;shutdown sessions server vllm/b", "a;disable", "a b", "a\nset server x/y state maint", "a\u2003b", "{{ lookup('pipe','id') }}",
    "", "n\u00f6de", "a#b", "a'b", 'a"b', "a\\b", "x" * 256, "a\x00b", "a\tb"])
def test_a_name_that_could_carry_another_command_is_refused_in_one_sentence(name):
    found = problems(dict(HAPROXY, backend=name)) if name else problems(dict(HAPROXY, backend="vllm"), name)
    if not name:  # the unset server name is the host's, checked by the module where it runs
        assert found == []
        return
    assert len(found) == 1 and found[0].startswith("inference_service_rotation.backend is "), found
    assert len(problems(HAPROXY, name)) == 1 and problems(HAPROXY, name)[0].startswith("inference_service_rotation_server is ")
    assert "\n" not in found[0]


def test_plain_names_pass_the_name_rule_and_a_hook_takes_more():
    for name in ("node1", "gpu-node-07.dc1", "vllm_a:8001"):
        assert name_fault(name) is None and name_fault(name, "http") is None, name
    for name in ("be/1", "a@b%c$d"):  # HAProxy's config refuses them; a hook's argument takes them
        assert name_fault(name) and name_fault(name, "command") is None, name
    assert name_fault("a;b", "command") and name_fault("a b", "http")


def test_each_fault_is_named_once():
    found = problems({"balancer": "haproxy", "host": "lb1", "bogus": 1, "drain_timeout_s": -1, "timeout_s": True,
                      "socket": "admin.sock"})
    assert found == [
        "inference_service_rotation.bogus: unknown key; the keys are balancer, host, backend, socket, drain_timeout_s, "
        "command, url, headers, timeout_s, marker_dir.",
        "inference_service_rotation.backend is missing: the haproxy balancer needs it.",
        'inference_service_rotation.socket is "admin.sock": a path must be absolute (start with /).',
        "inference_service_rotation.drain_timeout_s is -1: it must be a whole number of seconds from 0 to 3600.",
        "inference_service_rotation.timeout_s is true: it must be a whole number of seconds from 1 to 3600."]


@pytest.mark.parametrize("rotation, words", [
    ({"backend": "vllm"}, "inference_service_rotation.host is missing"),
    ({"balancer": "nginx", "host": "lb1"}, 'inference_service_rotation.balancer is "nginx": it must be one of haproxy, command, http.'),
    ({"balancer": "command", "host": "lb1"}, "inference_service_rotation.command is missing"),
    ({"balancer": "command", "host": "lb1", "command": "/bin/hook out"},
     'inference_service_rotation.command is "/bin/hook out": it must be a list of texts'),
    ({"balancer": "command", "host": "lb1", "command": ["/bin/hook", 3]}, "it must be a list of texts"),
    ({"balancer": "http", "host": "lb1", "url": "file:///etc/passwd"}, "it must start with http:// or https://"),
    ({"balancer": "http", "host": "lb1", "url": "https://lb", "headers": ["X-Token: s3cr3t"]},
     "inference_service_rotation.headers is (hidden)"),
    (dict(HAPROXY, drain_timeout_s=float("nan")), "drain_timeout_s is NaN"),
    (dict(HAPROXY, drain_timeout_s=3601), "from 0 to 3600"),
    (dict(HAPROXY, host=7), "inference_service_rotation.host is 7: it must be text."),
])
def test_a_bad_setting_is_one_sentence(rotation, words):
    found = problems(rotation)
    assert len(found) == 1 and words in found[0], found
    assert "s3cr3t" not in found[0]


@pytest.mark.parametrize("value", ["lb1:vllm", None, ["lb1"], 0])
def test_a_rotation_that_is_no_mapping_is_the_type_checks_sentence_alone(value):
    found = problems(value)
    assert len(found) == 1 and found[0].startswith("inference_service_rotation is ") and "mapping" in found[0], found


def variables(*instances, **changes):
    defaults = yaml.safe_load((ROOT / "roles" / "inference_service" / "defaults" / "main.yml").read_text())
    values = {name: defaults[name] for name in spec()}
    values.update(inference_service_model="/models/llama", inference_service_instances=list(instances),
                  inference_service_rotation=HAPROXY)
    values.update(changes)
    return values


def instance(letter, gpus, **more):
    return dict({"unit": "vllm-%s.service" % letter, "port": 8000 + ord(letter) - 96,
                 "environment": {"CUDA_VISIBLE_DEVICES": gpus}}, **more)


def test_instances_behind_one_balancer_need_their_own_server_names():
    found = inference_service_instances(variables(instance("a", "0"), instance("b", "1")))["problems"]
    assert found == ["inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] (vllm-b.service) "
                     "share the balancer's server name (unset: the host's name): each instance behind a balancer needs "
                     "its own rotation_server."], found
    found = inference_service_instances(variables(instance("a", "0", rotation_server="n1-a"),
                                                  instance("b", "1", rotation_server="n1-a")))["problems"]
    assert len(found) == 1 and "share the balancer's server name n1-a" in found[0], found
    # One not behind a balancer (its own rotation {}) shares nothing.
    resolved = inference_service_instances(variables(instance("a", "0"), instance("b", "1", rotation={})))
    assert resolved["problems"] == [], resolved["problems"]


def test_an_instances_bad_server_name_is_named_by_its_instance():
    found = inference_service_instances(variables(instance("a", "0", rotation_server="n1-a"),
                                                  instance("b", "1", rotation_server="n1 b")))["problems"]
    assert len(found) == 1 and found[0].startswith("inference_service_instances[1] (vllm-b.service).rotation_server is "), found


def test_the_servers_of_a_transition_are_those_behind_a_balancer_of_the_units_named():
    resolved = inference_service_instances(variables(instance("a", "0", rotation_server="n1-a"),
                                                     instance("b", "1", rotation_server="n1-b"),
                                                     instance("c", "2", rotation={})))["instances"]
    assert [(s["unit"], s["server"]) for s in inference_service_rotation_servers(resolved, "node1")] == [
        ("vllm-a.service", "n1-a"), ("vllm-b.service", "n1-b")]
    assert [s["server"] for s in inference_service_rotation_servers(resolved, "node1", units=["vllm-b.service",
                                                                                              "vllm-c.service"])] == ["n1-b"]
    # Nothing to reset: nobody leaves rotation (not "every server", which units=None means).
    assert inference_service_rotation_servers(resolved, "node1", units=[]) == []
    one = [{"unit": "vllm.service", "rotation": HAPROXY, "rotation_server": ""}]
    assert inference_service_rotation_servers(one, "node7")[0]["server"] == "node7"


GATE = {"status": "ready", "reason": "", "ready_s": 3.0, "unit": {"MainPID": "42"}}
ITEM = {"rotation": HAPROXY, "servers": [{"unit": "vllm.service", "server": "node2"}]}
OUT = {"item": ITEM, "changed": True, "servers": [
    {"server": "node2", "changed": True, "state_before": "ready", "state_after": "maint", "sessions_at_maint": 0,
     "drained_s": 2.9, "msg": "node2 drained in 2.9 s"}]}
BACK = {"item": ITEM, "changed": True, "servers": [{"server": "node2", "changed": True, "state_before": "maint",
                                                    "state_after": "ready"}]}


def rotation(*steps):
    kept = {}
    for name, call in steps:
        for key, value in inference_service_rotation_steps(call, name)["vllm.service"].items():
            kept[key] = value
    return kept


def test_a_hosts_servers_move_in_one_call_per_balancer_and_each_keeps_what_its_balancer_said():
    other = dict(HAPROXY, backend="sglang")
    servers = [{"unit": "a", "server": "n1-a", "rotation": dict(HAPROXY)}, {"unit": "b", "server": "n1-b", "rotation": other},
               {"unit": "c", "server": "n1-c", "rotation": dict(HAPROXY)}]
    calls = inference_service_rotation_by_balancer(servers)
    assert calls == [{"rotation": HAPROXY, "servers": [{"unit": "a", "server": "n1-a"}, {"unit": "c", "server": "n1-c"}]},
                     {"rotation": other, "servers": [{"unit": "b", "server": "n1-b"}]}]
    # The module answers each server by name; a unit takes its own server's answer, whatever the order.
    said = {"item": calls[0], "servers": [{"server": "n1-c", "state_after": "maint", "drained_s": 4.0},
                                          {"server": "n1-a", "state_after": "drain", "drained_s": 0.5}]}
    kept = inference_service_rotation_steps(said, "out")
    assert (kept["a"]["server"], kept["a"]["out"]["state_after"], kept["c"]["out"]["drained_s"]) == ("n1-a", "drain", 4.0)
    assert kept["a"]["host"] == "lb1" and set(kept) == {"a", "c"}


def test_a_server_taken_out_and_put_back_is_in_rotation_and_its_row_has_no_warning():
    result = inference_service_result({"gate": GATE, "rotation": rotation(("out", OUT), ("restored", BACK))}, "node2",
                                      unit="vllm.service")
    assert result["ok"] and not result["rotation"]["left_out"] and result["warnings"] == []
    assert result["rotation"]["out"] == {"changed": True, "state_before": "ready", "state_after": "maint",
                                         "sessions_at_maint": 0, "drained_s": 2.9}
    assert result["rotation"]["server"] == "node2" and result["rotation"]["host"] == "lb1"


def test_a_degraded_server_left_out_says_so_and_a_failed_one_says_it_in_its_reason():
    degraded = inference_service_result({"gate": dict(GATE, status="degraded"), "rotation": rotation(("out", OUT))},
                                        "node2", unit="vllm.service")
    assert degraded["rotation"]["left_out"]
    assert degraded["warnings"] == ["left out of rotation: node2 on lb1 is maint until a run serves it and its gate "
                                    "passes"], degraded["warnings"]
    failed = inference_service_result({"gate": GATE, "rotation": rotation(("out", OUT))}, "node2", unit="vllm.service",
                                      failed_stage="Wait until the server answers a real completion",
                                      failed_result={"msg": "the server exited 1"})
    assert failed["reason"] == ("the server exited 1; left out of rotation: node2 on lb1 is maint until a run serves it "
                                "and its gate passes"), failed["reason"]
    assert not inference_service_report_row(failed)["ok"]


def test_a_server_without_a_balancer_has_no_rotation():
    result = inference_service_result({"gate": GATE}, "node2", unit="vllm.service")
    assert result["rotation"] == {} and result["warnings"] == []


def test_check_mode_shows_the_transition_and_leaves_nothing_out():
    would = dict(OUT, changed=True, state_after="maint", msg="node2 would be drained and put in maintenance")
    result = inference_service_result({"rotation": rotation(("out", would))}, "node2", unit="vllm.service",
                                      check_mode=True)
    assert result["ok"] and result["rotation"]["out"]["changed"] and not result["rotation"]["left_out"], result
    assert result["warnings"] == [], result["warnings"]
