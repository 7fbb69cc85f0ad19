"""bench/gpu_check.sh, the prepared GPU command, in its CPU dry run; the shapes it builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, load_script

gpu_check = load_script("bench/gpu_check.py", "gpu_check")


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        # embeddings 151936 x 896 (tied) + 24 layers x (q 896x896+896, k and v 896x128+128 each,
        # o 896x896, MLP 3 x 896x4864, 2 norms x 896 = 14,912,384) + the final norm 896
        ("qwen2.5-0.5b", 151936 * 896 + 24 * 14_912_384 + 896),  # 494,032,768: Qwen2.5-0.5B's 0.49B
        # 151936 x 2048 + 36 x (2048x2048+2048, 2 x (2048x256+256), 2048x2048, 3 x 2048x11008,
        # 2 x 2048 = 77,076,992) + 2048
        ("qwen2.5-3b", 151936 * 2048 + 36 * 77_076_992 + 2048),  # 3,085,938,688: Qwen2.5-3B's 3.09B
    ],
)
def test_the_shapes_are_qwen25s(shape: str, expected: int) -> None:
    with torch.device("meta"):
        model = gpu_check.build(shape, dry_run=False, device="meta", dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_the_dry_run_prints_a_step_of_each_figure() -> None:
    """The command as the GPU machine runs it, on the CPU: one JSON line with the three figures."""
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", "bench/gpu_check.sh", "--dry-run", "--shapes", "qwen2.5-0.5b"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600, check=True).stdout  # fmt: skip
    (line,) = [json.loads(s) for s in out.splitlines() if s.startswith("{")]
    # 2 layers of the 0.5B shape and an 8192-token vocabulary: 8192 x 896 + 2 x 14,912,384 + 896
    assert line["params_m"] == round((8192 * 896 + 2 * 14_912_384 + 896) / 1e6, 1) == 37.2
    assert line["step_s"] > 0 and line["rollout_tokens_per_s"] > 0 and line["peak_gpu_gib"] is None
