"""inference_service_instances resolved on the controller: each instance the single-service variables
overridden by its keys, its GPUs from CUDA_VISIBLE_DEVICES, and every reason two servers cannot
share the host refused by name, before anything runs (issue 26)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils._settings import BY_NAME
import yaml

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service import spec
from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_instances import (
    inference_service_early_starts,
    inference_service_instances, instance_keys)

ROOT = Path(__file__).resolve().parents[2]
UUID_A = "GPU-1b2c3d4e-0000-1111-2222-333344445555"
UUID_B = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"


def variables(*instances, **changes):
    defaults = yaml.safe_load((ROOT / "roles" / "inference_service" / "defaults" / "main.yml").read_text())
    values = {name: defaults[name] for name in spec()}
    values.update(inference_service_model="/models/llama", inference_service_instances=list(instances))
    values.update(changes)
    return values


def two(second_gpus="2,3", **second):
    return (
        {"unit": "vllm-a.service", "port": 8001, "served_name": "a", "environment": {"CUDA_VISIBLE_DEVICES": "0,1"}},
        dict({"unit": "vllm-b.service", "port": 8002, "served_name": "b",
              "environment": {"CUDA_VISIBLE_DEVICES": second_gpus}}, **second))


def problems(*instances, **changes):
    return inference_service_instances(variables(*instances, **changes))["problems"]


def test_each_instance_is_the_single_service_variables_overridden_by_its_keys():
    resolved = inference_service_instances(variables(*two(), inference_service_port=9000,
                                                     inference_service_min_acceptance_rate=0.5))
    assert resolved["problems"] == []
    first, second = resolved["instances"]
    assert (first["unit"], first["port"], first["served_name"], first["gpus"]) == ("vllm-a.service", 8001, "a", [0, 1])
    assert (second["unit"], second["port"], second["gpus"]) == ("vllm-b.service", 8002, [2, 3])
    # Not overridden: the host's own value, in every instance.
    assert first["model"] == second["model"] == "/models/llama"
    assert first["min_acceptance_rate"] == second["min_acceptance_rate"] == 0.5
    # Indices are read in PCI order: written into the unit when the instance did not say.
    assert second["environment"] == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # Every key an instance may set, and only those: the host's list and fail_host are the host's.
    assert set(first) == set(instance_keys()) | {"gpus", "gpu_kind"}
    assert "instances" not in first and "fail_host" not in first


def test_the_instance_does_not_change_the_host_variables_it_started_from():
    values = variables(*two())
    environment = values["inference_service_environment"] = {"HF_HOME": "/srv/hf"}
    resolved = inference_service_instances(values)["instances"]
    assert environment == {"HF_HOME": "/srv/hf"}
    # An instance's environment replaces the host's (a mapping is one value, as Ansible's variables are).
    assert resolved[0]["environment"] == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_an_unknown_key_is_refused_by_name_with_the_nearest_known_one():
    first, second = two()
    second = dict(second, prot=8003)
    del second["port"]
    assert problems(first, second) == [
        "inference_service_instances[1] (vllm-b.service).prot: unknown key; did you mean port?"]
    assert problems(first, dict(second, port=8002, fail_host=False))[-1] == (
        "inference_service_instances[1] (vllm-b.service).fail_host: the host's setting, not an instance's; set "
        "inference_service_fail_host for the host.")
    assert problems(first, dict(second, port=8002, zzzz=1))[-1] == (
        "inference_service_instances[1] (vllm-b.service).zzzz: unknown key.")


@pytest.mark.parametrize("port", ["abc", None, True, 0, -1, 65536, 10 ** 30, "nan", float("inf"), 8000.5])
def test_a_bad_port_is_refused_naming_the_instance_and_its_key(port):
    found = problems(*two(port=port))
    assert len(found) == 1 and found[0].startswith("inference_service_instances[1] (vllm-b.service).port is "), found
    assert found[0].endswith(": it must be %s." % BY_NAME["port"].range.words()), found


def test_wrong_types_are_refused_like_the_roles_own_variables():
    found = problems(*two(environment="CUDA_VISIBLE_DEVICES=2"))
    assert found == ['inference_service_instances[1] (vllm-b.service).environment is "CUDA_VISIBLE_DEVICES=2": '
                     "it must be a mapping of names to values."]
    found = problems(*two(engine="tgi"))
    assert found[0].startswith('inference_service_instances[1] (vllm-b.service).engine is "tgi": it must be one of ')
    # A secret's value is never shown, under the instance's name too.
    found = problems(*two(secrets="sk-verysecret"))
    assert found == ["inference_service_instances[1] (vllm-b.service).secrets is (hidden): it must be a mapping of "
                     "names to values."]


@pytest.mark.parametrize("items, sentence", [
    ("vllm", 'inference_service_instances is "vllm": it must be a list of instances (mappings).'),
    ({"unit": "a.service"}, 'inference_service_instances is {"unit": "a.service"}: it must be a list of instances '
                            '(mappings).'),
])
def test_a_list_that_is_not_one_is_refused(items, sentence):
    assert inference_service_instances(variables(inference_service_instances=items))["problems"] == [sentence]


def test_an_item_that_is_not_a_mapping_is_refused():
    found = problems(two()[0], "vllm-b.service")
    assert found == ['inference_service_instances[1] is "vllm-b.service": each instance must be a mapping of the '
                     "role's variable names without the prefix (unit, port, environment, ...)."]


@pytest.mark.parametrize("visible, phrase", [
    ("", "is empty"), (" , ", "is empty"), ("-1", 'holds "-1": CUDA ignores that GPU and every one after it'),
    ("2,-1", 'holds "-1"'), ("2,2", "names 2 more than once"),
    ("MIG-1b2c3d4e-0000-1111-2222-333344445555", "a MIG instance"),
    ("%s/1/0" % UUID_A, "neither a GPU index nor a whole GPU's UUID"),
    ("2,%s" % UUID_B, "mixes GPU indices and UUIDs"),
    ("%s,%s" % (UUID_B, UUID_B.upper().replace("GPU-", "gpu-")), "names GPU-%s more than once" % UUID_B[4:].lower()),
    ("2\n3", "neither a GPU index"), ("2;3", "neither a GPU index"), ("'2'", "neither a GPU index"),
    ("$GPUS", "neither a GPU index"), ("@/%", "neither a GPU index"), ("2\udcff", "neither a GPU index"),
    ("GPU-xyz", "neither a GPU index"), ("nan", "neither a GPU index"), (["2", "3"], 'is ["2", "3"]'),
    (None, "is null"), (True, "is true"), ("99999", 'holds "99999": CUDA ignores that GPU'),
])
def test_a_gpu_list_that_is_not_one_is_refused_in_a_sentence(visible, phrase):
    found = problems(*two(environment={"CUDA_VISIBLE_DEVICES": visible}))
    assert len(found) == 1, found
    assert found[0].startswith("inference_service_instances[1] (vllm-b.service).environment.CUDA_VISIBLE_DEVICES "), found
    assert phrase in found[0], found
    assert "\n" not in found[0]


def test_uuids_are_compared_whatever_their_case():
    first = {"unit": "vllm-a.service", "port": 8001, "environment": {"CUDA_VISIBLE_DEVICES": UUID_A}}
    second = {"unit": "vllm-b.service", "port": 8002, "environment": {"CUDA_VISIBLE_DEVICES": UUID_A.upper()}}
    assert problems(first, second) == [
        "inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] (vllm-b.service) share the "
        "GPU %s: a reset of one would kill the other's workers." % UUID_A]
    second["environment"]["CUDA_VISIBLE_DEVICES"] = UUID_B
    resolved = inference_service_instances(variables(first, second))
    assert resolved["problems"] == [] and resolved["instances"][1]["gpus"] == [UUID_B]
    # UUIDs need no order: none is added.
    assert "CUDA_DEVICE_ORDER" not in resolved["instances"][1]["environment"]


def test_indices_with_another_device_order_are_refused():
    found = problems(*two(environment={"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}))
    assert found == ['inference_service_instances[1] (vllm-b.service).environment.CUDA_DEVICE_ORDER is "FASTEST_FIRST": '
                     "GPU indices in CUDA_VISIBLE_DEVICES then do not count GPUs as NVML does, and the reset would pick "
                     "other GPUs; use PCI_BUS_ID or GPU UUIDs."]
    uuids = {"CUDA_VISIBLE_DEVICES": UUID_B, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    ok = inference_service_instances(variables(*two(environment=uuids)))
    assert ok["problems"] == ["inference_service_instances mixes GPU indices and UUIDs in CUDA_VISIBLE_DEVICES across "
                              "instances: an index and a UUID of the same GPU cannot be told apart before the host is "
                              "read; use one or the other."]


def test_two_instances_sharing_a_gpu_a_port_or_a_unit_are_refused_by_name():
    pair = "inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] (vllm-b.service)"
    assert problems(*two(second_gpus="1,2")) == [
        "%s share the GPU 1: a reset of one would kill the other's workers." % pair]
    assert problems(*two(port=8001)) == ["%s share the port 8001: the second server could not listen on it." % pair]
    # The same port on two addresses of the host is two sockets; on every address it is one.
    assert problems(*two(port=8001, host="127.0.0.1")) == [
        "%s share the port 8001: the second server could not listen on it." % pair]
    first, second = two(port=8001, host="127.0.0.2")
    assert problems(dict(first, host="127.0.0.1"), second) == []
    same = "inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] (vllm-a.service)"
    assert problems(*two(unit="vllm-a.service")) == ["%s share the unit vllm-a.service: each instance needs its own "
                                                     "unit." % same]
    # A port given as text (-e) is the same port.
    assert problems(*two(port="8001")) == ["%s share the port 8001: the second server could not listen on it." % pair]


def test_with_several_instances_each_must_name_its_gpus():
    first, second = two()
    del second["environment"]
    assert problems(first, second) == [
        "inference_service_instances[1] (vllm-b.service).environment has no CUDA_VISIBLE_DEVICES: with several "
        "instances on a host, each must name its GPUs, or it would see and load every GPU of the host."]
    # One instance alone may use every GPU of the host, as the single-service variables do.
    alone = inference_service_instances(variables(second))
    assert alone["problems"] == [] and alone["instances"][0]["gpus"] == []
    # From the host's environment, which every instance starts from, when the item has none.
    inherited = problems(first, second, inference_service_environment={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert inherited == ["inference_service_instances[0] (vllm-a.service) and inference_service_instances[1] "
                         "(vllm-b.service) share the GPU 0, 1: a reset of one would kill the other's workers."]


def test_every_problem_is_said_at_once_and_no_instance_is_returned():
    first, second = two(prot=1)
    resolved = inference_service_instances(variables(dict(first, port=0), second))
    assert resolved["instances"] == []
    assert len(resolved["problems"]) == 2, resolved["problems"]


def test_no_list_is_one_instance_of_the_single_service_variables():
    resolved = inference_service_instances(variables())
    assert resolved["problems"] == [] and len(resolved["instances"]) == 1
    assert resolved["instances"][0]["unit"] == "inference-server.service"


def test_the_instance_loop_sets_every_per_instance_variable():
    # That the block is current is tests/unit/test_generate.py's; this reads what Ansible will.
    tasks = yaml.safe_load((ROOT / "roles" / "inference_service" / "tasks" / "instances.yml").read_text())
    loop = next(task for task in tasks if "loop" in task)
    assert sorted(name.removeprefix("inference_service_") for name in loop["vars"]) == instance_keys()


def test_the_generator_names_a_stale_loop_and_rewrites_only_its_block(tmp_path, monkeypatch):
    """--check exits 1 naming instances.yml when a variable is missing from the block; a run writes
    the block back and leaves the hand-written lines around it as they were."""
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import gen_instance_tasks  # pylint: disable=import-outside-toplevel
    tasks = ROOT / "roles" / "inference_service" / "tasks" / "instances.yml"
    current = tasks.read_text()
    stale = current.replace('    inference_service_port: "{{ __inference_service_instance.port }}"\n', "")
    assert stale != current
    fresh = gen_instance_tasks.generated(ROOT)[gen_instance_tasks.TASKS]
    assert fresh == current
    root = tmp_path / "root"
    (root / tasks.parent.relative_to(ROOT)).mkdir(parents=True)
    (root / "roles" / "inference_service" / "meta").mkdir(parents=True)
    (root / "roles" / "inference_service" / "meta" / "argument_specs.yml").write_text(
        (ROOT / "roles" / "inference_service" / "meta" / "argument_specs.yml").read_text())
    copy = root / tasks.relative_to(ROOT)
    copy.write_text(stale.replace("# Several servers on one host", "# A hand-written line kept\n# Several servers on one host"))
    # The filter's rule comes from this checkout's collection, as the tool's own run finds it.
    monkeypatch.setattr(gen_instance_tasks, "instance_keys", lambda dummy: instance_keys())
    assert gen_instance_tasks.main(["--check", "--root", str(root)]) == 1
    assert gen_instance_tasks.main(["--root", str(root)]) == 0
    assert copy.read_text() == current.replace("# Several servers on one host", "# A hand-written line kept\n# Several servers on one host")


def test_the_write_pass_keeps_only_the_instances_whose_files_were_written_and_unit_read():
    """A refused instance, or one whose unit was not read, is left to its own serve step (which writes and
    starts it): keeping it would skip its write and gate a unit nobody started."""
    pending = [{"unit": "vllm-%s.service" % name, "look": {"url": "http://h:%d" % index}} for index, name in enumerate("abcd")]
    written = {"changed": True, "instances": [
        {"unit": {"path": "/etc/systemd/system/vllm-a.service", "load_state": "loaded", "started": True}, "changed": True},
        {"failed": True, "msg": "instances[1]: ... is written for another server of this task too"},
        {"unit": {"path": "/etc/systemd/system/vllm-c.service", "action": "unchanged"}, "changed": False},
        {"unit": {"path": "/etc/systemd/system/vllm-d.service", "load_state": "loaded", "started": False,
                  "start_left": "its unit file is disabled, not enabled"}, "changed": False}]}
    kept = inference_service_early_starts(written, pending)
    assert sorted(kept) == ["vllm-a.service", "vllm-d.service"], kept
    assert kept["vllm-a.service"] == {"files": written["instances"][0], "look": {"url": "http://h:0"}}
    assert kept["vllm-d.service"]["files"]["unit"]["start_left"] == "its unit file is disabled, not enabled"


@pytest.mark.parametrize("written", [
    {"failed": True, "msg": "systemctl daemon-reload: Failed to connect to bus"},
    {"unreachable": True, "msg": "Failed to connect to the host via ssh"},
    {"changed": False, "skipped": True},
    None,
])
def test_a_write_that_failed_as_a_whole_keeps_no_instance(written):
    assert inference_service_early_starts(written, [{"unit": "vllm-a.service", "look": {}}]) == {}


def test_the_write_pass_filter_refuses_instances_without_their_unit():
    with pytest.raises(TypeError, match="a list of mappings that name their unit"):
        inference_service_early_starts({"instances": []}, [{"look": {}}])
