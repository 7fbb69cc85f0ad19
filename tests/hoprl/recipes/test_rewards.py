"""The step-signal adapter: R_t = sum_k w_k(t) r_k(t), R = sum_t R_t, and query cosines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.embedding import get_embedder
from hoprl.recipes.rewards import (
    episode_reward,
    gold_titles_in,
    query_cosines,
    sequence_reward,
    signal_total,
    step_rewards,
)

torch.set_num_threads(1)


def episode(*signals: dict[str, float]) -> Episode:
    steps = [Step(t=i, action="search", text="", signals=s) for i, s in enumerate(signals, 1)]
    return Episode(recipe="test", question_id="q1", question="?", steps=steps)


EP = episode(
    {"hit": 1.0, "step": -1.0}, {"hit": -1.0, "step": -1.0, "logged": 5.0}, {"hit": 1.0, "step": -1.0}
)


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        # constant weights: R_t = 2*hit + 0.1*step
        (lambda t: {"hit": 2.0, "step": 0.1}, [1.9, -2.1, 1.9]),
        # weights that change with t: w_hit(t) = t, w_step(t) = 0.5
        (lambda t: {"hit": float(t), "step": 0.5}, [0.5, -2.5, 2.5]),
        # one signal only; "logged" has no weight and never counts
        (lambda t: {"step": 1.0}, [-1.0, -1.0, -1.0]),
        (lambda t: {}, [0.0, 0.0, 0.0]),
    ],
)
def test_step_and_sequence_rewards(weights, expected):
    assert step_rewards(EP, weights) == pytest.approx(expected)
    assert sequence_reward(EP, weights) == pytest.approx(sum(expected))


def test_missing_weighted_signal_raises_naming_the_step():
    with pytest.raises(KeyError, match=r"t=2 .* no signal 'bonus'"):
        step_rewards(episode({"bonus": 1.0}, {}), lambda t: {"bonus": 1.0})


def test_empty_episode_has_zero_return():
    assert sequence_reward(episode(), lambda t: {"x": 1.0}) == 0.0


def test_signal_total_sums_unweighted_values():
    assert signal_total(EP, "hit") == pytest.approx(1.0)
    with pytest.raises(KeyError, match="logged"):
        signal_total(EP, "logged")  # only step 2 has it


def test_episode_reward_lifts_to_trl_signature():
    reward = episode_reward(lambda ep: signal_total(ep, "step"))
    eps = [EP, episode({"step": -1.0})]
    assert reward(["p1", "p2"], ["c1", "c2"], episodes=eps) == [-3.0, -1.0]
    with pytest.raises(KeyError, match="episodes"):
        reward(["p"], ["c"])
    with pytest.raises(ValueError, match="2 episodes for 1 completions"):
        reward(["p"], ["c"], episodes=eps)


def test_gold_titles_match_case_and_space_insensitively():
    docs = [
        RetrievedDoc(id="1", title="Acme  Records", text="x"),
        RetrievedDoc(id="2", title="Other", text="y"),
    ]
    assert gold_titles_in(docs, ["acme records", "Missing"]) == {"acme records"}
    assert gold_titles_in(docs, []) == set()


def test_query_cosines_match_the_embedder_and_dedupe():
    queries = ["Who founded Acme Records?", "capital of France", "Who founded Acme Records?"]
    sims = query_cosines(queries)
    assert sims.shape == (3, 3)
    direct = get_embedder().similarity(queries[:2], queries[:2])
    np.testing.assert_allclose(sims[:2, :2], direct, atol=1e-5)
    np.testing.assert_allclose(sims, sims.T, atol=1e-6)
    assert sims[0, 2] == pytest.approx(1.0, abs=1e-5)  # a repeated query is a perfect overlap
    assert sims[0, 1] < 0.5
    assert query_cosines([]).shape == (0, 0)
