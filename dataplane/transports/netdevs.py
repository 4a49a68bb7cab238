"""Which network devices UCX may use so that it listens only on the agent's configured address.

UCX's TCP transport listens on every network interface it is allowed (``UCX_NET_DEVICES``, all by
default): an agent told ``listen.host: 127.0.0.1`` would still accept connections on the pod's other
addresses. ``net_devices_for`` names the interface that holds ``listen.host`` and every RDMA port
(which open no TCP listener), for ``NixlConfig.ucx_net_devices`` when the config leaves it unset.
NIXL's own ``device_list`` backend parameter names RDMA devices only (it appends a port), so the
value reaches UCX through its environment variable, set where the process starts
(``transports.nixl.sdk.ucx_environment``).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

SIOCGIFADDR = 0x8915
INFINIBAND = Path("/sys/class/infiniband")


def interface_of(host: str) -> str | None:
    """The network interface whose IPv4 address is ``host`` (None: no such interface, or not IPv4)."""
    try:
        wanted = ipaddress.IPv4Address(host)
    except ValueError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address on this one
            if ipaddress.IPv4Address(answer[20:24]) == wanted:
                return name
    return None


def rdma_ports(root: Path = INFINIBAND) -> list[str]:
    """Every RDMA port of the host as UCX names it (``mlx5_0:1``)."""
    ports: list[str] = []
    with contextlib.suppress(OSError):
        for dev in sorted(root.iterdir()):
            ports += [f"{dev.name}:{p.name}" for p in sorted((dev / "ports").iterdir(), key=lambda p: p.name)]
    return ports


def net_devices_for(host: str, root: Path = INFINIBAND) -> str | None:
    """``UCX_NET_DEVICES`` for an agent listening on ``host``: its interface and the RDMA ports;
    None (UCX's default, every device) when no interface holds ``host`` (a wildcard or a name)."""
    iface = interface_of(host)
    if iface is None:
        return None
    return ",".join([iface, *rdma_ports(root)])
