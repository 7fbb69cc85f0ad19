"""The per-step signals of an RL step beyond TRL's: how episodes ended, TRL's completion metrics
recomputed from the episodes, the answer length and the KL to the warm start.

The expected values are worked out by hand from small hand-built episodes; the KL is checked by
hand on one token of a tiny model, and in two real steps of a tiny model's training.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.domain import Action, Episode, Question, Step, ended_shares
from hoprl.jobspec import resolve
from hoprl.recipes.baselines import SearchR1
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.grpo import build_grpo, grpo_config
from hoprl.training.rollout import AgentRollout, RolloutOptions, episode_stats
from hoprl.training.signals import (
    WarmStartKL,
    answer_tokens,
    answers_flat_share,
    completion_metrics,
    correct,
    correct_by_type,
    kl_sums,
    probe_kl,
    replace_completion_metrics,
    warm_start_kl,
)
from tests.conftest import shape


def episode(outcome: str, answer: str | None = None, searches: int = 0) -> Episode:
    search = {"action": "search", "text": "<search>q</search>", "queries": ["q"]}
    steps = [Step(t=t, **search) for t in range(1, searches + 1)]
    return Episode(recipe="search-r1", question_id="q", question="?", steps=steps, final_answer=answer,
                   outcome=outcome)  # fmt: skip


class Words:
    """A tokenizer that makes one token of each word (the counts below are then counted by eye)."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": list(range(len(text.split())))}


def test_how_the_episodes_ended() -> None:
    """5 episodes: 2 answered (0.4), 1 cut by the budget, 1 by a format error (0.2 each), 1 refused
    (counted in no share: the recipe's own ending), none by the step cap."""
    got = ended_shares(["answer", "token_budget", "answer", "refuse", "format_error"])
    assert got == pytest.approx(
        {"ended/answer": 0.4, "ended/token_budget": 0.2, "ended/format_error": 0.2, "ended/step_cap": 0.0}
    )


def test_answer_length_counts_the_final_answers_only() -> None:
    """Answers of 3 words and 1 word, and an episode cut before answering: (3 + 1) / 2 = 2 tokens."""
    episodes = [episode("answer", "New York City"), episode("answer", "1961"), episode("token_budget")]
    assert answer_tokens(episodes, Words()) == 2.0
    assert answer_tokens([episode("format_error")], Words()) == 0.0


def test_correct_is_normalised_exact_match_and_never_on_an_unanswerable_question() -> None:
    def said(answer: str | None, golds: list[str]) -> bool:
        return correct(Episode(recipe="r", question_id="q", question="?", answers=golds, final_answer=answer))

    assert said("the Eiffel Tower!", ["Eiffel Tower"]) and said("NYC", ["New York City", "nyc"])
    assert not said("Eiffel", ["Eiffel Tower"]) and not said(None, ["x"]) and not said("", [])


def test_the_share_of_groups_whose_answers_agree() -> None:
    """Three groups of 2: right+right (agree), wrong+wrong (agree), right+wrong (spread): 2/3. By
    reward a when-to-search group of two wrong answers can still spread (r_s, r_f): not by answers."""

    def ep(answer: str) -> Episode:
        return Episode(recipe="r", question_id="q", question="?", answers=["1961"], final_answer=answer)

    groups = [ep("1961"), ep("1961."), ep("1960"), ep("no"), ep("1961"), ep("1962")]
    assert answers_flat_share(groups, 2) == pytest.approx(2 / 3)
    assert answers_flat_share(groups[4:], 2) == 0.0 and answers_flat_share([], 2) == 0.0


def test_right_answers_per_question_type() -> None:
    """Bridges 1 right of 3, comparisons 2 of 2, an untyped question 0 of 1: by hand, 1/3, 1, 0."""

    def ep(answer: str) -> Episode:
        return Episode(recipe="r", question_id="q", question="?", answers=["Oslo"], final_answer=answer)

    episodes = [ep("Oslo"), ep("Bergen"), ep("Kolnunkro"), ep("oslo."), ep("Oslo"), ep("Paris")]
    types = ["bridge", "bridge", "bridge", "comparison", "comparison", None]
    assert correct_by_type(episodes, types) == {
        "correct/bridge": pytest.approx(1 / 3), "correct/comparison": 1.0, "correct/other": 0.0,
    }  # fmt: skip
    assert correct_by_type([], []) == {}


def test_episode_stats_carry_the_answer_share_and_length() -> None:
    """2 searches + 0 + 1 over 3 episodes = 1.0 search each; 2 of 3 answered; answers of 2 and 1 words."""
    episodes = [episode("answer", "two words", 2), episode("answer", "one"), episode("step_cap", None, 1)]
    got = episode_stats(episodes, Words())
    assert got["searches"] == 1.0
    assert got["answer_tokens"] == 1.5
    assert got["ended/answer"] == pytest.approx(2 / 3) and got["ended/step_cap"] == pytest.approx(1 / 3)
    assert "answer_tokens" not in episode_stats(episodes)  # no tokenizer, no length


def test_trls_clipped_ratio_is_replaced_by_the_episodes_own() -> None:
    """4 episodes with 30, 90, 60 and 20 policy tokens. TRL, looking for EOS at the end of each
    completion, called all 4 clipped (1.0) with no terminated length (0). Two were cut by a limit of
    the episode's shape (token budget, step cap): clipped 2/4 = 0.5; the other two (an answer, a
    format error: the policy ended them) are terminated: mean (30 + 20) / 2 = 25, min 20, max 30."""
    episodes = [episode("answer"), episode("token_budget"), episode("step_cap"), episode("format_error")]
    mask = torch.zeros(4, 100)
    for row, tokens in enumerate([30, 90, 60, 20]):
        mask[row, :tokens] = 1
    metrics: dict[str, list[float]] = {
        "reward": [0.5],
        "completions/mean_length": [50.0],
        "completions/clipped_ratio": [1.0],
        "completions/mean_terminated_length": [0.0],
        "completions/min_terminated_length": [0.0],
        "completions/max_terminated_length": [0.0],
    }
    replace_completion_metrics(metrics, episodes, mask, gather=lambda t: t)
    assert metrics == {
        "reward": [0.5],
        "completions/mean_length": [50.0],
        "completions/clipped_ratio": [0.5],
        "completions/mean_terminated_length": [25.0],
        "completions/min_terminated_length": [20.0],
        "completions/max_terminated_length": [30.0],
    }


def test_every_episode_clipped_leaves_no_terminated_length() -> None:
    got = completion_metrics([True, True], [96.0, 80.0])
    assert got["completions/clipped_ratio"] == 1.0
    assert math.isnan(got["completions/mean_terminated_length"])  # TRL's log leaves NaN out


def test_kl_estimators_by_hand() -> None:
    """Three policy tokens, x = log πθ - log πref = 0, 1, -0.5; the third is injected (mask 0).
    k1 sums x: 0 + 1 = 1; k3 sums exp(-x) + x - 1: 0 + (e^-1 + 0) = 0.3679; 2 tokens."""
    logps = torch.tensor([[-2.0, -1.0, -3.0]])
    ref = torch.tensor([[-2.0, -2.0, -2.5]])
    k1, k3, tokens = kl_sums(logps, ref, torch.tensor([[1, 1, 0]]))
    assert (k1, tokens) == (1.0, 2.0)
    assert k3 == pytest.approx(math.exp(-1))


class AnswerAtOnce(SearchR1):
    """Every segment is read as the answer: every episode ends on ``answer`` (never on EOS, as an
    agent's episode), and the reward is the generated length (it varies for a random model)."""

    stop = [" "]  # noqa: RUF012

    def parse(self, segment: str) -> Action:
        return Action("answer", answer=segment.strip() or "x")

    def reward_funcs(self) -> list[Any]:
        def length(prompts: Any, completions: Any, **kw: Any) -> list[float | None]:
            return [len(e.completion_text()) / 10 for e in kw["episodes"]]

        return [length]


def trainer_for(tiny_model: str, retriever_url: str, collection: str, questions: list[Question], tmp: Path,
                steps: int, rows: int, temperature: float = 1.0,
                micro_batch: int | None = None) -> Any:  # fmt: skip
    hp = resolve(Hyperparameters(learning_rate=1e-2, questions_per_step=2, num_generations=3, max_steps=2,
                                 max_new_tokens_per_step=12, token_budget=96, save_steps=100, beta=0.0,
                                 temperature=temperature, warm_start_kl=rows, micro_batch=micro_batch),
                 "search-r1")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    opts = RolloutOptions(collection=collection, retriever_url=retriever_url, num_generations=3,
                          shape=shape(max_steps=2, max_new_tokens_per_step=12, token_budget=96,
                                      temperature=temperature))  # fmt: skip
    rollout = AgentRollout(AnswerAtOnce(), questions, opts)
    config = grpo_config(hp, "dapo", steps=steps, output_dir=str(tmp / "out"), seed=0)
    return build_grpo(model, tokenizer, rollout, questions, config, warm_start_kl=hp.warm_start_kl or 0)


def test_the_kl_to_the_warm_start_of_one_token_by_hand(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The policy is moved off its starting weights (final norm x3); a step of two passes scores one
    completion token each. By hand: log-softmax of each model's logits over temperature 0.7 at the
    token, from a plain forward of the policy and of the starting weights loaded afresh from disk;
    x = their difference, k1 = mean x, k3 = mean (exp(-x) + x - 1) over the step's two tokens."""
    monkeypatch.setenv("HOPRL_BF16", "0")  # fp32 on both sides, as the hand computation
    trainer = trainer_for(tiny_model, retriever_url, collection, synthetic["train"], tmp_path, 1, 8, 0.7)
    assert trainer.ref_model is None and trainer.warm_start is not None  # beta 0: TRL has no reference
    with torch.no_grad():
        trainer.model.model.norm.weight.mul_(3.0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    ones = torch.ones_like(prompt)
    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    xs, got = [], {}
    # two passes of one episode each, one token each: the step's figures come at its last pass
    for word, last in ((" Paris", False), (" London", True)):
        token = tokenizer(word, add_special_tokens=False)["input_ids"][0]
        inputs = {"prompt_ids": prompt, "prompt_mask": ones, "completion_ids": torch.tensor([[token]]),
                  "completion_mask": torch.tensor([[1]]), "tool_mask": torch.tensor([[1]])}  # fmt: skip
        ids = torch.cat([prompt, inputs["completion_ids"]], dim=1)
        policy, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), 1)
        got = warm_start_kl(trainer, inputs, policy, trainer.warm_start, last_pass=last)
        assert (got == {}) != last  # nothing logged before the step's last pass
        with torch.no_grad():
            mine = torch.log_softmax(trainer.model(prompt).logits[0, -1] / 0.7, -1)[token]
            theirs = torch.log_softmax(start(prompt).logits[0, -1] / 0.7, -1)[token]
        xs.append(float(mine - theirs))
    assert min(abs(x) for x in xs) > 0.01, "the moved policy must differ from its start on both tokens"
    assert got["warm_start_kl/k1"] == pytest.approx((xs[0] + xs[1]) / 2, abs=1e-4)
    k3 = sum(math.exp(-x) + x - 1 for x in xs) / 2
    assert got["warm_start_kl/k3"] == pytest.approx(k3, abs=1e-4)
    assert got["warm_start_kl/forward_s"] > 0


def test_two_steps_log_the_kl_to_the_warm_start_and_the_episodes_clipped_share(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]], tmp_path: Path
) -> None:
    """Step 1 runs on the starting weights: KL 0. Step 2 runs after a large update (lr 1e-2): KL > 0.
    Every episode ends on an answer, so none is clipped (TRL, reading EOS, called every one clipped)
    and every one is terminated: the mean terminated length is TRL's own mean policy-token length."""
    trainer = trainer_for(tiny_model, retriever_url, collection, synthetic["train"], tmp_path, 2, 6)
    trainer.train()
    first, second = [h for h in trainer.state.log_history if "reward" in h]
    by_type = {k for k in trainer.rollout_func.step_stats if k.startswith("correct/")}
    assert by_type and by_type <= {f"correct/{q.type or 'other'}" for q in synthetic["train"]}
    assert first["warm_start_kl/k3"] == pytest.approx(0.0, abs=1e-6)
    assert first["warm_start_kl/k1"] == pytest.approx(0.0, abs=1e-6)
    assert second["warm_start_kl/k3"] > 1e-4
    # the probe: all 6 episodes of step 1 (rows 6, one pass), scored again at step 2 after the update
    assert first["warm_start_kl/probe_k3"] == pytest.approx(0.0, abs=1e-6)
    assert second["warm_start_kl/probe_k3"] > 1e-4
    assert second["warm_start_kl/probe_tokens"] == first["warm_start_kl/probe_tokens"] > 0
    assert len(trainer.warm_start.probe) == 6
    for step in (first, second):
        assert step["completions/clipped_ratio"] == 0.0
        assert step["completions/mean_terminated_length"] == pytest.approx(step["completions/mean_length"])
        assert step["completions/max_terminated_length"] == step["completions/max_length"]
        assert {"frac_reward_zero_std", "clip_ratio/region_mean", "entropy", "grad_norm"} <= step.keys()


def test_the_probe_kl_after_one_step_by_hand(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Passes of one episode (the demo's micro_batch 1) and 2 probe rows: the probe is the first two
    episodes of step 1 that have policy tokens, gathered over two passes. After one step (lr 1e-2)
    its KL is recomputed by hand: a plain forward of the trained policy and of the starting weights
    loaded afresh from disk, log-softmax over the vocabulary at temperature 0.7, each completion
    token read from the position before it; on the policy's tokens x = log p_start - log p_policy
    (the probe samples the start), k1 = mean x, k3 = mean (exp(-x) + x - 1)."""
    monkeypatch.setenv("HOPRL_BF16", "0")  # fp32 on both sides, as the hand computation
    trainer = trainer_for(tiny_model, retriever_url, collection, synthetic["train"], tmp_path, 1, 2, 0.7, 1)
    trainer.train()
    probe = trainer.warm_start.probe
    assert len(probe) == 2 and all(e.ids.size(0) == 1 and e.mask.sum() > 0 for e in probe)
    first = next(h for h in trainer.state.log_history if "reward" in h)
    # measured at the last pass of step 1, on the starting weights, the probe complete
    assert first["warm_start_kl/probe_k3"] == pytest.approx(0.0, abs=1e-6)
    assert first["warm_start_kl/probe_tokens"] == sum(float(e.mask.sum()) for e in probe)
    got = probe_kl(trainer, trainer.model, trainer.warm_start)  # as at step 2's last pass
    assert probe_kl(trainer, trainer.model, trainer.warm_start) == {}  # once a step

    start = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    trainer.model.eval()
    xs = []
    with torch.no_grad():
        for e in probe:
            kept = e.mask.size(1)
            targets = e.ids[0, -kept:]
            logits = [
                m(e.ids, attention_mask=e.attention).logits[0, -kept - 1 : -1] for m in (start, trainer.model)
            ]
            scores = [torch.log_softmax(lg / 0.7, -1) for lg in logits]
            ref, pol = (sc.gather(1, targets[:, None])[:, 0] for sc in scores)
            xs += (ref - pol)[e.mask[0].bool()].tolist()
    assert max(abs(x) for x in xs) > 0.01, "the step must have moved the policy on the probe"
    assert got["warm_start_kl/probe_tokens"] == len(xs)
    assert got["warm_start_kl/probe_k1"] == pytest.approx(sum(xs) / len(xs), abs=1e-4)
    k3 = sum(math.exp(-x) + x - 1 for x in xs) / len(xs)
    assert got["warm_start_kl/probe_k3"] == pytest.approx(k3, rel=1e-3, abs=1e-6)


def test_the_frozen_copy_scores_n_episodes_a_step_in_passes_of_one(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]], tmp_path: Path
) -> None:
    """Passes of one episode (the demo's micro_batch 1), 6 episodes a step, N = 2: the frozen copy
    scores 2 episodes a step, one per pass in the step's first two passes (it scored all 6 when N
    counted per pass), and each step logs one KL and one forward_s, the step's."""
    trainer = trainer_for(tiny_model, retriever_url, collection, synthetic["train"], tmp_path, 2, 2, 1.0, 1)
    measure, scored = trainer.warm_start, []
    reference_logps = measure.reference_logps

    def counted(trainer_: Any, inputs: dict[str, Any], rows: torch.Tensor) -> torch.Tensor:
        scored.append((int(trainer.state.global_step), rows.numel()))
        return reference_logps(trainer_, inputs, rows)

    measure.reference_logps = counted
    trainer.train()
    assert scored == [(0, 1), (0, 1), (1, 1), (1, 1)]
    first, second = [h for h in trainer.state.log_history if "reward" in h]
    assert first["warm_start_kl/k3"] == pytest.approx(0.0, abs=1e-6) and second["warm_start_kl/k3"] > 1e-4
    assert first["warm_start_kl/forward_s"] > 0 and second["warm_start_kl/forward_s"] > 0


def test_the_kl_is_measured_on_episodes_that_are_in_the_loss() -> None:
    """Rows 0 and 2 left the loss (a dropped flat group: mask all 0); with 2 rows to score, the KL
    takes rows 1 and 3, the first two with policy tokens; with none left, no row at all."""
    completion = torch.ones(5, 3, dtype=torch.long)
    tool = torch.tensor([[0, 0, 0], [1, 0, 1], [0, 0, 0], [0, 1, 1], [1, 1, 1]])
    measure = WarmStartKL(torch.nn.Linear(1, 1), rows=2)
    assert measure.scored_rows({"completion_mask": completion, "tool_mask": tool}).tolist() == [1, 3]
    measure.scored = 1  # one episode of the step scored at an earlier pass: one left
    assert measure.scored_rows({"completion_mask": completion, "tool_mask": tool}).tolist() == [1]
    measure.scored = 2
    assert measure.scored_rows({"completion_mask": completion, "tool_mask": tool}).tolist() == []
    measure.scored = 0
    everything = WarmStartKL(torch.nn.Linear(1, 1), rows=None)
    assert everything.scored_rows({"completion_mask": completion, "tool_mask": tool}).tolist() == [1, 3, 4]
    dropped = {"completion_mask": completion, "tool_mask": torch.zeros_like(tool)}
    assert measure.scored_rows(dropped).tolist() == []


def test_the_cpu_preset_measures_the_kl_on_two_episodes_a_step_and_the_paper_preset_on_none() -> None:
    """2 of make run's 8 episodes: the frozen copy's forward pass cost 7-9% of the loss, under 10% of
    a step (all 8: 26-30% of the loss; docs/training.md, "What a step logs")."""
    assert resolve(Hyperparameters(preset="cpu"), "when-to-search").warm_start_kl == 2
    assert resolve(Hyperparameters(), "when-to-search").warm_start_kl == 0
    assert resolve(Hyperparameters(preset="cpu", warm_start_kl=8), "when-to-search").warm_start_kl == 8
