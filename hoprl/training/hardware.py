"""What every TRL config of the trainer shares (SFT, GRPO, DPO): accelerator and bookkeeping.

bf16 mixed precision (autocast, fp32 master weights) is on with CUDA and on CPUs with AMX, off
elsewhere; ``HOPRL_BF16=0`` / ``1`` overrides the choice. Measured on SmolLM2-135M, one thread
(``python bench/precision.py``): on a 2-core CPU with AVX512-BF16 but no AMX autocast made a
forward + backward of 4 x 720 tokens slower (26 s against 17-20 s); on a 2-core CPU with AMX it made
it 1.91x faster and sampling 8 x 64 tokens 1.12x faster, beside one other process (2.97x and
1.16x beside two; docs/training.md). The trainer's rollouts decode at the same precision with CUDA
and in fp32 on a CPU unless ``HOPRL_ROLLOUT_BF16`` says otherwise (:func:`rollout_bf16`,
:func:`decoding_precision`): on CPUs autocast speeds the backward up but slows decoding (with AMX
too, at rollout lengths), so training in bf16 and decoding in fp32 is the fastest step
(``bench/rl_whole_step.py``, ``bench/decode_step.py``). Their prompts' prefill,
matmul-bound like the training's forward, autocasts as training does unless
``HOPRL_ROLLOUT_PREFILL_BF16`` says otherwise (:func:`rollout_prefill_bf16`).
Activation checkpointing stays at TRL's default (on) on CPU too: without it a GRPO step of 8
multi-turn episodes held 16 GB, too much next to the other services on a 24 GB machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from hoprl.settings import get_settings


def bf16_mixed_precision() -> bool:
    """Whether training and rollouts autocast to bf16 here (see the module docstring)."""
    override = get_settings().bf16
    if override is not None:
        return override
    if torch.cuda.is_available():
        return True
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private, hence the guard
    return bool(amx is not None and amx())


def rollout_bf16() -> bool:
    """Whether the trainer's rollouts decode under bf16 autocast: ``HOPRL_ROLLOUT_BF16`` when set,
    else as training (:func:`bf16_mixed_precision`) with CUDA and fp32 on a CPU. A CPU decode step
    (a few rows, each over a long cache) is bound by attention and memory rather than by matmuls,
    and autocast made it slower on both kinds of CPU measured, with AMX too (``bench/decode_step.py``,
    docs/training.md). Either way the loss recomputes the log-probs it trains on under training's
    precision."""
    override = get_settings().rollout_bf16
    if override is not None:
        return override
    return torch.cuda.is_available() and bf16_mixed_precision()


def rollout_prefill_bf16() -> bool:
    """Whether the trainer's rollouts prefill their prompts under bf16 autocast:
    ``HOPRL_ROLLOUT_PREFILL_BF16`` when set, else as training (:func:`bf16_mixed_precision`). Where
    autocast pays for training's forward and backward it pays for a prefill too (both multiply every
    token by every weight), whatever it does to decoding (:mod:`hoprl.generation.decoding`)."""
    override = get_settings().rollout_prefill_bf16
    return bf16_mixed_precision() if override is None else override


@contextmanager
def decoding_precision(model: Any, autocast: bool) -> Iterator[None]:
    """Decode ``model`` at the rollouts' precision inside the block.

    A bf16 job's model is prepared by accelerate, which wraps its ``forward`` in bf16 autocast (and
    keeps the original as ``_original_forward``): every forward autocasts, whatever the engine
    asks. With rollouts in fp32 (``autocast`` False, :func:`rollout_bf16`) the block decodes
    through the original forward; the wrapped one is back for the loss after it.
    """
    original = model.__dict__.get("_original_forward")
    if autocast or original is None:
        yield
        return
    wrapped = model.__dict__["forward"]
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


def bf16_pays(tokens: int = 512, hidden: int = 576, inner: int = 1536, repeats: int = 7) -> bool:
    """Whether a forward + backward under bf16 autocast runs at least 1.3x faster than in fp32 on
    this machine's CPU, timed on one MLP block of SmolLM2-135M's shape (about a second).

    CPU flags do not decide it: two 2-core AMD EPYC machines with AVX512-BF16 and no AMX measured
    opposite ways (``bench/precision.py``: 26 s against 17-20 s once, 2.2-2.5x faster another time),
    so a job that would rather be fast than detected (``make demo-rl``) measures.
    """
    import time

    if torch.cuda.is_available():
        return True
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen)
    w1 = torch.randn(hidden, inner, generator=gen, requires_grad=True)
    w2 = torch.randn(inner, hidden, generator=gen, requires_grad=True)

    def seconds(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = (torch.nn.functional.silu(x @ w1) @ w2).float().square().mean()
        loss.backward()
        return time.perf_counter() - start

    seconds(False), seconds(True)  # the first runs warm the kernels up
    # alternated, so a neighbour's load falls on both alike; medians
    pairs = [(seconds(False), seconds(True)) for _ in range(repeats)]
    fp32, bf16 = (sorted(p[i] for p in pairs)[repeats // 2] for i in (0, 1))
    return fp32 >= 1.3 * bf16


def accelerator_args() -> dict[str, Any]:
    """``use_cpu`` / ``bf16`` for a transformers ``TrainingArguments``."""
    return {"use_cpu": not torch.cuda.is_available(), "bf16": bf16_mixed_precision()}


def common_args(output_dir: str, seed: int, report_to: list[str] | str | None) -> dict[str, Any]:
    """The ``TrainingArguments`` every job's TRL config sets alike: one log line per step, no tqdm
    of TRL's (the job draws its own bar), data loading in the training process, the job's seed for
    both model and data, and the accelerator (:func:`accelerator_args`)."""
    return {
        "output_dir": output_dir,
        "logging_steps": 1,
        "report_to": report_to or "none",
        "seed": seed,
        "data_seed": seed,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        **accelerator_args(),
    }


def per_process(batch: int, processes: int) -> int:
    """A step's global ``batch`` split over ``processes`` (the same global batch whatever N)."""
    if processes < 1 or batch % processes:
        raise ValueError(f"a batch of {batch} does not split evenly over {processes} processes")
    return batch // processes
