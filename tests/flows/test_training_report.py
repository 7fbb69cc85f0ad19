"""The training half of the report: every panel of ``training.png`` has data (one point is a marker
with its value), a panel without data is left out and named, and the markdown tells the SFT loss,
the headroom before RL and each RL step's signals.

No services: a SQLite registry in a temp folder holds the metrics the report reads back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.axes import Axes

from flows.report import markdown_table, table
from flows.rollouts import headroom_metrics
from flows.runs import registry
from flows.training_report import shown_steps, training_figure, training_plot, training_section
from hoprl.domain import Episode
from hoprl.registry.store import Registry

#: make run's shape of a run: 24 SFT steps (loss 1.33 -> 0.04), the headroom at step 0, one RL step
SFT_LOSS = [1.33 - i * (1.29 / 23) for i in range(24)]
STEP_1 = {
    "train/reward": 0.464, "train/reward_std": 0.712, "train/rewards/answer/mean": 0.25,
    "train/rewards/format/mean": 0.875, "train/frac_reward_zero_std": 0.5,
    "train/clip_ratio/region_mean": 0.0, "train/entropy": 0.0123, "train/grad_norm": 0.4,
    "train/searches": 1.875, "train/answer_tokens": 3.5, "train/ended/answer": 0.875,
    "train/ended/token_budget": 0.125, "train/ended/format_error": 0.0, "train/ended/step_cap": 0.0,
}  # fmt: skip
HEADROOM = {"headroom/pass@1": 0.25, "headroom/pass@k": 0.5, "headroom/k": 4.0, "headroom/questions": 3.0,
            "headroom/frac_reward_zero_std": 0.75, "headroom/temperature": 1.0}  # fmt: skip


@pytest.fixture
def run_id(local_registry: Registry) -> Iterator[str]:
    reg = local_registry
    reg.create_run("signals", "when-to-search", "dapo", "tiny", {}, 0)
    for step, loss in enumerate(SFT_LOSS, start=1):
        reg.log_metrics("signals", step, {"sft/loss": loss})
    reg.log_metrics("signals", 0, HEADROOM)
    reg.log_metrics("signals", 1, STEP_1)
    yield "signals"


def titles(fig: plt.Figure) -> list[str]:
    return [ax.get_title(loc="left") for ax in fig.axes]


def points(ax: Axes) -> list[int]:
    """The number of points of each line on ``ax`` (an error bar's marker is a line of one point)."""
    return [len(line.get_xdata()) for line in ax.lines if line.get_label() and len(line.get_xdata())]


def test_every_panel_has_data_and_a_single_point_shows_its_value(run_id: str) -> None:
    fig = training_figure(run_id)
    assert fig is not None
    try:
        assert [t.split(":")[0].split(",")[0] for t in titles(fig)] == [
            "SFT warm start", "RL", "RL", "How the episodes ended (share)", "Dev checks",
        ]  # fmt: skip
        sft, reward, shares, ended, dev = fig.axes
        assert points(sft) == [24]  # the SFT loss curve, every step
        assert sft.lines[0].get_ydata()[0] == pytest.approx(1.33)
        for ax in (reward, shares, ended, dev):  # one RL step: markers, each with its value beside it
            assert ax.lines and all(n == 1 for n in points(ax)), ax.get_title()
            values = {t.get_text() for t in ax.texts}
            for line in ax.lines:
                if line.get_label().startswith("_"):  # the error bar's own caps and bar
                    continue
                assert line.get_marker() == "o" and line.get_linestyle() == "None"
                value = f"{line.get_ydata()[0]:.3g}"
                assert any(v.startswith(value) for v in values), (ax.get_title(), values)
        assert "0.464 ± 0.71" in {t.get_text() for t in reward.texts}  # the mean and its spread
        assert {line.get_label() for line in dev.lines} == {"pass@1", "pass@4"}
        notes = [t.get_text() for t in fig.texts if t.get_text().startswith("Left out")]
        assert notes == ["Left out: RL: KL of the policy to the warm start: not measured (beta 0 and "
                         "warm_start_kl 0)."]  # fmt: skip
    finally:
        plt.close(fig)


def test_the_kl_panel_appears_with_its_series(run_id: str) -> None:
    reg = registry()
    reg.log_metrics(run_id, 1, {"train/warm_start_kl/k3": 0.0, "train/warm_start_kl/k1": 0.0,
                                "train/warm_start_kl/probe_k3": 0.0})  # fmt: skip
    reg.log_metrics(run_id, 2, {**STEP_1, "train/warm_start_kl/k3": 0.002, "train/warm_start_kl/k1": 0.0021,
                                "train/warm_start_kl/probe_k3": 0.0015})  # fmt: skip
    fig = training_figure(run_id)
    assert fig is not None
    try:
        kl = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("RL: KL"))
        assert points(kl) == [2, 2, 2]  # k3, k1 and the probe's k3, two steps each: lines, no value labels
        assert kl.get_legend_handles_labels()[1][2] == "k3 on the first step's episodes (fixed probe)"
        assert not [t for t in fig.texts if t.get_text().startswith("Left out")]
    finally:
        plt.close(fig)


def test_a_run_without_training_has_no_plot_and_no_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOPRL_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    registry().create_run("bare", "naive-rag", "grpo", "tiny", {}, 0)
    assert training_plot("bare", tmp_path / "training.png") is None
    assert training_section("bare", table) == []


def test_the_plot_file_is_written(run_id: str, tmp_path: Path) -> None:
    path = training_plot(run_id, tmp_path / "training.png")
    assert path is not None and path.stat().st_size > 10_000


def test_the_report_tells_the_sft_loss_the_headroom_and_each_rl_step(run_id: str) -> None:
    text = markdown_table(run_id)
    assert "- SFT warm start: 24 steps, loss 1.330 -> 0.040." in text
    assert "answered 3 answerable dev questions 4 times each" in text
    assert "pass@1 0.250, pass@4 0.500" in text
    assert "75% of the questions' groups had no reward spread" in text
    assert "| 1 | 0.464 | 0.712 | 0.50 | 0.000 | - |" in text  # reward, ± std, flat groups, clipped, KL k3
    assert "| 1 | 0.88 | 0.12 | 0.00 | 0.00 |" in text  # answer, token budget, format error, step cap
    assert "| 1 | 0.0123 | 0.4 | 1.88 | 3.5 | - |" in text  # entropy, grad norm, searches, answer tokens
    rows = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    assert max(len(c) for c in cells) <= 6 and max(len(v) for c in cells for v in c) <= 24  # narrow


def test_several_steps_draw_the_rewards_band_components_and_cuts(run_id: str, tmp_path: Path) -> None:
    reg = registry()
    for step, (mean, std) in enumerate([(-0.9, 0.1), (-0.5, 0.4)], start=1):
        reg.log_metrics(run_id, step, {"train/reward": mean, "train/reward_std": std,
                                       "train/rewards/format/mean": mean / 2, "train/rewards/format/std": std,
                                       "train/rewards/answer/mean": mean / 2,
                                       "train/ended/token_budget": 0.25, "train/ended/format_error": 0.125,
                                       "dev/em": 0.1 * step})  # fmt: skip
    fig = training_figure(run_id)
    assert fig is not None
    try:
        reward = fig.axes[1]
        assert reward.collections, "the reward's spread is a band over several steps"
        band = reward.collections[0].get_paths()[0].vertices[:, 1]
        assert min(band) == pytest.approx(-1.0) and max(band) == pytest.approx(-0.1)  # -0.9 - 0.1, -0.5 + 0.4
        assert {line.get_label(): len(line.get_xdata()) for line in reward.lines} == {
            "reward": 2, "answer": 2, "format": 2,
        }  # fmt: skip
        dev = fig.axes[-1]
        assert [len(line.get_xdata()) for line in dev.lines if line.get_label() == "dev EM"] == [2]
    finally:
        plt.close(fig)


def test_long_runs_show_a_dozen_steps_and_the_last() -> None:
    assert shown_steps(list(range(1, 31)), 4) == [1, 11, 21, 30]  # every 10th, then the last
    assert shown_steps([1, 2, 3]) == [1, 2, 3]
    assert len(shown_steps(list(range(1, 201)))) == 12


def test_the_headroom_of_sampled_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3 questions x 4 samples. q1: 1 of 4 right (rewards 1, -1, -1, -1); q2: none right (-1 x 4);
    q3 is unanswerable (0 x 4), left out of pass@k. pass@1 = (1/4 + 0) / 2 = 0.125; pass@4 =
    (1 + 0) / 2 = 0.5; groups without reward spread: q2 and q3, 2 of 3; mean reward (-2 - 4 + 0) / 12."""
    monkeypatch.setenv("HOPRL_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    reg = registry()
    reg.create_run("head", "when-to-search", "dapo", "tiny", {}, 0)
    groups = [("q1", ["Paris"], ["Paris", "Rome", "Lyon", "Nice"], [1, -1, -1, -1]),
              ("q2", ["1961"], ["1960"] * 4, [-1] * 4), ("q3", [], ["x"] * 4, [0] * 4)]  # fmt: skip
    for qid, answers, finals, reward in groups:
        episodes = [Episode(recipe="when-to-search", question_id=qid, question="?", answers=answers,
                            final_answer=f, sample=i) for i, f in enumerate(finals)]  # fmt: skip
        reg.write_episodes("head", -1, episodes, [{"total": float(r)} for r in reward])
    got = headroom_metrics("head", -1, 4)
    assert got == pytest.approx({"pass@1": 0.125, "pass@k": 0.5, "k": 4.0, "questions": 2.0,
                                 "reward": -0.5, "frac_reward_zero_std": 2 / 3})  # fmt: skip
