"""PPO on a tiny random Llama: GAE by hand, step-boundary rewards, masks, a real training run."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.domain import Episode, Step
from hoprl.jobspec import resolve
from hoprl.recipes.evo_rag import SIGNALS, EvoRag, episode_step_rewards
from hoprl.training.ppo import (
    PPOConfig,
    PPOSample,
    ValueHead,
    ValueModel,
    collate,
    forward,
    gae,
    load_critic,
    make_critic,
    ppo_loss,
    ppo_optimizer,
    ppo_step,
    prepare,
    step_ends,
    token_scores,
    train_ppo,
)
from tests.conftest import shape
from tests.episodes import searched


def signals(**values: float) -> dict[str, float]:
    return dict.fromkeys(SIGNALS, 0.0) | {"r_step": -1.0} | values


def scored_episode(qid: str = "q1", answer: str = "Jane Roe") -> Episode:
    """A hand-scored 3-step EVO-RAG episode (signals set directly: no judge, no embedder)."""
    info = "\n<information>\nDoc 1 (Title: Acme) Acme was founded by Jane Roe.\n</information>\n"
    return Episode(
        recipe="evo-rag",
        question_id=qid,
        question="Who founded Acme?",
        answers=["Jane Roe"],
        prompt=[
            {"role": "system", "content": "Search, then answer."},
            {"role": "user", "content": "Question: Who founded Acme?"},
        ],
        steps=[
            searched(1, "<search>Acme founder</search>", "Acme founder", info, signals=signals(r_ret=1.0)),
            searched(
                2,
                "<search>Acme founded by</search>",
                "Acme founded by",
                info,
                signals=signals(r_ret=1.0, r_dup=-0.9),
            ),
            Step(
                t=3,
                action="answer",
                text=f"<answer>{answer}</answer>",
                answer=answer,
                signals=signals(r_ans=1.0 if answer == "Jane Roe" else 0.0),
            ),
        ],
        meta={"evo_rag": {"stage": "discovery", "version": "evo_rag@1"}},
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model: str) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def samples(tokenizer: Any) -> list[PPOSample]:
    return [
        PPOSample.from_episode(scored_episode(f"q{i}", a), tokenizer)
        for i, a in enumerate(["Jane Roe", "John Doe", "Jane Roe", "Tokyo"])
    ]


def test_step_ends_are_the_last_token_of_each_run() -> None:
    assert step_ends([0, 1, 1, 0, 0, 1, 0, 1]) == [2, 5, 7]
    assert step_ends([1, 1]) == [1]
    assert step_ends([0, 0]) == []


def test_step_rewards_sit_on_the_last_policy_token_of_each_step(tokenizer: Any) -> None:
    ep = scored_episode()
    sample = PPOSample.from_episode(ep, tokenizer)
    ends = step_ends(sample.trajectory.mask)
    assert len(ends) == 3
    for end, step in zip(ends, ep.steps, strict=True):
        assert step.text.endswith(tokenizer.decode(sample.trajectory.completion_ids[end]))
    scores = token_scores(sample)
    assert [scores[i] for i in ends] == pytest.approx(episode_step_rewards(ep))
    assert sum(1 for s in scores if s != 0.0) == 3
    with pytest.raises(ValueError, match="2 step rewards for 3 policy-token runs"):
        token_scores(PPOSample(sample.trajectory, [1.0, 2.0]))


def test_gae_by_hand_on_three_steps_bridges_masked_spans() -> None:
    # policy tokens at 0, 1 | injected 2, 3 | step 2 at 4 | injected 5 | step 3 at 6
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1]], dtype=torch.float32)
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0, -0.5, 0.0, 2.0]])  # R_1, R_2, R_3 at step ends
    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 9.0, 0.4]])  # 9.0 on injected: must be ignored
    gamma, lam = 0.9, 0.8
    # compressed: r = [0, 1, -0.5, 2], V = [0.1, 0.2, 0.3, 0.4], V after the end = 0
    a6 = 2.0 - 0.4
    a4 = (-0.5 + gamma * 0.4 - 0.3) + gamma * lam * a6
    a1 = (1.0 + gamma * 0.3 - 0.2) + gamma * lam * a4
    a0 = (0.0 + gamma * 0.2 - 0.1) + gamma * lam * a1
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    expected = [a0, a1, 0.0, 0.0, a4, 0.0, a6]
    assert advantages[0].tolist() == pytest.approx(expected)
    assert [a6, a4, a1, a0] == pytest.approx([1.6, 0.712, 1.58264, 1.2195008])
    assert returns[0].tolist() == pytest.approx([a0 + 0.1, a1 + 0.2, 0, 0, a4 + 0.3, 0, a6 + 0.4])
    # gamma = lam = 1: the return is the reward-to-go, whatever the values
    _, returns = gae(rewards, values, mask, 1.0, 1.0)
    assert returns[0].tolist() == pytest.approx([2.5, 2.5, 0, 0, 1.5, 0, 2.0])


@pytest.mark.parametrize("critic_kind", ["separate", "shared"])
def test_injected_tokens_get_exactly_zero_gradient(
    tiny_model: str, samples: list[PPOSample], critic_kind: str
) -> None:
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model)
    value_head = make_critic(policy, critic_kind)  # type: ignore[arg-type]
    config = PPOConfig(ent_coef=0.01, kl_coef=0.1)
    data = prepare(policy, value_head, ref, collate(samples, 0), config)
    with torch.no_grad():  # move the policy so ratios leave 1 and the clipped branches matter
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    logits, values = forward(policy, value_head, data, config.temperature)
    logits.retain_grad()
    values.retain_grad()
    loss, _ = ppo_loss(logits, values, data, config)
    loss.backward()
    assert logits.grad is not None and values.grad is not None
    off = data["mask"] == 0
    assert off.any() and (~off).any()
    assert torch.count_nonzero(logits.grad[off]) == 0
    assert torch.count_nonzero(values.grad[off]) == 0
    assert torch.count_nonzero(logits.grad[~off]) > 0
    assert torch.count_nonzero(data["advantages"][off]) == 0
    assert torch.count_nonzero(data["kl"][off]) == 0


def test_value_loss_decreases_on_a_fixed_batch(tiny_model: str, samples: list[PPOSample]) -> None:
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model).requires_grad_(False)  # isolate the head
    value_head = ValueHead(policy.config.hidden_size)
    # gamma = lam = 1 makes the returns fixed targets (rewards-to-go), so vf must fall
    config = PPOConfig(gamma=1.0, lam=1.0, kl_coef=0.0, vf_coef=1.0, ppo_epochs=2, mini_batch_size=4)
    optimizer = torch.optim.AdamW(value_head.parameters(), lr=5e-2)
    losses = [ppo_step(policy, value_head, None, optimizer, samples, config)["vf_loss"] for _ in range(5)]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("critic_kind", ["separate", "shared"])
def test_train_ppo_changes_weights_and_saves(tiny_model: str, tmp_path: Path, critic_kind: str) -> None:
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    episodes = [scored_episode(f"q{i}", a) for i, a in enumerate(["Jane Roe", "John Doe", "Tokyo"])]
    config = PPOConfig(steps=2, batch_size=2, mini_batch_size=1, ppo_epochs=1, learning_rate=1e-3,
                       critic=critic_kind)  # fmt: skip
    seen: list[dict[str, float]] = []
    history = train_ppo(tiny_model, episodes, config, tmp_path, on_step=seen.append)
    assert [m["step"] for m in history] == [1, 2] and seen == history
    assert all(torch.isfinite(torch.tensor(list(m.values()))).all() for m in history)
    policy = AutoModelForCausalLM.from_pretrained(tmp_path)
    after = policy.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "model.embed_tokens.weight" in changed and any("layers.0" in k for k in changed)
    critic = load_critic(tmp_path, policy, critic_kind)  # type: ignore[arg-type]
    assert isinstance(critic, ValueModel if critic_kind == "separate" else ValueHead)
    assert load_critic(tmp_path, policy, "shared" if critic_kind == "separate" else "separate") is None


def test_the_papers_ppo_defaults() -> None:
    """EVO-RAG's PPO: KL 0.001, policy lr 1e-6, a separate critic at lr 1e-5 (the PPOConfig
    defaults, and what an evo-rag PPO job resolves to)."""
    from hoprl.schemas.trainer import Hyperparameters

    config = PPOConfig()
    assert (config.kl_coef, config.learning_rate, config.critic, config.critic_learning_rate) == (
        0.001, 1e-6, "separate", 1e-5,
    )  # fmt: skip
    hp = resolve(Hyperparameters(), "evo-rag", "ppo")
    assert (hp.beta, hp.learning_rate, hp.critic, hp.critic_learning_rate) == (0.001, 1e-6, "separate", 1e-5)
    assert resolve(Hyperparameters(critic="shared"), "evo-rag", "ppo").critic == "shared"


def test_a_separate_critic_has_its_own_network_and_learning_rate(
    tiny_model: str, samples: list[PPOSample]
) -> None:
    """Two parameter groups (policy 1e-6, critic 1e-5), no parameter shared; one PPO step moves
    the critic's body and head, and the policy, each with its own rate."""
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model)
    critic = make_critic(policy, "separate")
    assert isinstance(critic, ValueModel)
    config = PPOConfig(gamma=1.0, lam=1.0, ppo_epochs=1, mini_batch_size=4)
    optimizer = ppo_optimizer(policy, critic, config)
    assert [(g["name"], g["lr"]) for g in optimizer.param_groups] == [("policy", 1e-6), ("critic", 1e-5)]
    policy_ids = {id(p) for p in policy.parameters()}
    assert policy_ids.isdisjoint(id(p) for p in critic.parameters())
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == policy_ids
    # the critic starts as a copy of the policy's body
    body = {k: v.clone() for k, v in critic.body.state_dict().items()}
    assert torch.equal(body["layers.0.mlp.up_proj.weight"], policy.model.layers[0].mlp.up_proj.weight)
    head = critic.head.linear.weight.detach().clone()
    pol = policy.model.layers[0].mlp.up_proj.weight.detach().clone()
    ppo_step(policy, critic, None, optimizer, samples, config.model_copy(update={"kl_coef": 0.0}))
    assert not torch.equal(critic.head.linear.weight, head)
    moved = [k for k, v in critic.body.state_dict().items() if not torch.equal(v, body[k])]
    assert any("layers.0" in k for k in moved)
    policy_change = (policy.model.layers[0].mlp.up_proj.weight - pol).abs().max().item()
    critic_change = (
        critic.body.state_dict()["layers.0.mlp.up_proj.weight"] - body["layers.0.mlp.up_proj.weight"]
    )
    # Adam's first step moves every weight by about its learning rate: 1e-6 vs 1e-5
    assert 0 < policy_change <= 1.5e-6 and 5e-6 < critic_change.abs().max().item() <= 1.5e-5


def test_an_evo_rag_ppo_job_builds_the_papers_critic(tiny_model: str, tmp_path: Path) -> None:
    """The job loop with an evo-rag PPO request's resolved defaults: a ValueModel critic, two
    learning rates and a KL coefficient of 0.001 in the PPO config; Table 10's batch of 128
    episodes (128 questions, one episode each) in minibatches of 64, and its critic model."""
    from hoprl.domain import Question
    from hoprl.registry.store import Registry
    from hoprl.schemas.trainer import JobRequest
    from hoprl.training.offpolicy import OffPolicyTrainer
    from hoprl.training.rollout import RolloutOptions

    request = JobRequest(recipe="evo-rag", objective="ppo", model=tiny_model)
    hp = resolve(request.hyperparameters, request.recipe, request.objective)
    # Table 10, PPO column: batch 128 episodes, mini-batch 64, critic Qwen/Qwen2.5-0.5B-Instruct
    assert (hp.questions_per_step, hp.num_generations, hp.mini_batch_size) == (128, 1, 64)
    assert hp.critic_model == "Qwen/Qwen2.5-0.5B-Instruct"
    cpu = JobRequest(recipe="evo-rag", objective="ppo", hyperparameters={"preset": "cpu"})
    assert resolve(cpu.hyperparameters, "evo-rag", "ppo").critic_model == "policy"  # SmolLM2's own body
    hp = hp.model_copy(update={"critic_model": "policy"})  # the tiny policy's tokenizer is not Qwen2.5's
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    q = Question(id="q", dataset="t", split="train", question="Who founded Acme?", answers=["Jane Roe"])
    opts = RolloutOptions(
        collection="c", retriever_url="http://127.0.0.1:9", num_generations=2, shape=shape()
    )
    with Registry(f"sqlite:///{tmp_path / 'r.db'}") as registry:
        hp = hp.model_copy(update={"preference_model": False})
        tokenizer = AutoTokenizer.from_pretrained(tiny_model)
        trainer = OffPolicyTrainer("ppo", request, hp, EvoRag(), model, tokenizer, [q], [q], opts, registry,
                                   "job-x", str(tmp_path))  # fmt: skip
    assert isinstance(trainer.value_head, ValueModel) and trainer.ppo.kl_coef == 0.001
    assert (trainer.ppo.batch_size, trainer.ppo.mini_batch_size) == (128, 64)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [1e-6, 1e-5]
    assert trainer.ref is not None  # the KL needs the frozen reference


def test_critic_model_is_its_own_smaller_network_and_both_move(
    tiny_model: str, tokenizer: Any, samples: list[PPOSample], tmp_path: Path
) -> None:
    """EVO-RAG App. C Table 10 names a separate, smaller critic (Qwen2.5-0.5B beside an 8B policy).
    Here a 1-layer, width-32 body of the policy's tokenizer stands in for it: the critic holds no
    policy parameter, has its own width, and one PPO step changes the critic's weights and the policy's."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(1)
    small = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    LlamaModel(small).save_pretrained(tmp_path / "critic")
    tokenizer.save_pretrained(tmp_path / "critic")
    policy = AutoModelForCausalLM.from_pretrained(tiny_model)
    config = PPOConfig(critic_model=str(tmp_path / "critic"), ppo_epochs=1, mini_batch_size=4, kl_coef=0.0)
    critic = make_critic(policy, config.critic, config.critic_model, tokenizer)
    assert isinstance(critic, ValueModel) and critic.body.config.hidden_size == 32
    assert {id(p) for p in policy.parameters()}.isdisjoint(id(p) for p in critic.parameters())
    before_critic = {k: v.clone() for k, v in critic.state_dict().items()}
    before_policy = {k: v.clone() for k, v in policy.state_dict().items()}
    ppo_step(policy, critic, None, ppo_optimizer(policy, critic, config), samples, config)
    assert any(not torch.equal(v, before_critic[k]) for k, v in critic.state_dict().items() if "body" in k)
    assert not torch.equal(critic.head.linear.weight, before_critic["head.linear.weight"])
    assert any(not torch.equal(v, before_policy[k]) for k, v in policy.state_dict().items())


def test_a_critic_of_another_tokenizer_is_refused(tiny_model: str, tmp_path: Path) -> None:
    """The critic reads the policy's token ids, so a critic_model of another vocabulary is an error."""
    other = AutoTokenizer.from_pretrained(tiny_model)
    other.add_tokens(["<not-in-the-policy>"])
    other.save_pretrained(tmp_path / "other")
    AutoModelForCausalLM.from_pretrained(tiny_model).model.save_pretrained(tmp_path / "other")
    policy = AutoModelForCausalLM.from_pretrained(tiny_model)
    with pytest.raises(ValueError, match="another tokenizer"):
        make_critic(policy, "separate", tmp_path / "other", AutoTokenizer.from_pretrained(tiny_model))
