"""The progress lines ``hoprl pipeline`` prints while a trainer job runs and while an evaluation
answers (table-driven)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from flows.progress import AnswerProgress, answers_line, bar, duration, progress_line
from hoprl.schemas.trainer import Job


def job(step: int, status: str = "running", **metrics: float) -> Job:
    return Job.model_validate(
        {"id": "job-1", "status": status, "recipe": "search-r1", "objective": "grpo", "model": "m",
         "step": step, "steps": 10, "metrics": metrics}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59.4, "59 s"), (60, "1 min 00 s"), (185, "3 min 05 s"), (3600, "1 h 00 min"),
     (7380, "2 h 03 min")],
)  # fmt: skip
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("done", "total", "text"),
    [(0, 10, "[----------]"), (3, 10, "[###-------]"), (12, 24, "[#####-----]"), (10, 10, "[##########]"),
     (11, 10, "[##########]"), (0, 0, "[##########]")],
)  # fmt: skip
def test_bar(done: int, total: int, text: str) -> None:
    assert bar(done, total) == text


HEAD = "grpo job-1 (seg)"


@pytest.mark.parametrize(
    ("state", "rate", "waited", "text"),
    [
        # before any step: how long the wait has lasted (model loading, the first rollouts)
        (job(0), None, 75.0, f"{HEAD} [----------] step 0/10 (0%), 1 min 15 s in"),
        # 3 of 10 steps at 12 s/step: 7 x 12 = 84 s left
        (job(3, reward=0.25, loss=0.5), 12.0, 100.0,
         f"{HEAD} [###-------] step 3/10 (30%), reward 0.250, loss 0.500, 12.0 s/step, ETA 1 min 24 s"),
        (job(10, reward=1.0), 12.0, 200.0, f"{HEAD} [##########] step 10/10 (100%), reward 1.000, saving"),
        (job(10, "succeeded", loss=0.125), 12.0, 210.0,
         f"{HEAD} [##########] step 10/10 (100%), loss 0.125, succeeded"),
        (job(4, "failed"), None, 30.0, f"{HEAD} [####------] step 4/10 (40%), failed"),
        # 1 of 8 episodes cut by the token budget, 2 of 8 by a format error (1/8 = 0.125, 2/8 = 0.25)
        (Job.model_validate({**job(5).model_dump(), "metrics": {"reward": 0.5, "ended/token_budget": 0.125,
                                                              "ended/format_error": 0.25}}), None, 1.0,
         f"{HEAD} [#####-----] step 5/10 (50%), reward 0.500, cut by token_budget 0.12 / format_error 0.25, "
         "1 s in"),
        # an RL step's signals: reward ± its spread, half the groups flat (no gradient), the KL to
        # the warm start, no clipped ratio, 7 of 8 episodes answered (0.875)
        (Job.model_validate({**job(1, "succeeded").model_dump(), "metrics": {
            "reward": 0.464, "reward_std": 0.712, "loss": 0.003, "frac_reward_zero_std": 0.5,
            "warm_start_kl/k3": 0.00123, "clip_ratio/region_mean": 0.0, "ended/answer": 0.875,
            "ended/token_budget": 0.125}}), None, 1.0,
         f"{HEAD} [#---------] step 1/10 (10%), reward 0.464 ± 0.712, loss 0.003, flat groups 0.50, "
         "KL to start 0.00123, clipped 0.000, answered 0.88, cut by token_budget 0.12, succeeded"),
        # right answers per question type: 3 of 8 bridge episodes (0.375), 6 of 8 comparisons (0.75)
        (Job.model_validate({**job(2).model_dump(), "metrics": {"reward": 0.5, "correct/comparison": 0.75,
                                                              "correct/bridge": 0.375}}), None, 1.0,
         f"{HEAD} [##--------] step 2/10 (20%), reward 0.500, right bridge 0.38 / comparison 0.75, 1 s in"),
    ],
)  # fmt: skip
def test_progress_line(state: Job, rate: float | None, waited: float, text: str) -> None:
    assert progress_line(state, "seg", rate, waited) == text


@pytest.mark.parametrize(
    ("done", "em_sum", "errors", "elapsed", "text"),
    [
        (0, 0.0, 0, 3.0, "evaluation sft [----------] 0/340 questions (0%)"),
        # 34 of 340 in 85 s: 2.5 s a question, 306 left -> 765 s
        (34, 10.0, 0, 85.0,
         "evaluation sft [#---------] 34/340 questions (10%), EM so far 0.294, 2.50 s a question, "
         "ETA 12 min 45 s"),
        (170, 51.0, 2, 340.0,
         "evaluation sft [#####-----] 170/340 questions (50%), EM so far 0.300, 2 failed, 2.00 s a question, "
         "ETA 5 min 40 s"),
        (340, 102.0, 0, 700.0,
         "evaluation sft [##########] 340/340 questions (100%), EM so far 0.300, done in 11 min 40 s"),
    ],
)  # fmt: skip
def test_answers_line(done: int, em_sum: float, errors: int, elapsed: float, text: str) -> None:
    assert answers_line("evaluation sft", done, 340, em_sum, errors, elapsed) == text


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_answer_progress_logs_at_most_every_interval_and_always_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = logging.getLogger("test.answer_progress")
    lines = AnswerProgress("evaluation final", 5, every_s=30.0, log=log, clock=clock)
    rows: list[dict[str, Any]] = [
        {"em": 1.0, "error": None}, {"em": 0.0, "error": None}, {"em": 0.0, "error": "ServiceError: 504"},
        {"em": 1.0, "error": None}, {"em": 1.0, "error": None},
    ]  # fmt: skip
    with caplog.at_level(logging.INFO, logger=log.name):
        for at, row in zip([10.0, 30.0, 40.0, 50.0, 55.0], rows, strict=True):
            clock.now = at
            lines(row)
    # 10 s: under 30 s since the start, quiet; 30 s: a line (2 in 30 s, 3 left); 40 and 50 s:
    # under 30 s since that line; 55 s: the last answer
    assert [r.getMessage() for r in caplog.records] == [
        "evaluation final [####------] 2/5 questions (40%), EM so far 0.500, 15.00 s a question, ETA 45 s",
        "evaluation final [##########] 5/5 questions (100%), EM so far 0.600, 1 failed, done in 55 s",
    ]
