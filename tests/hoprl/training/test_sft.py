"""SFT warm start on scripted expert trajectories: masks cover assistant text only, loss falls."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer

from hoprl.domain import Question
from hoprl.jobspec import resolve
from hoprl.recipes import get_recipe
from hoprl.recipes.when_to_search import keyword_query
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.sft import CompletionHeadSFTTrainer, build_sft, expert_episodes, sft_config, sft_dataset


def test_expert_episodes_are_real_rollouts(retriever_url: str, collection: str,
                                           synthetic: dict[str, list[Question]]) -> None:  # fmt: skip
    recipe = get_recipe("when-to-search")
    episodes = asyncio.run(expert_episodes(recipe, synthetic["train"][:4], retriever_url, collection))
    answered = [e for e in episodes if e.outcome == "answer"]
    assert len(answered) == 4
    assert all(
        e.retrieval_count >= 1 and e.steps[0].information.startswith("<information>") for e in answered
    )
    rewards = recipe.reward_funcs()[0](prompts=[], completions=[], episodes=episodes)
    assert rewards == [1.0] * 4  # the expert's text is well formed


def test_adaptive_expert_episodes_search_less(retriever_url: str, collection: str,
                                              synthetic: dict[str, list[Question]]) -> None:  # fmt: skip
    """The adaptive expert, on the live retriever: keywords first, then only the hops still missing.
    Every episode is well formed and answered; at most one search more than the scripted expert
    per question, and fewer searches in all."""
    questions = [q for q in synthetic["train"] if q.answers]
    recipe = get_recipe("when-to-search", expert="adaptive")
    scripted, adaptive = (
        asyncio.run(expert_episodes(r, questions, retriever_url, collection))
        for r in (get_recipe("when-to-search"), recipe)
    )
    pairs = list(zip(adaptive, questions, strict=True))
    assert all(e.outcome == "answer" and e.final_answer == q.answers[0] for e, q in pairs)
    assert recipe.reward_funcs()[0](prompts=[], completions=[], episodes=adaptive) == [1.0] * len(questions)
    counts = [(a.retrieval_count, s.retrieval_count) for a, s in zip(adaptive, scripted, strict=True)]
    assert all(a <= s + 1 for a, s in counts)  # the keyword search is at most one extra
    assert sum(a for a, _ in counts) < sum(s for _, s in counts)  # and it often makes the rest unneeded
    assert all(e.queries[0] == keyword_query(q.question) for e, q in pairs)


def test_sft_lowers_loss(tiny_model: str, retriever_url: str, collection: str,
                         synthetic: dict[str, list[Question]], tmp_path: Path) -> None:  # fmt: skip
    recipe = get_recipe("when-to-search", top_k=1)  # short injected turns: fast steps
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    episodes = asyncio.run(expert_episodes(recipe, synthetic["train"][:4], retriever_url, collection))
    data = sft_dataset(episodes, tokenizer)
    row = data[0]
    generated = tokenizer.decode(
        [t for t, m in zip(row["input_ids"], row["completion_mask"], strict=True) if m]
    )
    assert "<information>" not in generated and "<search>" in generated
    hp = Hyperparameters(preset="cpu", questions_per_step=2, learning_rate=1e-2, save_steps=1000)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    trainer = build_sft(model, tokenizer, data, sft_config(hp, steps=6, output_dir=str(tmp_path), seed=0))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and losses[-1] < 0.85 * losses[0]
    assert not model.is_gradient_checkpointing  # trained as the cpu preset asks


def test_the_cpu_preset_does_not_recompute_activations(tmp_path: Path) -> None:
    """TRL's trainers checkpoint activations by default (a second forward in every backward); the
    cpu preset's SFT turns that off (2 episodes a step), RL keeps it (8 episodes a step without it
    ran out of memory on 24 GB), and the paper preset keeps TRL's default."""
    from hoprl.training.grpo import grpo_config

    for preset, sft_expected in (("cpu", False), ("paper", True)):
        hp = Hyperparameters(preset=preset)
        sft = sft_config(resolve(hp, "when-to-search", "sft"), 2, str(tmp_path), 0)
        rl = grpo_config(resolve(hp, "when-to-search", "dapo"), "dapo", 2, str(tmp_path), 0)
        assert sft.gradient_checkpointing is sft_expected and rl.gradient_checkpointing is True


def test_sft_takes_the_schedule(tmp_path: Path) -> None:
    for schedule in ("constant", "cosine", "linear"):
        hp = Hyperparameters(lr_scheduler=schedule)  # type: ignore[arg-type]
        assert sft_config(hp, steps=2, output_dir=str(tmp_path), seed=0).lr_scheduler_type == schedule
    assert Hyperparameters().lr_scheduler == "linear"  # transformers' default, as before


def test_the_compact_head_gives_trls_loss_gradients_and_metrics(tiny_model: str, tmp_path: Path) -> None:
    """On a CPU the head runs on the labelled positions only; the loss, every gradient and the
    logged entropy and accuracy equal TRL's fused head (which scores every position there), and the
    loss equals the summed NLL of the labelled tokens over the count, computed from the full logits."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    g = torch.Generator().manual_seed(3)
    lengths, spans = (40, 29), ((10, 18, 30, 40), (5, 9, 20, 29))  # two assistant spans per row
    ids = [torch.randint(100, 4000, (n,), generator=g).tolist() for n in lengths]
    pairs = zip(lengths, spans, strict=True)
    masks = [[int(a <= i < b or c <= i < d) for i in range(n)] for n, (a, b, c, d) in pairs]
    data = Dataset.from_dict({"input_ids": ids, "completion_mask": masks})
    hp = Hyperparameters(questions_per_step=2, save_steps=1000)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    trainer = build_sft(model, tokenizer, data, sft_config(hp, steps=1, output_dir=str(tmp_path), seed=0))
    assert isinstance(trainer, CompletionHeadSFTTrainer)
    batch = next(iter(trainer.get_train_dataloader()))
    model.train()
    assert trainer._compact(model, batch, return_outputs=False)
    count = sum(sum(m) for m in masks)  # labels = 8 + 10 and 4 + 9 tokens
    assert count == 31

    def run(compute: object) -> tuple[torch.Tensor, list[torch.Tensor], list[float]]:
        model.zero_grad()
        loss = compute(trainer, model, dict(batch), num_items_in_batch=torch.tensor(count))  # type: ignore[operator]
        loss.backward()
        metrics = [trainer._metrics["train"][k][-1] for k in ("entropy", "mean_token_accuracy")]
        return loss.detach(), [p.grad.clone() for p in model.parameters()], metrics

    ours, trl = run(CompletionHeadSFTTrainer.compute_loss), run(SFTTrainer.compute_loss)
    assert torch.allclose(ours[0], trl[0], rtol=1e-5, atol=0)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(ours[1], trl[1], strict=True))
    assert ours[2] == pytest.approx(trl[2], rel=1e-5)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        labels = batch["labels"][:, 1:]
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100,
                              reduction="sum")  # fmt: skip
    assert int((labels != -100).sum()) == count
    assert ours[0].item() == pytest.approx(nll.item() / count, rel=1e-5)
