"""flows.stack.services: the local services a pipeline starts, as real processes."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.stack import APPS, services, stop
from tests.processes import alive


def test_local_services_start_side_by_side(
    tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """All four processes are started before any is waited for, then every one answers /readyz.

    Started one after another (each once the previous was ready), the last started seconds after
    the first: the retriever alone takes several seconds to import and load its encoder.
    """
    for name in APPS:
        monkeypatch.delenv(f"HOPRL_{name.upper()}_URL", raising=False)
    monkeypatch.setenv("HOPRL_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("POLICY_ENGINE", "transformers")  # the process layout, not vLLM, is tested here
    caplog.set_level(logging.INFO, logger="flows.stack")
    with services(tmp_path, model=tiny_model) as urls:
        for url in (urls.retriever, urls.judge, urls.policy, urls.trainer):
            assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
    starts = [r.created for r in caplog.records if r.getMessage().startswith("started ")]
    assert len(starts) == 4
    assert max(starts) - min(starts) < 2.0
    stopped = [r.getMessage().split()[1] for r in caplog.records if r.getMessage().startswith("stopped ")]
    assert sorted(stopped) == sorted(APPS)


def test_stop_kills_a_process_deaf_to_sigterm_and_every_process_below_it() -> None:
    """A process that ignores SIGTERM (as uvicorn does until its app has started), with a child that
    ignores it too (as a policy's vLLM engine core): after the grace both are gone."""
    deaf = "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    child = f"{deaf}time.sleep(60)"
    code = f"{deaf}p = subprocess.Popen([sys.executable, '-c', {child!r}]); print(p.pid, flush=True); "
    code += "time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    start = time.monotonic()
    stop(proc, grace_s=1.0)
    assert proc.returncode == -9 and 1.0 <= time.monotonic() - start < 10
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)
