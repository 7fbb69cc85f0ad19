"""bench/rl_whole_step.py end to end on the tiny model: two variants as real trainer jobs, each in
a worker process of its own against a live retriever, timed from the jobs' own metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
bench = load_script("bench/rl_whole_step.py", "bench_rl_whole_step")


def test_each_variant_is_make_runs_dapo_job_with_its_options() -> None:
    request = bench.job_request("/m", 2, {"lora_rank": 16, "micro_batch": 1})
    what = (request.recipe, request.objective, request.dataset, request.steps)
    assert what == ("when-to-search", "dapo", "synthetic:0:2", 2)
    hp = request.hyperparameters
    assert (hp.preset, hp.lora_rank, hp.micro_batch, hp.save_steps) == ("cpu", 16, 1, 2)
    assert hp.dynamic_sampling is False  # a step is its 8 episodes, no refills
    assert hp.recipe_config["switch_step"] == 1  # make run's: stage 2 for the second half


def test_the_rollout_suffixes_add_to_the_step_benchs_variants() -> None:
    assert bench.variant("lora16-micro1-nogc-bf16-fp32rollouts") == (
        {"lora_rank": 16, "micro_batch": 1, "gradient_checkpointing": False},
        {"HOPRL_BF16": "1", "HOPRL_ROLLOUT_BF16": "0"},
    )
    assert bench.variant("full-unmerged-fp32rollouts") == (
        {},
        {bench.UNMERGED: "1", "HOPRL_ROLLOUT_BF16": "0"},
    )
    assert bench.variant("lora16-micro1-nogc-bf16-fp32rollouts-fp32prefill")[1] == {
        "HOPRL_BF16": "1", "HOPRL_ROLLOUT_BF16": "0", "HOPRL_ROLLOUT_PREFILL_BF16": "0",
    }  # fmt: skip
    assert bench.variant("full-fp32-repeatkv")[1] == {"HOPRL_BF16": "0", bench.REPEAT_KV: "1"}
    assert bench.variant("full-fp32-bf16prefill")[1] == {"HOPRL_BF16": "0", "HOPRL_ROLLOUT_PREFILL_BF16": "1"}
    assert bench.variant("full") == ({}, {})
    # a hyperparameter suffix, last: the frozen copy scores every episode of the step
    assert bench.variant("lora16-micro1-bf16-klall") == (
        {"lora_rank": 16, "micro_batch": 1, "warm_start_kl": 8},
        {"HOPRL_BF16": "1"},
    )


def test_the_bench_times_whole_steps_of_two_variants(tiny_model: str, tmp_path: Path) -> None:
    out = tmp_path / "whole.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "bench/rl_whole_step.py", "--model", tiny_model, "--steps", "2", "--threads", "1",
         "--variants", "full-fp32,lora16-micro1-nogc-fp32", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [r["variant"] for r in results] == ["full-fp32", "lora16-micro1-nogc-fp32"]
    for r in results:
        assert len(r["steps_s"]) == len(r["rollouts_s"]) == 2
        assert all(0 < roll < step for roll, step in zip(r["rollouts_s"], r["steps_s"], strict=True))
        assert r["step_s"] == r["steps_s"][1] and r["peak_rss_gib"] > 0.1  # the step after the warm-up
        assert r["env"] == {"HOPRL_BF16": "0"}
        assert len(r["completion_tokens"]) == 2 and all(n > 0 for n in r["completion_tokens"])
        # the figure comes from unrounded seconds; the listed step is rounded to 0.1 s and the
        # figure to 0.01, so it lies within what those roundings allow (a 0.1 s rollout is +-50%)
        seconds, tokens = r["rollouts_s"][1], r["completion_tokens"][1]
        low, high = 1000 * (seconds - 0.05) / tokens, 1000 * (seconds + 0.05) / tokens
        assert low - 0.005 <= r["rollout_s_per_1k_tokens"] <= high + 0.005
        engine = r["engine"]  # the rollout engine's counters: it prefilled and decoded
        assert engine["prefill_tokens"] > 0 and engine["prefill_s"] > 0 and engine["decode_s"] > 0
        assert 1 <= engine["rows_per_step"] <= 8
        assert r["kl_forward_s"] > 0  # the cpu preset scores the KL to the warm start on 2 episodes
    assert results[1]["options"] == {"lora_rank": 16, "micro_batch": 1, "gradient_checkpointing": False}
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `")]
    ratio = results[1]["step_s"] / results[0]["step_s"]
    assert [row.split("|")[3].strip() for row in rows] == ["1.00", f"{ratio:.2f}"]
    assert [row.split("|")[8].strip() for row in rows] == [str(r["engine"]["rows_per_step"]) for r in results]
