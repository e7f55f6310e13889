"""Who listens on the gate's port, read from /proc (plugins/module_utils/_listeners.py), against
real processes listening on 127.0.0.1: a listener and the child it forked after bind (which
shares the socket), beside a connected socket that is not listening. The processes end when
the test closes their stdin: nothing is signalled."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest

from ansible_collections.cleanslate.gpu.plugins.module_utils import _listeners
from ansible_collections.cleanslate.gpu.plugins.modules.inference_ready import port_problem

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
        # Root reads its own processes' descriptors (a process of another user namespace, such as a
        # sandbox's PID 1, may refuse even root: it is named unreadable, not passed over).
        assert not set(seen["pids"]) & set(found["unreadable"]), found
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


# Listens on 127.0.0.1 as nobody and prints its port; ends at EOF on stdin.
NOBODY_LISTENER = r"""
import os, socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(4)
print(server.getsockname()[1], os.getpid(), flush=True)
sys.stdin.read()
"""
# The gate's reading of the port, by a root process without CAP_SYS_PTRACE (a container's root, or a
# confined one): another user's /proc/PID/fd is then refused (EACCES), not gone.
READ_AS_CONFINED_ROOT = r"""
import json, sys
from ansible_collections.cleanslate.gpu.plugins.module_utils import _listeners
print(json.dumps(_listeners.listeners(int(sys.argv[1]))))
"""


# What a confined root lacks: CAP_SYS_PTRACE alone (a container's root: it lists another user's
# /proc/PID/fd, and readlink of each descriptor is refused), or with what lists the directory too.
@pytest.mark.parametrize("drop", ["-sys_ptrace", "-sys_ptrace,-dac_read_search,-dac_override"])
def test_a_listener_whose_descriptors_may_not_be_read_is_named_unreadable_not_taken_for_gone(drop):
    """A reader may not look into another user's descriptors (EACCES): that process may hold the
    port, so it is named, and the gate cannot prove the unit answers; skipping it as if it had
    exited (or its refused links as if they had closed) would let a foreign server pass unseen."""
    listener = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                 "-c", NOBODY_LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd="/")
    try:
        port, pid = (int(word) for word in listener.stdout.readline().split())
        read = subprocess.run(["setpriv", "--bounding-set=" + drop, "--inh-caps=-all",
                               sys.executable, "-c", READ_AS_CONFINED_ROOT, str(port)], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), check=True, timeout=60)
        found = json.loads(read.stdout)
        assert pid in found["unreadable"], found
        assert found["sockets"] and all(holders == [] for holders in found["sockets"].values()), found
        # What the gate says of it (the module's decision, from the same reading).
        problem, holder, unproven = port_problem(port, "gate-test.service", "/system.slice/gate-test.service", found)
        assert holder is None and problem.startswith("cannot prove that unit gate-test.service answers on port %d" % port)
        assert unproven is True and "CAP_SYS_PTRACE" in problem, problem
    finally:
        listener.stdin.close()
        listener.wait(timeout=30)
