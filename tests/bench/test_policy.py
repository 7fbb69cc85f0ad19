"""bench/policy.py's two layouts: the policy in this process or in its own, and whose memory counts."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench.policy import (
    peak_rss,
    policy_at,
    policy_env,
    policy_processes,
    policy_values,
    retriever_at,
)
from flows.stack import APPS
from services.policy.settings import PolicySettings

ARGS = argparse.Namespace(tokens=32)


def test_the_environment_reads_back_as_the_same_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    values = policy_values(ARGS, "some/model", "vllm", retriever_url="http://127.0.0.1:9",
                           default_collection="bench-hotpotqa", default_recipe="naive-rag")  # fmt: skip
    for key, value in policy_env(values).items():
        monkeypatch.setenv(key, value)
    from_env = PolicySettings()
    assert from_env == PolicySettings.model_validate(values)
    assert (from_env.eager, from_env.kv_cache_gib, from_env.max_tokens_per_step) == (True, 1, 32)


def hold(megabytes: int, *argv: str) -> subprocess.Popen[bytes]:
    """A child that holds ``megabytes`` of written memory until killed (``argv`` marks it)."""
    code = f"import sys, time; x = b'x' * ({megabytes} << 20); print('ok', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    return proc


def test_the_policy_layout_counts_the_policys_process_alone() -> None:
    """Two children: 200 MiB in one whose command line names the policy app, 600 MiB in another.
    The policy's peak is the first one's 200 MiB (plus an interpreter), never the 800 together."""
    policy, other = hold(200, APPS["policy"]), hold(600, "other")
    try:
        assert [p.pid for p in policy_processes()] == [policy.pid]
        with peak_rss(policy_processes) as rss:
            time.sleep(0.6)
    finally:
        for proc in (policy, other):
            proc.kill()
            proc.wait()
    assert 200 / 1024 <= rss["peak_rss_gib"] < 300 / 1024


@pytest.mark.parametrize("layout", ["threads", "processes"])
def test_the_services_serve_in_either_layout(layout: str, tiny_model: str, tmp_path: Path) -> None:
    """The retriever and a policy that calls it, in this process or each in a ``uvicorn`` child
    (ready only once it reaches the retriever; gone when the block ends)."""
    with retriever_at(layout, tmp_path / "qdrant") as retriever_url:
        assert httpx.get(f"{retriever_url}/readyz", timeout=30).status_code == 200
        values = policy_values(ARGS, tiny_model, "transformers", retriever_url=retriever_url)
        with policy_at(layout, values) as url:
            assert httpx.get(f"{url}/readyz", timeout=30).status_code == 200
            assert len(httpx.get(f"{url}/v1/models", timeout=30).json()["data"]) == 1
            assert len(policy_processes()) == (layout == "processes")
    assert policy_processes() == []
