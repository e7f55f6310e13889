"""How the stand-in behaves: its environment, overridden by a JSON file read at start.

    STANDIN_LOAD_S        seconds to "load the model" (connection refused meanwhile), default 2
    STANDIN_WARMUP_S      SGLang: seconds /health answers 503 after the port opens, default 0
    STANDIN_ACCEPTANCE    fraction of drafted tokens accepted, default 0.7
    STANDIN_IMPORT_S      seconds before the port is even bound, default 0 (real vLLM imports for
                          10 to 60 s before it binds: the window in which another server can hold the port)
    STANDIN_HEALTH_DELAY_S
                          seconds /health takes to answer, default 0 (SGLang's runs a one-token
                          generation: up to 20 s under load)
    STANDIN_DECODE_S      seconds each generated token of a completion takes, default 0 (a real engine
                          streams tens of tokens a second: a request is in flight for seconds, which a
                          balancer's drain and the server's own shutdown timeout are about)
    STANDIN_CRASH_AFTER_S seconds after readiness at which the server exits 1, default 0 (never)
    STANDIN_FAULT         one fault (below), default none
    STANDIN_FAULT_FILE    a JSON file {"load_s": .., "fault": .., "acceptance": .., "import_s": ..,
                          "health_delay_s": .., "crash_after_s": .., "decode_s": ..} read at each start,
                          so a test changes a running unit's next start without editing the unit
    STANDIN_FLAGS_DIR     the flag data (default: the role's files/flags in this checkout)
    STANDIN_VERSION       the engine version to be (default: the installed package's version, as
                          the role's probe reads it; else the newest with data)
    STANDIN_DEV_DIR       where the GPU device files are (default /dev)
    STANDIN_STATE_FILE    where to write what it parsed and when it became ready (JSON), if set
    STANDIN_HOLD_FILE     while this file exists, loading goes on after load_s (a test ends it by
                          removing the file, so nothing depends on how fast the machine is)
    FAKE_NVML_STATE       the fake NVML state to register GPU memory in (tests/fixtures/fake_nvml)

Faults: ignore_sigterm (the server never stops on SIGTERM), crash_during_load (exits 1 half-way
through loading), never_ready (loads forever), low_acceptance (accepts 15% of drafts),
orphan_workers (once ready, the API server dies by SIGKILL and its GPU workers stay behind),
dead_api (once ready, the API server's listener dies and its port closes while the process and
its GPU workers live on: the unit stays active, nothing answers, as a vLLM whose event loop died),
hung_engine (completions never answer and no token is generated while /health answers 200, as a
vLLM whose EngineCore process is stopped), busy (completions wait 60 s in the queue while other
requests generate 50 tokens a second, as a saturated server), exit_zero_leaking (once ready, the
server leaves a segment in STANDIN_SHM_DIR and exits 0, as a vLLM whose API server ends cleanly after
its engine died, vllm-project/vllm#48966; any start that finds that segment dies, as an engine that
meets a leaked segment does, sgl-project/sglang#40723).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .cli import DEFAULT_FLAGS_DIR

FAULTS = ("ignore_sigterm", "crash_during_load", "never_ready", "low_acceptance", "orphan_workers", "dead_api",
          "hung_engine", "busy", "exit_zero_leaking")
LOW_ACCEPTANCE = 0.15


class SettingsError(ValueError):
    pass


def _number(name: str, value, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SettingsError("%s must be a number, got %r" % (name, value)) from None
    if not math.isfinite(number) or not low <= number <= high:
        raise SettingsError("%s must be from %s to %s, got %r" % (name, low, high, value))
    return number


def load(env=None) -> dict:
    env = os.environ if env is None else env
    raw = {"load_s": env.get("STANDIN_LOAD_S", "2"), "warmup_s": env.get("STANDIN_WARMUP_S", "0"),
           "acceptance": env.get("STANDIN_ACCEPTANCE"), "fault": env.get("STANDIN_FAULT", ""),
           "import_s": env.get("STANDIN_IMPORT_S", "0"), "health_delay_s": env.get("STANDIN_HEALTH_DELAY_S", "0"),
           "crash_after_s": env.get("STANDIN_CRASH_AFTER_S", "0"), "decode_s": env.get("STANDIN_DECODE_S", "0")}
    fault_file = env.get("STANDIN_FAULT_FILE")
    if fault_file and os.path.exists(fault_file):
        try:
            override = json.loads(Path(fault_file).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise SettingsError("%s is not JSON: %s" % (fault_file, exc)) from exc
        if not isinstance(override, dict) or set(override) - set(raw):
            raise SettingsError("%s may hold only %s" % (fault_file, ", ".join(sorted(raw))))
        raw.update(override)
    fault = raw["fault"] or ""
    if fault and fault not in FAULTS:
        raise SettingsError("fault must be one of %s, got %r" % (", ".join(FAULTS), fault))
    acceptance = raw["acceptance"]
    if acceptance is None or acceptance == "":
        acceptance = LOW_ACCEPTANCE if fault == "low_acceptance" else 0.7
    return {
        "load_s": _number("load_s", raw["load_s"], 0, 86400),
        "warmup_s": _number("warmup_s", raw["warmup_s"], 0, 86400),
        "import_s": _number("import_s", raw["import_s"], 0, 86400),
        "health_delay_s": _number("health_delay_s", raw["health_delay_s"], 0, 86400),
        "crash_after_s": _number("crash_after_s", raw["crash_after_s"], 0, 86400),
        "decode_s": _number("decode_s", raw["decode_s"], 0, 60),
        "acceptance": _number("acceptance", acceptance, 0, 1),
        "fault": fault,
        "flags_dir": Path(env.get("STANDIN_FLAGS_DIR") or DEFAULT_FLAGS_DIR),
        "version": env.get("STANDIN_VERSION", ""),
        "dev_dir": Path(env.get("STANDIN_DEV_DIR") or "/dev"),
        "state_file": env.get("STANDIN_STATE_FILE") or "",
        "hold_file": env.get("STANDIN_HOLD_FILE") or "",
        "nvml_state": env.get("FAKE_NVML_STATE") or "",
    }
