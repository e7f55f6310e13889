# -*- coding: utf-8 -*-
"""A callback for the benchmarks only: the wall time of each task, written as JSON at the end.

Enabled by bench/bench_inference_service.py (ANSIBLE_CALLBACK_PLUGINS=bench/callbacks,
ANSIBLE_CALLBACKS_ENABLED=task_seconds) with BENCH_TASK_SECONDS naming the file to write. A task's
time runs from its start to the next task's start (or the end of the run): what the run waits for
it, the worker, the host contact and the module included. The file: {"total_s", "tasks": [[seconds,
"path:line", "name"], ...], "ran": [["path:line", "action", delegated], ...]} in the order the tasks
ran; "ran" lists each task that some host ran (not skipped by every host), with its action and
whether it was delegated, from which the benchmark counts the host contacts.
"""
from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: task_seconds
type: aggregate
short_description: Write each task's wall time to the file BENCH_TASK_SECONDS names (benchmarks only)
description: Not part of the collection; bench/bench_inference_service.py enables it.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_seconds"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.started = self.mark = time.monotonic()
        self.current = None
        self.tasks = []
        self.ran = {}  # task uuid -> [path, action, delegated], once a host ran it

    def _next(self, current):
        now = time.monotonic()
        if self.current is not None:
            self.tasks.append([round(now - self.mark, 3), *self.current])
        self.mark, self.current = now, current

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._next((task.get_path() or "", task.get_name()))

    def v2_playbook_on_handler_task_start(self, task):
        self._next((task.get_path() or "", task.get_name()))

    def v2_playbook_on_play_start(self, play):
        # The play's own start (its hosts, its variables) is not the last task's time.
        self._next(("", "play: %s" % play.get_name()))

    def _ran(self, result):
        task = result._task  # pylint: disable=protected-access
        self.ran.setdefault(task._uuid, [task.get_path() or "", task.action,  # pylint: disable=protected-access
                                         bool(task.delegate_to)])

    def v2_runner_on_ok(self, result):
        self._ran(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._ran(result)

    def v2_runner_on_unreachable(self, result):
        self._ran(result)

    def v2_playbook_on_stats(self, stats):
        self._next(None)
        path = os.environ.get("BENCH_TASK_SECONDS")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({"total_s": round(time.monotonic() - self.started, 3), "tasks": self.tasks,
                           "ran": list(self.ran.values())}, handle)
