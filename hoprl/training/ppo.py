"""PPO for multi-turn trajectories with step rewards (TRL removed its PPOTrainer).

One cohesive module over ~400 lines: the algorithm (samples, critic, GAE, loss, step, its
checkpoint files) reads best in one place, and every part is used only by the others.

A trajectory is a :class:`~hoprl.domain.TokenTrajectory`: prompt ids, completion ids and a
mask (1 = the policy generated the token, 0 = injected text such as retrieved documents or chat
template tokens). Its rewards are EVO-RAG's per-step rewards ``R_t``
(:func:`hoprl.recipes.evo_rag.episode_step_rewards`), one per policy step.

Per-token rewards. Step ``t``'s policy tokens form the ``t``-th maximal run of mask-1 tokens (the
chat template puts mask-0 tokens between any two assistant turns). The last token of that run gets
``R_t``; every other token gets 0, minus the optional KL penalty
``kl_coef * (log pi_old - log pi_ref)`` on policy tokens only.

GAE over policy tokens only. Injected tokens are not time steps: the policy did not act there. For
policy tokens ``i < j`` adjacent in the compressed (mask-1 only) sequence::

    delta_i = r_i + gamma * V(j) - V(i)          # V after the last policy token is 0
    A_i     = delta_i + gamma * lam * A_j
    returns_i = A_i + V(i)

so the value of the *next policy token* bridges a masked span: the retrieved text between two steps
is part of the environment's transition, costs no discount step, and its tokens get no advantage,
no return, no policy / value loss and no KL. (The value head still reads the injected text through
the model's hidden states: V at the first token of step ``t+1`` has seen the documents.)

Loss on a minibatch (masked means over policy tokens; ``ratio = exp(log pi - log pi_old)``)::

    pg      = max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps))           eps = 0.2
    vf      = 0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)   c = 0.2
    loss    = pg + vf_coef * vf - ent_coef * entropy

``pi_old``, ``V_old`` and the advantages are computed once per :func:`ppo_step` (no gradient) by
the policy being trained, then ``ppo_epochs`` passes over minibatches follow.

The critic. EVO-RAG's PPO (the paper's defaults, :class:`PPOConfig`; App. C, Table 10): a
**separate** value model (:class:`ValueModel`: a transformer body with a linear value head)
trained at its own learning rate, 1e-5, beside the policy's 1e-6, and a per-token KL penalty of
0.001. Table 10 names the critic's model, ``Qwen/Qwen2.5-0.5B-Instruct``, a smaller network than
the 8B policy: ``critic_model`` loads that body (``configs/evo-rag.yaml`` sets it). The critic reads
the policy's token ids, so its tokenizer must be the policy's (Qwen2.5-0.5B shares Qwen2.5-7B's;
Llama-3.1-8B's differs, and :func:`make_critic` refuses the pair). Without ``critic_model`` (the
CPU default) the critic body is a copy of the policy's own: the tiny CPU model is its own small
critic. The optimizer holds two parameter groups
(:func:`ppo_optimizer`), each clipped to ``max_grad_norm`` on its own. ``critic="shared"`` (an
option, the project's earlier design) puts a :class:`ValueHead` on the policy's own last hidden
state instead: one network, and the value loss's gradient reaches the policy body too.

Example::

    samples = [PPOSample.from_episode(ep, tokenizer) for ep in scored_episodes]
    config = PPOConfig()
    critic = make_critic(policy, config.critic)
    metrics = ppo_step(policy, critic, ref, ppo_optimizer(policy, critic, config), samples, config)
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
from trl.trainer.utils import disable_dropout_in_model, entropy_from_logits, pad, selective_log_softmax

from hoprl.agent.tokens import to_token_trajectory
from hoprl.domain import Episode, TokenTrajectory
from hoprl.recipes.evo_rag import EvoRagConfig, episode_step_rewards
from hoprl.training.optimizer import adamw

log = logging.getLogger("hoprl.trainer.ppo")

VALUE_HEAD_FILE = "value_head.safetensors"
CRITIC_DIR = "critic"  # a separate critic's body, beside its head in VALUE_HEAD_FILE
Tensors = dict[str, torch.Tensor]
CriticKind = Literal["separate", "shared"]


class PPOConfig(BaseModel):
    """PPO's constants: EVO-RAG's paper values for the critic, the learning rates and the KL;
    common RLHF practice for the rest (the clip ranges are PPO's 0.2)."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=10, ge=1, description="ppo_step calls in train_ppo")
    batch_size: int = Field(default=8, ge=1, description="trajectories per ppo_step")
    mini_batch_size: int = Field(default=4, ge=1)
    ppo_epochs: int = Field(default=2, ge=1, description="passes over the batch per ppo_step")
    learning_rate: float = Field(default=1e-6, description="the policy's (EVO-RAG: 1e-6)")
    critic: CriticKind = Field(
        default="separate", description="a separate value model, or a head on the policy"
    )
    critic_model: str | None = Field(
        default=None,
        description="a separate critic's body: a model path (EVO-RAG App. C Table 10: "
        "Qwen/Qwen2.5-0.5B-Instruct); None: a copy of the policy's body",
    )
    critic_learning_rate: float = Field(default=1e-5, description="the critic's (EVO-RAG: 1e-5)")
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = Field(default=0.2, description="eps of the clipped surrogate")
    cliprange_value: float = Field(default=0.2, description="clip of V around V_old")
    vf_coef: float = 0.1
    ent_coef: float = Field(default=0.0, description="entropy bonus; 0 turns it off")
    kl_coef: float = Field(
        default=0.001, description="per-token KL penalty (EVO-RAG: 0.001); 0: no reference"
    )
    whiten_advantages: bool = True
    max_grad_norm: float = 1.0
    temperature: float = Field(default=1.0, gt=0.0, description="the sampling temperature")
    seed: int = 0


@dataclass
class PPOSample:
    """One trajectory and its per-step rewards ``R_1..R_T`` (one per mask-1 run)."""

    trajectory: TokenTrajectory
    step_rewards: list[float]

    @classmethod
    def from_episode(cls, episode: Episode, tokenizer: Any, config: EvoRagConfig | None = None) -> PPOSample:
        """Tokenize a *scored* EVO-RAG episode and attach its step rewards."""
        return cls(to_token_trajectory(episode, tokenizer), episode_step_rewards(episode, config))


def step_ends(mask: Sequence[int]) -> list[int]:
    """Index of the last token of each maximal run of 1s: ``[1,1,0,1,0] -> [1, 3]``."""
    return [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]


def token_scores(sample: PPOSample) -> list[float]:
    """Per completion token: ``R_t`` on the last policy token of step ``t``, 0 elsewhere."""
    ends = step_ends(sample.trajectory.mask)
    if len(ends) != len(sample.step_rewards):
        raise ValueError(
            f"{len(sample.step_rewards)} step rewards for {len(ends)} policy-token runs; every step "
            "needs non-empty text and mask-0 tokens between steps (to_token_trajectory does this)"
        )
    scores = [0.0] * len(sample.trajectory.mask)
    for i, reward in zip(ends, sample.step_rewards, strict=True):
        scores[i] = reward
    return scores


class ValueHead(nn.Module):
    """``V(s) = w . h + b`` on the causal LM's last hidden state; one value per position."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.linear.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


class ValueModel(nn.Module):
    """A separate critic: its own transformer body (a copy of the policy's) and a :class:`ValueHead`."""

    def __init__(self, body: Any, head: ValueHead | None = None) -> None:
        super().__init__()
        self.body: Any = body  # a transformers base model (e.g. LlamaModel)
        self.head = head or ValueHead(int(body.config.hidden_size))

    @classmethod
    def from_policy(cls, policy: Any) -> ValueModel:
        """Initialised from the policy's current weights (its body, without the LM head)."""
        body = copy.deepcopy(policy.base_model)
        disable_dropout_in_model(body)
        return cls(body)

    @classmethod
    def from_pretrained(cls, path: str | Path, tokenizer: Any = None) -> ValueModel:
        """A critic whose body is the model at ``path`` (a fresh value head). It reads the policy's
        token ids: with ``tokenizer`` (the policy's) given, the critic's own must have the same vocabulary."""
        if tokenizer is not None:
            own = AutoTokenizer.from_pretrained(str(path))
            if own.get_vocab() != tokenizer.get_vocab():
                raise ValueError(
                    f"critic_model {str(path)!r} has another tokenizer than the policy; the critic reads "
                    "the policy's token ids, so pick a critic of the policy's family (EVO-RAG's "
                    "Qwen2.5-0.5B-Instruct for a Qwen2.5 policy) or leave critic_model unset"
                )
        body = AutoModel.from_pretrained(str(path), dtype=torch.float32)
        disable_dropout_in_model(body)
        return cls(body)

    def forward(self, batch: Tensors) -> torch.Tensor:
        """Values ``[B, L-1]`` in the shifted frame of :func:`collate`."""
        hidden = self.body(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        values: torch.Tensor = self.head(hidden[:, :-1])
        return values


Critic = ValueHead | ValueModel


def make_critic(
    policy: Any, kind: CriticKind = "separate", model: str | Path | None = None, tokenizer: Any = None
) -> Critic:
    """A :class:`ValueModel` (separate: the body of ``model``, else a copy of ``policy``'s) or a
    :class:`ValueHead` on the policy (shared). ``tokenizer``: the policy's, checked against ``model``'s."""
    if kind == "separate":
        return ValueModel.from_pretrained(model, tokenizer) if model else ValueModel.from_policy(policy)
    if model:
        raise ValueError("critic_model needs critic='separate' (a shared critic is a head on the policy)")
    if kind == "shared":
        return ValueHead(int(policy.config.hidden_size))
    raise ValueError(f"critic must be 'separate' or 'shared', got {kind!r}")


def ppo_optimizer(policy: nn.Module, critic: Critic, config: PPOConfig) -> torch.optim.AdamW:
    """AdamW with two parameter groups: the policy at ``learning_rate``, the critic at
    ``critic_learning_rate`` (a shared critic's group is its head alone)."""
    return adamw(
        ("policy", policy.parameters(), config.learning_rate),
        ("critic", critic.parameters(), config.critic_learning_rate),
    )


def collate(samples: Sequence[PPOSample], pad_id: int) -> Tensors:
    """Right-padded tensors in the *shifted* frame: position ``i`` predicts token ``i + 1``.

    ``mask[b, i]`` is 1 where token ``i + 1`` is a policy token, ``scores[b, i]`` its step reward.
    """
    ids, masks, scores = [], [], []
    for s in samples:
        traj = s.trajectory
        n_prompt = len(traj.prompt_ids)
        ids.append(torch.tensor(traj.prompt_ids + traj.completion_ids))
        masks.append(torch.tensor([0] * (n_prompt - 1) + traj.mask, dtype=torch.float32))
        scores.append(torch.tensor([0.0] * (n_prompt - 1) + token_scores(s)))
    input_ids = pad(ids, padding_value=pad_id)
    lengths = torch.tensor([len(x) for x in ids])
    attention = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "targets": input_ids[:, 1:],
        "mask": pad(masks),
        "scores": pad(scores),
    }


def forward(
    policy: nn.Module, critic: nn.Module, batch: Tensors, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[B, L-1, V]`` (divided by the temperature) and values ``[B, L-1]``."""
    shared = not isinstance(critic, ValueModel)
    out = policy(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=shared
    )
    values = critic(out.hidden_states[-1][:, :-1]) if shared else critic(batch)
    return out.logits[:, :-1].float() / temperature, values


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over mask-1 entries; mask-0 entries get exactly zero gradient."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit variance over mask-1 entries; mask-0 entries become 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + 1e-8) * mask


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``[B, L]`` by GAE over mask-1 positions only (see the module doc).

    Walking backwards, a mask-0 position passes the next policy token's value and advantage
    through unchanged, which is GAE on the compressed sequence of policy tokens.
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for i in reversed(range(rewards.shape[1])):
        on = mask[:, i] > 0
        delta = rewards[:, i] + gamma * next_value - values[:, i]
        adv = delta + gamma * lam * next_adv
        advantages[:, i] = torch.where(on, adv, 0.0)
        next_adv = torch.where(on, adv, next_adv)
        next_value = torch.where(on, values[:, i], next_value)
    return advantages, (advantages + values) * mask


@torch.no_grad()
def prepare(
    policy: nn.Module, critic: nn.Module, ref: nn.Module | None, batch: Tensors, config: PPOConfig
) -> Tensors:
    """Add ``old_logps``, ``old_values``, ``advantages``, ``returns`` and ``kl`` to ``batch``."""
    mask = batch["mask"]
    logits, values = forward(policy, critic, batch, config.temperature)
    old_logps = selective_log_softmax(logits, batch["targets"])
    kl = torch.zeros_like(old_logps)
    if ref is not None and config.kl_coef > 0:
        ref_logits = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        ref_logps = selective_log_softmax(ref_logits[:, :-1].float() / config.temperature, batch["targets"])
        kl = (old_logps - ref_logps) * mask
    rewards = batch["scores"] - config.kl_coef * kl
    values = values * mask
    advantages, returns = gae(rewards, values, mask, config.gamma, config.lam)
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    return batch | {
        "old_logps": old_logps * mask,
        "old_values": values,
        "advantages": advantages,
        "returns": returns,
        "kl": kl,
    }


def ppo_loss(
    logits: torch.Tensor, values: torch.Tensor, batch: Tensors, config: PPOConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped PPO loss of one minibatch (module doc) and its statistics."""
    mask, adv = batch["mask"], batch["advantages"]
    logps = selective_log_softmax(logits, batch["targets"])
    ratio = torch.exp((logps - batch["old_logps"]) * mask)
    clipped = torch.clamp(ratio, 1.0 - config.cliprange, 1.0 + config.cliprange)
    pg_loss = masked_mean(torch.max(-adv * ratio, -adv * clipped), mask)
    old_v, returns = batch["old_values"], batch["returns"]
    v_clipped = old_v + torch.clamp(values - old_v, -config.cliprange_value, config.cliprange_value)
    vf_loss = 0.5 * masked_mean(torch.max((values - returns) ** 2, (v_clipped - returns) ** 2), mask)
    with torch.set_grad_enabled(torch.is_grad_enabled() and config.ent_coef > 0):  # logged either way
        entropy = masked_mean(entropy_from_logits(logits), mask)
    loss = pg_loss + config.vf_coef * vf_loss - config.ent_coef * entropy
    stats = {
        "loss": loss.item(),
        "pg_loss": pg_loss.item(),
        "vf_loss": vf_loss.item(),
        "entropy": entropy.item(),
        "clipfrac": masked_mean(((ratio - 1.0).abs() > config.cliprange).float(), mask).item(),
        "approx_kl": masked_mean(0.5 * (logps - batch["old_logps"]) ** 2, mask).item(),
    }
    return loss, stats


def ppo_step(
    policy: nn.Module,
    critic: nn.Module,
    ref: nn.Module | None,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[PPOSample],
    config: PPOConfig,
    pad_id: int = 0,
) -> dict[str, float]:
    """One PPO update on ``batch``: advantages once, then ``ppo_epochs`` passes of minibatches.

    ``critic`` is a :class:`ValueModel` or a :class:`ValueHead` (:func:`make_critic`);
    ``optimizer`` must hold the policy's and the critic's parameters (:func:`ppo_optimizer`;
    each parameter group's gradient is clipped to ``max_grad_norm`` on its own). Disable the
    policy's dropout (``trl.trainer.utils.disable_dropout_in_model``) so the first ratios are
    exactly 1. Returns the mean of the minibatch statistics plus ``score`` (mean trajectory
    return) and ``kl`` (mean per policy token, the k1 estimate ``log pi_old - log pi_ref``).
    """
    device = next(policy.parameters()).device
    tensors = {k: v.to(device) for k, v in collate(batch, pad_id).items()}
    data = prepare(policy, critic, ref, tensors, config)
    history: list[dict[str, float]] = []
    for _ in range(config.ppo_epochs):
        for idx in torch.randperm(len(batch), device=device).split(config.mini_batch_size):
            mb = {k: v[idx] for k, v in data.items()}
            logits, values = forward(policy, critic, mb, config.temperature)
            loss, stats = ppo_loss(logits, values, mb, config)
            optimizer.zero_grad()
            loss.backward()
            for group in optimizer.param_groups:
                torch.nn.utils.clip_grad_norm_(group["params"], config.max_grad_norm)
            optimizer.step()
            history.append(stats)
    metrics = {k: sum(h[k] for h in history) / len(history) for k in history[0]}
    metrics["score"] = sum(sum(s.step_rewards) for s in batch) / len(batch)
    metrics["kl"] = masked_mean(data["kl"], data["mask"]).item()
    return metrics


def save_value_head(value_head: ValueHead, out_dir: str | Path) -> None:
    save_file(value_head.state_dict(), str(Path(out_dir) / VALUE_HEAD_FILE))


def load_value_head(path: str | Path, hidden_size: int) -> ValueHead:
    """The value head saved by :func:`train_ppo` in ``path`` (a checkpoint folder)."""
    head = ValueHead(hidden_size)
    head.load_state_dict(load_file(str(Path(path) / VALUE_HEAD_FILE)))
    return head


def save_critic(critic: Critic, out_dir: str | Path) -> None:
    """The head into :data:`VALUE_HEAD_FILE`; a separate critic's body into :data:`CRITIC_DIR`."""
    if isinstance(critic, ValueModel):
        critic.body.save_pretrained(Path(out_dir) / CRITIC_DIR)
        critic = critic.head
    save_value_head(critic, out_dir)


def load_critic(path: str | Path, policy: Any, kind: CriticKind) -> Critic | None:
    """The critic saved in checkpoint ``path`` (None if it holds none of this kind)."""
    folder = Path(path)
    if not (folder / VALUE_HEAD_FILE).is_file() or (kind == "separate") != (folder / CRITIC_DIR).is_dir():
        return None
    head = load_value_head(folder, int(policy.config.hidden_size))
    if kind == "shared":
        return head
    body = AutoModel.from_pretrained(folder / CRITIC_DIR, dtype=torch.float32)
    disable_dropout_in_model(body)
    return ValueModel(body, head)


def train_ppo(
    model_path: str | Path,
    trajectories: Sequence[Episode | PPOSample],
    config: PPOConfig,
    out_dir: str | Path,
    recipe_config: EvoRagConfig | None = None,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``model_path`` with PPO on stored trajectories; save model, tokenizer and critic.

    ``trajectories`` are scored EVO-RAG episodes (tokenized here with the model's tokenizer) or
    ready :class:`PPOSample` s. Batches cycle through them in a seeded shuffled order. A critic
    of ``config.critic``'s kind found in ``model_path`` is resumed. ``on_step`` gets each step's
    metrics (with ``step``). Returns the metrics of every step.
    """
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    policy = AutoModelForCausalLM.from_pretrained(str(model_path), device_map=device)
    disable_dropout_in_model(policy)
    critic = load_critic(model_path, policy, config.critic) or make_critic(
        policy, config.critic, config.critic_model, tokenizer
    )
    ref = None
    if config.kl_coef > 0:
        ref = AutoModelForCausalLM.from_pretrained(str(model_path), device_map=device)
        ref.eval().requires_grad_(False)
    critic.to(device)
    optimizer = ppo_optimizer(policy, critic, config)
    samples = [
        t if isinstance(t, PPOSample) else PPOSample.from_episode(t, tokenizer, recipe_config)
        for t in trajectories
    ]
    if not samples:
        raise ValueError("no trajectories to train on; collect and score rollouts first")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    order: list[int] = []
    history = []
    for step in range(1, config.steps + 1):
        while len(order) < config.batch_size:
            order += random.sample(range(len(samples)), len(samples))
        batch, order = [samples[i] for i in order[: config.batch_size]], order[config.batch_size :]
        metrics = ppo_step(policy, critic, ref, optimizer, batch, config, pad_id) | {"step": step}
        log.info("ppo step %d: %s", step, {k: round(v, 4) for k, v in metrics.items()})
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    save_critic(critic, out_dir)
    return history
