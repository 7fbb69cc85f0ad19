"""hoprl/ports.py: a port picked for a process that binds it later stays out of the kernel's way."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from pathlib import Path

import pytest

from hoprl import ports
from hoprl.ports import LOWEST, ephemeral_range, free_port


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low, _ = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert LOWEST <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: binding it works


def test_sockets_that_bind_port_0_never_get_it() -> None:
    """300 sockets bound to port 0 while the picked port is released (the window in which vLLM's
    sockets once took the policy's port): none of them is handed that port."""
    port = free_port()
    with ExitStack() as stack:
        taken = set()
        for _ in range(300):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            taken.add(s.getsockname()[1])
    assert port not in taken and min(taken) >= ephemeral_range()[0]


def test_the_range_is_read_from_the_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "range").write_text("40000\t50000\n")
    monkeypatch.setattr(ports, "_RANGE", tmp_path / "range")
    assert ephemeral_range() == (40000, 50000)
    assert all(LOWEST <= free_port() < 40000 for _ in range(20))
    monkeypatch.setattr(ports, "_RANGE", tmp_path / "missing")
    assert ephemeral_range() == (32768, 60999)  # Linux's default where the file cannot be read


def test_without_room_below_the_range_the_kernel_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("10500 65000\n")  # 500 ports below it: too few to pick from
    monkeypatch.setattr(ports, "_RANGE", tmp_path / "range")
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
