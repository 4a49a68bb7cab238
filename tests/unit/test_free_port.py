"""``agent_processes.free_port`` hands out ports outgoing connections cannot take first: below the kernel's
ephemeral range (a ``bind(0)`` port is inside it, where any client socket may grab it)."""

from __future__ import annotations

import socket

from dataplane.harness import agent_processes


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_bound():
    low = agent_processes._ephemeral_low()
    for _ in range(20):
        port = agent_processes.free_port()
        assert max(1024, low - agent_processes.BELOW_EPHEMERAL) <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_with_no_room_below_the_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(agent_processes, "_ephemeral_low", lambda: 1100)
    port = agent_processes.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
