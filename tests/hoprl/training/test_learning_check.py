"""The placebo-controlled learning check, small enough for the suite.

The same RL job runs from the same tiny model and seed in two arms: with its real rewards and with
its rewards permuted across the batch (``placebo=True``). The agent has one decision to learn: a
first segment that opens with the digit ``7`` is a search (its text is the query, and the retrieved
text follows), anything else is an answer that ends the episode. The reward pays the search (1,
else 0). The tiny model is set up so that ``7`` carries about a third of the probability at every
position (a shared embedding coordinate lifts the whole vocabulary equally, and ``7``'s a little
more), so groups of four have spread from the first step.

The rewarded behaviour is read where the rollouts sample from, the rollout engine's weights: the
probability of ``7`` at the first generated position of each training prompt, computed exactly
from the engine model's softmax (no sampling noise). The check passes when the real arm raises it
by at least :data:`GAIN` and ends at least :data:`GAIN` above the placebo. The placebo's updates are
as large as the real ones but point nowhere in particular, so its p(7) wanders (measured over
seeds 0-2 at these settings: 0.39 -> 0.07, 0.28, 0.58, against 0.88, 0.90, 0.90 for the real
rewards); a placebo that is *not significant* is a claim about many questions, which belongs to
``make demo-rl``, not to a test of a few steps. The check must fail on the
three faults that have broken RL in practice, each built here as a variant of the real trainer or
rollout:

- the rollout engine samples stale weights (a frozen copy of the starting model): nothing moves;
- the advantages have the wrong sign: ``7`` falls;
- injected (retrieved) tokens enter the loss: the paid episodes are the ones with retrieved text,
  so the loss then also teaches the model to write that text, and each of its hundred-odd tokens
  takes probability from ``7`` (which is likely at every position), outweighing the one ``7`` the
  policy wrote.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.training_args import OptimizerNames

from hoprl.domain import Action, Question
from hoprl.jobspec import resolve
from hoprl.recipes.baselines import SearchR1
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.grpo import HoprlGRPOTrainer, build_grpo, grpo_config, placebo_order
from hoprl.training.rollout import AgentRollout, RolloutOptions, TrainingEngine
from tests.conftest import shape

#: the least rise of the engine's probability of ``7`` that counts as learning (from 0.39)
GAIN = 0.1
STEPS = 4
SEVEN = "7"
#: how much higher 7's shared coordinate is than every other token's (measured: p(7) = 0.33)
LIFT = 1.35


class SevenSearches(SearchR1):
    """A first segment that opens with ``7`` searches for its own text; anything else answers.
    Segments end at the first space. The reward is 1 when the episode searched at its first step."""

    stop = [" "]  # noqa: RUF012

    def parse(self, segment: str) -> Action:
        if segment.startswith(SEVEN):
            return Action("search", queries=[segment.strip()], query_kinds=["search"])
        return Action("answer", answer=segment.strip() or "none")

    def reward_funcs(self) -> list[Any]:
        def searched(prompts: Any, completions: Any, **kw: Any) -> list[float]:
            return [float(e.steps[0].text.startswith(SEVEN)) for e in kw["episodes"]]

        return [searched]


def seven_biased(model: Any, seven: int) -> Any:
    """Every embedding gets the same first coordinate (the residual stream then carries a constant
    direction, so the final hidden state is alike at every position) and ``7``'s is larger: with the
    tied output layer ``7`` takes about a third of the probability everywhere."""
    with torch.no_grad():
        weights = model.model.embed_tokens.weight
        weights[:, 0] = 1.0
        weights[seven, 0] = 1.0 + LIFT
    return model


class StaleRollout(AgentRollout):
    """Fault: the engine decodes with a frozen copy of the starting weights."""

    def engine_for(self, trainer: Any) -> Any:
        self.trainer = trainer
        if self.engine is None:  # the starting weights, cloned (not shared) into a model of its own
            live = trainer.accelerator.unwrap_model(trainer.model)
            frozen = type(live)(live.config)
            frozen.load_state_dict({k: v.detach().clone() for k, v in live.state_dict().items()})
            self.engine = TrainingEngine(frozen, trainer.processing_class)
        return self.engine


class LeakyRollout(AgentRollout):
    """Fault: retrieved text and template glue enter the loss (every completion token is mask 1)."""

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = super().__call__(prompts, trainer)
        out["env_mask"] = [[1] * len(m) for m in out["env_mask"]]
        return out


class FlippedTrainer(HoprlGRPOTrainer):
    """Fault: the advantages reach the loss with the wrong sign."""

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        output["advantages"] = -output["advantages"]
        return output


def first_token_mass(model: Any, prompts: list[list[int]], token: int) -> float:
    """Mean over prompts of the probability of ``token`` at the first generated position."""
    was = model.training
    model.eval()
    with torch.no_grad():
        masses = [
            float(torch.softmax(model(input_ids=torch.tensor([p])).logits[0, -1].float(), -1)[token])
            for p in prompts
        ]
    model.train(was)
    return sum(masses) / len(masses)


Arm = tuple[float, float, list[float]]


def run_arm(tiny_model: str, retriever_url: str, collection: str, questions: list[Question], tmp: Path,
            *, placebo: bool = False, seed: int = 0, lr: float = 0.05, groups: int = 4,
            rollout_cls: type = AgentRollout, trainer_cls: type = HoprlGRPOTrainer) -> Arm:  # fmt: skip
    """One arm: ``(p(7) before, after, mean training reward per step)`` on the engine's weights."""
    random.seed(seed)
    torch.manual_seed(seed)
    params = resolve(Hyperparameters(
        learning_rate=lr, lr_scheduler="constant", questions_per_step=groups, num_generations=4, max_steps=2,
        max_new_tokens_per_step=4, token_budget=256, save_steps=100, placebo=placebo,
    ), "search-r1")  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    seven = int(tokenizer.convert_tokens_to_ids(SEVEN))  # type: ignore[arg-type]
    model = seven_biased(AutoModelForCausalLM.from_pretrained(tiny_model), seven)
    recipe = SevenSearches()
    opts = RolloutOptions(
        collection=collection, retriever_url=retriever_url, num_generations=params.num_generations,
        shape=shape(max_steps=params.max_steps, max_new_tokens_per_step=params.max_new_tokens_per_step,
                    token_budget=params.token_budget, temperature=1.0, top_k=2),
    )  # fmt: skip
    rollout = rollout_cls(recipe, questions, opts)
    texts = [tokenizer.apply_chat_template(recipe.messages(q), add_generation_prompt=True, tokenize=False)
             for q in questions]  # fmt: skip
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    before = first_token_mass(model, prompts, seven)
    config = grpo_config(params, "dapo", steps=STEPS, output_dir=str(tmp / "out"), seed=seed)
    # plain gradient steps: Adam's first steps move every weight of the tiny model by lr, whatever its
    # gradient, which drowns the one decision in noise
    config.optim = OptimizerNames.SGD
    trainer = build_grpo(model, tokenizer, rollout, questions, config, placebo=placebo)
    trainer.__class__ = trainer_cls
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    after = first_token_mass(rollout.engine.model, prompts, seven)
    return before, after, rewards


def learns(real: Arm, placebo: Arm) -> bool:
    """The check: the real arm gains at least GAIN and ends at least GAIN above the placebo."""
    return real[1] - real[0] >= GAIN and real[1] - placebo[1] >= GAIN


@pytest.fixture(scope="module")
def arms(tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Arm]:  # fmt: skip
    questions = synthetic["train"]
    variants: dict[str, dict[str, Any]] = {
        "real": {}, "placebo": {"placebo": True}, "stale": {"rollout_cls": StaleRollout},
        "leaky": {"rollout_cls": LeakyRollout}, "flipped": {"trainer_cls": FlippedTrainer},
    }  # fmt: skip
    return {
        name: run_arm(tiny_model, retriever_url, collection, questions, tmp_path_factory.mktemp(name), **kw)
        for name, kw in variants.items()
    }


def test_the_real_rewards_teach_and_the_placebo_does_not(arms: dict[str, Any]) -> None:
    assert learns(arms["real"], arms["placebo"]), {k: v[:2] for k, v in arms.items()}
    before, _, rewards = arms["real"]
    assert 0.3 < before < 0.45  # the set-up's p(7)
    assert rewards[-1] > rewards[0]  # what the engine sampled was paid more by the end


@pytest.mark.parametrize("fault", ["stale", "leaky", "flipped"])
def test_the_check_fails_on_a_broken_trainer(fault: str, arms: dict[str, Any]) -> None:
    """Each fault, in place of the real arm, fails the same check against the same placebo."""
    assert not learns(arms[fault], arms["placebo"]), {k: v[:2] for k, v in arms.items()}


def test_the_placebo_permutes_the_batch_rewards() -> None:
    """The permutation is a reordering of every row, fixed by seed and step, different by step."""
    order = placebo_order(8, seed=0, step=1)
    assert sorted(order) == list(range(8))
    assert order == placebo_order(8, seed=0, step=1)
    assert order != placebo_order(8, seed=0, step=2)
    # rewards [1, 0, 0, 0 | 0, 0, 0, 0]: the paid episode lands where the permutation sends row 0
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    permuted = [rewards[i] for i in order]
    assert sum(permuted) == 1.0 and permuted.index(1.0) == order.index(0)
