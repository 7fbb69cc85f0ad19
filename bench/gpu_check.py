"""A GRPO-shaped training step on a GPU for the papers' Qwen2.5 shapes, with random weights: no download.

    bash bench/gpu_check.sh              (on the GPU machine: 0.5B then 3B, bf16)
    bash bench/gpu_check.sh --dry-run    (on a CPU: the same code on a 2-layer slice of each shape, fp32)

Each shape's model is built in code from Qwen2.5's published config values (:data:`SHAPES`:
Qwen2.5-0.5B-Instruct and -3B-Instruct, the policies of Search-R1 and its successors) with random
weights, so nothing but this repository has to travel. One step is what a GRPO step of the trainer
does on one GPU: ``--prompts`` prompts x ``--group`` samples decoded with transformers ``generate``
(sampling, ``--new-tokens`` each, the rollout), then the policy-gradient loss on the sampled
tokens (group-normalized advantages of a stand-in reward: random, since a random model answers
nothing) with backward and an AdamW step. Printed per shape: step time (median of ``--steps``
after one warm-up step), rollout tokens/s, and peak GPU memory (``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

#: Qwen2.5's config.json values (0.5B-Instruct and 3B-Instruct); vocab and context as published
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2.5-3b": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "tie_word_embeddings": True},
}  # fmt: skip
VOCAB, CONTEXT, ROPE_THETA = 151936, 32768, 1_000_000.0


def build(shape: str, dry_run: bool, device: str, dtype: torch.dtype) -> Any:
    """A random Qwen2 model of ``shape`` (``dry_run``: 2 layers and an 8192-token vocabulary, for a CPU)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    values = {"vocab_size": VOCAB, **SHAPES[shape]}
    if dry_run:
        values |= {"num_hidden_layers": 2, "vocab_size": 8192}
    config = Qwen2Config(max_position_embeddings=CONTEXT, rope_theta=ROPE_THETA, **values)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = 0
    return model


def step(model: Any, optimizer: Any, args: argparse.Namespace, device: str) -> dict[str, float]:
    """One rollout (generate) and one policy-gradient update; its timings."""
    prompts = torch.randint(
        100, model.config.vocab_size - 100, (args.prompts, args.prompt_tokens), device=device
    )
    batch = prompts.repeat_interleave(args.group, dim=0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    model.eval()
    model.gradient_checkpointing_disable()  # decoding keeps its KV cache
    with torch.no_grad():
        out = model.generate(batch, attention_mask=torch.ones_like(batch), do_sample=True, temperature=1.0,
                             max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)  # fmt: skip
    sync()
    rollout_s = time.perf_counter() - start
    completion = out[:, batch.shape[1] :]
    rewards = torch.rand(args.prompts, args.group, device=device)  # a random model earns nothing real
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    model.train()
    model.gradient_checkpointing_enable()  # the update recomputes activations: 3B fits beside AdamW
    logits = model(out).logits[:, batch.shape[1] - 1 : -1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    loss = -(advantages[:, None] * logp).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    return {"step_s": time.perf_counter() - start, "rollout_s": rollout_s, "tokens": completion.numel()}


def run(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    device = "cpu" if args.dry_run else "cuda"
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    model = build(shape, args.dry_run, device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps = [step(model, optimizer, args, device) for _ in range(args.steps + 1)][1:]  # the first warms up
    params = sum(p.numel() for p in model.parameters())
    del model, optimizer
    return {
        "shape": shape + (" (2 layers, 8192 vocab, dry run)" if args.dry_run else ""),
        "params_m": round(params / 1e6, 1),
        "dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "step_s": round(statistics.median(s["step_s"] for s in steps), 3),
        "rollout_tokens_per_s": round(statistics.median(s["tokens"] / s["rollout_s"] for s in steps), 1),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, fp32, 2 layers, small vocab, few tokens")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=5, help="samples per prompt (GRPO's group)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens sampled per rollout")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.prompts, args.group, args.prompt_tokens, args.new_tokens, args.steps = 2, 2, 8, 4, 1
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device; --dry-run runs the same code on a CPU")
    for shape in args.shapes:
        print(json.dumps(run(shape, args)), flush=True)


if __name__ == "__main__":
    main()
