"""Backends on this host for the local Traefik: a selectorless Service plus a hand-made EndpointSlice.

Traefik sends to the addresses in a Service's EndpointSlices. A test server on 127.0.0.1 cannot be one:
the API server refuses loopback (and link-local) endpoint addresses ("may not be in the loopback range").
`HostAddress` puts a /32 address on a bridge of its own with no ports (`cfhost<n>`, like the real nodes'
`cfbr<i>`), so a server can listen on that address alone, never on the host's network interface; the
EndpointSlice names it, and `close()` deletes the bridge again. Adding a bridge needs root and `ip`.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess

from chatfleet_platform.common.config import PlatformError, require_tool

#: Where HostAddress picks its /32 addresses: outside the kwok pods (10.244/16), the real nodes' pods
#: (10.245/16) and the Services (10.96/16).
HOST_ADDRESS_RANGE = ipaddress.ip_network("10.246.0.0/24")
MANAGED_BY = "chatfleet-platform"


def selectorless_service(name: str, namespace: str, port: int, port_name: str = "http") -> dict:
    """Service `name` without a selector: its endpoints are whatever EndpointSlices say. Pure."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": [{"name": port_name, "port": port, "protocol": "TCP"}]},
    }


def endpoint_slice(service: str, namespace: str, address: str, port: int, port_name: str = "http") -> dict:
    """EndpointSlice `<service>-host`: one Ready endpoint `address:port` for Service `service`. Pure.

    Traefik matches the slice to the Service by the `kubernetes.io/service-name` label, and the slice's port
    to the Service's port by name; its Gateway provider keeps only endpoints whose `ready` is true.
    """
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-host",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True, "serving": True}}],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    tool = require_tool("ip", "install iproute2")
    res = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise PlatformError(f"ip {' '.join(args)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


class HostAddress:
    """A /32 address of this host, on a bridge of its own (no ports), for servers that back Services.

    Use as a context manager; `address` is where to bind. The bridge is named after this process
    (`cfhost<pid>`), so sessions side by side each have their own, and `open` deletes those of processes
    that are gone.
    """

    PREFIX = "cfhost"

    def __init__(self) -> None:
        self.bridge = f"{self.PREFIX}{os.getpid()}"
        self.address = ""

    def open(self) -> HostAddress:
        """Create the bridge with the first address of HOST_ADDRESS_RANGE no interface has yet."""
        if os.geteuid() != 0:
            raise PlatformError("a host address for test backends needs root (it adds a bridge)")
        self._sweep()
        taken = {word.split("/")[0] for word in _ip("-4", "-o", "addr", "show").stdout.split()}
        free = next((str(a) for a in HOST_ADDRESS_RANGE.hosts() if str(a) not in taken), None)
        if free is None:
            raise PlatformError(f"every address of {HOST_ADDRESS_RANGE} is taken")
        try:
            if _ip("link", "show", self.bridge, check=False).returncode != 0:
                _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "replace", f"{free}/32", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except PlatformError:
            self.close()
            raise
        self.address = free
        return self

    def _sweep(self) -> None:
        """Delete the bridges of sessions that died before their `close`."""
        for line in _ip("-o", "link", "show", "type", "bridge").stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            pid = name.removeprefix(self.PREFIX)
            if name.startswith(self.PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                _ip("link", "del", name, check=False)

    def close(self) -> None:
        """Delete the bridge (and its address)."""
        _ip("link", "del", self.bridge, check=False)
        self.address = ""

    def __enter__(self) -> HostAddress:
        return self.open()

    def __exit__(self, *_: object) -> None:
        self.close()
