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
import json
import math
import posixpath
import re
import shlex

from ansible_collections.cleanslate.gpu.plugins.plugin_utils._engine_flags import EngineFlags, FlagError
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


class ServeConfigError(ValueError):
    """Every problem of a configuration, each one sentence."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def _var(name: str) -> str:
    return PREFIX + name


def _control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _suggest(word: str, candidates) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=3)
    return (" (did you mean %s?)" % ", ".join(close)) if close else ""


class _Builder:
    def __init__(self, settings: dict, flags: EngineFlags):
        self.s = settings
        self.flags = flags
        self.problems = []
        self.warnings = []
        self.owned = {}  # dest -> the variable that sets it

    def problem(self, text: str) -> None:
        self.problems.append(text)

    # --- scalar settings ------------------------------------------------------------------

    def check_scalars(self) -> None:
        s = self.s
        # A leading "-" would make the engine read the model as an option (vLLM then serves its
        # default model under the served name).
        if not isinstance(s["model"], str) or not s["model"].strip() or _control(s["model"]) \
                or s["model"].startswith("-"):
            self.problem("%s must name the model (a Hugging Face repository or a local path), got %r"
                         % (_var("model"), s["model"]))
        if not isinstance(s["served_name"], str) or _control(s["served_name"]) or " " in s["served_name"]:
            self.problem("%s must be one word without spaces, got %r" % (_var("served_name"), s["served_name"]))
        if not _int(s["tensor_parallel_size"]) or not 1 <= s["tensor_parallel_size"] <= 1024:
            self.problem("%s must be an integer from 1 to 1024, got %r"
                         % (_var("tensor_parallel_size"), s["tensor_parallel_size"]))
        if not isinstance(s["host"], str) or not s["host"] or any(c.isspace() for c in s["host"]) or _control(s["host"]) \
                or s["host"].startswith("-"):
            self.problem("%s must be an address or host name, got %r" % (_var("host"), s["host"]))
        if not _int(s["port"]) or not 1 <= s["port"] <= 65535:
            self.problem("%s must be a port from 1 to 65535, got %r" % (_var("port"), s["port"]))
        fraction = s["gpu_memory_fraction"]
        if not _number(fraction) or not 0 <= fraction <= 1:
            self.problem("%s must be more than 0 and at most 1 (0: the engine's default), got %r"
                         % (_var("gpu_memory_fraction"), fraction))
        if not _int(s["max_model_len"]) or s["max_model_len"] < 0:
            self.problem("%s must be a positive integer (0: the model's own), got %r"
                         % (_var("max_model_len"), s["max_model_len"]))
        if not _int(s["drain_timeout"]) or not 0 <= s["drain_timeout"] <= 86400:
            self.problem("%s must be an integer from 0 to 86400 seconds, got %r"
                         % (_var("drain_timeout"), s["drain_timeout"]))
        unit = s["unit"]
        if not isinstance(unit, str) or not UNIT_NAME.match(unit) or ".." in unit or len(unit) > 255:
            self.problem("%s must be a service unit name such as vllm.service (letters, digits, ':_.-'), got %r"
                         % (_var("unit"), unit))
        if s["user"] and (not isinstance(s["user"], str) or not USER_NAME.match(s["user"])):
            self.problem("%s must be a user name, got %r" % (_var("user"), s["user"]))
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
        if self.s["executable"]:
            return self.s["executable"]
        if self.s["venv"]:
            return posixpath.join(self.s["venv"], "bin", self.flags.engine)
        return posixpath.join("/usr/local/bin", self.flags.engine)

    def unit_stem(self) -> str:
        return self.s["unit"][: -len(".service")] if isinstance(self.s["unit"], str) else "inference"

    # --- the command line -----------------------------------------------------------------

    def own(self, dest: str, variable: str) -> str:
        self.owned[dest] = variable
        return self.flags.flag_of(dest)

    def core_args(self) -> list:
        s = self.s
        flags = self.flags
        served = s["served_name"] or s["model"]
        args = list(flags.data.get("command", []))
        if flags.engine == "vllm":
            args.append(s["model"])
            self.owned["model"] = _var("model")
        else:
            args += [self.own("model_path", _var("model")), s["model"]]
        args += [self.own("served_model_name", _var("served_name")), served,
                 self.own("tensor_parallel_size" if flags.engine == "vllm" else "tp_size",
                          _var("tensor_parallel_size")), str(s["tensor_parallel_size"]),
                 self.own("host", _var("host")), s["host"],
                 self.own("port", _var("port")), str(s["port"])]
        fraction_dest = "gpu_memory_utilization" if flags.engine == "vllm" else "mem_fraction_static"
        length_dest = "max_model_len" if flags.engine == "vllm" else "context_length"
        flag = self.own(fraction_dest, _var("gpu_memory_fraction"))
        if s["gpu_memory_fraction"]:
            args += [flag, repr(float(s["gpu_memory_fraction"]))]
        flag = self.own(length_dest, _var("max_model_len"))
        if s["max_model_len"]:
            args += [flag, str(s["max_model_len"])]
        if flags.engine == "vllm":
            # SIGTERM drains in-flight requests for this long (0 would abort them).
            args += [self.own("shutdown_timeout", _var("drain_timeout")), str(s["drain_timeout"])]
            for dest in ("api_key", "hf_token"):
                self.owned[dest] = _var("secrets") + "." + dest
        else:
            # /metrics exists only with --enable-metrics: the acceptance rate is read there.
            args.append(self.own("enable_metrics", _var("speculative") + " (read back from /metrics)"))
            for dest in ("api_key", "admin_api_key"):
                self.owned[dest] = _var("secrets") + "." + dest
        return args

    # --- speculative decoding -------------------------------------------------------------

    def speculative_args(self) -> list:
        spec = self.s["speculative"]
        data = self.flags.data["speculative"]
        if self.flags.engine == "vllm":
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
        if self.flags.engine == "vllm":
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
                    self.problem("%s must be a %s value, got %r" % (label, entry["type"], value))
                    break
            else:
                args += [flag] + [str(item) for item in values]
        method = spec.get(data["method_key"])
        if not method:
            self.problem("%s.%s is required: name the algorithm (%s)"
                         % (where, data["method_key"], ", ".join(data["algorithms"])))
        elif isinstance(method, str) and method.upper() not in data["algorithms"]:
            self.warnings.append("%s.%s %s is not one of SGLang %s's built-in algorithms (%s); "
                                 "it must come from a plugin" % (where, data["method_key"], method,
                                                                 self.flags.version, ", ".join(data["algorithms"])))
        given = [key for key in data["all_or_none"] if key in spec]
        if given and len(given) != len(data["all_or_none"]):
            missing = ", ".join(k for k in data["all_or_none"] if k not in spec)
            self.problem("%s: %s are given together or not at all (SGLang picks all three itself when none is "
                         "given); missing: %s" % (where, ", ".join(data["all_or_none"]), missing))
        for key in given:
            if not _int(spec[key]) or spec[key] < 1:
                self.problem("%s.%s must be an integer of 1 or more, got %r" % (where, key, spec[key]))
        if spec.get("speculative_adaptive_config") and spec.get("speculative_adaptive") is not True:
            self.warnings.append("%s.speculative_adaptive_config has no effect without speculative_adaptive: true"
                                 % where)
        return args

    # --- extra arguments ------------------------------------------------------------------

    def check_extra(self, extra) -> list:
        where = _var("extra_args")
        if not isinstance(extra, list) or not all(isinstance(item, (str, int, float)) and not isinstance(item, bool)
                                                  for item in extra):
            self.problem("%s must be a list of strings (each flag and each value its own item), got %r"
                         % (where, extra))
            return []
        items = [str(item) for item in extra]
        for item in items:
            if _control(item):
                self.problem("%s: item %r holds a control character" % (where, item))
        found, unknown = self.flags.options_in(items)
        for text in unknown:
            self.problem("%s: %s" % (where, text))
        for option, entry in found:
            owner = self.owned.get(entry["dest"])
            if owner and owner.startswith(_var("secrets")):
                self.problem("%s: %s would put a secret on the command line, where every user of the host reads "
                             "it in /proc; set %s instead" % (where, option, owner))
            elif owner:
                self.problem("%s: %s is set by the role; use %s" % (where, option, owner))
            elif entry["dest"] == "config":
                if self.flags.engine == "sglang" and self.s["secrets_set"].get("api_key"):
                    self.problem("%s: %s cannot be given with an API key: SGLang takes one --config file, "
                                 "which carries the key" % (where, option))
                else:
                    self.warnings.append("%s: the flags inside %s's file are not checked" % (where, option))
            if entry.get("deprecated"):
                self.warnings.append("%s: %s is deprecated in %s" % (where, option, self.flags.label))
            if self.flags.engine == "vllm" and entry["dest"] == "disable_log_stats" and self.s["speculative"]:
                self.warnings.append("%s: %s also turns off /metrics, where the acceptance rate is read"
                                     % (where, option))
        return items

    # --- environment ----------------------------------------------------------------------

    def environment(self) -> dict:
        where = _var("environment")
        env = self.s["environment"]
        if not isinstance(env, dict):
            self.problem("%s must be a dict of variable names to values, got %r" % (where, env))
            return {}
        out = {}
        for name, value in env.items():
            label = "%s.%s" % (where, name)
            if not isinstance(name, str) or not ENV_NAME.match(name):
                self.problem("%s: %r is not an environment variable name" % (where, name))
                continue
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                self.problem("%s must be a string (quote YAML's true/false), got %r" % (label, value))
                continue
            value = str(value)
            if _control(value):
                self.problem("%s holds a control character" % label)
                continue
            if name in ("VLLM_PORT", "VLLM_HOST_IP"):
                self.problem("%s: %s is vLLM's address for its own internal communication, not the API's; "
                             "set %s and %s" % (where, name, _var("port"), _var("host")))
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

    def secret_environment(self, plain: dict) -> dict:
        """{variable: secret} for the unit's 0600 EnvironmentFile."""
        where = _var("secrets")
        secrets = self.s["secrets_set"]
        env = {}
        if secrets.get("hf_token"):
            env["HF_TOKEN"] = "hf_token"
        if secrets.get("api_key") and self.flags.data.get("api_key_env"):
            env[self.flags.data["api_key_env"]] = "api_key"
        if secrets.get("admin_api_key") and self.flags.engine != "sglang":
            self.problem("%s.admin_api_key: %s has no admin API key (SGLang only)" % (where, self.flags.label))
        for name in secrets.get("environment", []):
            if not isinstance(name, str) or not ENV_NAME.match(name):
                self.problem("%s.environment: %r is not an environment variable name" % (where, name))
            elif name in plain:
                self.problem("%s.environment.%s is also in %s" % (where, name, _var("environment")))
            elif name in env:
                self.problem("%s.environment.%s is already set from %s.%s" % (where, name, where, env[name]))
            else:
                env[name] = "environment"
        return env

    def secret_config(self) -> dict:
        """SGLang reads its API key from no environment variable: a --config YAML file (0600) carries it,
        so the command line holds only the file's path."""
        secrets = self.s["secrets_set"]
        if self.flags.engine != "sglang":
            return {}
        keys = {flag[2:]: name for name, flag in (("api_key", "--api-key"), ("admin_api_key", "--admin-api-key"))
                if secrets.get(name)}
        if not keys:
            return {}
        path = posixpath.join(self.s["config_dir"], self.unit_stem() + ".secrets.yaml")
        return {"path": path, "secrets": keys, "args": [self.flags.flag_of("config"), path]}


def gate_url(host: str, port) -> str:
    """Where the readiness gate on the host reaches the server."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = "[%s]" % host
    return "http://%s:%s" % (host, port)


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
    if not builder.problems:
        try:
            flags.parse(args[len(flags.data.get("command", [])):])
        except FlagError as exc:
            builder.problem("%s would refuse the command line: %s" % (flags.label, exc))
    if builder.problems:
        raise ServeConfigError(builder.problems)
    argv = [builder.executable()] + args
    stem = builder.unit_stem()
    spec = settings["speculative"] or {}
    method_key = flags.data["speculative"]["method_key"]
    return {
        "engine": flags.engine,
        "engine_version": flags.version,
        "argv": argv,
        "command_line": " ".join(shlex.quote(word) for word in argv),
        "exec_start": systemd.exec_line(argv),
        "executable": argv[0],
        "environment": env,
        "environment_lines": [systemd.environment_item(k, v) for k, v in sorted(env.items())],
        "secret_environment": secret_env,
        "secret_config": {k: v for k, v in secret_config.items() if k != "args"},
        "env_file": posixpath.join(settings["config_dir"], stem + ".env"),
        "url": gate_url(settings["host"], settings["port"]),
        "served_name": settings["served_name"] or settings["model"],
        "timeout_stop_sec": settings["drain_timeout"] + STOP_MARGIN_S,
        "speculative": {"enabled": bool(spec), "method": spec.get(method_key)},
        "warnings": builder.warnings,
    }
