"""A stand-in for `vllm serve` and `sglang serve`, for hosts without GPUs or models.

    python -m tests.sim.engine vllm serve MODEL [vLLM options]
    python -m tests.sim.engine sglang serve --model-path MODEL [SGLang options]

(On the fleet hosts it is installed as /usr/local/bin/vllm and /usr/local/bin/sglang.)
Standard library only: it runs with the bare Debian python3 of the fleet hosts.

It parses its command line with a parser built from the engine version's flag data and exits 2
on an option that version does not have; refuses an unknown speculative key as vLLM's pydantic
config does (exit 1); binds its port but refuses connections while it "loads" (as both engines
do); holds the GPU device files and registers memory in the fake NVML through one worker
process per tensor-parallel rank; serves the engine's HTTP endpoints (server.py) with
speculative counters at the configured acceptance rate; and on SIGTERM drains in-flight
requests, stops its workers and exits 0. settings.py lists what its environment controls,
faults included.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

from . import cli, gpus, server, settings as settings_mod
from .. import procinfo

# What the exit_zero_leaking fault leaves in STANDIN_SHM_DIR: a name of shm_clean's (psm_*), as vLLM's rings.
LEAKED_SEGMENT = "psm_standin_leaked"


DEFAULTS = {  # what the engines use when a flag is not given
    "vllm": {"port": 8000, "host": "0.0.0.0", "fraction": 0.92, "workers": "VLLM::Worker_TP"},
    "sglang": {"port": 30000, "host": "127.0.0.1", "fraction": 0.88, "workers": "sglang::scheduler_TP"},
}


def log(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def die(text: str, status: int = 1) -> int:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    return status


def _nvml(state_dir: str):
    if not state_dir:
        return None
    from ...fixtures.fake_nvml.state import FakeNvml  # pylint: disable=import-outside-toplevel
    return FakeNvml(state_dir)


def _options(engine: str, ns, env) -> dict:
    """What the engine takes from its parsed arguments, with its own defaults."""
    base = DEFAULTS[engine]
    if engine == "vllm":
        spec = ns.speculative_config or {}
        api_key = (ns.api_key or [None])[0] or env.get("VLLM_API_KEY", "")
        return {"model": ns.model_tag or "Qwen/Qwen3-0.6B", "served": (ns.served_model_name or [None])[0],
                "tp": ns.tensor_parallel_size or 1, "host": ns.host or base["host"], "port": ns.port or base["port"],
                "fraction": ns.gpu_memory_utilization or base["fraction"], "api_key": api_key,
                "spec_tokens": int(spec.get("num_speculative_tokens") or (3 if spec else 0)),
                "speculative": spec, "metrics": not ns.disable_log_stats, "drain_s": ns.shutdown_timeout or 0}
    spec = {key: value for key, value in vars(ns).items() if key.startswith("speculative_") and value}
    return {"model": ns.model_path, "served": ns.served_model_name, "tp": ns.tp_size or 1,
            "host": ns.host or base["host"], "port": ns.port or base["port"],
            "fraction": ns.mem_fraction_static or base["fraction"], "api_key": ns.api_key or "",
            "spec_tokens": int(ns.speculative_num_steps or 3) if ns.speculative_algorithm else 0,
            "speculative": spec, "metrics": bool(ns.enable_metrics), "drain_s": None,
            "decode_log_interval": ns.decode_log_interval or server.SGLANG_DECODE_LOG_INTERVAL}


def main(engine: str, argv: list, env=None) -> int:
    env = os.environ if env is None else env
    if engine not in DEFAULTS:
        return die("stand-in: unknown engine %r" % engine, 2)
    try:
        conf = settings_mod.load(env)
    except settings_mod.SettingsError as exc:
        return die("stand-in: %s" % exc, 2)
    try:
        data, ns = cli.parse(engine, list(argv), conf["flags_dir"], conf["version"])
        opts = _options(engine, ns, env)
    except (cli.UsageError, OSError) as exc:
        return cli.fail_usage(engine, str(exc))
    if engine == "sglang" and not opts["model"]:
        return cli.fail_usage(engine, "the following arguments are required: --model-path")
    try:
        if engine == "vllm":
            cli.check_speculative(data, opts["speculative"])
    except ValueError as exc:
        return die("pydantic_core._pydantic_core.ValidationError: %s" % exc)
    opts["served"] = opts["served"] or opts["model"]
    gpus.set_name(engine)
    stop = threading.Event()
    if conf["fault"] == "ignore_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    info = {"engine": engine, "version": data["version"], "argv": [sys.argv[0]] + list(argv), "pid": os.getpid(),
            "model": opts["model"], "served": opts["served"], "tp": opts["tp"], "speculative": opts["speculative"],
            "api_key_set": bool(opts["api_key"]), "settings": {k: str(v) for k, v in conf.items()}}
    if engine == "sglang":
        # As SGLang does at every start: its arguments in one line, keys and all (their repr).
        log("INFO server_args=ServerArgs(model_path=%r, served_model_name=%r, tp_size=%d, host=%r, port=%d, "
            "api_key=%r, admin_api_key=%r)" % (opts["model"], opts["served"], opts["tp"], opts["host"], opts["port"],
                                               opts["api_key"] or None, getattr(ns, "admin_api_key", None)))
    log("INFO stand-in %s %s: loading %s as %s, tensor parallel %d, on %s:%d%s"
        % (engine, data["version"], opts["model"], opts["served"], opts["tp"], opts["host"], opts["port"],
           ", speculative %s" % json.dumps(opts["speculative"], sort_keys=True) if opts["speculative"] else ""))
    workers = gpus.Workers()
    try:
        nvml = _nvml(conf["nvml_state"])
        indices = gpus.visible_gpus(env, opts["tp"], str(conf["dev_dir"]), nvml)
        state = server.State(engine, opts["served"], opts["model"], opts["api_key"], opts["spec_tokens"],
                             conf["acceptance"], opts["metrics"], conf["warmup_s"], info, conf["health_delay_s"],
                             opts.get("decode_log_interval", server.SGLANG_DECODE_LOG_INTERVAL), conf["fault"],
                             conf["decode_s"])
        leaked = os.path.join(env.get("STANDIN_SHM_DIR") or "/dev/shm", LEAKED_SEGMENT)
        if os.path.exists(leaked):
            return die("OSError: [Errno 28] No space left on device: %r (a segment a crash leaked)" % leaked)
        if stop.wait(conf["import_s"]):  # importing: the port is not bound yet
            log("INFO stand-in: stopped while importing")
            return 0
        try:
            httpd = server.make_server(opts["host"], opts["port"], state)
        except OSError as exc:
            raise gpus.EngineError("OSError: [Errno %s] %s: %s:%s" % (exc.errno, exc.strerror, opts["host"],
                                                                      opts["port"])) from exc
        mib = gpus.check_free(nvml, indices, opts["fraction"])
        workers.start(DEFAULTS[engine]["workers"], indices, mib, str(conf["dev_dir"]), nvml,
                      env.get("STANDIN_SHM_DIR", ""), conf["fault"] == "orphan_workers",
                      conf["fault"] == "ignore_sigterm")
        info["workers"] = [{"pid": pid, "create_time": procinfo.create_time(pid)} for pid in workers.pids]
        info["gpus"] = indices
        started = time.monotonic()
        while (conf["fault"] == "never_ready" or time.monotonic() - started < conf["load_s"]
               or (conf["hold_file"] and os.path.exists(conf["hold_file"]))):
            if stop.wait(0.02):
                log("INFO stand-in: stopped while loading")
                workers.stop()
                return 0
            if conf["fault"] == "crash_during_load" and time.monotonic() - started >= conf["load_s"] / 2:
                workers.stop()
                return die("RuntimeError: CUDA error: an illegal memory access was encountered "
                           "(stand-in fault crash_during_load)")
    except gpus.EngineError as exc:
        workers.stop()
        return die(str(exc))
    httpd.server_activate()
    state.listening_at = time.monotonic()
    state.warm_at = state.listening_at + conf["warmup_s"]
    info["ready_monotonic"] = state.warm_at
    if conf["state_file"]:
        with open(conf["state_file"] + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(info, handle)
        os.replace(conf["state_file"] + ".tmp", conf["state_file"])
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    log("INFO: Application startup complete." if engine == "vllm" else "The server is fired up and ready to roll!")
    if conf["fault"] == "orphan_workers":
        die("stand-in fault orphan_workers: the API server dies by SIGKILL, its workers stay")
        os.kill(os.getpid(), signal.SIGKILL)
    if conf["fault"] == "dead_api":
        # Only the listener goes: the process still stops on SIGTERM, its workers with it. The
        # workers were forked with the bound socket: shut down, not only closed here, it refuses.
        httpd.shutdown()
        httpd.socket.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        log("ERROR stand-in fault dead_api: the API server stopped serving, its workers hold their GPUs")
    if conf["fault"] == "exit_zero_leaking":
        with open(leaked, "wb") as handle:
            handle.write(b"\0" * 65536)
        workers.stop()
        log("ERROR stand-in fault exit_zero_leaking: the engine died, the API server exits 0, %s stays" % leaked)
        return 0
    if conf["crash_after_s"] and not stop.wait(conf["crash_after_s"]):
        workers.stop()
        return die("RuntimeError: CUDA error: unspecified launch failure (stand-in crash %.1f s after ready)"
                   % conf["crash_after_s"])
    while not stop.wait(0.2):
        pass
    return _shutdown(httpd, state, workers, opts["drain_s"])


def _shutdown(httpd, state, workers, drain_s) -> int:
    """SIGTERM: stop taking requests (SGLang's /health turns 503), drain in-flight ones (vLLM for
    --shutdown-timeout seconds, 0 aborts them; SGLang without a bound), stop the workers."""
    log("INFO stand-in: SIGTERM, draining %d request(s)" % state.in_flight)
    state.shutting_down = True
    deadline = None if drain_s is None else time.monotonic() + drain_s
    while state.in_flight and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.05)
    httpd.shutdown()
    httpd.server_close()
    workers.stop()
    log("INFO stand-in: shut down")
    return 0
