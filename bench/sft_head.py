"""SFT step time on a CPU: TRL's fused LM head (every position) against the compact head (labelled ones).

    python bench/sft_head.py --steps 8            # SmolLM2-135M on make run's SFT batches

The SFT warm start of ``make run``: expert episodes of when-to-search on the synthetic world
(``synthetic:0:2``), run against a live retriever started as the pipeline starts it, tokenized as the
trainer tokenizes them and batched at the CPU preset's size (2 episodes a step, grouped by length).
Each batch's forward and backward runs with TRL's ``SFTTrainer.compute_loss`` and with
:class:`hoprl.training.sft.CompletionHeadSFTTrainer`'s, alternating which goes first, on all cores;
the medians, their ratio and the share of positions that carry a label are printed, and the two
losses must agree (the run fails otherwise). Timings on a shared machine are noisy: read the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer

from flows.pipeline import MODEL_CACHE
from flows.stack import local_process
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import pool
from hoprl.data.sources import load
from hoprl.evaluation import corpus_collection, ensure_indexed
from hoprl.generation.model import resolve_model
from hoprl.jobspec import resolve
from hoprl.recipes import get_recipe
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.sft import CompletionHeadSFTTrainer, expert_episodes, sft_config, sft_dataset


def episodes_data(questions: int, dataset: str, tokenizer: Any, out: Path) -> Any:
    """SFT rows from expert episodes run against a live retriever on ``out``."""
    qs = [q for q in load(dataset, split="train") if q.answers][:questions]
    documents = pool(qs)
    name = corpus_collection("bench-sft-head", documents)
    with local_process("retriever", {"RETRIEVER_STORAGE_PATH": str(out / "qdrant")}, out / "logs") as url:
        with RetrieverClient(url) as client:
            ensure_indexed(client, name, documents)
        episodes = asyncio.run(expert_episodes(get_recipe("when-to-search"), qs, url, name))
    return sft_dataset(episodes, tokenizer)


def timed_step(compute: Any, trainer: Any, model: Any, batch: dict[str, Any]) -> tuple[float, float]:
    """Seconds for one forward and backward, and the loss."""
    model.zero_grad(set_to_none=True)
    count = (batch["labels"][:, 1:] != -100).sum()
    start = time.perf_counter()
    loss = compute(trainer, model, dict(batch), num_items_in_batch=count)
    loss.backward()
    return time.perf_counter() - start, loss.item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="batches timed (each with both heads)")
    p.add_argument("--dataset", default="synthetic:0:2")
    p.add_argument("--model", default=None, help="model or checkpoint (default: the bundled SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model, MODEL_CACHE)
    tokenizer = AutoTokenizer.from_pretrained(path)
    hp = resolve(Hyperparameters(preset="cpu"), "when-to-search", "sft")  # make run's: 2 episodes a step
    with tempfile.TemporaryDirectory() as tmp:
        data = episodes_data(args.steps * hp.questions_per_step, args.dataset, tokenizer, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        config = sft_config(hp, args.steps, str(Path(tmp) / "out"), seed=0)
        trainer = CompletionHeadSFTTrainer(model=model, args=config, train_dataset=data,
                                           processing_class=tokenizer)  # fmt: skip
    model.train()
    heads = {"trl": SFTTrainer.compute_loss, "compact": CompletionHeadSFTTrainer.compute_loss}
    times: dict[str, list[float]] = {name: [] for name in heads}
    labelled = positions = 0
    for i, batch in enumerate(trainer.get_train_dataloader()):
        if i == args.steps:
            break
        assert trainer._compact(model, batch, return_outputs=False)
        labelled += int((batch["labels"][:, 1:] != -100).sum())
        positions += int(batch["attention_mask"][:, 1:].sum())
        order = list(heads) if i % 2 == 0 else list(reversed(heads))
        losses = {}
        for name in order:
            seconds, losses[name] = timed_step(heads[name], trainer, model, batch)
            times[name].append(seconds)
        if abs(losses["trl"] - losses["compact"]) > 1e-4 * abs(losses["trl"]):
            raise SystemExit(f"batch {i}: losses differ: {losses}")
        print(f"batch {i}: {tuple(batch['input_ids'].shape)} tokens, "
              + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in heads), flush=True)  # fmt: skip
    med = {n: statistics.median(t) for n, t in times.items()}
    print(f"\n{args.threads} threads, {len(times['trl'])} batches; labelled positions "
          f"{labelled}/{positions} ({labelled / positions:.0%})")  # fmt: skip
    print("| head | median s/step | min | max |\n|---|---:|---:|---:|")
    for n, t in times.items():
        print(f"| {n} | {med[n]:.2f} | {min(t):.2f} | {max(t):.2f} |")
    ratio = med["compact"] / med["trl"]
    print(f"compact / trl: {ratio:.2f}x the time ({1 / ratio:.2f}x faster)")


if __name__ == "__main__":
    main()
