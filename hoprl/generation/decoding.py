"""Continuous batching for the transformers engine: requests join and leave the batch at every token.

Why not ``model.generate`` on one left-padded batch, as the engine did before: a batch ran until its
longest row ended, so a request that arrived one token after a batch started waited for all of it;
every prompt was padded to the longest (eight naive-rag prompts of 400-900 tokens prefilled
together cost 1.5x their time one by one); and only requests with equal sampling parameters could
share a batch. On two cores, /v1/answer under 16 concurrent clients had a *lower* throughput than
one client (0.25 vs 0.29 requests/s). transformers' own continuous batching (``generate_batch``)
takes one GenerationConfig for all requests, so no per-request stop strings, sampling, grammar or
deadline: hence this loop.

Threads with one torch thread each, so the cores work together when requests are concurrent:

- *prefill* threads (two by default) run each new prompt alone (no padding; rows with equal prompts
  share one run, and a cached prefix of the prompt is reused: :mod:`hoprl.generation.prefix_cache`),
  pick its first token and hand the call's rows over;
- the *decode* thread merges them into the batch's key/value cache between two steps, decodes one
  token for every row per step, and drops each row the moment it ends. It lets prompts being
  prefilled join first (see :meth:`Batcher._decode_wait`), so rows decode in full batches.

Measured on the project's 2 shared cores (``bench/policy.py``): the old engine decoded 1 row per
step under 16 concurrent naive-rag clients; this one ~11, and its throughput at 16 clients is
1.4-1.9x that of one client where it was 0.86x.

Precision: ``autocast`` runs the decode steps under bf16 autocast, ``prefill_autocast`` (default:
the same) the prompts' prefill. The two can differ because the phases are bound differently:
prefill is a matmul over every prompt token, decoding reads every weight for one token a row. On a
2-core AMD EPYC with AVX512-BF16 and no AMX (SmolLM2-135M, one thread, ``bench/decode_step.py``,
2026-11-29) bf16 autocast prefilled 300 tokens in 0.38 s against 0.73 s in fp32 and took a decode
step of 8 rows over 1,000 positions in 0.29 s against 0.12 s. A bf16 prefill's keys and values are
cast to the weights' dtype before they join the batch, so the batch's cache keeps one dtype.

The loop counts where its time goes (:attr:`Batcher.counters`, :class:`Counters`): prefill seconds
(summed over the prefill threads) and tokens, decode seconds, steps and rows decoded.

Every row keeps its own sampling (temperature, top-p, seed), stop strings, ``max_tokens``,
deadline, log-probs, streaming sink and grammar matcher (constrained decoding: the tokens that
would leave the grammar are masked before sampling; see :mod:`hoprl.agent.grammar`). The rows of
one call join the batch together, so a call decoded alone (:class:`hoprl.generation.lockstep.Lockstep`'s
rounds) is decoded the same way on every run; a seeded call runs alone, so its output repeats.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
from torch.nn import functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from hoprl.generation.prefix_cache import PrefixCache
from hoprl.generation.rows import Call, Retired, Row, advance, choose, generation

log = logging.getLogger("hoprl.policy")


#: the longest the batch waits for prompts being prefilled before its next step
DECODE_PATIENCE_S = 10.0


Staged = list[tuple[Row, DynamicCache]]


@dataclass
class Counters:
    """Where a batcher's time went since it started; a rollout reports the difference of two."""

    prefill_s: float = 0.0  # summed over the prefill threads (they run at once)
    prefill_tokens: int = 0  # prompt tokens computed (a cached prefix's are not)
    decode_s: float = 0.0
    decode_steps: int = 0
    decode_rows: int = 0  # rows decoded, summed over the steps

    def since(self, earlier: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})


class Batcher:
    """The decoding loop of one loaded model. ``run(call)`` blocks until the call's rows ended."""

    def __init__(
        self, model: Any, tokenizer: Any, max_batch: int, autocast: bool, prefill_threads: int = 2,
        prefix_cache: int = 0, prefill_autocast: bool | None = None,
    ) -> None:  # fmt: skip
        probe = DynamicCache(config=model.config)
        # The forward's cache argument: `cache` since transformers 5.2x, `past_key_values` before
        # (5.17 is what vLLM 0.31, and so `.[gpu]`, installs); an unknown keyword is silently ignored.
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        if any(type(layer) is not DynamicLayer for layer in probe.layers):
            raise ValueError(
                f"{model.config.model_type}: the transformers engine batches full-attention models only "
                "(this one has sliding-window or other cache layers); serve it with POLICY_ENGINE=vllm"
            )
        self.model, self.tokenizer, self.max_batch, self.autocast = model, tokenizer, max_batch, autocast
        self.prefill_autocast = autocast if prefill_autocast is None else prefill_autocast
        self.counters = Counters()  # updated under self.cond
        eos = model.generation_config.eos_token_id or tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.pad_token_id}
        self.cond = threading.Condition()
        self.queue: deque[Call] = deque()  # waiting for the prefill thread
        self.prefilling: list[Call] = []
        self.ready: list[Staged] = []  # prefilled calls waiting to join the batch
        self.active: list[Row] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [rows, cache length], 0 = left padding
        self.alone: Call | None = None
        self.retired = self.closed = False
        self.grammar_tokenizer: Any = None
        self.prefixes = PrefixCache(prefix_cache)
        self.steps = self.widest = 0  # decode steps so far, and the most rows one of them decoded
        self.moved = time.monotonic()  # when the batch last stepped, or rows began to wait for one
        self.threads = [
            *(
                threading.Thread(target=self._prefill_loop, name=f"hoprl-prefill-{i}", daemon=True)
                for i in range(prefill_threads)
            ),
            threading.Thread(target=self._decode_loop, name="hoprl-decode", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    # -- callers ---------------------------------------------------------------------------------

    def matcher(self, grammar: str | None) -> Any:
        """A fresh llguidance matcher of the Lark ``grammar`` (one per row); ValueError if invalid."""
        if grammar is None:
            return None
        import llguidance
        import llguidance.hf

        with self.cond:  # the tokenizer's vocabulary is read once per model (~0.2 s)
            if self.grammar_tokenizer is None:
                vocab = self.model.config.vocab_size
                self.grammar_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=vocab)
        matcher = llguidance.LLMatcher(self.grammar_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid grammar: {matcher.get_error()}")
        return matcher

    def run(self, call: Call) -> None:
        call.left = len(call.rows)
        with self.cond:
            if self.retired or self.closed:
                raise Retired("this model was replaced")
            self.queue.append(call)
            self.cond.notify_all()
        call.done.wait()

    def retire(self) -> None:
        """Take no new calls; the threads finish the calls they hold, then exit."""
        with self.cond:
            self.retired = True
            self.cond.notify_all()

    def close(self) -> None:
        """Stop now: every unfinished call fails; returns once the threads have ended their last
        forward pass (a thread killed inside one at interpreter exit aborts the process)."""
        with self.cond:
            self.closed = True
            calls = [*self.queue, *self.prefilling, *(row.call for staged in self.ready for row, _ in staged)]
            calls += [row.call for row in self.active]
            self.queue.clear()
            self.cond.notify_all()
        self._fail(calls, RuntimeError("the engine was closed"))
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=60)

    # -- prefill thread ----------------------------------------------------------------------------

    def _busy(self) -> int:
        staged = sum(len(s) for s in self.ready)
        return len(self.active) + staged + sum(len(call.rows) for call in self.prefilling)

    def _admissible(self) -> Call | None:
        """The next queued call if it may start prefilling now (oldest first; lock held)."""
        if not self.queue or self.alone is not None:
            return None
        call, busy = self.queue[0], self._busy()
        if call.alone:
            return call if busy == 0 else None
        return call if busy == 0 or busy + len(call.rows) <= self.max_batch else None

    def _prefill_loop(self) -> None:
        while True:
            with self.cond:
                call = self._admissible()
                while not self.closed and call is None:
                    if self.retired and not self.queue:
                        return
                    self.cond.wait()
                    call = self._admissible()
                if self.closed or call is None:
                    return
                self.queue.popleft()
                self.prefilling.append(call)
                if call.alone:
                    self.alone = call
            try:
                staged = self._prefill(call)
            except Exception as exc:  # this call fails; the batch goes on
                log.exception("prefill failed")
                self._fail([call], exc)
                staged = []
            with self.cond:
                self.prefilling.remove(call)
                if staged:
                    if not self.active and not self.ready:  # the first rows to wait for a step
                        self.moved = time.monotonic()
                    self.ready.append(staged)
                self.cond.notify_all()

    def _prefill(self, call: Call) -> Staged:
        staged: Staged = []
        shared: dict[tuple[int, ...], tuple[DynamicCache, torch.Tensor]] = {}
        for row in call.rows:
            key = tuple(row.prompt)
            if key not in shared:  # n choices, or a group's samples, share the prompt's run
                shared[key] = self._forward_prompt(row.prompt)
            cache, logits = shared[key]
            if self._advance(row, self._choose(row, logits)):
                self._release(row)
            else:
                staged.append((row, cache))
        return staged

    def _forward_prompt(self, prompt: list[int]) -> tuple[DynamicCache, torch.Tensor]:
        """The prompt's key/value cache and its last position's logits; a cached prefix is reused
        (at least the last token is computed: its logits are the point)."""
        began = time.perf_counter()
        hit = self.prefixes.lookup(prompt)
        if hit is None:
            done, cache = 0, DynamicCache(config=self.model.config)
        else:
            done = min(hit[0], len(prompt) - 1)
            cache = DynamicCache(ddp_cache_data=[(k[:, :, :done], v[:, :, :done]) for k, v in hit[1]],
                                 config=self.model.config)  # fmt: skip
        with self._inference(self.prefill_autocast):
            new = torch.tensor([prompt[done:]])
            out = self.model(input_ids=new, **{self.cache_arg: cache}, use_cache=True, logits_to_keep=1)
        if self.prefill_autocast and not self.autocast:  # the batch's cache keeps the weights' dtype
            dtype = self.model.dtype
            for layer in cast(list[Any], cache.layers):
                layer.keys, layer.values = layer.keys.to(dtype), layer.values.to(dtype)
        with self.cond:
            self.counters.prefill_s += time.perf_counter() - began
            self.counters.prefill_tokens += len(prompt) - done
        return cache, out.logits[0, -1].float()

    # -- decode thread -----------------------------------------------------------------------------

    def _decode_loop(self) -> None:
        while True:
            with self.cond:
                while not self.closed and (wait := self._decode_wait()) != 0:
                    if self.retired and not (self.queue or self.prefilling or self.ready or self.active):
                        return
                    self.cond.wait(wait)
                if self.closed:  # rows merged after close() took its list: their callers wait too
                    held = [row.call for row in self.active]
                    held += [row.call for staged in self.ready for row, _ in staged]
                    break
                joining, self.ready = self.ready, []
            try:
                if joining:
                    self._merge([pair for staged in joining for pair in staged])
                self._step()
            except Exception as exc:  # the batch's state is unknown: fail its calls, start afresh
                log.exception("decoding failed")
                # the joining rows too: a failed merge leaves them outside `active`, their callers waiting
                joined = [row for staged in joining for row, _ in staged if row not in self.active]
                calls = list({id(r.call): r.call for r in self.active + joined}.values())
                self.active, self.cache, self.mask = [], None, None
                self._fail(calls, exc)
        self._fail(held, RuntimeError("the engine was closed"))

    def _decode_wait(self) -> float | None:
        """How long the decode thread waits before its next step (lock held): 0 = step now, None =
        until notified.

        It waits with nothing to decode; and, *prefill first* (as vLLM's first scheduler), while
        the rows it holds are no more than the rows being prefilled or queued to join, for at most
        :data:`DECODE_PATIENCE_S` since the batch last moved. Rows then decode in fuller batches (on
        a CPU a decode step costs about the same for 1 row as for 4: it reads every weight either
        way) while the prompts' prefill, the bulk of a request's work, keeps the cores; and a
        running batch is never held up for a newcomer or two (waiting for every prefill, the 99th
        percentile latency of 64 requests from 16 clients was 134 s; waiting at most 1 s for any,
        throughput at 16 clients fell from 1.9x that of one client to 1.3x).
        """
        rows = len(self.active) + sum(len(s) for s in self.ready)
        if rows == 0:
            return None
        if rows >= self.max_batch or not (self.prefilling or self._admissible() is not None):
            return 0
        return max(0.0, DECODE_PATIENCE_S - (time.monotonic() - self.moved))

    def _merge(self, staged: Staged) -> None:
        """Add prefilled rows to the batch: every cache is left-padded to the longest, then stacked."""
        parts = [(kv(cache), cache.get_seq_length()) for _, cache in staged]
        if self.cache is not None and self.mask is not None:
            parts.insert(0, (kv(self.cache), self.mask.shape[1]))
        width = max(n for _, n in parts)
        masks = [
            F.pad(torch.ones(1, n, dtype=torch.long), (width - n, 0))
            for _, n in parts[len(parts) - len(staged) :]
        ]
        if self.mask is not None:
            masks.insert(0, F.pad(self.mask, (width - self.mask.shape[1], 0)))
        layers = [
            tuple(torch.cat([F.pad(layer[i][j], (0, 0, width - n, 0)) for layer, n in parts]) for j in (0, 1))
            for i in range(len(parts[0][0]))
        ]
        self.cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)
        self.mask = torch.cat(masks)
        self.active += [row for row, _ in staged]

    def _step(self) -> None:
        """One token for every active row; ended rows leave the batch."""
        assert self.cache is not None and self.mask is not None
        rows = self.active
        began = time.perf_counter()
        self.moved = time.monotonic()
        self.steps += 1
        self.widest = max(self.widest, len(rows))
        tokens = torch.tensor([[row.ids[-1]] for row in rows])
        positions = torch.tensor([[len(row.prompt) + len(row.ids) - 1] for row in rows])
        self.mask = torch.cat([self.mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
        with self._inference(self.autocast):
            out = self.model(
                input_ids=tokens, attention_mask=self.mask, position_ids=positions,
                **{self.cache_arg: self.cache}, use_cache=True,
            )  # fmt: skip
        logits = out.logits[:, -1].float()
        with self.cond:  # before any row is released: its caller may read the counters at once
            self.counters.decode_s += time.perf_counter() - began
            self.counters.decode_steps += 1
            self.counters.decode_rows += len(rows)
        keep = [b for b, row in enumerate(rows) if not self._advance(row, self._choose(row, logits[b]))]
        if len(keep) == len(rows):
            return
        ended = [b for b in range(len(rows)) if b not in keep]
        self._remember(ended)  # before the callers return: their next turn may look it up
        for b in ended:
            self._release(rows[b])
        self.active = [rows[b] for b in keep]
        if not keep:
            self.cache, self.mask = None, None
            return
        index = torch.tensor(keep)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        pad = int((self.mask.shape[1] - self.mask.sum(dim=1)).min())
        if pad:  # the padding every remaining row has: drop it
            self.mask = self.mask[:, pad:]
            for layer in cast(list[Any], self.cache.layers):
                layer.keys, layer.values = layer.keys[:, :, pad:], layer.values[:, :, pad:]

    def _remember(self, ended: list[int]) -> None:
        """Copy the keys and values of the rows that just ended into the prefix cache."""
        if not self.prefixes.capacity or self.cache is None or self.mask is None:
            return
        width, layers = self.mask.shape[1], kv(self.cache)
        for b in ended:
            n = int(self.mask[b].sum())  # the row's cached positions: the rightmost n (left padding)
            row = self.active[b]
            tensors = [(k[b : b + 1, :, width - n :].clone(), v[b : b + 1, :, width - n :].clone())
                       for k, v in layers]  # fmt: skip
            self.prefixes.add((row.prompt + row.ids)[:n], tensors)

    # -- per row -----------------------------------------------------------------------------------

    @contextmanager
    def _inference(self, autocast: bool) -> Iterator[None]:
        device = self.model.device.type
        with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            yield

    def _choose(self, row: Row, logits: torch.Tensor) -> int:
        return choose(row, logits, self.eos)

    def _advance(self, row: Row, token: int) -> bool:
        """Append ``token``; True when the row has ended (its Generation is then built)."""
        finish = advance(row, token, self.tokenizer, self.eos)
        if finish is None:
            return False
        row.result = generation(row, finish, self.tokenizer)
        return True

    def _release(self, row: Row) -> None:
        """Hand an ended row's result over; its call returns once all its rows are released."""
        call = row.call
        with self.cond:
            call.left -= 1
            if call.left == 0:
                if call is self.alone:
                    self.alone = None
                call.done.set()
                self.cond.notify_all()

    def _fail(self, calls: list[Call], exc: BaseException) -> None:
        with self.cond:
            for call in set(calls):
                if not call.done.is_set():
                    call.error = exc
                    if call is self.alone:
                        self.alone = None
                    call.done.set()
            self.cond.notify_all()


def kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the cache's key and value tensors ``[rows, kv heads, positions, head dim]``."""
    return [(layer.keys, layer.values) for layer in cast(list[Any], cache.layers)]
