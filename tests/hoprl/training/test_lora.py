"""LoRA RL through TRL: only the adapters learn, rollouts sample them, checkpoints serve them merged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.domain import Question
from hoprl.jobspec import resolve
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.callbacks import Curricula, RunCallback
from hoprl.training.grpo import build_grpo, grpo_config
from hoprl.training.lora import MERGED, adapters_merged, lora_config, servable
from hoprl.training.rollout import AgentRollout, RolloutOptions
from tests.conftest import shape
from tests.hoprl.training.test_grpo import LengthRecipe


def continuation_logps(model: Any, ids: list[int], start: int) -> torch.Tensor:
    """Log-probs of ``ids[start:]`` given what precedes each, under ``model`` (eval, no grad)."""
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    model.train(was)
    logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return logps[start - 1 :]


def test_lora_trains_the_adapters_and_the_engine_samples_them(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
    tmp_path: Path,
) -> None:  # fmt: skip
    hp = resolve(Hyperparameters(
        learning_rate=1e-2, questions_per_step=2, num_generations=3, max_steps=2, max_new_tokens_per_step=8,
        token_budget=96, save_steps=2, lora_rank=4,
    ), "search-r1")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    opts = RolloutOptions(collection=collection, retriever_url=retriever_url, num_generations=3,
                          shape=shape(max_steps=2, max_new_tokens_per_step=8, token_budget=96))  # fmt: skip
    rollout = AgentRollout(LengthRecipe(), synthetic["train"], opts)
    config = grpo_config(hp, "dapo", steps=2, output_dir=str(tmp_path / "out"), seed=0)
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    run_id = registry.create_run("lora", "search-r1", "dapo", "tiny", {}, seed=0).id
    callback = RunCallback(registry, run_id, Curricula(LengthRecipe()), rollout)
    trainer = build_grpo(model, tokenizer, rollout, synthetic["train"], config, callbacks=[callback],
                         peft_config=lora_config(hp))  # fmt: skip
    trainer.train()

    # Only the adapters moved: every base weight is bit-for-bit the loaded one.
    policy = trainer.accelerator.unwrap_model(trainer.model)
    adapters = {n: p for n, p in policy.named_parameters() if "lora_" in n}
    assert adapters and all(p.requires_grad for p in adapters.values())
    assert any(torch.count_nonzero(p) for n, p in adapters.items() if "lora_B" in n), "lora_B never left 0"
    for name, weight in policy.get_base_model().named_parameters():
        key = name.replace("base_layer.", "")
        if "lora_" not in name:
            assert torch.equal(weight, base[key]), name

    # The rollout engine decodes with the adapted policy, not the base: its log-probs of a fixed
    # continuation are the trainer's, and the base model's (adapters off) differ.
    engine_model = rollout.engine.model
    ids = tokenizer("Question: which river flows through the capital? Answer: the long river")["input_ids"]
    engine = continuation_logps(engine_model, ids, start=8)
    trained = continuation_logps(policy, ids, start=8)
    with policy.disable_adapter():
        untrained = continuation_logps(policy, ids, start=8)
    assert torch.allclose(engine, trained, atol=1e-6)
    assert not torch.allclose(engine, untrained, atol=1e-3)

    # The checkpoint serves the merged policy: a plain model whose log-probs are the adapted ones.
    folder = tmp_path / "out" / "checkpoint-2"
    assert servable(folder) == folder / MERGED
    assert registry.checkpoints(run_id)[-1].path == str(folder / MERGED)
    registry.close()
    merged = AutoModelForCausalLM.from_pretrained(folder / MERGED)
    # W + BA rounds once into the merged weights: on an AMD EPYC (2026-11-29) the log-probs moved by up
    # to 1.5e-3 of ~11 that way; the adapters themselves moved them further from the base's
    served = continuation_logps(merged, ids, start=8)
    assert (served - trained).abs().max() < 0.5 * (trained - untrained).abs().max()
    assert torch.allclose(served, trained, rtol=5e-4)


def test_a_rollout_decodes_the_adapters_merged_and_leaves_every_weight_as_it_was(tiny_model: str) -> None:
    """Inside ``adapters_merged`` the layers are merged and compute the adapted policy (not the
    base); after it they are apart again and every weight is bit for bit what it was."""
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer

    policy = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model), lora_config(Hyperparameters(lora_rank=4))
    )
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter: B leaves its zero init
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.05)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    layers = [m for m in policy.modules() if isinstance(m, LoraLayer)]
    ids = list(range(3, 40))
    adapted = continuation_logps(policy, ids, start=8)
    with policy.disable_adapter():
        untrained = continuation_logps(policy, ids, start=8)
    with adapters_merged(policy):
        assert layers and all(layer.merged for layer in layers)
        merged = continuation_logps(policy, ids, start=8)
    assert torch.allclose(merged, adapted, atol=1e-4)
    assert (adapted - untrained).abs().max() > 1e-2  # the adapters matter, so the check above does
    assert not any(layer.merged for layer in layers)
    for name, weight in policy.named_parameters():
        assert torch.equal(weight, before[name]), name
    assert torch.equal(continuation_logps(policy, ids, start=8), adapted)
    with adapters_merged(policy, merge=False):
        assert not any(layer.merged for layer in layers)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    with adapters_merged(plain):  # not a peft model: as it is
        assert continuation_logps(plain, ids, start=8).shape == adapted.shape
