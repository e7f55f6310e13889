"""Who listens on the gate's port, read from /proc (plugins/module_utils/_listeners.py), against
real processes listening on 127.0.0.1: a listener and the child it forked after bind (which
shares the socket), beside a connected socket that is not listening. The processes end when
the test closes their stdin: nothing is signalled."""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager

from ansible_collections.cleanslate.gpu.plugins.module_utils import _listeners

# Listens on 127.0.0.1 (and ::1 when told), forks a child that keeps the socket, connects a
# client socket to it (established, not listening), prints the ports and pids, waits for EOF.
LISTENER = r"""
import json, os, socket, sys
family = socket.AF_INET6 if sys.argv[1] == "6" else socket.AF_INET
server = socket.socket(family)
server.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
server.listen(4)
client = socket.create_connection(server.getsockname()[:2])
child = os.fork()
if child == 0:
    sys.stdin.read()
    os._exit(0)
print(json.dumps({"port": server.getsockname()[1], "client_port": client.getsockname()[1],
                  "pids": [os.getpid(), child]}), flush=True)
sys.stdin.read()
os.waitpid(child, 0)
"""


@contextmanager
def listening(family="4"):
    proc = subprocess.Popen([sys.executable, "-c", LISTENER, family, "listener-under-test"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def own_cgroup():
    with open("/proc/self/cgroup") as handle:
        return _listeners.cgroup_path(handle.read())


def test_a_listening_socket_is_found_with_every_process_that_holds_it():
    with listening() as seen:
        found = _listeners.listeners(seen["port"])
        assert list(found["sockets"].values()) == [[
            {"pid": pid, "name": ("%s -c %s 4 listener-under-test" % (sys.executable, LISTENER))[:200],
             "cgroup": own_cgroup()} for pid in seen["pids"]]]
        assert found["unreadable"] == []  # root reads every process's descriptors
        # The client end is an established socket, not a listener.
        assert _listeners.listening_sockets(seen["client_port"]) == set()
    assert _listeners.listening_sockets(seen["port"]) == set()  # gone with its processes


def test_an_ipv6_listener_is_found_too():
    with listening("6") as seen:
        holders, dummy = _listeners.socket_holders(_listeners.listening_sockets(seen["port"]))
        assert list(holders.values()) == [seen["pids"]]


def test_the_cgroup_path_of_v2_and_of_systemds_v1_hierarchy():
    assert _listeners.cgroup_path("0::/system.slice/vllm.service\n") == "/system.slice/vllm.service"
    assert _listeners.cgroup_path("12:memory:/x\n1:name=systemd:/system.slice/sglang.service\n0::/\n") == "/"
    assert _listeners.cgroup_path("12:memory:/x\n1:name=systemd:/system.slice/sglang.service\n") == \
        "/system.slice/sglang.service"
    assert _listeners.cgroup_path("") == ""
