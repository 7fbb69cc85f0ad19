"""pass@k: the unbiased estimator, checked against counts worked out by hand."""

from __future__ import annotations

import pytest

from hoprl.metrics.sampling import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 2, 1, 0.5),  # pass@1 = c / n
        (4, 1, 4, 1.0),  # n == k: one right sample is enough
        (4, 0, 4, 0.0),
        (4, 2, 2, 1 - 1 / 6),  # the 6 pairs of 4 samples; 1 pair holds neither right sample
        (5, 1, 3, 0.6),  # 1 - C(4, 3) / C(5, 3) = 1 - 4/10
    ],
)
def test_pass_at_k_by_hand(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 1, 5), (4, 1, 0)])
def test_impossible_counts_are_refused(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_the_mean_over_questions() -> None:
    """Question 1: 1 of 4 right; question 2: none: pass@1 = (0.25 + 0) / 2, pass@4 = (1 + 0) / 2."""
    groups = [[True, False, False, False], [False] * 4]
    assert mean_pass_at_k(groups, 1) == pytest.approx(0.125)
    assert mean_pass_at_k(groups, 4) == pytest.approx(0.5)
    assert mean_pass_at_k([], 4) == 0.0
