"""bench/sft_head.py end to end on the tiny model: a live retriever, expert episodes, both heads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_times_both_heads_on_expert_batches(tiny_model: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "bench/sft_head.py", "--steps", "2", "--model", tiny_model, "--threads", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("batch ") for line in lines) == 2  # and the two losses agreed on each
    table = [line for line in lines if line.startswith(("| trl |", "| compact |"))]
    assert len(table) == 2 and any(line.startswith("compact / trl: ") for line in lines)
    share = next(line for line in lines if "labelled positions" in line)
    assert int(share.split("labelled positions ")[1].split("/")[0]) > 0  # episodes carry assistant text
