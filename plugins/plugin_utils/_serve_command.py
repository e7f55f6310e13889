# -*- coding: utf-8 -*-
# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The inference server's command line, environment and secret files, from the role's
variables, checked against the engine version's flags. Private to this collection.

build(settings, flags) returns what the unit needs, or raises ServeConfigError with every
problem found, one sentence each, each naming the variable, key or flag at fault. Secrets never
enter here: only which ones are set. They reach the engine through a 0600 file (the unit's
EnvironmentFile, or for SGLang's API key a --config YAML file), never the command line.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import posixpath
import re
import shlex
from urllib.parse import urlsplit, urlunsplit

from ansible_collections.cleanslate.gpu.plugins.module_utils import _settings
from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import ENGINES
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker, secret_values
from ansible_collections.cleanslate.gpu.plugins.plugin_utils._engine_flags import EngineFlags, FlagError
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _speculative_rules
from ansible_collections.cleanslate.gpu.plugins.plugin_utils import _systemd_quote as systemd

PREFIX = "inference_service_"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\-]+\.service$")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SECRET_NAME = re.compile(r"TOKEN|API_?KEY|SECRET|PASSW|CREDENTIAL|PRIVATE_KEY", re.IGNORECASE)
# Seconds systemd waits beyond the drain before SIGKILL: vLLM's workers take up to 5 s
# (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS), SGLang's schedulers up to 15 s (ShutdownReq).
STOP_MARGIN_S = 30
# Draft methods that read a draft checkpoint: without `model` vLLM has nothing to load.
VLLM_METHODS_WITH_DRAFT = ("eagle", "eagle3", "draft_model")
SECRET_KEYS = ("api_key", "hf_token", "admin_api_key")
# A DNS host name label (RFC 1123): letters, digits and inner hyphens, 1 to 63 of them.
HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
HOST_NAME_MAX = 253
# A last label that reads as a number (WHATWG URL's "ends in a number"): inet_aton takes it for an address.
NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
LOOPBACK = frozenset(["127.0.0.1", "::1"])
# Characters of no served name: Prometheus escapes \ and " in a label value, braces end its label set;
# no client quotes a model's name.
SERVED_NAME_REFUSED = frozenset('\\"\'`{}')
UNIT_NAME_MAX_CHARS = 255           # systemd's UNIT_NAME_MAX, less the terminating NUL
# Bounds no real configuration reaches, each where something outside the role fails first:
MODEL_MAX_CHARS = 4096              # PATH_MAX, the longest path Linux opens (a Hub repository id is < 100)
SERVED_NAME_MAX_CHARS = 256         # clients send it in every request; Hub ids are < 100 characters
EXTRA_ARGS_MAX_ITEMS = 1024         # the engines have ~400 (vLLM) and ~560 (SGLang) options in all
ARGUMENT_MAX_BYTES = 131072         # MAX_ARG_STRLEN: execve refuses an argument or environment string this long
# The unit's cleanup before each start (issue 39), run as root (ExecStartPre=+): installed root's,
# outside any venv the server's user may write, with the module_utils it imports beside it, and
# run by the system's own Python, isolated (-I: no PYTHON* variable of the unit, no user site).
PRESTART_DIR = "/usr/local/libexec/cleanslate-gpu"
PRESTART_PYTHON = "/usr/bin/python3"
PRESTART_MODULE_UTILS = ("_leftovers.py", "_file_users.py", "_procs.py", "_text.py")
UNIT_LINE_MAX_BYTES = 1024 * 1024   # systemd's LONG_LINE_MAX: a longer unit line (continuations joined) is refused
# Draft tokens per step: the largest published trees stay at 64 (SGLang's EAGLE example for Llama:
# 5 steps, top-8, 64 draft tokens; vLLM's suffix decoding defaults to depth 24); each draft token
# takes a slot in every CUDA graph and the KV cache of every request, so 4 times that is a typo.
SPECULATIVE_TOKENS_MAX = 256
# Users that other daemons run as too: any of them could read the secret files the server's user owns.
SHARED_USERS = ("nobody", "nfsnobody")
# Algorithm names people bring from other engines, which SGLang refuses ("Unknown speculative
# algorithm name"): what SGLang calls the same thing.
SGLANG_FOREIGN_ALGORITHMS = {
    "MTP": "SGLang's multi-token prediction is NEXTN",
    "MEDUSA": "for a model's own MTP heads SGLang has NEXTN; otherwise EAGLE or EAGLE3 with a draft model",
}
# Flags that take a secret no variable of the role carries: what to do instead.
SECRET_FLAGS = {"ssl_keyfile_password": "use a key file without a password, readable by the server's user alone"}
# ssl.CERT_REQUIRED, the value of --ssl-cert-reqs that makes uvicorn demand a client certificate.
CERT_REQUIRED = 2


def not_texts(items) -> str:
    """What is wrong with a list that must hold texts, showing only the items that are not:
    the others may be a secret flag's value (["--api-key", KEY, null])."""
    if not isinstance(items, list):
        return "a %s" % type(items).__name__
    bad = ["item %d is %s" % (index, json.dumps(item, default=str)[:40])
           for index, item in enumerate(items, 1)
           if isinstance(item, bool) or not isinstance(item, (str, int, float))]
    return "%d item(s) that are not texts: %s" % (len(bad), ", ".join(bad[:5]) + (", ..." if len(bad) > 5 else ""))


class ServeConfigError(ValueError):
    """Every problem of a configuration, each one sentence."""

    def __init__(self, problems):
        # Once each (a flag given twice is one mistake), and one per line: the report splits the
        # failure on newlines into one bullet per problem.
        self.problems = list(dict.fromkeys(problems))
        super().__init__("\n".join(self.problems))


def _var(name: str) -> str:
    return PREFIX + name


def _control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _utf8(text: str) -> bool:
    """Whether text can be written to the unit file: a surrogate (a non-UTF-8 byte that
    Ansible let through) cannot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bytes(text: str) -> int:
    """Its length in the unit file and in execve's argument strings."""
    return len(text.encode("utf-8", "surrogatepass"))


def _shown(value, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: a sentence stays readable whatever was given."""
    text = repr(value)
    return text if len(text) <= limit else "%s... (%d characters)" % (text[:limit], len(text))


class HostSpelling(ValueError):
    """An address written in a spelling the role refuses; its text says which address and how to write it."""


def parse_host(host):
    """An IP address (ipaddress) or a DNS host name (str) from inference_service_host, or ValueError.

    An address is one spelling only: ipaddress's (dotted decimal without leading zeros, or IPv6),
    not an IPv4 address written as IPv6 (::ffff:127.0.0.1, which a server binds only on a
    dual-stack socket). A host name is RFC 1123 labels whose last one is no number (all digits, or
    0x and hexadecimal digits: the WHATWG URL rule), since inet_aton, and so getaddrinfo and every
    HTTP client, reads "127.1", "0x7f000001" or "1.0x1" as an address. Anything else (user@host,
    host:port, a path, brackets, a zone index) could make the gate's URL name another machine."""
    if not isinstance(host, str) or "%" in host:
        raise ValueError("not an address or host name")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if address.version == 6 and address.ipv4_mapped:
            raise HostSpelling("the IPv4 address %s written as IPv6: write %s" % ((address.ipv4_mapped,) * 2))
        return address
    labels = host.split(".")
    if len(host) > HOST_NAME_MAX or not all(HOST_LABEL.fullmatch(label) for label in labels):
        raise ValueError("not an address or host name")
    if NUMERIC_LABEL.fullmatch(labels[-1]):
        raise HostSpelling("a host name whose last label is a number, which inet_aton reads as an IPv4 address "
                           "(127.1, 0x7f000001 and 0177.0.0.1 are 127.0.0.1) or refuses: write an address as four "
                           "decimal numbers without leading zeros, or give a host name")
    return host


def listen_addresses(host):
    """The addresses a server told to listen on `host` takes a port on, to tell whether two servers
    of one host can share it: None for every address (0.0.0.0, ::, and :: takes IPv4 too on a
    dual-stack host), loopback for localhost (which resolves to 127.0.0.1 and ::1), an IPv4
    address written as IPv6 as that IPv4 address. Another host name is itself, in lower case: what
    it resolves to on the host is not known here. A host the role refuses is itself, as given."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = parse_host(host)
        except ValueError:
            return frozenset([host])
    if isinstance(address, str):
        name = address.lower()
        return LOOPBACK if name == "localhost" or name.endswith(".localhost") else frozenset([name])
    if address.version == 6 and address.ipv4_mapped:
        address = address.ipv4_mapped
    return None if address.is_unspecified else frozenset([address.compressed])


def share_addresses(host, other) -> bool:
    """Whether servers listening on `host` and on `other` take a port on a common address."""
    one, two = listen_addresses(host), listen_addresses(other)
    return one is None or two is None or bool(one & two)


def served_name_fault(value):
    """What is wrong with inference_service_served_name, as a phrase without its value, or None.

    Clients send the name in every request's JSON, the engines write it as the model_name label
    value of every /metrics line, the unit's Description carries it: one word of printable
    characters (org/model and llama-3.1:8b@q4 are), none of Prometheus's escaped characters (\\, ")
    or the label set's braces, no quote, no Unicode space or invisible character, and no leading '-', with
    which the engine would read it as an option."""
    if not isinstance(value, str):
        return "it must be text"
    if len(value) > SERVED_NAME_MAX_CHARS:
        return "it is %d characters long, at most %d (clients send it in every request)" % (
            len(value), SERVED_NAME_MAX_CHARS)
    if value.startswith("-"):
        return "it starts with '-', and the engine would read it as an option"
    if not _utf8(value) or any(not char.isprintable() or char.isspace() or char in SERVED_NAME_REFUSED
                               for char in value):
        return ("it must be one word of printable characters, without spaces, quotes, backslashes or braces "
                "(clients send it in every request, /metrics carries it as a label value)")
    return None


def unit_fault(value):
    """What is wrong with a unit name (inference_service_unit, an instance's unit), as a phrase
    without its value, or None. The name goes into paths under /etc/systemd/system, into systemctl's
    arguments and the journal's identifier: systemd's characters for a unit that is no template,
    a name of at most 255 characters, no '..' and no leading '-' (an option to systemctl)."""
    if not isinstance(value, str):
        return "it must be text"
    if len(value) > UNIT_NAME_MAX_CHARS:
        return "it is %d characters long, at most %d (systemd's limit)" % (len(value), UNIT_NAME_MAX_CHARS)
    if not UNIT_NAME.fullmatch(value) or ".." in value or value.startswith("-"):
        return "it must be a service unit name such as vllm.service (letters, digits, ':_.-')"
    return None


def value_sentence(variable: str, value, fault, mask=None):
    """The sentence of a variable whose value has a fault (None: no sentence), the value shown as
    repr cut to a line, after `mask` (the secrets' Masker) hid any secret in it: a secret cut in
    two would no longer be found whole."""
    if fault is None:
        return None
    return "%s is %s: %s" % (variable, _shown(mask(value) if mask and isinstance(value, str) else value), fault)


def _suggest(word: str, candidates) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=3)
    return (" (did you mean %s?)" % ", ".join(close)) if close else ""


class _Builder:
    def __init__(self, settings: dict, flags: EngineFlags):
        self.s = settings
        self.flags = flags
        self.engine = ENGINES[flags.engine]  # what differs between the engines
        self.problems = []
        self.warnings = []
        self.owned = {}  # dest -> the variable that sets it
        self.running = {}  # what vLLM will run: its method after the name guess, the draft's tensor-parallel size
        self.reach = {"scheme": "http", "ca_path": "", "validate_certs": True}  # how the gate reaches the API

    def problem(self, text: str) -> None:
        self.problems.append(text)

    # --- scalar settings ------------------------------------------------------------------

    def check_scalars(self) -> None:
        s = self.s
        # A leading "-" would make the engine read the model as an option (vLLM then serves its
        # default model under the served name).
        if isinstance(s["model"], str) and len(s["model"]) > MODEL_MAX_CHARS:
            self.problem("%s is %d characters long: at most %d (PATH_MAX, the longest path Linux opens)"
                         % (_var("model"), len(s["model"]), MODEL_MAX_CHARS))
        elif not isinstance(s["model"], str) or not s["model"].strip() or _control(s["model"]) \
                or s["model"].startswith("-") or not _utf8(s["model"]):
            self.problem("%s must name the model (a Hugging Face repository or a local path), got %s"
                         % (_var("model"), _shown(s["model"])))
        # The secrets (the action's `secrets`, when given) are masked before the value is cut: the
        # action masks every sentence again, but half a key cut at 80 characters would not match.
        mask = Masker([value for dummy, value in secret_values(s.get("secrets"))])
        for name, fault in (("served_name", served_name_fault), ("unit", unit_fault)):
            sentence = value_sentence(_var(name), s[name], fault(s[name]), mask)
            if sentence:
                self.problem(sentence)
        # The numbers, each against its setting's range (module_utils/_settings.py).
        for setting, one in _settings.passed(_settings.ARGS):
            if setting.range:
                self.problems += filter(None, [setting.range.sentence(setting.variable, s[one.option])])
        if isinstance(s["host"], str) and "%" in s["host"]:
            self.problem("%s %s has a zone index (%%): the readiness gate's URL cannot carry one; listen on a "
                         "global or loopback address, or on :: (every address)" % (_var("host"), _shown(s["host"])))
        else:
            try:
                parse_host(s["host"])
            except HostSpelling as exc:
                self.problem("%s is %s: %s" % (_var("host"), _shown(s["host"]), exc))
            except ValueError:
                self.problem("%s must be an IP address or a DNS host name (letters, digits and inner '-' in labels "
                             "joined by '.'), got %s" % (_var("host"), _shown(s["host"])))
        if s["user"] and (not isinstance(s["user"], str) or not USER_NAME.fullmatch(s["user"])):
            self.problem("%s must be a user name, got %s" % (_var("user"), _shown(s["user"])))
        elif s["user"] in SHARED_USERS:
            # A process of the same user reads the server's /proc/PID/environ (VLLM_API_KEY, HF_TOKEN).
            self.warnings.append("%s %s is shared by other daemons, and any of them could read the server's secrets "
                                 "(its /proc/PID/environ, SGLang's secrets file): create a user of its own for the "
                                 "server" % (_var("user"), s["user"]))
        for name in ("config_dir", "venv"):
            value = s[name]
            if name == "venv" and not value:
                continue
            if not isinstance(value, str) or not posixpath.isabs(value) or ".." in value.split("/") or _control(value):
                self.problem("%s must be an absolute path without '..', got %r" % (_var(name), value))
        exe = s["executable"]
        if exe and (not isinstance(exe, str) or not posixpath.isabs(exe) or ".." in exe.split("/") or _control(exe)
                    or exe.endswith("/")):
            self.problem("%s must be the absolute path of the engine's executable, got %r" % (_var("executable"), exe))

    def executable(self) -> str:
        return executable_path(self.s, self.flags.engine)

    def unit_stem(self) -> str:
        return self.s["unit"][: -len(".service")] if isinstance(self.s["unit"], str) else "inference"

    # --- the command line -----------------------------------------------------------------

    def own(self, dest: str, variable: str) -> str:
        self.owned[dest] = variable
        return self.flags.flag_of(dest)

    def core_args(self) -> list:
        """The command, then each setting that has this engine's flag (module_utils/_settings.py), in
        the table's order, then the flags the role always gives."""
        s = self.s
        flags = self.flags
        args = list(flags.data.get("command", []))
        for setting, one in _settings.passed(_settings.ARGS):
            dest = setting.flags.get(flags.engine)
            if dest is None:
                continue
            value = s[one.option]
            if setting.fallback and not value:
                value = s[setting.fallback]
            if dest == _settings.MODEL:
                if flags.data["model"].get("positional"):
                    self.owned["model"] = setting.variable
                    args.append(value)
                    continue
                dest = next(entry["dest"] for entry in flags.options if flags.data["model"]["flag"] in entry["flags"])
            flag = self.own(dest, setting.variable)
            if setting.omit_empty and not value:
                continue  # the engine's own default; the flag stays the role's
            args += [flag, repr(float(value)) if setting.type == "float" else str(value)]
        for dest, why in self.engine["always"].items():
            args.append(self.own(dest, PREFIX + why))
        for secret, dest in self.engine["secret_flags"].items():
            self.owned[dest] = _var("secrets") + "." + secret
        return args

    # --- speculative decoding -------------------------------------------------------------

    def speculative_args(self) -> list:
        spec = self.s["speculative"]
        data = self.flags.data["speculative"]
        if self.engine["speculative"] == "config":
            for dest in ("speculative_config", "spec_method", "spec_model", "spec_tokens"):
                if self.flags.by_dest(dest):
                    self.owned[dest] = _var("speculative")
        else:
            for dest in data["keys"]:
                self.owned[dest] = _var("speculative")
        if not isinstance(spec, dict):
            self.problem("%s must be a dict of the engine's speculative keys, got %r" % (_var("speculative"), spec))
            return []
        if not spec:
            return []
        if self.engine["speculative"] == "config":
            return self._vllm_speculative(spec, data)
        return self._sglang_speculative(spec, data)

    def _vllm_speculative(self, spec: dict, data: dict) -> list:
        keys = data["keys"]
        where = _var("speculative")
        for key, value in spec.items():
            if key in data.get("forbidden", {}):
                self.problem("%s.%s is refused by vLLM's SpeculativeConfig: %s" % (where, key, data["forbidden"][key]))
                continue
            if key not in keys:
                self.problem("%s.%s is not a key of vLLM %s's SpeculativeConfig%s"
                             % (where, key, self.flags.version, _suggest(key, keys)))
                continue
            self._check_spec_value("%s.%s" % (where, key), keys[key], value)
        tokens = spec.get("num_speculative_tokens")
        if _int(tokens) and tokens > SPECULATIVE_TOKENS_MAX:
            self.problem("%s.num_speculative_tokens must be at most %d (published configurations use 1 to 24), got %d"
                         % (where, SPECULATIVE_TOKENS_MAX, tokens))
        method = spec.get(data["method_key"])
        if method is None:
            self.problem("%s.method is required: without it vLLM guesses the method from the draft model's "
                         "repository name (a draft whose name lacks 'eagle3' runs as draft_model)" % where)
        elif method in data.get("method_aliases", []):
            self.warnings.append("%s.method %s is a deprecated alias that vLLM %s rewrites to mtp"
                                 % (where, method, self.flags.version))
        if method in VLLM_METHODS_WITH_DRAFT and not spec.get("model"):
            self.problem("%s.model is required with method %s: the draft checkpoint to load" % (where, method))
        draft_tp = spec.get("draft_tensor_parallel_size")
        target_tp = self.s["tensor_parallel_size"]
        if _int(draft_tp) and _int(target_tp) and draft_tp not in (1, target_tp):
            self.problem("%s.draft_tensor_parallel_size must be 1 or the target's %s (%d), got %d"
                         % (where, _var("tensor_parallel_size"), target_tp, draft_tp))
        self._check_schedule(spec)
        problems, warnings, self.running = _speculative_rules.check(
            spec, self.flags.version, target_tp, data.get("method_aliases", []), self.s["model"])
        for problem in problems:
            self.problem(problem)
        self.warnings += warnings
        # With spaces and quotes: exactly what the unit's quoting must carry through intact.
        return [self.flags.flag_of("speculative_config"), json.dumps(spec, sort_keys=True)]

    def _check_spec_value(self, label: str, rule: dict, value) -> None:
        kind = rule["kind"]
        if value is None:
            if not rule.get("nullable"):
                self.problem("%s may not be null" % label)
            return
        if kind == "internal":
            self.problem("%s is set by vLLM itself and cannot be given" % label)
        elif kind == "int" and not _int(value):
            self.problem("%s must be an integer, got %r" % (label, value))
        elif kind == "float" and not _number(value):
            self.problem("%s must be a finite number, got %r" % (label, value))
        elif kind == "bool" and not isinstance(value, bool):
            self.problem("%s must be true or false, got %r" % (label, value))
        elif kind == "str" and (not isinstance(value, str) or not value):
            self.problem("%s must be a non-empty string, got %r" % (label, value))
        elif kind == "choice" and value not in rule["choices"]:
            self.problem("%s must be one of %s, got %r" % (label, ", ".join(rule["choices"]), value))
        elif kind == "dict" and not isinstance(value, dict):
            self.problem("%s must be a dict, got %r" % (label, value))
        elif kind == "float_list" and (not isinstance(value, list) or not all(_number(v) for v in value)):
            self.problem("%s must be a list of numbers, got %r" % (label, value))
        elif _number(value) and kind in ("int", "float"):
            if "min" in rule and value < rule["min"]:
                self.problem("%s must be %s or more, got %r" % (label, rule["min"], value))
            if "above" in rule and value <= rule["above"]:
                self.problem("%s must be more than %s, got %r" % (label, rule["above"], value))

    def _check_schedule(self, spec: dict) -> None:
        """num_speculative_tokens_per_batch_size: [[lowest batch size, highest, tokens], ...]."""
        schedule = spec.get("num_speculative_tokens_per_batch_size")
        if schedule is None:
            return
        label = "%s.num_speculative_tokens_per_batch_size" % _var("speculative")
        if not isinstance(schedule, list) or not schedule:
            self.problem("%s must be a list of [lowest batch size, highest batch size, tokens], got %r"
                         % (label, schedule))
            return
        most = spec.get("num_speculative_tokens")
        ranges = []
        for entry in schedule:
            if not isinstance(entry, list) or len(entry) != 3 or not all(_int(v) for v in entry):
                self.problem("%s: each entry is [lowest batch size, highest batch size, tokens] of integers, got %r"
                             % (label, entry))
                return
            low, high, tokens = entry
            if low < 1 or high < low:
                self.problem("%s: batch sizes must satisfy 1 <= lowest <= highest, got %r" % (label, entry))
            if tokens < 0 or (_int(most) and tokens > most):
                self.problem("%s: tokens must be from 0 (no speculation) to num_speculative_tokens (%s), got %r"
                             % (label, most, entry))
            ranges.append((low, high))
        ranges.sort()
        for (low_a, high_a), (low_b, _high_b) in zip(ranges, ranges[1:]):
            if low_b <= high_a:
                self.problem("%s: batch size ranges %d-%d and %d-... overlap" % (label, low_a, high_a, low_b))

    def _sglang_speculative(self, spec: dict, data: dict) -> list:
        keys = data["keys"]
        where = _var("speculative")
        args = []
        for key, value in spec.items():
            if key not in keys:
                self.problem("%s.%s is not a speculative option of SGLang %s (keys are its server arguments: %s)%s"
                             % (where, key, self.flags.version, "speculative_algorithm, speculative_num_steps, ...",
                                _suggest(key, keys)))
                continue
            entry = self.flags.by_dest(key)
            flag = keys[key]
            label = "%s.%s" % (where, key)
            if entry["nargs"] == 0:
                if not isinstance(value, bool):
                    self.problem("%s is a switch: true or false, got %r" % (label, value))
                elif value:
                    args.append(flag)
                elif any(f.startswith("--no-") for f in entry["flags"]):
                    args.append([f for f in entry["flags"] if f.startswith("--no-")][0])
                continue
            values = value if isinstance(value, list) and entry["nargs"] in ("+", "*") else [value]
            for item in values:
                if isinstance(item, bool) or item is None or isinstance(item, (dict, list)) or (
                        isinstance(item, float) and not math.isfinite(item)):
                    self.problem("%s must be a %s value, got %s" % (label, entry["type"], _shown(value)))
                    break
                if isinstance(item, str) and (_control(item) or not _utf8(item)):
                    self.problem("%s holds a control character or text that is not UTF-8" % label)
                    break
            else:
                args += [flag] + [str(item) for item in values]
        self._check_sglang_algorithm(spec.get(data["method_key"]), data)
        given = [key for key in data["all_or_none"] if key in spec]
        if given and len(given) != len(data["all_or_none"]):
            missing = ", ".join(k for k in data["all_or_none"] if k not in spec)
            self.problem("%s: %s are given together or not at all (SGLang picks all three itself when none is "
                         "given); missing: %s" % (where, ", ".join(data["all_or_none"]), missing))
        for key in given:
            if not _int(spec[key]) or not 1 <= spec[key] <= SPECULATIVE_TOKENS_MAX:
                self.problem("%s.%s must be an integer from 1 to %d, got %s"
                             % (where, key, SPECULATIVE_TOKENS_MAX, _shown(spec[key])))
        if spec.get("speculative_adaptive_config") and spec.get("speculative_adaptive") is not True:
            self.warnings.append("%s.speculative_adaptive_config has no effect without speculative_adaptive: true"
                                 % where)
        return args

    def _check_sglang_algorithm(self, method, data: dict) -> None:
        """SGLang's from_string upper-cases the name, but ServerArgs sets an algorithm up by
        comparing it case-sensitively first (NEXTN becomes EAGLE, EAGLE/EAGLE3/STANDALONE get
        their step defaults): a lower-case name skips that setup, or is refused later."""
        label = "%s.%s" % (_var("speculative"), data["method_key"])
        algorithms = data["algorithms"]
        if not method:
            self.problem("%s is required: name the algorithm (%s)" % (label, ", ".join(algorithms)))
        elif not isinstance(method, str):
            self.problem("%s must be a name (%s), got %s" % (label, ", ".join(algorithms), _shown(method)))
        elif method in algorithms:
            return
        elif method.upper() in algorithms:
            self.problem("%s %s must be spelled %s: SGLang sets an algorithm up by its upper-case name"
                         % (label, method, method.upper()))
        elif method.upper() in SGLANG_FOREIGN_ALGORITHMS:
            self.problem("%s %s is not an algorithm of SGLang %s, which refuses it (Unknown speculative algorithm "
                         "name): %s" % (label, method, self.flags.version, SGLANG_FOREIGN_ALGORITHMS[method.upper()]))
        else:
            self.warnings.append("%s %s is not one of SGLang %s's built-in algorithms (%s); it must come from a plugin"
                                 % (label, method, self.flags.version, ", ".join(algorithms)))

    # --- extra arguments ------------------------------------------------------------------

    def check_extra(self, extra) -> list:
        """The items of inference_service_extra_args, checked one by one. No sentence shows an
        item's value: a secret given to a flag would be printed with it."""
        where = _var("extra_args")
        if not isinstance(extra, list) or not all(isinstance(item, (str, int, float)) and not isinstance(item, bool)
                                                  for item in extra):
            self.problem("%s must be a list of strings (each flag and each value its own item), got %s"
                         % (where, not_texts(extra)))
            return []
        if len(extra) > EXTRA_ARGS_MAX_ITEMS:
            self.problem("%s has %d items: at most %d (each option and value is one item; the engines have about "
                         "500 options)" % (where, len(extra), EXTRA_ARGS_MAX_ITEMS))
            return []
        items = [str(item) for item in extra]
        for position, item in enumerate(items, 1):
            if not _utf8(item):
                self.problem("%s item %d is not UTF-8 text" % (where, position))
            elif _control(item):
                self.problem("%s item %d holds a control character" % (where, position))
            elif _bytes(item) >= ARGUMENT_MAX_BYTES:
                self.problem("%s item %d is %d bytes long: the kernel refuses an argument of %d bytes or more "
                             "(MAX_ARG_STRLEN); give a file instead" % (where, position, _bytes(item), ARGUMENT_MAX_BYTES))
        reported = set()
        secret_at = None  # the position of a secret flag whose value follows it
        for position, option, entry, unknown in self.flags.options_in(items):
            if entry is None:
                # Right after a secret's flag, or after a flag not known (a misspelled secret flag?), an
                # item that reads as an option may be the secret ("-sk..."): not shown. A version
                # without flag data: another version's names decide nothing (the engine's check does).
                if position != secret_at and not self.flags.data.get("unchecked"):
                    self.problem("%s: %s" % (where, unknown))
                secret_at = position + 1
                continue
            reported.add(entry["dest"])
            if self._refuse_option(option, entry):
                secret_at = position + 1
        self._joined(items)
        given = self.flags.set_by(items)
        if given is not None:
            # What the engine's own parser reads that the walk above could not (-tp=8, a prefix of a
            # short option): the same sentences, named by the option's first spelling.
            for dest in sorted(set(given) - reported):
                entry = self.flags.by_dest(dest)
                if entry is not None:  # not vLLM's positional model, which the whole line's parse checks
                    self._refuse_option(entry["flags"][0], entry)
            self.reach = self.api_reach(given)
        return items

    def _joined(self, items: list) -> None:
        """An option and its value in one item ("--max-num-seqs 64"): the engine would refuse the
        line, and its message (which the final parse gives only when nothing else is wrong) shows
        the item whole. Said here, with the rest, showing the option only: the value may be a secret."""
        where = _var("extra_args")
        for position, entry in self.flags.joined_in(items):
            if entry is None:
                self.problem("%s item %d starts with '-' and holds a space, which the engine takes for a value and "
                             "refuses: give each flag and each value as an item of its own" % (where, position))
            elif self.owned.get(entry["dest"]) or entry["dest"] in SECRET_FLAGS:
                self._refuse_option(entry["flags"][0], entry)
            elif entry["nargs"] == 0:
                flag = entry["flags"][0]
                self.problem("%s item %d holds %s and more after a space, which the engine takes for a value and "
                             "refuses: give %s as an item of its own" % (where, position, flag, flag))
            else:
                flag = entry["flags"][0]
                self.problem("%s item %d holds %s and its value in one item, which the engine takes for a value and "
                             "refuses: give them as two items ([%s, VALUE]) or as %s=VALUE"
                             % (where, position, flag, flag, flag))

    def _refuse_option(self, option: str, entry: dict) -> bool:
        """Refuse (or warn about) one option of inference_service_extra_args; True when it is a
        secret's flag, whose value must not be shown."""
        where = _var("extra_args")
        dest = entry["dest"]
        owner = self.owned.get(dest)
        secret = dest in SECRET_FLAGS or bool(owner and owner.startswith(_var("secrets")))
        if owner and owner.startswith(_var("secrets")):
            self.problem("%s: %s would put a secret on the command line, where every user of the host reads "
                         "it in /proc; set %s instead" % (where, option, owner))
        elif dest in SECRET_FLAGS:
            self.problem("%s: %s would put a secret on the command line, where every user of the host reads "
                         "it in /proc; %s" % (where, option, SECRET_FLAGS[dest]))
        elif owner:
            self.problem("%s: %s is set by the role; use %s" % (where, option, owner))
        elif dest == "config":
            if self.secret_file_keys():
                self.problem("%s: %s cannot be given with an API key: %s takes one --config file, "
                             "which carries the key" % (where, option, self.engine["label"]))
            else:
                self.warnings.append("%s: the flags inside %s's file are not checked" % (where, option))
        if entry.get("deprecated"):
            self.warnings.append("%s: %s is deprecated in %s" % (where, option, self.flags.label))
        if dest == self.engine["stats_off_flag"] and self.s["speculative"]:
            self.warnings.append("%s: %s also turns off /metrics, where the acceptance rate is read"
                                 % (where, option))
        return secret

    def api_reach(self, given: dict) -> dict:
        """How the gate reaches the API that the options `given` ({dest: value}) set up: TLS is
        followed (https, and the CA the engine names); what moves the API off http(s)://host:port
        is refused, since the gate would wait its whole deadline."""
        where = _var("extra_args")
        flag = self.flags.flag_of
        unreachable = "the readiness gate could not reach the API"
        if given.get("uds"):
            self.problem("%s: %s makes the server listen on a Unix socket instead of %s and %s: %s"
                         % (where, flag("uds"), _var("host"), _var("port"), unreachable))
        if given.get("headless"):
            self.problem("%s: %s runs the engine without an API server: %s" % (where, flag("headless"), unreachable))
        count = given.get("api_server_count")
        if _int(count) and count < 1:
            self.problem("%s: %s %d runs the engine without an API server (as --headless does): %s"
                         % (where, flag("api_server_count"), count, unreachable))
        for dest in ("grpc", "grpc_mode"):
            if given.get(dest):
                self.problem("%s: %s serves gRPC instead of HTTP: %s" % (where, flag(dest), unreachable))
        if given.get("ssl_keyfile") and not given.get("ssl_certfile"):
            self.problem("%s: %s without %s: uvicorn needs the certificate to start TLS, so the server would not "
                         "start and %s" % (where, flag("ssl_keyfile"), flag("ssl_certfile"), unreachable))
        if given.get("ssl_cert_reqs") == CERT_REQUIRED and given.get("ssl_certfile"):
            self.problem("%s: %s %d requires a client certificate, which the readiness gate does not have: %s"
                         % (where, flag("ssl_cert_reqs"), CERT_REQUIRED, unreachable))
        # uvicorn serves TLS when given a certificate (the key may be in the same file). The CA the
        # engine checks clients against is the one the gate checks the server with; a relative path
        # is the engine's, whose unit runs in / (no WorkingDirectory).
        tls = bool(given.get("ssl_certfile"))
        ca_path = posixpath.normpath(posixpath.join("/", given["ssl_ca_certs"])) \
            if tls and given.get("ssl_ca_certs") else ""
        return {"scheme": "https" if tls else "http", "ca_path": ca_path, "validate_certs": bool(ca_path) or not tls}

    # --- environment ----------------------------------------------------------------------

    def environment(self) -> dict:
        where = _var("environment")
        env = self.s["environment"]
        if not isinstance(env, dict):
            self.problem("%s must be a dict of variable names to values, got %s" % (where, _shown(env)))
            return {}
        out = {}
        for name, value in env.items():
            label = "%s.%s" % (where, name)
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                self.problem("%s: %s is not an environment variable name" % (where, _shown(name)))
                continue
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                self.problem("%s must be a string (quote YAML's true/false), got %s" % (label, _shown(value)))
                continue
            value = str(value)
            if not _utf8(value):
                self.problem("%s is not UTF-8 text" % label)
                continue
            if _control(value):
                self.problem("%s holds a control character" % label)
                continue
            if _bytes("%s=%s" % (name, value)) >= ARGUMENT_MAX_BYTES:
                self.problem("%s is %d bytes long: the kernel refuses an environment string of %d bytes or more "
                             "(MAX_ARG_STRLEN)" % (label, _bytes(value), ARGUMENT_MAX_BYTES))
                continue
            if self.refused_name(where, name):
                continue
            if SECRET_NAME.search(name):
                self.problem("%s looks like a secret: the unit file is readable by every user, so put it in "
                             "%s.environment (a 0600 file)" % (label, _var("secrets")))
                continue
            out[name] = value
        visible = out.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            devices = [d.strip() for d in visible.split(",") if d.strip()]
            if _int(self.s["tensor_parallel_size"]) and len(devices) < self.s["tensor_parallel_size"]:
                self.problem("%s.CUDA_VISIBLE_DEVICES lists %d GPU(s), fewer than %s (%d)"
                             % (where, len(devices), _var("tensor_parallel_size"), self.s["tensor_parallel_size"]))
            # CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi and NVML by PCI bus.
            out.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            if out["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID":
                self.warnings.append("%s.CUDA_DEVICE_ORDER is %s: CUDA_VISIBLE_DEVICES then does not count GPUs "
                                     "as nvidia-smi does" % (where, out["CUDA_DEVICE_ORDER"]))
        return out

    def refused_name(self, where: str, name: str) -> bool:
        """A variable that neither environment may set (the plain one or the secrets'): its problem
        said, True."""
        if name in ("VLLM_PORT", "VLLM_HOST_IP"):
            self.problem("%s: %s is vLLM's address for its own internal communication, not the API's; "
                         "set %s and %s" % (where, name, _var("port"), _var("host")))
            return True
        return False

    def flag_variables(self) -> dict:
        """{flag: the variable that sets it} of the role's own flags, every spelling, for a sentence
        to name the variable to change."""
        return {flag: variable for dest, variable in self.owned.items() if self.flags.by_dest(dest)
                for flag in self.flags.by_dest(dest)["flags"]}

    def secret_environment(self, plain: dict) -> dict:
        """{variable: secret} for the unit's 0600 EnvironmentFile."""
        where = _var("secrets")
        secrets = self.s["secrets_set"]
        env = {}
        if secrets.get("hf_token"):
            env["HF_TOKEN"] = "hf_token"
        if secrets.get("api_key") and self.flags.data.get("api_key_env"):
            env[self.flags.data["api_key_env"]] = "api_key"
        if secrets.get("admin_api_key") and "admin_api_key" not in self.engine["secret_flags"]:
            self.problem("%s.admin_api_key: %s has no admin API key (%s only)" % (
                where, self.flags.label, ", ".join(e["label"] for e in ENGINES.values() if "admin_api_key" in e["secret_flags"])))
        for name in secrets.get("environment", []):
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                self.problem("%s.environment: %s is not an environment variable name" % (where, _shown(name)))
            elif self.refused_name(where + ".environment", name):
                pass
            elif name in plain:
                self.problem("%s.environment.%s is also in %s" % (where, name, _var("environment")))
            elif name in env:
                self.problem("%s.environment.%s is already set from %s.%s" % (where, name, where, env[name]))
            else:
                env[name] = "environment"
        return env

    def secret_file_keys(self) -> list:
        """The secrets set that this engine reads from its --config file."""
        return [name for name in self.engine["secret_file_keys"] if self.s["secrets_set"].get(name)]

    def secret_config(self) -> dict:
        """An engine that reads its API key from no environment variable (SGLang): a --config YAML file
        (0600) carries it, so the command line holds only the file's path."""
        keys = {self.flags.flag_of(self.engine["secret_flags"][name])[2:]: name for name in self.secret_file_keys()}
        if not keys:
            return {}
        path = posixpath.join(self.s["config_dir"], self.unit_stem() + ".secrets.yaml")
        return {"path": path, "secrets": keys, "args": [self.flags.flag_of("config"), path]}


def secrets_set(secrets) -> dict:
    """Which of the role's secrets (inference_service_secrets) are set, never their values: what build() is told."""
    named = dict(secret_values(secrets))
    environment = secrets.get("environment") if isinstance(secrets, dict) else None
    return {"api_key": "api_key" in named, "hf_token": "hf_token" in named, "admin_api_key": "admin_api_key" in named,
            "environment": list(environment) if isinstance(environment, dict) else []}


def gate_url(host: str, port: int, scheme: str = "http") -> str:
    """Where the readiness gate on the host reaches the server: built from the parsed host (an
    unspecified address becomes loopback), then read back as an HTTP client reads it, so that no
    text of the host can make the URL name another machine."""
    parsed = parse_host(host)
    if isinstance(parsed, str):
        name, netloc_host = parsed.lower(), parsed
    else:
        if parsed.is_unspecified:
            parsed = ipaddress.ip_address("::1" if parsed.version == 6 else "127.0.0.1")
        name = parsed.compressed
        netloc_host = "[%s]" % name if parsed.version == 6 else name
    url = urlunsplit((scheme, "%s:%d" % (netloc_host, port), "", "", ""))
    parts = urlsplit(url)
    if (parts.scheme, parts.hostname, parts.port, parts.username, parts.path) != (scheme, name, port, None, ""):
        raise ValueError("the gate's URL %s does not read back as %s port %d" % (url, name, port))
    return url


def executable_path(settings: dict, engine: str) -> str:
    """The engine's executable: inference_service_executable, else <venv>/bin/<engine>, else
    /usr/local/bin/<engine> (the role asks the same file's Python for the engine's version)."""
    if settings.get("executable"):
        return settings["executable"]
    if settings.get("venv"):
        return posixpath.join(settings["venv"], "bin", engine)
    return posixpath.join("/usr/local/bin", engine)


def build(settings: dict, flags: EngineFlags) -> dict:
    """Everything the unit needs from the role's settings (names without the role prefix)."""
    builder = _Builder(settings, flags)
    builder.check_scalars()
    if builder.problems:
        raise ServeConfigError(builder.problems)
    args = builder.core_args()
    args += builder.speculative_args()
    secret_config = builder.secret_config()
    extra = builder.check_extra(settings["extra_args"])
    env = builder.environment()
    secret_env = builder.secret_environment(env)
    args += secret_config.get("args", [])
    args += extra
    unchecked = flags.data.get("unchecked")
    if unchecked:
        builder.warnings.append("%s has no flag data: its command line is built with %s %s's flag names and not "
                                "checked on the controller; the engine's own check on the host decides"
                                % (flags.label, flags.engine, unchecked))
    elif not builder.problems:
        try:
            flags.parse(args[len(flags.data.get("command", [])):])
        except FlagError as exc:
            builder.problem("%s would refuse the command line: %s" % (flags.label, exc))
    if builder.problems:
        raise ServeConfigError(builder.problems)
    argv = [builder.executable()] + args
    exec_start = systemd.exec_line(argv)
    if _bytes(exec_start) > UNIT_LINE_MAX_BYTES:
        builder.problem("the command line is %d bytes in the unit file: systemd refuses a unit line over %d bytes "
                        "(LONG_LINE_MAX); shorten %s" % (_bytes(exec_start), UNIT_LINE_MAX_BYTES, _var("extra_args")))
        raise ServeConfigError(builder.problems)
    stem = builder.unit_stem()
    spec = settings["speculative"] or {}
    # "-": a cleanup that cannot run never stops the start; "+": as root, whatever User= says.
    prestart = [PRESTART_PYTHON, "-I", posixpath.join(PRESTART_DIR, "prestart_clean.py"), "--user", settings["user"] or "root"]
    method_key = flags.data["speculative"]["method_key"]
    return {
        "engine": flags.engine,
        "engine_version": flags.version,
        "engine_version_named": flags.named_version,
        # Which check the flag data made: `passed`, or `no data` (the engine's own check decides).
        "flag_data": "no data" if unchecked else "passed",
        "argv": argv,
        "command_line": " ".join(shlex.quote(word) for word in argv),
        "exec_start": exec_start,
        "exec_start_pre": "-+" + systemd.exec_line(prestart),
        "prestart_dir": PRESTART_DIR,
        "prestart_module_utils": list(PRESTART_MODULE_UTILS),
        "executable": argv[0],
        "environment": env,
        "environment_lines": [systemd.environment_item(k, v) for k, v in sorted(env.items())],
        "secret_environment": secret_env,
        "secret_config": {k: v for k, v in secret_config.items() if k != "args"},
        "env_file": posixpath.join(settings["config_dir"], stem + ".env"),
        "url": gate_url(settings["host"], settings["port"], builder.reach["scheme"]),
        "validate_certs": builder.reach["validate_certs"],
        "ca_path": builder.reach["ca_path"],
        "served_name": settings["served_name"] or settings["model"],
        "timeout_stop_sec": settings["drain_timeout"] + STOP_MARGIN_S,
        "speculative": dict({"enabled": bool(spec), "method": spec.get(method_key)}, **builder.running),
        "flag_variables": builder.flag_variables(),
        "warnings": builder.warnings,
    }
