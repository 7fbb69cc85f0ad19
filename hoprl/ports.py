"""Free loopback ports for processes that bind them later (a service, a rendezvous).

A port found free by binding port 0 comes from the kernel's ephemeral range, and is free only until
the next socket that binds port 0 or connects out: a process that binds its port seconds later can
find it taken. The policy service binds after its engine has loaded (vLLM, ~25 s), and in that
time vLLM's own sockets took its port once (``make run``, 2026-11-28: "address already in use",
the run stopped). Ports below the ephemeral range are never handed out that way, so this picks one
of those at random; only another process that names the same port could still take it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: the lowest port this picks from; ports under it are left to fixed services
LOWEST = 10_000
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral ports (Linux's ``ip_local_port_range``; its default elsewhere)."""
    try:
        low, high = (int(v) for v in _RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bound(port: int) -> int | None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return int(s.getsockname()[1])


def free_port(attempts: int = 200) -> int:
    """A port nothing listens on now, below the ephemeral range where it has room (module docstring)."""
    low, _ = ephemeral_range()
    pick = random.SystemRandom()
    if low - LOWEST >= 1_000:
        for _ in range(attempts):
            if port := _bound(pick.randrange(LOWEST, low)):
                return port
    port = _bound(0)  # no room below the range (or all tried were taken): the kernel's choice
    assert port is not None
    return port
