"""``demo_rl`` against live services (``conftest.py``): the real trainer trains a tiny Llama, the
scripted policy answers the evaluations (its answers do not depend on the weights served, so every
arm must score exactly as the warm start and the verdict must say no gain)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from prefect.testing.utilities import prefect_test_harness

from flows import fanout
from flows.demo_rl import MIN_GAIN, SIGNALS, demo_rl, format_verdict, with_test_split
from flows.report import evaluations
from flows.runs import registry, run_dir
from flows.stack import ServiceUrls
from hoprl.clients.trainer import TrainerClient

#: the tiny model answers nothing right, so every group is flat: trained on (``flat_groups: train``),
#: not dropped, so that both arms move and log every signal
TINY_HP = {"questions_per_step": 2, "num_generations": 2, "max_steps": 2, "max_new_tokens_per_step": 8,
           "token_budget": 64, "lora_rank": 4, "flat_groups": "train"}  # fmt: skip
TEST_QUESTIONS = 4  # the scripted policy knows the first 6 of each split: 0 and 2 right, 1 and 3 wrong


@pytest.fixture(scope="module")
def demo(
    tmp_path_factory: pytest.TempPathFactory,
    live_services: Callable[[Path], AbstractContextManager[ServiceUrls]],
    tiny_model: str,
) -> Iterator[dict[str, Any]]:
    """One demo (1 SFT step, 2 RL steps an arm), then the same run id again (every stage skipped)."""
    folder = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as mp, prefect_test_harness(server_startup_timeout=120):
        mp.setenv("HOPRL_DATABASE_URL", f"sqlite:///{folder / 'registry.db'}")
        mp.setenv("HOPRL_RUNS_DIR", str(folder / "runs"))
        fanout.use_eager(True)
        with live_services(folder) as urls:
            for name, value in vars(urls).items():
                mp.setenv(f"HOPRL_{name.upper()}_URL", value)
            mp.setenv("HOPRL_POLICY_ADMIN_TOKEN", "flows-test")
            args = {"dataset": "synthetic", "test_questions": TEST_QUESTIONS, "sft_steps": 1, "steps": 2,
                    "dev_limit": 2, "hyperparameters": TINY_HP, "run_id": "demo", "model": tiny_model,
                    "limit": 6}  # fmt: skip
            with TrainerClient(urls.trainer) as client:
                result = demo_rl(**args)
                jobs = client.list()
                again = demo_rl(**args)
                jobs_again = client.list()
            yield {"result": result, "again": again, "jobs": jobs, "jobs_again": jobs_again, "folder": folder}


def test_the_two_arms_train_apart_from_one_warm_start(demo: dict[str, Any]) -> None:
    reg = registry()
    sft = next(c for c in reg.checkpoints("demo") if c.step == 0)
    # the placebo's run starts from the warm start's checkpoint; each arm ends at step 2, its own folder
    assert (reg.checkpoints("demo-placebo")[0].step, reg.checkpoints("demo-placebo")[0].path) == (0, sft.path)
    steps = [[c.step for c in reg.checkpoints(run)] for run in ("demo", "demo-placebo")]
    assert steps == [[0, 2], [0, 2]]
    final, placebo = reg.checkpoints("demo")[-1].path, reg.checkpoints("demo-placebo")[-1].path
    # LoRA: each arm's adapter beside the merged model the policy serves (hoprl.training.lora)
    for path in (final, placebo):
        assert Path(path).name == "merged" and Path(path, "model.safetensors").is_file()
        assert Path(path).parent.joinpath("adapter_model.safetensors").is_file()
    assert final != placebo
    # one SFT job and one RL job an arm, the same request but for the placebo flag
    requests = [json.loads(json.dumps(reg.get_run(j.id).config["request"]))  # type: ignore[union-attr]
                for j in demo["jobs"] if j.objective == "dapo"]  # fmt: skip
    rl = {bool(r["hyperparameters"].pop("placebo", False)): r for r in requests}
    assert sorted(rl) == [False, True] and len(demo["jobs"]) == 3
    real, fake = rl[False], rl[True]
    assert real == fake and real["seed"] == 0 and real["hyperparameters"]["lora_rank"] == 4
    # both arms' training signals per step, in their own runs
    for run in ("demo", "demo-placebo"):
        assert [s for s, _ in reg.metric_series(run, "train/reward")] == [1, 2]
    placebo_rewards = [v for _, v in reg.metric_series("demo-placebo", "train/reward")]
    assert demo["result"]["signals"]["placebo"]["reward"] == placebo_rewards
    # each arm's KL probe (its first step's first episodes, hoprl.training.signals.probe_kl): the same
    # tokens at both steps, at 0 on the warm start's weights. Not the same tokens in both arms: the
    # rollouts are sampled without a seed per request (16 and 17 tokens in one run)
    for run in ("demo", "demo-placebo"):
        tokens = reg.metric_series(run, "train/warm_start_kl/probe_tokens")
        assert [s for s, _ in tokens] == [1, 2] and tokens[0][1] == tokens[1][1] > 0
        assert reg.metric_series(run, "train/warm_start_kl/probe_k3")[0] == (1, pytest.approx(0.0, abs=1e-6))
    # every signal the verdict carries is there for both steps of both arms (dynamic sampling's
    # counts and answers_flat once went missing: the run did not copy them from the job), and the
    # right answers per question type, one per step (None for a step without a question of the type)
    for arm, signals in demo["result"]["signals"].items():
        lengths = {name: len(values) for name, values in signals.items()}
        assert {name: lengths.pop(name, 0) for name in SIGNALS} == dict.fromkeys(SIGNALS, 2), arm
        assert lengths and all(k.startswith("correct/") and n == 2 for k, n in lengths.items()), arm
        by_type = [signals[k] for k in lengths]
        assert all(any(v is not None for v in values) for values in by_type), arm
        assert all(sum(values[i] is not None for values in by_type) >= 1 for i in range(2)), arm


def test_the_three_evaluations_answer_the_same_questions(demo: dict[str, Any]) -> None:
    evals = run_dir("demo") / "evals"
    rows = {label: json.loads((evals / f"{label}.json").read_text()) for label in ("sft", "final", "placebo")}
    ids = [[r["id"] for r in rows[label]] for label in rows]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == TEST_QUESTIONS
    metrics = {str(e.metrics["label"]): e.metrics for e in evaluations("demo")}
    assert set(metrics) == {"sft", "final", "placebo"}
    assert all(m["questions"] == TEST_QUESTIONS for m in metrics.values())


def test_the_verdict_says_no_gain_when_nothing_changed(demo: dict[str, Any]) -> None:
    """The scripted policy answers alike whatever is served: the scripts get test questions 0 and 2
    right, 1 and 3 wrong, so every evaluation scores the answerable ones of those 4 alike and both
    differences are exactly 0 (p = 1): no gain, and the target not met."""
    result = demo["result"]
    for arm in ("final", "placebo", "final_vs_placebo"):
        row = result[arm]
        assert row["diff"] == 0.0 and row["better"] == row["worse"] == 0 and row["p"] == 1.0
        assert row["em"] == result["sft_em"]
    assert result["rl_beats_warm_start"] is False and result["target_met"] is False
    assert json.loads((run_dir("demo") / "demo.json").read_text()) == result
    text = format_verdict(result)
    assert "RL beats the warm start (+0.05 at p < 0.05): no" in text and MIN_GAIN == 0.05
    assert "EM against `sft`" in (run_dir("demo") / "report.md").read_text()


def test_the_same_run_id_again_skips_every_stage(demo: dict[str, Any]) -> None:
    assert demo["again"] == demo["result"]
    assert len(demo["jobs_again"]) == len(demo["jobs"])  # no trainer job submitted again


def test_the_test_split_grows_only_for_the_synthetic_world_with_its_seed() -> None:
    assert with_test_split("synthetic:3:2", 340) == "synthetic:3:2:340"
    assert with_test_split("synthetic:3:2", 150) == "synthetic:3:2"
    assert with_test_split("synthetic", 340) == "synthetic"  # no seed to keep: as it is
    assert with_test_split("../shared/data/hotpotqa_dev.jsonl", 340) == "../shared/data/hotpotqa_dev.jsonl"


def test_the_verdict_prints_wide_intervals_apart_and_the_arms_against_each_other() -> None:
    """The figures of demo-rl-3d932660 (2026-11-29, seed 1, lr 1e-3): a CI of two negative bounds
    is 16 characters and once ran into the difference before it (``-0.180[-0.236, -0.127]``)."""

    def row(em: float, diff: float, ci: list[float], p: float, better: int, worse: int) -> dict[str, Any]:
        return {"em": em, "questions": 322, "diff": diff, "ci": ci, "p": p, "better": better, "worse": worse}

    result = {
        "run_id": "demo-rl-1", "placebo_run_id": "demo-rl-1-placebo", "sft_em": 0.466,
        "final": row(0.416, -0.050, [-0.106, 0.009], 0.104, 37, 53),
        "placebo": row(0.286, -0.180, [-0.236, -0.127], 0.0001, 15, 73),
        "final_vs_placebo": row(0.416, 0.130, [0.068, 0.196], 0.0003, 60, 18),
        "headroom": {"pass@1": 0.375, "pass@k": 0.7, "k": 4.0},
        "rl_beats_warm_start": False, "placebo_not_significant": False,
    }  # fmt: skip
    lines = format_verdict(result).splitlines()
    assert lines[3] == "final       0.416   -0.050   [-0.106, 0.009]   0.104      37     53"
    assert lines[4] == "placebo     0.286   -0.180  [-0.236, -0.127]  0.0001      15     73"
    assert lines[5] == (
        "final against placebo: +0.130 EM, 95% CI [0.068, 0.196], p 0.0003, 60 better / 18 worse"
    )
