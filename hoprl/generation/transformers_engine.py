"""The transformers engine: any causal LM on CPU (or a GPU torch sees), continuously batched.

Concurrent calls share one decoding loop (:class:`hoprl.generation.decoding.Batcher`); the engine
loads, swaps checkpoints and turns each call into the batch's rows (:mod:`hoprl.generation.rows`).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hoprl.generation.engines import Generation, Prompt, SamplingParams, check_prompts, encode_prompt


class TransformersEngine:
    """Any causal LM transformers loads, on CPU (or a GPU when torch sees one).

    Concurrent calls share one continuously batched decoding loop
    (:class:`hoprl.generation.decoding.Batcher`): a call joins the batch as soon as its prompt is
    prefilled and each row leaves it the moment it ends, whatever the other rows' parameters.

    Args:
        path: HF id or checkpoint folder.
        threads: torch threads (process-wide); 1 decodes fastest on a 2-core machine (2 threads
            measured 3-5x slower). ``None``: leave the process's count (the trainer's engine).
        max_batch: rows (prompts x n) decoded together at most (one call with more runs alone).
        autocast: decode under bf16 autocast (weights stay in ``dtype``): about 1.1x faster on CPUs
            with AMX (``bench/precision.py``); the tokens can differ from fp32 decoding at near-ties.
        prefill_threads: prompts prefilled at once, each on its own thread (and core), beside the
            decoding thread.
        prefix_cache: tokens of finished rows kept to skip re-prefilling a chat's earlier turns
            (:mod:`hoprl.generation.prefix_cache`); 0 = off.
        prefill_autocast: prefill prompts under bf16 autocast; ``None``: as ``autocast``. Prefill is
            matmul-bound where decoding is bound by reading the weights, and bf16 can speed the
            one and slow the other (:mod:`hoprl.generation.decoding`).
    """

    constrains = True  # SamplingParams.grammar is enforced (llguidance)

    def __init__(
        self, path: str, dtype: str = "float32", threads: int | None = 1, max_batch: int = 16,
        autocast: bool = False, prefill_threads: int = 2, prefix_cache: int = 32768,
        prefill_autocast: bool | None = None,
    ) -> None:  # fmt: skip
        import torch

        if threads is not None:  # process-wide: the policy service's process decodes and nothing else
            torch.set_num_threads(threads)
        self.dtype, self.max_batch, self.autocast = dtype, max_batch, autocast
        self.prefill_autocast = prefill_autocast
        self.prefill_threads, self.prefix_cache = prefill_threads, prefix_cache
        self.lock = threading.Lock()  # guards the swap of model, tokenizer and batcher
        self.model: Any = None
        self.tokenizer: Any = None
        self.batcher: Any = None
        self.model_path = ""
        self.load(path)

    def load(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from hoprl.generation.attention import use_kernel_gqa

        dtype = self.dtype if self.dtype == "auto" else getattr(torch, self.dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.eval()
        use_kernel_gqa(model)  # the batch's decode steps attend under a padding mask
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        batcher = self.batcher_for(model, tokenizer)
        with self.lock:  # new calls go to the new weights; calls in flight end on the old ones
            old, self.batcher = self.batcher, batcher
            self.model, self.tokenizer, self.model_path = model, tokenizer, path
        if old is not None:
            old.retire()

    def batcher_for(self, model: Any, tokenizer: Any) -> Any:
        """The decoding loop of ``model`` with this engine's batch, precision and cache settings."""
        from hoprl.generation.decoding import Batcher

        return Batcher(model, tokenizer, self.max_batch, self.autocast, self.prefill_threads,
                       self.prefix_cache, self.prefill_autocast)  # fmt: skip

    def close(self) -> None:
        with self.lock:
            batcher, self.batcher, self.model = self.batcher, None, None
        if batcher is not None:
            batcher.close()
        gc.collect()

    def encode(self, prompt: Prompt, tokenizer: Any = None) -> list[int]:
        """Token ids of a raw prompt, or of chat messages under the chat template (ValueError if none)."""
        return encode_prompt(tokenizer or self.tokenizer, prompt, self.model_path)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        from hoprl.generation.rows import Retired

        while True:
            with self.lock:
                batcher = self.batcher
            if batcher is None:
                raise RuntimeError("the engine is closed")
            call = self._call(batcher, prompts, params)
            try:
                batcher.run(call)
                break
            except Retired:  # a checkpoint switch between our two lines: encode for the new model
                continue
        if call.error is not None:
            raise call.error
        results = [row.result for row in call.rows]
        return [results[i : i + params.n] for i in range(0, len(results), params.n)]

    def _call(self, batcher: Any, prompts: Sequence[Prompt], params: SamplingParams) -> Any:
        """The rows of one call (encoded, checked against the context, each with its matcher/stream)."""
        import torch

        from hoprl.generation.rows import Call, Row
        from hoprl.generation.streaming import TextStream

        tok = batcher.tokenizer
        encoded = [self.encode(p, tok) for p in prompts]
        check_prompts(encoded, params.max_tokens, batcher.model.config.max_position_embeddings)
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        call = Call(params, generator=generator)
        for choice, ids in enumerate(ids for ids in encoded for _ in range(params.n)):
            sink = _sink(params.on_text, choice)
            stream = sink and TextStream(tok, batcher.eos, params.stop, sink)
            call.rows.append(Row(call, ids, batcher.matcher(params.grammar), stream))
        return call


def _sink(on_text: Callable[[int, str], None] | None, choice: int) -> Callable[[str], None] | None:
    """Row ``choice``'s text sink: ``on_text`` with the choice index bound."""
    return None if on_text is None else lambda text: on_text(choice, text)
