"""GRPO through TRL on a tiny model: weights move, injected tokens get no gradient, loss types run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.training_args import OptimizerNames

from hoprl.domain import Action, Question
from hoprl.jobspec import resolve
from hoprl.recipes.baselines import SearchR1, generated_texts
from hoprl.recipes.evo_rag import EvoRag
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.grpo import (
    HoprlGRPOTrainer,
    build_grpo,
    grpo_config,
    k2_kl,
    masked_sequence_mean,
    step_advantages,
    token_advantages,
)
from hoprl.training.rollout import AgentRollout, RolloutOptions
from tests.conftest import shape


class LengthRecipe(SearchR1):
    """search-r1's protocol with a reward that varies even for a random model: generated length."""

    def reward_funcs(self) -> list[Any]:
        def length_reward(prompts: Any, completions: Any, **kw: Any) -> list[float | None]:
            return [len("".join(s.text for s in e.steps)) / 100 for e in kw["episodes"]]

        return [length_reward]


class SpaceSearch(LengthRecipe):
    """Every segment ends at the first space and reads as a search: a random model then runs
    real multi-turn episodes, with retrieved text injected between its turns."""

    stop = [" "]  # noqa: RUF012

    def parse(self, segment: str) -> Action:
        return Action("search", queries=["river city capital"], query_kinds=["search"])


class Probe(HoprlGRPOTrainer):
    """Keeps the policy log-probs of the loss (with their gradient) and the masks of the batch."""

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self.policy_mask = inputs["completion_mask"] * inputs["tool_mask"]
        self.injected_mask = inputs["completion_mask"] * (1 - inputs["tool_mask"])
        return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if kwargs.get("compute_entropy"):
            out[0].retain_grad()
            self.logps = out[0]
        return out


def make_trainer(
    tiny_model: str, retriever_url: str, collection: str, questions: list[Question], tmp: Path,
    objective: str = "grpo", recipe: Any = None, steps: int = 2, **hp: Any,
) -> Any:  # fmt: skip
    hp = {"learning_rate": 1e-2, "questions_per_step": 2, "num_generations": 3, "max_steps": 2,
          "max_new_tokens_per_step": 12, "token_budget": 96, "save_steps": 100, **hp}  # fmt: skip
    params = resolve(Hyperparameters(**hp), "search-r1")
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    recipe = recipe or LengthRecipe()
    opts = RolloutOptions(
        collection=collection, retriever_url=retriever_url, num_generations=params.num_generations,
        shape=shape(max_steps=params.max_steps, max_new_tokens_per_step=params.max_new_tokens_per_step,
                    token_budget=params.token_budget, temperature=1.0),
        dynamic_sampling=bool(params.dynamic_sampling), max_resample=params.max_resample,
        dynamic_sampling_signal=params.dynamic_sampling_signal or "answers",
        flat_groups=params.flat_groups or "drop",
    )  # fmt: skip
    rollout = AgentRollout(recipe, questions, opts)
    config = grpo_config(params, objective, steps=steps, output_dir=str(tmp / "out"), seed=0)
    return build_grpo(model, tokenizer, rollout, questions, config, kl_estimator=params.kl_estimator or "k3",
                      advantage=params.advantage or "sequence")  # fmt: skip


def test_grpo_moves_weights(tiny_model: str, retriever_url: str, collection: str,
                            synthetic: dict[str, list[Question]], tmp_path: Path) -> None:  # fmt: skip
    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter changed after two GRPO steps"
    assert trainer.state.global_step == 2


class ThreadProbe(HoprlGRPOTrainer):
    """Notes the torch threads each loss runs on, and those each rollout decodes on."""

    loss_threads: list[int]

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self.loss_threads.append(torch.get_num_threads())
        return super()._compute_loss(model, inputs)


def test_the_loss_keeps_the_trainers_threads_after_a_rollout(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
    tmp_path: Path,
) -> None:  # fmt: skip
    """Rollouts decode on one thread; the loss after them runs on the trainer's threads (building the
    rollout engine once set the whole process to one thread, and every loss after it ran on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path)
        trainer.__class__ = ThreadProbe
        trainer.loss_threads = []
        trainer.train()
        assert trainer.loss_threads == [2, 2]  # two steps, each after its rollout
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("objective", "scale", "expected"),
    [
        ("grpo", None, "group"),
        ("dapo", None, "group"),
        ("dr_grpo", None, "none"),
        ("dr_grpo", "batch", "batch"),
    ],
)
def test_reward_scaling_follows_the_objective(
    objective: str, scale: str | None, expected: str, tmp_path: Path
) -> None:
    hp = resolve(Hyperparameters(scale_rewards=scale), "search-r1")  # type: ignore[arg-type]
    assert grpo_config(hp, objective, steps=1, output_dir=str(tmp_path), seed=0).scale_rewards == expected


@pytest.mark.parametrize(("schedule", "decays"), [("linear", True), ("constant", False)])
def test_the_learning_rate_schedule_reaches_trl(
    schedule: str, decays: bool, tiny_model: str, retriever_url: str, collection: str,
    synthetic: dict[str, list[Question]], tmp_path: Path,
) -> None:  # fmt: skip
    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path,
                           steps=4, lr_scheduler=schedule)  # fmt: skip
    trainer.create_optimizer_and_scheduler(num_training_steps=4)
    rates = []
    for _ in range(3):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert rates[0] == pytest.approx(1e-2)
    assert rates == (sorted(rates, reverse=True) if decays else [rates[0]] * 3), rates
    assert (rates[-1] < rates[0]) is decays, rates


def test_k2_values() -> None:
    logps = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-3.0, -2.0, -0.5]])
    assert k2_kl(logps, ref).tolist() == [[2.0, 0.0, 0.0]]
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert float(masked_sequence_mean(k2_kl(logps, ref), mask)) == pytest.approx(1.0)


def test_injected_tokens_get_no_gradient(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]], tmp_path: Path
) -> None:
    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path,
                           recipe=SpaceSearch(), steps=1)  # fmt: skip
    trainer.__class__ = Probe
    trainer.train()
    episodes = trainer.rollout_func.last_episodes
    assert all(e.retrieval_count == 2 and e.steps[0].information for e in episodes)
    grad = trainer.logps.grad
    assert trainer.injected_mask.sum() > 0, "no injected tokens in the batch"
    assert torch.count_nonzero(grad[trainer.injected_mask.bool()]) == 0
    assert torch.count_nonzero(grad[trainer.policy_mask.bool()]) > 0


@pytest.mark.parametrize("flat_groups", ["drop", "train"])
def test_groups_kept_flat_leave_the_loss_when_dropped(
    flat_groups: str, tiny_model: str, retriever_url: str, collection: str,
    synthetic: dict[str, list[Question]], tmp_path: Path,
) -> None:  # fmt: skip
    """DAPO's filter (Eq. 11, Algorithm 1) by answers, with no refill draws: the untrained model
    answers nothing right, so both groups are flat and kept, though their rewards (generated
    length) spread. Dropped, they leave no policy token in the loss and no gradient; trained, they
    move the policy by their length rewards."""
    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path,
                           objective="dapo", steps=1, dynamic_sampling=True, max_resample=0,
                           dynamic_sampling_signal="answers", flat_groups=flat_groups)  # fmt: skip
    trainer.__class__ = Probe
    trainer.train()
    rollout = trainer.rollout_func
    assert rollout.counts == {"resampled": 0, "kept_flat": 2}
    assert torch.tensor(rollout.last_totals).view(2, 3).std(1).min() > 0, "rewards must spread"
    touched = int(torch.count_nonzero(trainer.logps.grad))
    if flat_groups == "drop":
        assert int(trainer.policy_mask.sum()) == 0 and touched == 0
    else:
        assert int(trainer.policy_mask.sum()) > 0 and touched > 0


@pytest.mark.parametrize("objective", ["dapo", "dr_grpo"])
def test_loss_types_run(objective: str, tiny_model: str, retriever_url: str, collection: str,
                        synthetic: dict[str, list[Question]], tmp_path: Path) -> None:  # fmt: skip
    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path,
                           objective=objective, steps=1, epsilon_high=0.28)  # fmt: skip
    assert trainer.loss_type == objective and trainer.epsilon_high == 0.28
    trainer.train()
    assert trainer.state.global_step == 1
    assert "loss" in trainer.state.log_history[0]


class KLProbe(HoprlGRPOTrainer):
    """Keeps what the KL term is computed from (the policy and reference log-probs of the loss's
    batch, the policy-token mask) and how much the KL adds to the loss: the loss minus the same
    loss recomputed with ``beta = 0``."""

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        loss = super()._compute_loss(model, inputs)
        assert self._policy_logps is not None
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        tensors = (self._policy_logps, inputs["ref_per_token_logps"], mask)
        self.kl_inputs = [t.detach().clone() for t in tensors]
        beta, self.beta = self.beta, 0.0
        try:
            with torch.no_grad():
                without_kl = super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
        self.kl_in_loss = float(loss.detach() - without_kl)
        return loss


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_k2_kl_in_training(estimator: str, tiny_model: str, retriever_url: str, collection: str,
                           synthetic: dict[str, list[Question]], tmp_path: Path) -> None:  # fmt: skip
    """ARENA's k2 = ½ (log πθ - log πref)² is what the loss adds and logs, not TRL's k3.

    The policy is made 10x sharper than its reference (final norm scaled), so its sampled tokens
    sit several nats above the reference, x = log πθ - log πref > 0, where the two estimators part:
    k2 = x²/2 grows quadratically, k3 = exp(-x) + x - 1 linearly (x = 4: 8 vs 3.02). Both are
    recomputed by hand from the loss's own log-probs. ``kl_estimator="k3"`` (TRL's) must match k3
    and not k2: the same assertions tell the two apart in both directions.
    """
    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path,
                           steps=1, beta=0.1, kl_estimator=estimator)  # fmt: skip
    assert trainer.kl_estimator == estimator and trainer.ref_model is not None
    trainer.__class__ = KLProbe
    with torch.no_grad():
        trainer.model.model.norm.weight.mul_(10.0)
    trainer.train()
    logps, ref, mask = trainer.kl_inputs
    x = logps - ref
    per_token = {"k2": 0.5 * x**2, "k3": torch.exp(-x) + x - 1}

    def sequence_mean(v: torch.Tensor) -> float:  # per sequence over policy tokens, then over sequences
        return float(((v * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean())

    def token_mean(v: torch.Tensor) -> float:  # over every policy token of the batch (TRL's kl log)
        return float((v * mask).sum() / mask.sum())

    other = "k3" if estimator == "k2" else "k2"
    k_mine, k_other = per_token[estimator], per_token[other]
    low, high = sorted(sequence_mean(k) for k in per_token.values())
    assert high > 1.5 * low, "k2 and k3 must differ clearly in this batch, or the test cannot tell them apart"
    # The loss adds beta * (k averaged per sequence, then over sequences) for both estimators (the
    # grpo aggregation; TRL adds beta * k3 per token before that same aggregation).
    assert trainer.kl_in_loss == pytest.approx(0.1 * sequence_mean(k_mine), rel=1e-4)
    assert trainer.kl_in_loss != pytest.approx(0.1 * sequence_mean(k_other), rel=0.2)
    # The logged kl: ours logs the k2 term it added; TRL logs k3's mean over all policy tokens.
    (logged,) = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    expected = sequence_mean(k_mine) if estimator == "k2" else token_mean(k_mine)
    assert logged == pytest.approx(expected, rel=1e-4)
    assert all(logged != pytest.approx(m(k_other), rel=0.2) for m in (sequence_mean, token_mean))


def test_arena_jobs_default_to_the_k2_kl() -> None:
    """ARENA's objective (ARENA §3.2): GRPO with the k2 KL, so a job that leaves the estimator
    unset trains with k2 and a KL at all (beta > 0: at 0 no KL term is added); others keep TRL's k3."""
    hp = resolve(Hyperparameters(), "arena")
    assert hp.kl_estimator == "k2" and hp.beta is not None and hp.beta > 0
    assert resolve(Hyperparameters(), "search-r1").kl_estimator == "k3"
    assert resolve(Hyperparameters(kl_estimator="k3"), "arena").kl_estimator == "k3"  # a request wins


class Capture(HoprlGRPOTrainer):
    """Keeps the batch the loss was computed on (token ids, masks, TRL's advantages)."""

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self.batch = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        return super()._compute_loss(model, inputs)


def mean_policy_logps(trainer: Any, model: Any) -> torch.Tensor:
    """Per completion: the mean log-prob of its policy tokens (mask 1) under ``model``."""
    b = trainer.batch
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
    attention = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(
            model, ids, attention, b["completion_ids"].size(1)
        )[0]
    mask = b["completion_mask"] * b["tool_mask"]
    return (logps * mask).sum(1) / mask.sum(1).clamp(min=1)


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo"])
def test_a_step_favours_completions_with_higher_reward(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
    tmp_path: Path, objective: str,
) -> None:  # fmt: skip
    """The sign and the alignment of the policy gradient: TRL's advantages follow our rewards of
    the same episodes, row by row, and one small step raises the (mean) log-probability of the
    completions with positive advantage against those with negative advantage. Under ``dr_grpo``
    the advantages are the rewards minus their group mean, not divided by the group's std."""
    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path,
                           objective=objective, steps=1, learning_rate=1e-4)  # fmt: skip
    trainer.__class__ = Capture
    before = copy.deepcopy(trainer.model)
    trainer.train()
    # TRL shuffles the batch before the loss: find each row's episode by its generated text
    b, rollout, g = trainer.batch, trainer.rollout_func, trainer.num_generations
    totals = torch.tensor(rollout.last_totals)
    centred = totals - totals.view(-1, g).mean(1).repeat_interleave(g)
    texts = generated_texts([], rollout.last_episodes)
    mask = b["completion_mask"] * b["tool_mask"]
    rows = [trainer.processing_class.decode(ids[m.bool()], clean_up_tokenization_spaces=False)
            for ids, m in zip(b["completion_ids"], mask, strict=True)]  # fmt: skip
    episode = [texts.index(text) for text in rows]
    assert sorted(episode) == list(range(len(texts))), "rows and episodes do not match one to one"
    advantages = b["advantages"]
    assert advantages.abs().sum() > 0, "every group was flat: nothing to learn from"
    expected = centred[episode]
    assert torch.equal(torch.sign(advantages), torch.sign(expected.where(expected.abs() > 1e-6, 0.0)))
    if objective == "dr_grpo":
        assert torch.allclose(advantages, expected.to(advantages.dtype), atol=1e-5)
    change = mean_policy_logps(trainer, trainer.model) - mean_policy_logps(trainer, before)
    assert float((advantages * change).sum()) > 0
    assert float(change[advantages > 0].mean()) > float(change[advantages < 0].mean())


# --- EVO-RAG's per-step group normalisation (advantage="per_step") ----------------------------


def test_step_advantages_by_hand_on_episodes_of_different_lengths() -> None:
    """One group of three episodes with 2, 1 and 3 steps (step rewards R_t as EVO-RAG scores them).

    t = 1: R = [1, 0, 2]      mean 1, sample std 1          A = [0, -1, 1] / (1 + 1e-4)
    t = 2: R = [-0.5, 0.5]    mean 0, std sqrt(0.5)         A = [-0.5, 0.5] / (0.70711 + 1e-4)
    t = 3: R = [-1]           one episode: no spread        A = 0
    """
    rewards = [[1.0, -0.5], [0.0], [2.0, 0.5, -1.0]]
    s2 = 0.5**0.5 + 1e-4
    expected = [[0.0, -0.5 / s2, 0.0], [-1 / 1.0001, 0.0, 0.0], [1 / 1.0001, 0.5 / s2, 0.0]]
    assert step_advantages(rewards, group_size=3).tolist() == [pytest.approx(r, abs=1e-6) for r in expected]
    # scale "none": centred only; two groups are normalised separately
    two = step_advantages([[1.0], [3.0], [10.0], [30.0]], group_size=2, scale="none")
    assert two.tolist() == [[-1.0], [1.0], [-10.0], [10.0]]
    with pytest.raises(ValueError, match="whole number of groups"):
        step_advantages(rewards, group_size=2)


def test_each_steps_tokens_get_that_steps_advantage(tiny_model: str) -> None:
    """Step t's policy tokens carry A_t; injected documents and template tokens carry 0; a step
    without text owns no tokens."""
    from hoprl.agent.tokens import to_token_trajectory
    from hoprl.domain import Episode, Step

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    info = "\n<information>\nDoc 1 (Title: Acme) Acme was founded by Jane Roe.\n</information>\n"
    steps = [
        Step(t=1, action="search", text="<search>Acme founder</search>", queries=["Acme"], information=info),
        Step(t=2, action="backtrack", text=""),
        Step(t=3, action="answer", text="<answer>Jane Roe</answer>", answer="Jane Roe"),
    ]
    episode = Episode(recipe="evo-rag", question_id="q", question="Who founded Acme?",
                      prompt=[{"role": "user", "content": "Who founded Acme?"}], steps=steps)  # fmt: skip
    traj = to_token_trajectory(episode, tokenizer)
    mask = torch.tensor([traj.mask])
    out = token_advantages(torch.tensor([[0.5, 9.0, -2.0]]), [episode], mask)[0]
    first = len(tokenizer("<search>Acme founder</search>", add_special_tokens=False)["input_ids"])
    policy = [i for i, m in enumerate(traj.mask) if m]
    assert out[policy[:first]].tolist() == [0.5] * first
    assert out[policy[first:]].tolist() == [-2.0] * (len(policy) - first)  # step 3; step 2 had no text
    assert torch.count_nonzero(out[mask[0] == 0]) == 0
    with pytest.raises(ValueError, match="runs of policy tokens"):
        token_advantages(torch.zeros(1, 3), [episode.model_copy(update={"steps": steps[:1]})], mask)


class SpaceEvoRag(EvoRag):
    """EVO-RAG for a random model: a segment ends at the first space and reads, by the sum of its
    character codes mod 3, as a SEARCH (documents are injected after it), a BACKTRACK or a REFUSE
    (which ends the episode), so a group's episodes differ in length and in step rewards (a group
    of 6 has all its first steps alike with probability 3 / 3^6)."""

    stop = [" "]  # noqa: RUF012

    def parse(self, segment: str) -> Action:
        kind = sum(map(ord, segment)) % 3
        if kind == 0:
            return Action("search", queries=["river city capital"], query_kinds=["search"])
        return Action("backtrack") if kind == 1 else Action("refuse")


class Generated(HoprlGRPOTrainer):
    """Keeps the batch as ``_generate_and_score_completions`` returns it: rows in episode order,
    before TRL shuffles them for the loss."""

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        self.generated = {k: v.detach().clone() for k, v in output.items() if isinstance(v, torch.Tensor)}
        return output


def test_per_step_advantages_reach_trl_and_a_step_follows_them(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]], tmp_path: Path
) -> None:
    """A GRPO step of EVO-RAG with advantage="per_step" on the tiny model: every policy token of
    the batch TRL trains on carries (R_{i,t} - mean_t) / (std_t + 1e-4) of its own step, computed
    here with the statistics module from the rollout's scored episodes, and one small step raises
    the log-probability of tokens with positive advantage against those with negative advantage."""
    import statistics

    trainer = make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path, steps=1,
                           learning_rate=1e-4, recipe=SpaceEvoRag(), advantage="per_step",
                           num_generations=6)  # fmt: skip
    assert trainer.advantage == "per_step"
    trainer.__class__ = Generated
    before = copy.deepcopy(trainer.model)
    trainer.train()
    b, rollout, g = trainer.generated, trainer.rollout_func, trainer.num_generations
    episodes = rollout.last_episodes
    rewards = [rollout.recipe.step_rewards(e) for e in episodes]
    mask = b["completion_mask"] * b["tool_mask"]
    advantages = b["advantages"]
    assert advantages.dim() == 2 and advantages.shape == mask.shape
    for i, episode in enumerate(episodes):
        group = range(i - i % g, i - i % g + g)
        runs = [t for t, step in enumerate(episode.steps) if step.text]
        on = mask[i].bool().tolist()
        starts = [j for j, x in enumerate(on) if x and (j == 0 or not on[j - 1])]
        assert len(starts) == len(runs)
        for k, (t, start) in enumerate(zip(runs, starts, strict=True)):
            peers = [rewards[j][t] for j in group if len(rewards[j]) > t]
            spread = statistics.stdev(peers) if len(peers) > 1 else 0.0
            want = 0.0 if spread == 0 else (rewards[i][t] - statistics.mean(peers)) / (spread + 1e-4)
            end = starts[k + 1] if k + 1 < len(starts) else len(on)
            got = advantages[i, start:end][mask[i, start:end].bool()]
            assert torch.allclose(got, torch.full_like(got, want), atol=1e-4), (i, t, got[:3], want)
        assert torch.count_nonzero(advantages[i][~mask[i].bool()]) == 0
    assert advantages.abs().sum() > 0, "every step was flat: nothing to learn from"
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
    attention = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
    width = b["completion_ids"].size(1)
    with torch.no_grad():
        new = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width)[0]
        old = trainer._get_per_token_logps_and_entropies(before, ids, attention, width)[0]
    change = (new - old) * mask
    assert float((advantages * change).sum()) > 0
    assert float(change[advantages > 0].mean()) > float(change[advantages < 0].mean())


def test_per_step_needs_step_rewards(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="step rewards"):
        make_trainer(tiny_model, retriever_url, collection, synthetic["train"], tmp_path,
                     advantage="per_step")  # fmt: skip


def test_evo_rag_jobs_default_to_sibling_advantages() -> None:
    assert resolve(Hyperparameters(), "evo-rag").advantage == "siblings"
    assert resolve(Hyperparameters(advantage="per_step"), "evo-rag").advantage == "per_step"
    assert resolve(Hyperparameters(), "search-r1").advantage == "sequence"
    assert resolve(Hyperparameters(advantage="sequence"), "evo-rag").advantage == "sequence"


def test_the_config_trl_receives_for_vllm_rollouts_and_several_processes(tmp_path: Path) -> None:
    colocate = Hyperparameters(generation="vllm", questions_per_step=4, num_generations=5, processes=2)
    args = grpo_config(resolve(colocate, "search-r1"), "grpo", 3, str(tmp_path), 0)
    assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization) == (True, "colocate", 0.3)
    assert args.vllm_importance_sampling_correction is True
    assert args.per_device_train_batch_size == 4 * 5 // 2  # the global batch split over the processes
    server = Hyperparameters(generation="vllm", vllm_mode="server", vllm_importance_sampling_correction=False)
    args = grpo_config(resolve(server, "search-r1"), "grpo", 3, str(tmp_path), 0)
    assert (args.vllm_mode, args.vllm_server_base_url) == ("server", "http://127.0.0.1:8000")
    assert args.vllm_importance_sampling_correction is False
    named = Hyperparameters(generation="vllm", vllm_mode="server", vllm_server_url="http://gpu-2:8000")
    assert grpo_config(resolve(named, "search-r1"), "grpo", 3, str(tmp_path), 0).vllm_server_base_url == (
        "http://gpu-2:8000"
    )
    plain = grpo_config(resolve(Hyperparameters(), "search-r1"), "grpo", 3, str(tmp_path), 0)
    assert plain.use_vllm is False
    with pytest.raises(ValueError, match="split evenly"):
        grpo_config(
            resolve(Hyperparameters(questions_per_step=3, processes=2), "search-r1"),
            "grpo",
            3,
            str(tmp_path),
            0,
        )


class FixedRollout:
    """A rollout that hands TRL the same token rows every step (no generation): two groups of four
    rows of different lengths, every other token injected (mask 0), rewards 1, 0, 0.5, 0.25."""

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        rows = [[5 + (7 * i + j) % 90 for j in range(6 + 3 * (i % 4))] for i in range(len(prompts))]
        return {
            "prompt_ids": [[1, 2, 3] for _ in rows], "completion_ids": rows, "logprobs": None,
            "env_mask": [[(j + 1) % 2 for j in range(len(r))] for r in rows],
            "score": [(1.0, 0.0, 0.5, 0.25)[i % 4] for i in range(len(rows))],
        }  # fmt: skip


@pytest.mark.parametrize("objective", ["dapo", "grpo"])
def test_micro_batches_make_the_same_update(objective: str, tiny_model: str, tmp_path: Path,
                                            synthetic: dict[str, list[Question]]) -> None:  # fmt: skip
    """A step in passes of 2 episodes accumulates to the update of one pass over all 8."""

    def score(prompts: Any, completions: Any, **kw: Any) -> list[float]:
        return list(kw["score"])

    weights = []
    for micro in (None, 2):
        hp = resolve(Hyperparameters(learning_rate=1e-3, questions_per_step=2, num_generations=4,
                                     micro_batch=micro), "search-r1")  # fmt: skip
        config = grpo_config(hp, objective, steps=1, output_dir=str(tmp_path / f"m{micro}"), seed=0)
        # plain SGD: the update is lr x the gradient, so the passes' summed gradient shows as it is.
        # Adam divides by the gradient's own size, so a weight whose gradient is ~0 moves by up to lr
        # either way on rounding alone (7.7e-4 at lr 1e-3 measured on an AMD EPYC, 2026-11-29).
        config.optim = OptimizerNames.SGD
        assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (
            (8, 1) if micro is None else (2, 4)
        )
        trainer = HoprlGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_model), reward_funcs=[score], args=config,
            train_dataset=Dataset.from_dict({"prompt": [q.question for q in synthetic["train"][:2]]}),
            processing_class=AutoTokenizer.from_pretrained(tiny_model), rollout_func=FixedRollout(),
        )  # fmt: skip
        trainer.train()
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    start = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    moved = [n for n in weights[0] if not torch.equal(weights[0][n], start[n])]
    assert moved, "the step changed nothing"
    for name in weights[0]:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=1e-4, atol=1e-6)
