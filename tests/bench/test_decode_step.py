"""bench/decode_step.py end to end on a small grouped-query model: every variant timed, and the two
attentions compared on the same padded decode steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_times_both_phases_and_finds_the_attentions_equal(tmp_path: Path) -> None:
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "gqa")
    out = tmp_path / "decode.json"
    done = subprocess.run(
        [sys.executable, "bench/decode_step.py", "--model", str(tmp_path / "gqa"), "--repeats", "2",
         "--prompt-tokens", "40", "--rows", "3", "--context", "50", "--steps", "3", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["heads"], result["kv_heads"], result["threads"]) == (4, 2, 1)
    assert set(result["prefill 40 tokens"]) == {"fp32", "bf16"}
    steps = result["decode step 3 rows x 50"]
    assert list(steps) == ["fp32 repeated heads", "fp32 kernel GQA", "bf16 repeated heads", "bf16 kernel GQA"]
    assert all(s > 0 for s in [*steps.values(), *result["prefill 40 tokens"].values()])
    assert result["max |logit difference| fp32 repeated vs kernel GQA"] < 1e-5
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| decode")]
    assert len(rows) == 4 and rows[0][4].strip() == "1.00"  # the first variant is the reference
