"""The agent loop on TRL's vLLM generation: ``generation: vllm`` rollouts, in rounds every rank agrees on.

TRL owns vLLM in a GRPO job (``use_vllm=True``): colocated in each training process, or a
``trl vllm-serve`` server; it pushes the new weights to vLLM after every optimizer step. Its
``trainer.vllm_generation.generate(prompt_ids, images, num_generations)`` is single-turn and, in
server mode, *collective*: every rank must call it the same number of times with the same number of
prompts (rank 0 gathers all prompts, asks the server, broadcasts, and each rank takes the slice at
``process_index * len(prompts)``). The recipe's agent loop is multi-turn and asynchronous: many
episodes per rank ask for their next turn whenever their retrieval returns.

:class:`VllmRolloutEngine` is the adapter: an :class:`~hoprl.generation.engines.Engine` whose
``generate`` queues the ask and waits, and a driver thread that decodes in **rounds**. Each round it
takes this rank's pending asks, and all ranks exchange ``(asks, done, max_tokens)``; when nobody
has an ask the round is skipped (and the loop ends once every rank is done); otherwise every rank
calls TRL's ``generate`` once with the same number of prompts (padded with copies of a short
prompt, whose outputs are dropped), at the round's largest ``max_tokens``. Each ask's output is
then cut to its own ``max_tokens`` and stop strings, by the engines' common conventions (text
without the stop string, token ids through the token that completed it, never the end token).

vLLM's log-probs of the sampled tokens come back with each turn; :func:`sampling_logprobs` lays them
over the trajectory's completion tokens (``None`` on injected tokens and wherever the canonical
tokenization differs from what vLLM sampled), so TRL's importance-sampling correction uses them
where they are exact and leaves the rest uncorrected (TRL treats ``None`` as no correction).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from hoprl.domain import Episode, TokenTrajectory
from hoprl.generation.engines import Generation, Prompt, SamplingParams, encode_prompt, find_stop
from hoprl.generation.rows import tokens_through
from hoprl.training import distributed

_Ask = tuple[list[list[int]], SamplingParams, "Future[list[list[Generation]]]"]


class VllmRolloutEngine:
    """An Engine over TRL's ``VLLMGeneration`` (module docstring); use inside :meth:`rounds`.

    Args:
        generation: the trainer's ``vllm_generation`` (or anything with its ``generate`` signature
            and its ``temperature``, ``top_p``, ``max_completion_length`` and ``generation_kwargs``).
        tokenizer: the training model's tokenizer (its chat template renders the prompts).
        window_s: how long a round waits for asks to gather before it is exchanged.
    """

    constrains = False  # the grammar is for serving; rollouts sample the policy's own mistakes

    def __init__(self, generation: Any, tokenizer: Any, window_s: float = 0.02) -> None:
        self.generation, self.tokenizer, self.window_s = generation, tokenizer, window_s
        self.model_path = "(trl vllm)"
        self.asks: queue.Queue[_Ask] = queue.Queue()
        self.done = threading.Event()
        self.rounds_decoded = 0

    # -- the Engine interface ---------------------------------------------------------------------

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        future: Future[list[list[Generation]]] = Future()
        self.asks.put(([self.encode(p) for p in prompts], params, future))
        return future.result()

    def load(self, path: str) -> None:
        raise NotImplementedError("TRL pushes the training weights to vLLM itself")

    def close(self) -> None:
        self.done.set()

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids as the transformers engine encodes them (chat template, no extra specials)."""
        return encode_prompt(self.tokenizer, prompt, self.model_path)

    # -- rounds -----------------------------------------------------------------------------------

    @contextmanager
    def rounds(self) -> Iterator[None]:
        """Decode this rank's asks in rounds while the block runs, then until every rank is done."""
        self.done.clear()
        failure: list[BaseException] = []

        def drive() -> None:
            try:
                self._drive()
            except BaseException as exc:  # surfaced to the caller below, and to every waiting ask
                failure.append(exc)
                self._fail_pending(exc)

        driver = threading.Thread(target=drive, name="hoprl-vllm-rounds", daemon=True)
        driver.start()
        try:
            yield
        finally:
            self.done.set()
            driver.join()
        if failure:
            raise failure[0]

    def _drive(self) -> None:
        while True:
            time.sleep(self.window_s)
            pending = self._drain()
            count = sum(len(p) * params.n for p, params, _ in pending)
            most = max((params.max_tokens for _, params, _ in pending), default=0)
            finished = self.done.is_set() and not pending and self.asks.empty()
            every = distributed.gather([(count, finished, most)])
            if sum(c for c, _, _ in every) == 0:
                if all(f for _, f, _ in every):
                    return
                continue
            self._decode(pending, max(c for c, _, _ in every), max(m for _, _, m in every))

    def _drain(self) -> list[_Ask]:
        out = []
        while True:
            try:
                out.append(self.asks.get_nowait())
            except queue.Empty:
                return out

    def _fail_pending(self, exc: BaseException) -> None:
        for _, _, future in self._drain():
            future.set_exception(exc)

    def _decode(self, pending: list[_Ask], width: int, max_tokens: int) -> None:
        """One collective call: this rank's prompts padded to ``width``, at ``max_tokens``."""
        rows = [ids for prompts, params, _ in pending for ids in prompts for _ in range(params.n)]
        filler = rows[0] if rows else self._filler()
        padded = rows + [filler] * (width - len(rows))
        first = pending[0][1] if pending else SamplingParams()
        g = self.generation
        g.temperature, g.top_p, g.max_completion_length = first.temperature, first.top_p, max_tokens
        stops = sorted({s for _, params, _ in pending for s in params.stop})
        g.generation_kwargs = {**(getattr(g, "generation_kwargs", None) or {}), "stop": stops or None}
        try:
            _, completions, logprobs, _ = g.generate(padded, None, 1)
        except BaseException as exc:
            for _, _, future in pending:
                future.set_exception(exc)
            raise
        self.rounds_decoded += 1
        k = 0
        for prompts, params, future in pending:
            out = []
            for ids in prompts:
                gens = []
                for _ in range(params.n):
                    lps = logprobs[k] if logprobs is not None else None
                    gens.append(self.cut(list(completions[k]), lps, params, len(ids)))
                    k += 1
                out.append(gens)
            future.set_result(out)

    def _filler(self) -> list[int]:
        """A one-token prompt for a rank with nothing to ask in a round others decode."""
        tok = self.tokenizer
        token = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        return [int(token)]

    def cut(self, ids: list[int], logprobs: Any, params: SamplingParams, prompt_tokens: int) -> Generation:
        """vLLM's tokens for one ask, cut to its ``max_tokens`` and stop strings (module docstring)."""
        tok = self.tokenizer
        lps = [float(lp[0]) if isinstance(lp, list | tuple) else float(lp) for lp in logprobs or []]
        finish = "length"
        end_ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        for i, t in enumerate(ids):
            if t in end_ids:
                ids, finish = ids[:i], "stop"
                break
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        text = tok.decode(ids, skip_special_tokens=True)
        stop_reason = None
        hit = find_stop(text, params.stop)
        if hit is not None:
            pos, stop_reason = hit
            ids = ids[: tokens_through(tok, ids, pos + len(stop_reason))]
            text, finish = text[:pos], "stop"
        gen = Generation(
            text, finish, stop_reason, ids, [tok.decode([t]) for t in ids], prompt_tokens=prompt_tokens
        )
        if params.logprobs and lps:
            gen.logprobs = lps[: len(ids)]
        return gen


def sampling_logprobs(traj: TokenTrajectory, episode: Episode, tokenizer: Any) -> list[float | None]:
    """Per completion token of ``traj``: vLLM's log-prob where it is known to be that token's, else None.

    ``episode.meta["logprobs"]`` holds each model turn's ``(token text, logprob)`` pairs (the
    runner's ``logprobs=True``). The ``k``-th run of mask-1 tokens is the ``k``-th turn with text;
    a run gets its turn's log-probs only when its tokens decode to the same pieces, one for one.
    """
    out: list[float | None] = [None] * len(traj.completion_ids)
    turns = [
        lp for lp, step in zip(episode.meta.get("logprobs") or [], episode.steps, strict=False) if step.text
    ]
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(traj.mask):
        if m and runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        elif m:
            runs.append((i, i + 1))
    for (start, end), turn in zip(runs, turns, strict=False):
        if not turn:
            continue
        pieces = [tokenizer.decode([t]) for t in traj.completion_ids[start:end]]
        if pieces == [tok for tok, _ in turn][: len(pieces)] and len(turn) >= len(pieces):
            out[start:end] = [float(lp) for _, lp in turn[: len(pieces)]]
    return out
