"""Paired bootstrap and bootstrap CIs: null, strong effect, the p-value definition, determinism."""

import numpy as np
import pytest

from hoprl.metrics.stats import mean_ci, paired_bootstrap

STRONG_A = [1.0] * 80 + [0.0] * 20
STRONG_B = [0.0] * 70 + [1.0] * 10 + [0.0] * 20


def test_identical_runs_have_no_difference() -> None:
    scores = [1.0, 0.0, 0.5, 1.0, 0.0] * 20
    r = paired_bootstrap(scores, scores)
    assert r.diff == 0.0
    assert (r.ci_low, r.ci_high) == (0.0, 0.0)
    assert r.p_value == 1.0


def test_strong_difference_is_significant_and_antisymmetric() -> None:
    ab = paired_bootstrap(STRONG_A, STRONG_B)
    ba = paired_bootstrap(STRONG_B, STRONG_A)
    assert ab.diff == pytest.approx(0.7)
    assert ab.p_value < 0.01
    assert ab.ci_low > 0.5 and ab.ci_high < 0.9
    assert ba.diff == pytest.approx(-0.7)
    assert ba.p_value == ab.p_value
    assert ba.ci_high == pytest.approx(-ab.ci_low)


def test_one_question_apart_is_not_significant() -> None:
    a = [1.0] * 50 + [0.0] * 50
    b = [1.0] * 49 + [0.0] * 51
    assert paired_bootstrap(a, b).p_value > 0.5


def test_p_value_matches_the_documented_definition_on_a_case_solved_by_hand() -> None:
    # Deltas [1, 0], observed d = 0.5. Resampled means are 0, 0.5, 1 with probability 1/4, 1/2,
    # 1/4; |d* - d| >= |d| holds for 0 and 1, so p = 1/2 up to sampling noise.
    r = paired_bootstrap([1.0, 0.0], [0.0, 0.0], n_resamples=20_000)
    assert r.p_value == pytest.approx(0.5, abs=0.015)


def test_same_seed_same_result_other_seed_other_interval() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.random(200), rng.random(200)
    assert paired_bootstrap(a, b, seed=3) == paired_bootstrap(a, b, seed=3)
    assert paired_bootstrap(a, b, seed=3).ci_low != paired_bootstrap(a, b, seed=4).ci_low


def test_blocked_resampling_handles_many_questions() -> None:
    # 5,000 questions x 10,000 resamples is built in blocks; the interval must still be sane.
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 5_000).astype(float)
    r = paired_bootstrap(a, a - 0.1)
    assert r.diff == pytest.approx(0.1)
    assert r.ci_low == pytest.approx(0.1) and r.ci_high == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        ([1.0, 0.0], [1.0], "align both runs"),
        ([], [], "non-empty"),
        ([1.0, float("nan")], [1.0, 0.0], "NaN"),
    ],
)
def test_bad_inputs_name_the_fix(a: list[float], b: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(a, b)


def test_mean_ci_constant_and_bernoulli() -> None:
    assert mean_ci([1.0] * 10).low == 1.0
    ci = mean_ci([1.0, 0.0] * 200)  # mean 0.5, standard error 0.025 -> about +-0.049
    assert ci.mean == 0.5
    assert ci.low == pytest.approx(0.451, abs=0.01)
    assert ci.high == pytest.approx(0.549, abs=0.01)
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([1.0], confidence=95)
