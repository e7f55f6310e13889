"""The test bridge: one private /24 on this machine that only the fleet's hosts live on.

systemd-nspawn --network-bridge gives each host its own network namespace and a veth pair
whose outer end joins the bridge; nothing routes beyond it, so the hosts and the tests talk
only to each other and to this machine's bridge address.
"""
from __future__ import annotations

import ipaddress
import subprocess


class NetworkError(RuntimeError):
    pass


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


class Bridge:
    def __init__(self, name: str, cidr: str):
        self.name = name
        self.network = ipaddress.ip_network(cidr)
        hosts = self.network.hosts()
        self.gateway = str(next(hosts))

    def address(self, index: int) -> str:
        """The address of host number `index` (1-based): .11, .12, ..."""
        return str(self.network.network_address + 10 + index)

    @property
    def prefixlen(self) -> int:
        return self.network.prefixlen

    def exists(self) -> bool:
        return _ip("link", "show", "dev", self.name, check=False).returncode == 0

    def create(self) -> None:
        """A fresh bridge; a leftover one of the same name (a killed run) is replaced."""
        self.delete()
        _ip("link", "add", self.name, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", self.name)
        _ip("link", "set", self.name, "up")

    def delete(self) -> None:
        if self.exists():
            _ip("link", "del", self.name)
