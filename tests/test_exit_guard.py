"""tests/exit_guard.py, from the outside: a pytest run whose test leaves a thread blocked for ever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LEAKY = """
import threading

def test_passes_but_leaves_a_thread():
    threading.Thread(target=threading.Event().wait, name="stuck-caller").start()
"""


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_it.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOPRL_TEST_EXIT_GRACE_S": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.exit_guard", "-p", "no:cacheprovider",
         "test_it.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_thread_left_running_ends_the_run_with_a_failure_naming_it(tmp_path: Path) -> None:
    done = run(tmp_path, LEAKY)  # without the guard: no exit, and subprocess.run's timeout fires
    assert done.returncode == 1
    assert "1 passed" in done.stdout
    assert "still running" in done.stderr and "stuck-caller" in done.stderr


def test_a_clean_run_keeps_its_status(tmp_path: Path) -> None:
    done = run(tmp_path, "def test_fails():\n    assert False\n")
    assert done.returncode == 1 and "1 failed" in done.stdout and "still running" not in done.stderr
    done = run(tmp_path, "def test_ok():\n    pass\n")
    assert done.returncode == 0 and "still running" not in done.stderr
