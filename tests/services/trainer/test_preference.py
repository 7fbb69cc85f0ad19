"""The seven-head preference model: the head-wise loss by hand, learning, rewards, save / load."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from hoprl.domain import Episode, Question, Step
from hoprl.recipes.evo_rag import SIGNALS, Curriculum, EvoRag, EvoRagConfig, step_weights
from hoprl.training.preference import (
    Item,
    PreferenceConfig,
    PreferenceModel,
    headwise_loss,
    pairwise_accuracy,
    preference_pairs,
    return_accuracy,
    return_headwise_loss,
    train_preference,
)
from hoprl.training.preference_learning import PreferenceLearner, make_reward_func

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


def test_the_papers_headwise_loss_by_hand() -> None:
    """Every head is fitted to the pair's order by weighted return: y = +1 when a is preferred."""
    nll = lambda x: -math.log(1 / (1 + math.exp(-x)))  # noqa: E731  -log sigmoid(x)
    h_a, h_b = torch.zeros(2, 7), torch.zeros(2, 7)
    h_a[0, 0], h_b[0, 0] = 0.3, -0.2  # pair 1 (a preferred): head 0 gap +0.5, the other six 0
    h_a[1, 6], h_b[1, 6] = -1.0, 1.0  # pair 2 (b preferred): head 6 gap -2, y = -1, so +2
    expected = (nll(0.5) + 6 * nll(0.0) + nll(2.0) + 6 * nll(0.0)) / 14
    label = torch.tensor([1.0, -1.0])
    assert return_headwise_loss(h_a, h_b, label).item() == pytest.approx(expected)
    assert return_headwise_loss(h_b, h_a, -label).item() == pytest.approx(expected)  # shown swapped


def weighted_pairs(n: int, seed: int) -> list[tuple[Item, Item]]:
    """Synthetic pairs whose value is the scheduled weighted sum of their signals at t = 1."""
    w = step_weights(1, "discovery", EvoRagConfig())
    items = [
        Item(i.text, i.signals, t=1, value=sum(w[k] * x for k, x in zip(SIGNALS, i.signals, strict=True)))
        for i in synthetic_items(2 * n, seed)
    ]
    return [(a, b) for a, b in zip(items[:n], items[n:], strict=True) if a.value != b.value]


def test_the_default_loss_learns_the_weighted_return_order() -> None:
    torch.manual_seed(0)
    fresh = PreferenceModel(max_length=64)
    train, held_out = weighted_pairs(64, seed=3), weighted_pairs(64, seed=4)
    before = return_accuracy(fresh, held_out, "discovery", EvoRagConfig())
    train_preference(fresh, train, PreferenceConfig(epochs=3, batch_size=16, head_learning_rate=1e-2))
    after = return_accuracy(fresh, held_out, "discovery", EvoRagConfig())
    assert after is not None and after >= 0.8, (before, after)


def test_training_raises_pairwise_accuracy_of_every_head(model: PreferenceModel) -> None:
    """The per-signal option: each head learns its own signal's order."""
    train, held_out = synthetic_pairs(48, seed=1), synthetic_pairs(48, seed=2)
    before = pairwise_accuracy(model, held_out)
    config = PreferenceConfig(epochs=2, batch_size=16, head_learning_rate=1e-2, loss="per_signal")
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


def sibling(qid: str, sample: int, *steps: tuple[str, dict[str, float]]) -> Episode:
    """A scored episode of one question: every episode of a question shares its prompt."""
    return Episode(
        recipe="evo-rag", question_id=qid, question=f"{qid}?", sample=sample,
        prompt=[{"role": "user", "content": f"{qid}?"}],
        steps=[Step(t=t, action="search", text=text, signals=dict.fromkeys(SIGNALS, 0.0) | sig)
               for t, (text, sig) in enumerate(steps, 1)],
        meta={"evo_rag": {"stage": "discovery", "version": "evo_rag@1"}},
    )  # fmt: skip


def test_preference_pairs_are_ordered_by_weighted_return_and_balanced() -> None:
    """Five candidates for step 1 of one question. At t = 1 (p = 0) the Discovery weights are
    Table 2's Start: r_ret 2.0, r_step 0.02, r_ans 0.05; at t = 2 (p = 1/19) r_ans weighs
    (18 * 0.05 + 0.10) / 19 = 1/19 and r_step (18 * 0.02 + 0.05) / 19 = 0.41/19. G_1 = R_1 + R_2:
      a: r_ret +1, then an answer (r_ans 1):  2.0 - 0.02 + 1/19 - 0.41/19 = 2.01105...
      b: r_ret +1, one step:                  2.0 - 0.02            = 1.98
      c: r_step only:                          -0.02
      d: r_ret -1:                            -2.0 - 0.02            = -2.02
      e: r_ret -1, then r_ans 0:              -2.02 - 0.41/19        = -2.04158...
    Best with worst: (a, e), then (b, d); c is left alone. The first pair shows the preferred step
    first, the second shows it second: one label +1, one -1, and no candidate twice."""
    step = {"r_step": -1.0}
    eps = [
        sibling("q", 0, ("a", step | {"r_ret": 1.0}), ("ans", step | {"r_ans": 1.0})),
        sibling("q", 1, ("b", step | {"r_ret": 1.0})),
        sibling("q", 2, ("c", step)),
        sibling("q", 3, ("d", step | {"r_ret": -1.0})),
        sibling("q", 4, ("e", step | {"r_ret": -1.0}), ("ans", step)),
    ]
    g = {"a": 1.98 + 0.59 / 19, "b": 1.98, "c": -0.02, "d": -2.02, "e": -2.02 - 0.41 / 19}
    pairs = preference_pairs(eps, EvoRagConfig())
    assert [(x.text, y.text) for x, y in pairs] == [("a", "e"), ("d", "b")]
    for x, y in pairs:
        assert (x.value, y.value) == (pytest.approx(g[x.text]), pytest.approx(g[y.text]))
        assert (x.context, x.t, x.question_id) == ("q?", 1, "q")
    labels = [1 if x.value > y.value else -1 for x, y in pairs]
    assert labels.count(1) == labels.count(-1)
    texts = [i.text for pair in pairs for i in pair]
    assert len(texts) == len(set(texts))
    assert pairs[0][0].signals[SIGNALS.index("r_ret")] == 1.0  # each step keeps its own signals
    assert preference_pairs(eps, EvoRagConfig(), delta=4.0) == [pairs[0]]  # margins 4.05 and 4.0


def test_the_learner_never_trains_on_held_back_pairs(model: PreferenceModel) -> None:
    """Algorithm 1's reward-model update on one step's episodes: pairs of held-back questions are
    only evaluated; the rest are trained on; the accuracy is over the held-back ones."""
    episodes = [
        sibling(f"q{i}", s, (f"<search>{w} {i}</search>", {"r_ret": 1.0 if w == "apple" else -1.0}))
        for i in range(12)
        for s, w in enumerate(("apple", "tiger"))
    ]
    learner = PreferenceLearner(EvoRag(), PreferenceConfig(eval_share=0.5, epochs=1), model=model)
    pairs = preference_pairs(episodes, EvoRagConfig())
    held = [p for p in pairs if learner.is_held_back(p[0].question_id)]
    trained = [p for p in pairs if not learner.is_held_back(p[0].question_id)]
    assert held and trained and len(pairs) == 12
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    metrics = learner.step(episodes)
    assert torch.equal(torch.get_rng_state(), rng), "the job's sampling RNG must not be reseeded"
    assert learner.held_back == held
    assert {p[0].question_id for p in held}.isdisjoint(p[0].question_id for p in trained)
    assert metrics["preference/train_pairs"] == len(trained) and metrics["preference/eval_pairs"] == len(held)
    accuracy = return_accuracy(model, held, "discovery", EvoRagConfig())
    assert metrics["preference/eval_accuracy"] == pytest.approx(accuracy)
    assert "preference/loss" in metrics


def test_save_and_load_give_the_same_scores(model: PreferenceModel, tmp_path: Path) -> None:
    texts = ["<search>apple</search>", "<answer>copper violet</answer>"]
    model.save(tmp_path)
    loaded = PreferenceModel.load(tmp_path)
    assert loaded.score(texts).shape == (2, 7)
    assert torch.allclose(loaded.score(texts), model.score(texts), atol=1e-6)


# --- in the training loop: every EVO-RAG job reaches the preference model -----------------------


class ParityEvoRag(EvoRag):
    """EVO-RAG for a random model: a segment ends at the first space and reads, by the sum of its
    character codes mod 3, as REFUSE, BACKTRACK or ANSWER, so a group's first steps differ in
    weighted return (a group of 6 samples is all alike with probability 3 / 3^6): pairs."""

    stop = [" "]  # noqa: RUF012

    def parse(self, segment: str) -> Any:
        from hoprl.domain import Action

        kind = sum(map(ord, segment)) % 3
        return [Action("refuse"), Action("backtrack"), Action("answer", answer="x")][kind]


@pytest.mark.parametrize("objective", ["grpo", "ppo"])
def test_an_evo_rag_job_trains_the_preference_model_and_logs_its_accuracy(
    objective: str, tiny_model: str, retriever_url: str, collection: str,
    synthetic: dict[str, list[Question]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Algorithm 1 in a job: each step's sibling pairs train the preference model, held-back pairs
    give preference/eval_accuracy in the registry, and every checkpoint holds the model. (With
    seed 0 and a share of 0.4, four of the eight training questions are held back (the 1st, 3rd,
    6th and 7th) and four are trained on, so neither side hangs on a few groups' draws: with two
    held back (a share of 0.3), a group's six samples often gave no pair, 0-2 held-back pairs came
    from the first step, and in one CI run none came from either step.)"""
    from hoprl.data.jsonl import write_questions
    from hoprl.recipes import RECIPES
    from hoprl.registry.store import Registry
    from hoprl.schemas.trainer import Hyperparameters, JobRequest
    from services.trainer.jobs import run_job, submit
    from services.trainer.settings import TrainerSettings

    monkeypatch.setitem(RECIPES, "evo-rag", ParityEvoRag)
    data = tmp_path / "train.jsonl"
    write_questions(data, synthetic["train"])
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    settings = TrainerSettings(database_url=url, runs_dir=tmp_path / "runs", retriever_url=retriever_url,
                               torch_threads=1)  # fmt: skip
    hp = Hyperparameters(questions_per_step=4, num_generations=6, max_steps=2, max_new_tokens_per_step=8,
                         token_budget=64, save_steps=2, eval_questions=1, learning_rate=1e-3,
                         preference_eval_share=0.4, critic_model="policy")  # fmt: skip
    request = JobRequest(recipe="evo-rag", objective=objective, model=tiny_model, dataset=str(data),
                         collection=collection, steps=2, hyperparameters=hp)  # fmt: skip
    with Registry(settings.database_url) as registry:
        run_id = submit(registry, request).id
        assert registry.get_run(run_id).config["hyperparameters"]["preference_model"] is True  # type: ignore[union-attr]
        run_job(run_id, settings, registry)
        series = {name: registry.metric_series(run_id, f"preference/{name}")
                  for name in ("train_pairs", "eval_pairs", "eval_accuracy", "loss", "step_s")}  # fmt: skip
        checkpoint = Path(registry.checkpoints(run_id)[-1].path)
    assert [s for s, _ in series["train_pairs"]] == [1, 2]
    assert sum(v for _, v in series["train_pairs"]) > 0 and series["loss"]
    accuracy = [v for _, v in series["eval_accuracy"]]
    assert accuracy and all(0.0 <= v <= 1.0 for v in accuracy)
    assert series["eval_pairs"][-1][1] > 0
    assert [s for s, _ in series["step_s"]] == [1, 2]
    loaded = PreferenceModel.load(checkpoint / "preference")
    assert loaded.score(["<refuse/>"]).shape == (1, 7)
