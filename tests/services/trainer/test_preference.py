"""The seven-head preference model: the head-wise loss by hand, learning, rewards, save / load."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from hoprl.agent.trajectory import Episode, Step
from hoprl.recipes.evo_rag import SIGNALS, Curriculum, EvoRagConfig, step_weights
from services.trainer.preference import (
    Item,
    PreferenceConfig,
    PreferenceModel,
    headwise_loss,
    make_reward_func,
    pairs_from_episodes,
    pairwise_accuracy,
    train_preference,
)

# Signal k of a synthetic text is 1 when WORDS[k] occurs in it: every head has something to learn.
WORDS = ("apple", "river", "guitar", "planet", "copper", "violet", "tiger")
FILLER = ("the", "a", "search", "for", "some", "document", "about", "city", "name", "year")


def synthetic_items(n: int, seed: int) -> list[Item]:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        present = [w for w in WORDS if rng.random() < 0.5]
        words = present + rng.sample(FILLER, 4)
        rng.shuffle(words)
        items.append(Item(" ".join(words), tuple(float(w in present) for w in WORDS)))
    return items


def synthetic_pairs(n: int, seed: int) -> list[tuple[Item, Item]]:
    items = synthetic_items(2 * n, seed)
    return list(zip(items[:n], items[n:], strict=True))


@pytest.fixture(scope="module")
def model() -> PreferenceModel:
    torch.manual_seed(0)
    return PreferenceModel(max_length=64)


def test_headwise_loss_by_hand_on_two_pairs() -> None:
    nll = lambda x: -math.log(1 / (1 + math.exp(-x)))  # noqa: E731  -log sigmoid(x)
    # pair 1: a better on head 0, worse on head 1, tie on the rest (no preference there)
    # pair 2: a better on head 6 only
    sig_a = torch.zeros(2, 7)
    sig_b = torch.zeros(2, 7)
    sig_a[0, 0], sig_b[0, 1], sig_a[1, 6] = 1.0, 1.0, 0.5
    h_a = torch.zeros(2, 7)
    h_b = torch.zeros(2, 7)
    h_a[0, 0], h_b[0, 0] = 0.3, -0.2  # head 0 agrees: gap 0.5
    h_a[0, 1], h_b[0, 1] = 0.4, 0.1  # head 1 disagrees: b preferred, gap a - b = 0.3
    h_a[1, 6], h_b[1, 6] = -1.0, 1.0  # head 6 disagrees strongly: gap -2
    h_a[1, 2] = 5.0  # head 2 has no preference on pair 2: ignored
    expected = (nll(0.5) + nll(-0.3) + nll(-2.0)) / 3
    assert headwise_loss(h_a, h_b, sig_a, sig_b).item() == pytest.approx(expected)
    # swapping a and b changes nothing; no preference at all gives 0
    assert headwise_loss(h_b, h_a, sig_b, sig_a).item() == pytest.approx(expected)
    assert headwise_loss(h_a, h_b, sig_a, sig_a).item() == 0.0


def test_training_raises_pairwise_accuracy_of_every_head(model: PreferenceModel) -> None:
    train, held_out = synthetic_pairs(48, seed=1), synthetic_pairs(48, seed=2)
    before = pairwise_accuracy(model, held_out)
    config = PreferenceConfig(epochs=2, batch_size=16, head_learning_rate=1e-2)  # encoder trained too
    losses = train_preference(model, train, config)
    after = pairwise_accuracy(model, held_out)
    assert len(losses) == 6 and sum(losses[3:]) < sum(losses[:3])
    for name in SIGNALS:  # chance is 0.5; random heads start anywhere around it
        acc = after[name]
        assert acc is not None and acc >= 0.8, (name, before[name], acc)


def test_reward_func_weights_heads_by_stage(model: PreferenceModel) -> None:
    texts = ["<search>apple river</search>", "<answer>tiger</answer>"]
    prompts = ["Question: who?", [{"role": "user", "content": "Question: who?"}]]
    completions = [texts[0], [{"role": "assistant", "content": texts[1]}]]
    curriculum = Curriculum()
    reward = make_reward_func(model, curriculum)
    values = reward(prompts, completions, t=[1, 3])
    assert len(values) == 2 and all(isinstance(v, float) for v in values)
    scores = model.score(texts, ["Question: who?"] * 2)
    cfg = EvoRagConfig()
    for t, s, v in zip([1, 3], scores, values, strict=True):
        w = step_weights(t, "discovery", cfg)
        assert v == pytest.approx(sum(w[k] * float(s[i]) for i, k in enumerate(SIGNALS)), abs=1e-5)
    curriculum.stage = "refinement"
    assert reward(prompts, completions, t=[1, 3]) != pytest.approx(values)
    assert reward.__version__ == "evo_rag_preference@1"  # type: ignore[attr-defined]


def test_reward_func_sums_over_episode_steps(model: PreferenceModel) -> None:
    steps = [
        Step(t=1, action="search", text="<search>apple</search>", information="<information>x</information>"),
        Step(t=2, action="answer", text="<answer>tiger</answer>", answer="tiger"),
    ]
    ep = Episode(
        recipe="evo-rag", question_id="q1", question="Who?", prompt=[{"role": "user", "content": "Who?"}]
    )
    ep.steps = steps
    reward = make_reward_func(model, "refinement")
    total = reward(["Who?", "Who?"], ["", ""], episodes=[ep, ep.model_copy(update={"steps": []})])
    scores = model.score(
        [s.text for s in ep.steps], ["Who?", "Who?\n<search>apple</search>\n<information>x</information>"]
    )
    expected = sum(
        sum(
            step_weights(t, "refinement", EvoRagConfig())[k] * float(scores[t - 1, i])
            for i, k in enumerate(SIGNALS)
        )
        for t in (1, 2)
    )
    assert total == pytest.approx([expected, 0.0], abs=1e-5)


def test_pairs_from_episodes_use_each_steps_own_signals() -> None:
    def ep(text: str, r_ret: float, sample: int) -> Episode:
        signals = dict.fromkeys(SIGNALS, 0.0) | {"r_ret": r_ret, "r_step": -1.0}
        step = Step(t=1, action="search", text=text, signals=signals)
        prompt = [{"role": "user", "content": "Q?"}]
        return Episode(
            recipe="evo-rag", question_id="q", question="Q?", prompt=prompt, steps=[step], sample=sample
        )

    pairs = pairs_from_episodes([ep("<search>a</search>", 1.0, 0), ep("<search>b</search>", -1.0, 1)])
    assert len(pairs) == 1
    a, b = pairs[0]
    assert (a.text, b.text, a.context) == ("<search>a</search>", "<search>b</search>", "Q?")
    assert a.signals[SIGNALS.index("r_ret")] == 1.0 and b.signals[SIGNALS.index("r_ret")] == -1.0


def test_save_and_load_give_the_same_scores(model: PreferenceModel, tmp_path: Path) -> None:
    texts = ["<search>apple</search>", "<answer>copper violet</answer>"]
    model.save(tmp_path)
    loaded = PreferenceModel.load(tmp_path)
    assert loaded.score(texts).shape == (2, 7)
    assert torch.allclose(loaded.score(texts), model.score(texts), atol=1e-6)
