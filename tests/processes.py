"""Processes a test started, read from /proc: what runs below a process, what is still alive."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int) -> dict[int, str]:
    """Every live process below ``pid`` (children of children too), with its command line, from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    out = {}
    for p in found:
        try:
            out[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_with(env_value: str) -> dict[int, str]:
    """Every live process whose environment holds ``env_value`` (the processes a command started
    carry its HOPRL_RUNS_DIR, the ones started after a snapshot of its descendants too)."""
    out = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        try:
            if env_value.encode() in environ.read_bytes() and alive(pid) and pid != os.getpid():
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return out
