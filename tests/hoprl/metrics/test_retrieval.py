"""Retrieval metrics on rankings whose values are computed by hand."""

from __future__ import annotations

import pytest

from hoprl.metrics.retrieval import (
    agent_retrieval,
    average_precision,
    full_recall_at_k,
    recall_at_k,
    retrieval_report,
)

RANKED = ["d1", "g1", "d2", "g2", "d3"]
GOLD = {"g1", "g2"}


@pytest.mark.parametrize(
    ("k", "recall", "full"),
    [(1, 0.0, 0.0), (2, 0.5, 0.0), (3, 0.5, 0.0), (4, 1.0, 1.0), (10, 1.0, 1.0)],
)
def test_recall_and_full_recall(k: int, recall: float, full: float) -> None:
    assert recall_at_k(RANKED, GOLD, k) == recall
    assert full_recall_at_k(RANKED, GOLD, k) == full


def test_average_precision_by_hand() -> None:
    # hits at ranks 2 and 4: (1/2 + 2/4) / 2
    assert average_precision(RANKED, GOLD) == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert average_precision(RANKED, GOLD, k=3) == pytest.approx((1 / 2) / 2)
    assert average_precision(["g1", "g2"], GOLD) == 1.0
    assert average_precision(RANKED, set()) == 0.0


def test_report_averages_over_questions_with_gold() -> None:
    report = retrieval_report([RANKED, ["g3", "x"], ["x"]], [GOLD, {"g3"}, set()], ks=[2, 4])
    assert report["questions"] == 2
    assert report["recall@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert report["full_recall@4"] == 1.0
    assert report["map@4"] == pytest.approx(((1 / 2 + 2 / 4) / 2 + 1.0) / 2)
    with pytest.raises(ValueError, match="no question has gold"):
        retrieval_report([["x"]], [set()], ks=[1])


def test_agent_retrieval_scores_each_episode_at_its_own_k() -> None:
    """Three episodes, gold {g1, g2} each (paragraph ids in the order the episode retrieved them):

    - [x, g1, g1, g2]: a repeat counts once, so K = 3 ([x, g1, g2]); recall 2/2, full 1,
      AP = (1/2 + 2/3) / 2 = 7/12;
    - [g2]: K = 1, recall 1/2, full 0, AP = (1/1) / 2 = 1/2;
    - []: no search, K = 0, all 0.
    Means: K 4/3, recall 1/2, full 1/3, mAP (7/12 + 1/2) / 3 = 13/36. A question without gold is
    left out of every mean.
    """
    got = agent_retrieval(
        [["x", "g1", "g1", "g2"], ["g2"], [], ["g1"]], [{"g1", "g2"}, {"g1", "g2"}, {"g1", "g2"}, set()]
    )
    assert got == pytest.approx(
        {"agent_k": 4 / 3, "agent_recall": 1 / 2, "agent_full_recall": 1 / 3, "agent_map": 13 / 36}
    )
    assert agent_retrieval([["a"]], [set()]) == {}
