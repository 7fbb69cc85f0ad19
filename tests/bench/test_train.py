"""bench/train.py: the plot of a campaign's result, and its scores from the evaluation's rows.

The campaign itself (the local stack, trainer jobs, the policy's /v1/answer/batch) is what
``tests/services/policy/test_batch.py`` and the trainer's tests cover, one service at a time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np
import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench() -> object:
    return load_script("bench/train.py", "bench_train")


RESULT = {
    "table": [
        {"model": "sft", "EM": 24.0, "F1": 26.5, "retrievals": 1.0},
        {"model": "grpo_stage1", "EM": 17.0, "F1": 18.0, "retrievals": 1.0},
        {"model": "grpo_stage2", "EM": 14.0, "F1": 15.0, "retrievals": 1.0},
    ],
    "reward_curve": [[1, 0.18], [2, 0.51], [3, 0.94], [4, 0.01]],
    "switch_step": 2,
}


def test_plot_draws_curve_and_table(bench: object, tmp_path: Path) -> None:
    path = bench.plot(RESULT, tmp_path / "when-to-search.png")  # type: ignore[attr-defined]
    assert path == tmp_path / "when-to-search.png"
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (400, 1100)  # 11 x 4 inches at 100 dpi
    assert image.std() > 0.05  # not a blank canvas


def test_plot_adds_the_searches_per_episode_where_recorded(bench: object, tmp_path: Path) -> None:
    green = np.array(matplotlib.colors.to_rgb("tab:green"))

    def green_pixels(result: dict[str, object]) -> int:
        image = matplotlib.image.imread(bench.plot(result, tmp_path / "w.png"))  # type: ignore[attr-defined]
        return int((np.abs(image[..., :3] - green).max(axis=-1) < 0.05).sum())

    assert green_pixels(RESULT) == 0
    assert green_pixels({**RESULT, "search_curve": [[1, 2.0], [2, 1.75], [3, 1.5], [4, 1.25]]}) > 100


def test_plot_skips_results_without_a_curve(bench: object, tmp_path: Path) -> None:
    step_time = {"multi-turn retrieval": {"step_time": 83.8}}
    assert bench.plot(step_time, tmp_path / "step-time.png") is None  # type: ignore[attr-defined]
    assert bench.plot({**RESULT, "reward_curve": []}, tmp_path / "x.png") is None  # type: ignore[attr-defined]
    assert not list(tmp_path.iterdir())


def test_plot_command_redraws_every_result(bench: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "when-to-search.json").write_text(json.dumps(RESULT))
    (tmp_path / "step-time.json").write_text(json.dumps({"single turn": {"step_time": 37.0}}))
    monkeypatch.setattr(sys, "argv", ["train.py", "plot", "--out", str(tmp_path)])
    bench.main()  # type: ignore[attr-defined]
    assert (tmp_path / "when-to-search.png").stat().st_size > 10_000
    assert not (tmp_path / "step-time.png").exists()
    assert "step-time.json: nothing to plot" in capsys.readouterr().out


def test_scores_keep_answers_queries_and_errors_of_the_evaluation_rows(bench: object) -> None:
    def row(
        prediction: str | None, em: float, queries: list[str], error: str | None = None
    ) -> dict[str, object]:
        return {"prediction": prediction, "em": em, "f1": em, "retrievals": len(queries), "queries": queries,
                "error": error}  # fmt: skip

    scores = bench.scores([  # type: ignore[attr-defined]
        row("Paris", 1.0, ["q0"]),
        row("Lyon", 0.0, ["q0", "q1"]),
        row(None, 0.0, [], error="ServiceError: 504"),  # a failed request counts 0
    ])  # fmt: skip
    assert scores["em"] == [1.0, 0.0, 0.0] and scores["rc"] == [1.0, 2.0, 0.0]
    assert scores["answers"] == ["Paris", "Lyon", ""] and scores["queries"] == [["q0"], ["q0", "q1"], []]
    assert scores["errors"] == 1 and round(scores["EM"], 1) == 33.3 and scores["retrievals"] == 1.0
    assert bench.summary("sft", scores) == {"model": "sft", "EM": 33.3, "F1": 33.3, "retrievals": 1.0}  # type: ignore[attr-defined]
