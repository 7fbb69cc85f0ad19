"""The suite ends even when a thread it started does not.

A non-daemon thread still running when pytest finishes keeps the interpreter from exiting: the
results are printed, then the process waits for ever and CI reads only its time limit. Once the
session is over, the threads left get a short grace; any still running are named with their
stacks and the process exits with the session's status, or 1 if the tests passed (a thread that
would have hung the exit is a defect too).

Idle thread-pool workers are not counted: the interpreter's own exit handler wakes and joins them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import pytest

GRACE_S = float(os.environ.get("HOPRL_TEST_EXIT_GRACE_S", "30"))
_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    left = lingering()
    deadline = time.monotonic() + GRACE_S
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [thread for thread in left if thread.is_alive()]
    if not left:
        return
    frames = sys._current_frames()
    lines = [f"\n{len(left)} thread(s) still running {GRACE_S:.0f} s after the tests ended:"]
    for thread in left:
        lines.append(f"--- {thread.name}")
        frame = frames.get(thread.ident or -1)
        if frame is not None:
            lines.append("".join(traceback.format_stack(frame)).rstrip())
    sys.stderr.write("\n".join(lines) + "\nexiting without waiting for them\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(_status[-1] if _status and _status[-1] else 1)


def lingering() -> list[threading.Thread]:
    """Alive non-daemon threads other than this one and idle pool workers."""
    return [
        thread
        for thread in threading.enumerate()
        if thread is not threading.current_thread()
        and not thread.daemon
        and thread.is_alive()
        and not _pool_worker(thread)
    ]


def _pool_worker(thread: threading.Thread) -> bool:
    # concurrent.futures names its workers "<prefix>_<n>" and runs them in _worker; asyncio's
    # default executor is such a pool. The interpreter's exit handler shuts these pools down.
    target = getattr(thread, "_target", None)
    return getattr(target, "__module__", "") == "concurrent.futures.thread"
