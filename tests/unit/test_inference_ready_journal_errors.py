"""Issue 37, 5: the journal excerpt names the cause. When vLLM died at start, the 20 journal lines
the gate reported were all the API server's traceback frames, ending "Engine core initialization
failed. See root cause above."; the cause (`RuntimeError: No working C++ compiler found`, logged by
the EngineCore process) was above them. The gate now picks the invocation's error lines among its
last 2000 and puts them first. The logs below are the engines' real shapes (vLLM 0.11's
EngineCore and API server records with their process prefix, SGLang's scheduler), cut short."""
from __future__ import annotations

from ansible_collections.cleanslate.gpu.plugins.modules.inference_ready import (
    JOURNAL_ERROR_CHARS, JOURNAL_ERRORS, error_lines, journal, journal_text)
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker

CORE = "(EngineCore_DP0 pid=2345) ERROR 12-05 09:41:02 [core.py:708] "
API = "(APIServer pid=2300) "
VLLM_START_FAILURE = [
    API + "INFO 12-05 09:40:51 [api_server.py:1839] vLLM API server version 0.11.0",
    API + "INFO 12-05 09:40:51 [utils.py:233] non-default args: {'model_tag': 'Qwen/Qwen3-0.6B', 'port': 8000}",
    "(EngineCore_DP0 pid=2345) INFO 12-05 09:40:58 [core.py:77] Initializing a V1 LLM engine (v0.11.0)",
    CORE + "EngineCore failed to start.",
    CORE + "Traceback (most recent call last):",
    CORE + '  File "/opt/vllm/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 699, in run_engine_core',
    CORE + "    engine_core = EngineCoreProc(*args, **kwargs)",
    CORE + "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    CORE + '  File "/opt/vllm/lib/python3.12/site-packages/torch/_inductor/cpp_builder.py", line 120, in get_cpp_compiler',
    CORE + '    raise RuntimeError("No working C++ compiler found")',
    CORE + "RuntimeError: No working C++ compiler found",
    "(EngineCore_DP0 pid=2345) Process EngineCore_DP0:",
    "(EngineCore_DP0 pid=2345) Traceback (most recent call last):",
    '(EngineCore_DP0 pid=2345)   File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
    "(EngineCore_DP0 pid=2345)     self.run()",
    "(EngineCore_DP0 pid=2345) RuntimeError: No working C++ compiler found",
] + [API + line for line in (
    "Traceback (most recent call last):",
    '  File "/opt/vllm/bin/vllm", line 10, in <module>',
    "    sys.exit(main())",
    "             ^^^^^^",
    '  File "/opt/vllm/lib/python3.12/site-packages/vllm/entrypoints/cli/main.py", line 54, in main',
    "    args.dispatch_function(args)",
    '  File "/opt/vllm/lib/python3.12/site-packages/vllm/entrypoints/cli/serve.py", line 57, in cmd',
    "    uvloop.run(run_server(args))",
    '  File "/opt/vllm/lib/python3.12/site-packages/uvloop/__init__.py", line 109, in run',
    "    return __asyncio.run(",
    "           ^^^^^^^^^^^^^",
    '  File "/usr/lib/python3.12/asyncio/runners.py", line 195, in run',
    "    return runner.run(main)",
    "           ^^^^^^^^^^^^^^^^",
    '  File "/usr/lib/python3.12/asyncio/runners.py", line 118, in run',
    "    return self._loop.run_until_complete(task)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "uvloop/loop.pyx", line 1518, in uvloop.loop.Loop.run_until_complete',
    '  File "/opt/vllm/lib/python3.12/site-packages/vllm/entrypoints/openai/api_server.py", line 1884, in run_server',
    "    await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
    '  File "/opt/vllm/lib/python3.12/site-packages/vllm/entrypoints/openai/api_server.py", line 1902, in run_server_worker',
    "    async with build_async_engine_client(",
    '  File "/usr/lib/python3.12/contextlib.py", line 210, in __aenter__',
    "    return await anext(self.gen)",
    "           ^^^^^^^^^^^^^^^^^^^^^",
    '  File "/opt/vllm/lib/python3.12/site-packages/vllm/v1/engine/core_client.py", line 472, in __init__',
    "    with launch_core_engines(vllm_config, executor_class, log_stats) as (engine_manager,",
    '  File "/opt/vllm/lib/python3.12/site-packages/vllm/v1/engine/utils.py", line 878, in wait_for_engine_startup',
    "    raise RuntimeError(",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
)] + ["vllm.service: Main process exited, code=exited, status=1/FAILURE",
      "vllm.service: Failed with result 'exit-code'."]
VLLM_CAUSE = [CORE + "EngineCore failed to start.", CORE + "RuntimeError: No working C++ compiler found",
              API + "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]

SGLANG_SCHEDULER_FAILURE = [
    "[2025-12-05 09:41:00] server_args=ServerArgs(model_path='Qwen/Qwen3-0.6B', api_key=None, port=30000)",
    "[2025-12-05 09:41:02 TP0] Load weight begin. avail mem=78.50 GB",
    "[2025-12-05 09:41:02 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2680, in run_scheduler_process',
    "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
    '  File "/usr/local/lib/python3.12/dist-packages/torch/cuda/memory.py", line 300, in _alloc',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB",
    "",
    "[2025-12-05 09:41:03] Received sigquit from a child process. It usually means the child failed.",
]


def test_vllm_the_engine_cores_error_comes_first_and_its_frames_are_left_out():
    assert error_lines(VLLM_START_FAILURE) == VLLM_CAUSE


def test_the_last_20_lines_alone_hold_no_cause_which_is_why_the_errors_are_read_above_them():
    assert not any("C++" in line for line in VLLM_START_FAILURE[-20:])


def test_sglang_the_schedulers_exception_and_the_exception_line_ending_its_traceback():
    assert error_lines(SGLANG_SCHEDULER_FAILURE) == [SGLANG_SCHEDULER_FAILURE[2], SGLANG_SCHEDULER_FAILURE[6]]


def test_other_shapes_plain_errors_uvicorn_and_bare_exceptions_and_what_is_no_error():
    lines = ["ERROR 12-05 09:41:02 [serving_chat.py:10] Error in preprocessing prompt inputs",
             "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
             "Exception: boom",
             "KeyboardInterrupt",
             "WARNING 12-05 09:41:02 [config.py:100] RuntimeError: a warning that quotes an error is no error record",
             "INFO: Application startup complete.",
             "UserWarning: TypedStorage is deprecated",
             "A line that says Error in the middle: not an exception line"]
    assert error_lines(lines) == lines[:4]


def test_each_error_once_however_often_and_wherever_it_is_logged_and_at_most_journal_errors():
    repeated = ["(EngineCore_DP%d pid=%d) ERROR 12-05 09:41:%02d [core.py:1] ValueError: bad %d"
                % (rank, 100 + rank, second, second % 3) for rank in range(2) for second in range(20)]
    assert error_lines(repeated) == repeated[:3]
    many = ["ValueError: bad %d" % number for number in range(50)]
    assert error_lines(many) == many[:JOURNAL_ERRORS]


class FakeModule:
    def __init__(self, out):
        self.out, self.calls = out, []

    def run_command(self, argv):
        self.calls.append(argv)
        return 0, self.out, ""


def test_journal_reads_2000_lines_returns_the_tail_and_the_errors_masked_and_cut():
    secret = "sk-0123456789abcdef"
    long_error = "RuntimeError: " + "x" * 5000
    lines = VLLM_START_FAILURE + [API + "ValueError: the key %s was refused" % secret, long_error]
    module = FakeModule("\n".join(lines) + "\n")
    params = {"unit": "vllm.service", "journal_lines": 20}
    found = journal(module, params, "4b3c0f0e2b8a4c1d9f7e6a5b4c3d2e1f", Masker([secret]))
    assert module.calls[-1][module.calls[-1].index("--lines") + 1] == "2000"
    assert len(found["journal"]) == 20 and found["journal"][-2].endswith("the key ******** was refused")
    assert found["journal_errors"][:3] == VLLM_CAUSE
    assert found["journal_errors"][3] == API + "ValueError: the key ******** was refused"
    assert len(found["journal_errors"][4]) < JOURNAL_ERROR_CHARS + 40 and "more characters" in found["journal_errors"][4]
    assert not any(secret in line for line in found["journal"] + found["journal_errors"])


def test_the_failure_message_names_the_cause_first_then_the_tail():
    found = {"journal_errors": VLLM_CAUSE, "journal": VLLM_START_FAILURE[-20:]}
    text = journal_text(found, "its last journal lines")
    assert text.startswith("the cause, from the journal:\n" + "\n".join(VLLM_CAUSE) + "\nits last journal lines:\n")
    assert text.endswith("\n".join(VLLM_START_FAILURE[-20:]))
    assert text.index("No working C++ compiler") < text.index("its last journal lines")
    # No error line found: the tail alone, as before.
    assert journal_text({"journal_errors": [], "journal": ["a"]}, "its last journal lines") == "its last journal lines:\na"
