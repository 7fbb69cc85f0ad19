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
    phase_medians,
    policy_at,
    policy_env,
    policy_processes,
    policy_values,
    retriever_at,
    table,
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
    assert (from_env.eager, from_env.kv_cache_gib, from_env.max_new_tokens_per_step) == (True, 1, 32)


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


def test_phase_medians_split_the_services_time() -> None:
    phases = {"retrieval_s": [0.1, 0.3, 0.2], "generation_s": [1.0, 2.0, 4.0], "total_s": [1.2, 2.5, 4.3]}
    out = phase_medians(phases, "_16_clients")
    # rest of the handler: 1.2-1.1 = 0.1, 2.5-2.3 = 0.2, 4.3-4.2 = 0.1 -> median 0.1
    expected = {"retrieval": 0.2, "generation": 2.0, "total": 2.5, "service_other": 0.1}
    assert out == pytest.approx({f"answer_{k}_p50_s_16_clients": v for k, v in expected.items()})
    assert phase_medians({}, "") == {}


def test_the_table_names_its_two_columns_in_the_ratio() -> None:
    a: dict[str, object] = {"answer_requests_per_s_1_client": 0.5, "answer_errors": 0}
    b: dict[str, object] = {"answer_requests_per_s_1_client": 0.4, "answer_errors": 0}
    lines = table({"vllm": a, "vllm, processes": b}, 16).splitlines()
    assert lines[0] == "| | vllm | vllm, processes | vllm, processes / vllm |"
    assert "| /v1/answer req/s, 1 client | 0.5 | 0.4 | 0.80 |" in lines
