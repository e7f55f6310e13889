"""The evidence module's scenario, run as PID 1 of a private PID namespace (tests/functional/pidns.py):
a Python holder (a server's process, its API key on its command line) is started, the module runs
against it, and what it kept comes back: each file's text, the directory's mode."""
from __future__ import annotations

import os
import signal
import stat


def hung_server_then_evidence(ns, params, env, secret, stopped=False, name="VLLM::EngineCor"):
    held = ns.start(argv_extra=["--api-key", secret], key="engine", name=name)
    if stopped:  # a hung engine as the tests make one: SIGSTOP
        os.kill(held["engine"]["pid"], signal.SIGSTOP)
    result = ns.module("evidence", dict(params, cmdline_patterns=["--api-key"]), env=env)
    kept = {}
    if result.get("directory"):
        for name in sorted(os.listdir(result["directory"])):
            with open(os.path.join(result["directory"], name), "rb") as handle:
                kept[name] = handle.read().decode("utf-8")
        result["mode"] = stat.S_IMODE(os.stat(result["directory"]).st_mode)
    return {"result": result, "kept": kept, "pid": held["engine"]["pid"]}


def check_mode(ns, params):
    held = ns.start(argv_extra=["--api-key", "x"], key="engine")
    result = ns.module("evidence", dict(params, cmdline_patterns=["--api-key"]), check=True)
    return {"result": result, "pid": held["engine"]["pid"]}
