"""The rows of the transformers engine's batch: one call's sequences, how each picks its next
token (grammar mask, then its own sampling), when it ends, and the Generation it returns.

Row-level and free of scheduling: :mod:`hoprl.generation.decoding` drives them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hoprl.generation.engines import Generation, SamplingParams, find_stop
from hoprl.generation.streaming import TextStream

log = logging.getLogger("hoprl.policy")


class Retired(RuntimeError):
    """The batcher serves no new calls (the engine loaded another checkpoint): use the new one."""


@dataclass(eq=False)
class Call:
    """One ``generate`` call: its rows (prompt-major, ``n`` per prompt); ``done`` once all ended."""

    params: SamplingParams
    rows: list[Row] = field(default_factory=list)
    generator: torch.Generator | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    left: int = 0

    @property
    def alone(self) -> bool:
        """A seeded call shares no batch, so the same request gives the same output."""
        return self.params.seed is not None


@dataclass(eq=False)
class Row:
    """One sequence being decoded; ``ids[-1]`` is the sampled token not yet in the cache."""

    call: Call
    prompt: list[int]
    matcher: Any = None
    stream: TextStream | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[list[float], list[int]]] = field(default_factory=list)
    stop_reason: str | None = None
    result: Generation | None = None


def choose(row: Row, logits: torch.Tensor, eos: set[int]) -> int:
    """The row's next token from the model's raw ``logits`` (grammar mask, then its sampling)."""
    params = row.call.params
    scores = logits
    if row.matcher is not None:
        allowed = allowed_tokens(row.matcher, logits.shape[-1])
        if allowed is None:  # the grammar admits nothing more: end the row
            log.warning("grammar dead end: %s", row.matcher.get_error() or "no token allowed")
            return next(iter(eos))
        scores = logits.masked_fill(~allowed, float("-inf"))
    if params.temperature == 0:
        token = int(scores.argmax())
    else:
        # A tiny temperature (5e-324 is a valid float > 0) is 0 in float32 and overflowed the scores
        # to NaN: it is floored to the dtype's smallest normal and applied to scores less their top
        # one, so the top token keeps probability 1 (greedy) instead.
        temperature = max(params.temperature, torch.finfo(scores.dtype).tiny)
        probs = torch.softmax((scores - scores.max()) / temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > params.top_p
            probs = probs.scatter(0, order[outside], 0.0)
        token = int(torch.multinomial(probs, 1, generator=row.call.generator))
    if params.logprobs:
        logp = torch.log_softmax(logits, dim=-1)
        row.logprobs.append(float(logp[token]))
        if params.top_logprobs:
            values, indices = logp.topk(params.top_logprobs)
            row.top.append((values.tolist(), indices.tolist()))
    if row.matcher is not None and token not in eos:
        row.matcher.consume_token(token)
    return token


def advance(row: Row, token: int, tokenizer: Any, eos: set[int]) -> str | None:
    """Append ``token`` to the row; its finish reason when it has ended (``stop``: end of sequence
    or a stop string, ``length``: ``max_tokens`` or the deadline), else None."""
    params = row.call.params
    if token in eos:
        return "stop"
    row.ids.append(token)
    if row.stream is not None:
        row.stream.push(token)
    if params.stop:  # a stop string can only have completed in the last few tokens
        longest = max(len(s) for s in params.stop)
        tail = tokenizer.decode(row.ids[-(longest + 1) :], skip_special_tokens=True)
        if any(s in tail for s in params.stop):
            hit = find_stop(tokenizer.decode(row.ids, skip_special_tokens=True), params.stop)
            if hit is not None:
                row.stop_reason = hit[1]
                return "stop"
    if len(row.ids) >= params.max_tokens or (params.deadline and time.monotonic() > params.deadline):
        return "length"
    return None


def generation(row: Row, finish: str, tokenizer: Any) -> Generation:
    """The ended row as the engine's result: text and ids cut at the stop string (the ids keep the
    token that completed it), log-probs aligned with the ids."""
    tok, params, ids = tokenizer, row.call.params, row.ids
    text = tok.decode(ids, skip_special_tokens=True)
    if row.stop_reason is not None:
        pos = text.find(row.stop_reason)
        text = text[:pos]
        ids = ids[: tokens_through(tokenizer, ids, pos + len(row.stop_reason))]
    gen = Generation(text, finish, row.stop_reason, list(ids), [tok.decode([t]) for t in ids],
                     prompt_tokens=len(row.prompt))  # fmt: skip
    if params.logprobs:
        gen.logprobs = row.logprobs[: len(ids)]
        if params.top_logprobs:
            gen.top_logprobs = [
                {tok.decode([i]): v for v, i in zip(vs, ix, strict=True)} for vs, ix in row.top[: len(ids)]
            ]
    return gen


def tokens_through(tokenizer: Any, ids: list[int], chars: int) -> int:
    """The fewest leading tokens of ``ids`` whose decoded text is at least ``chars`` long."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return hi


def allowed_tokens(matcher: Any, vocab: int) -> torch.Tensor | None:
    """The grammar's next-token mask as booleans over the model's ``vocab``; None if it admits nothing.

    llguidance packs the mask in 32-bit words, least significant bit first (token 0 = bit 0 of
    byte 0); tokens past the tokenizer's vocabulary (padded embedding rows) are never allowed.
    """
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    allowed = np.zeros(vocab, dtype=bool)
    n = min(vocab, bits.size)
    allowed[:n] = bits[:n].astype(bool)
    if matcher.is_error() or not allowed.any():
        return None
    return torch.from_numpy(allowed)
