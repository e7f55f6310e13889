"""Issue 37 on real systemd hosts (the fleet of test_inference_service_fleet.py, served the same way):
a server that systemd's own restart is loading is not reset, and the gate waits for it; a server
whose /health answers while it generates nothing is hung, and reset.

Loading: a rerun of reset_and_serve.yml 14 s after `kill -9`, while systemd's Restart=always was
loading the model, saw "connection refused", called the server unhealthy and reset the load. Hung:
vLLM's EngineCore stopped keeps /health at 200 while no completion returns; the look called it
healthy and left it so. The stand-in's fault file (read at each start) makes the next start load
for a minute, or hang its completions (hung_engine)."""
from __future__ import annotations

import json
import time

from tests.integration.fleet.reports import rows_by_host
from tests.integration.test_inference_service_fleet import (  # noqa: F401 pylint: disable=unused-import
    UNIT, base_vars, served)
from tests.integration.test_serve_safety_fleet import answers, main_pid


def wait(what, check, timeout):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "%s did not happen within %d s" % (what, timeout)
        time.sleep(0.2)


def test_a_server_systemd_restarted_and_still_loading_is_not_reset_and_the_gate_waits_for_it(served):
    fleet = served.fleet
    old = main_pid(served, "node3", UNIT)
    served.fault("node3", load_s=60)
    since = float(fleet.run("node3", ["date", "+%s"]).stdout) - 1
    try:
        fleet.run("node3", ["systemctl", "kill", "--signal=SIGKILL", "--kill-whom=main", UNIT])
        # systemd's own restart (RestartSec 1): a new main process whose port refuses while it loads.
        wait("systemd's restart", lambda: main_pid(served, "node3", UNIT) not in (0, old), 30)
        restarted = main_pid(served, "node3", UNIT)
        assert not answers(served, "node3")
        proc, report = served.play(limit="node3")
        assert proc.returncode == 0, proc.stdout[-6000:]
        row = rows_by_host(report)["node3"]
        # Not reset: no step ran, nothing killed; the note says loading and since when.
        assert row["killed"] == 0 and row["seconds_per_step"] == {}, row
        assert row.get("note", "").startswith("server loading (started "), row
        # The gate waited for that very load: the same main process, one start (systemd's) since the kill.
        assert row["service"]["status"] == "ready", row["service"]
        assert main_pid(served, "node3", UNIT) == restarted
        assert served.starts_since("node3", since) == 1
    finally:
        served.fault("node3")
        served.vars["node3"] = base_vars("node3")
        if not answers(served, "node3"):
            served.heal("node3")


def test_a_server_whose_health_answers_but_that_generates_nothing_is_hung_and_reset(served):
    fleet = served.fleet
    served.fault("node3", fault="hung_engine")
    fleet.run("node3", ["systemctl", "restart", UNIT])
    try:
        served.wait_health("node3", timeout=60)  # the stand-in read its fault file when it started
        served.fault("node3")  # its next start (the reset's) serves again
        hung = main_pid(served, "node3", UNIT)
        status, body = served.get("node3", "/sim/state")
        assert status == 200 and json.loads(body)["settings"]["fault"] == "hung_engine", body
        served.vars["node3"]["inference_service_hung_after"] = 3
        proc, report = served.play(limit="node3")
        assert proc.returncode == 0, proc.stdout[-6000:]
        row = rows_by_host(report)["node3"]
        # Reset: the steps ran, the hung server's processes were stopped, a new one serves.
        assert row["seconds_per_step"] != {}, row
        assert row.get("note", "").startswith(
            "server hung (hung: /health answered 200 but a 1-token completion got no answer in 3 s and no token was "
            "generated (0 tokens generated"), row
        assert row["note"].endswith("): reset"), row
        assert main_pid(served, "node3", UNIT) not in (0, hung)
        assert row["service"]["status"] == "ready", row["service"]
    finally:
        served.fault("node3")
        served.vars["node3"] = base_vars("node3")
        if not answers(served, "node3"):
            served.heal("node3")
