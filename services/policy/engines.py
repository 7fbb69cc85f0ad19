"""Generation engines behind one small interface: transformers (CPU default), vLLM (GPU), OpenAI.

An :class:`Engine` turns prompts (a raw string, or chat messages rendered with the model's chat
template) into :class:`Generation` outputs and can :meth:`~Engine.load` another checkpoint while
the service runs. Conventions shared by all three:

- ``text`` excludes the matched stop string (OpenAI semantics); ``stop_reason`` names it (vLLM's
  field), so a client can restore it (see :mod:`hoprl.clients.llm`).
- ``token_ids`` are the generated tokens up to and including the one that completed a stop string,
  never the end-of-sequence token; ``logprobs`` (raw model log-probabilities, before temperature
  or top-p) are aligned with them. The remote OpenAI engine knows no ids and leaves them empty.
- ``finish_reason`` is ``"stop"`` (end of sequence or stop string) or ``"length"`` (``max_tokens``,
  or the request's deadline passed).

The transformers engine batches concurrent callers *continuously* (:mod:`services.policy.decoding`):
a call joins the running batch as soon as its prompt is prefilled, and every row leaves it when it
ends, whatever the sampling parameters of the others; seeded calls run alone so their output is
reproducible. ``SamplingParams.grammar`` (a Lark grammar) constrains decoding: the transformers
engine masks tokens with llguidance, vLLM passes it to its structured outputs (same library, same
grammar text); the remote OpenAI engine cannot (``constrains = False``).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Prompt = str | list[dict[str, Any]]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy; ``deadline`` is a ``time.monotonic()`` value.

    ``on_text(choice, text)`` streams: the transformers engine calls it with each choice's new
    text as it is decoded (choice = prompt index x n + sample), from the decoding thread (which may
    be another request's: keep it quick and thread-safe). The pieces never reach past a stop string
    and, concatenated, are a prefix of the choice's final ``text``; the caller sends the rest when
    ``generate`` returns. The vLLM and OpenAI engines never call it (one piece at the end). It is
    not part of equality, so streamed and unstreamed requests still share a batch.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    deadline: float | None = None
    on_text: Callable[[int, str], None] | None = field(default=None, compare=False, repr=False)
    grammar: str | None = None  # Lark text every choice must follow (hoprl.agent.grammar); None = free


@dataclass
class Generation:
    """One generated choice (see the module docstring for the conventions)."""

    text: str
    finish_reason: str
    stop_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[dict[str, float]] | None = None
    prompt_tokens: int = 0


class Engine(Protocol):
    """What the service needs of an engine."""

    model_path: str
    tokenizer: Any | None
    constrains: bool  # whether SamplingParams.grammar is enforced

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """``params.n`` generations per prompt, in prompt order."""
        ...

    def load(self, path: str) -> None:
        """Switch to the checkpoint at ``path``; requests in flight finish on the old weights."""
        ...

    def close(self) -> None: ...


def find_stop(text: str, stop: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` as ``(position, string)``; ``None`` when none occurs."""
    found = [(text.find(s), s) for s in stop if s and s in text]
    return min(found, key=lambda f: (f[0], -len(f[1]))) if found else None


# -- transformers ----------------------------------------------------------------------------------


class TransformersEngine:
    """Any causal LM transformers loads, on CPU (or a GPU when torch sees one).

    Concurrent calls share one continuously batched decoding loop
    (:class:`services.policy.decoding.Batcher`): a call joins the batch as soon as its prompt is
    prefilled and each row leaves it the moment it ends, whatever the other rows' parameters.

    Args:
        path: HF id or checkpoint folder.
        threads: torch threads; 1 decodes fastest on a 2-core machine (2 threads measured 3-5x slower).
        max_batch: rows (prompts x n) decoded together at most (one call with more runs alone).
        autocast: decode under bf16 autocast (weights stay in ``dtype``): about 1.1x faster on CPUs
            with AMX (``bench/precision.py``); the tokens can differ from fp32 decoding at near-ties.
        prefill_threads: prompts prefilled at once, each on its own thread (and core), beside the
            decoding thread.
        prefix_cache: tokens of finished rows kept to skip re-prefilling a chat's earlier turns
            (:mod:`services.policy.prefix_cache`); 0 = off.
    """

    constrains = True  # SamplingParams.grammar is enforced (llguidance)

    def __init__(
        self, path: str, dtype: str = "float32", threads: int = 1, max_batch: int = 16,
        autocast: bool = False, prefill_threads: int = 2, prefix_cache: int = 32768,
    ) -> None:  # fmt: skip
        import torch

        torch.set_num_threads(threads)
        self.dtype, self.max_batch, self.autocast = dtype, max_batch, autocast
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

        from services.policy.decoding import Batcher

        dtype = self.dtype if self.dtype == "auto" else getattr(torch, self.dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        batcher = Batcher(
            model, tokenizer, self.max_batch, self.autocast, self.prefill_threads, self.prefix_cache
        )
        with self.lock:  # new calls go to the new weights; calls in flight end on the old ones
            old, self.batcher = self.batcher, batcher
            self.model, self.tokenizer, self.model_path = model, tokenizer, path
        if old is not None:
            old.retire()

    def close(self) -> None:
        with self.lock:
            batcher, self.batcher, self.model = self.batcher, None, None
        if batcher is not None:
            batcher.close()
        gc.collect()

    def encode(self, prompt: Prompt, tokenizer: Any = None) -> list[int]:
        """Token ids of a raw prompt, or of chat messages under the chat template (ValueError if none)."""
        tok = tokenizer or self.tokenizer
        if isinstance(prompt, str):
            return list(tok(prompt)["input_ids"])
        if not tok.chat_template:
            raise ValueError(f"the model {self.model_path!r} has no chat template; use /v1/completions")
        text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        from services.policy.rows import Retired

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

        from services.policy.rows import Call, Row
        from services.policy.streaming import TextStream

        tok = batcher.tokenizer
        encoded = [self.encode(p, tok) for p in prompts]
        context = batcher.model.config.max_position_embeddings
        for ids in encoded:
            if not ids:
                raise ValueError("the prompt is empty; send at least one token of text")
            if len(ids) + params.max_tokens > context:
                raise ValueError(
                    f"the prompt has {len(ids)} tokens; with max_tokens={params.max_tokens} that exceeds "
                    f"the model's context of {context} tokens"
                )
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


# -- vLLM ------------------------------------------------------------------------------------------


class VllmEngine:
    """The real vLLM engine (GPU). ``vllm`` is imported here only: the CPU environment lacks it.

    It does not stream (``LLM.generate`` returns whole outputs): a streamed request gets its text
    in one chunk when decoding ends. ``SamplingParams.grammar`` goes to vLLM's structured outputs
    on its ``guidance`` backend: llguidance, the library the transformers engine masks with, so
    the same Lark text (token caps included) constrains both.
    """

    constrains = True

    def __init__(self, path: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85) -> None:
        self.dtype, self.gpu_memory_utilization = dtype, gpu_memory_utilization
        self.lock = threading.Lock()
        self.llm: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.load(path)

    def load(self, path: str) -> None:
        from vllm import LLM

        with self.lock:  # one engine fits in GPU memory: free the old one before building the new
            self.close()
            self.llm = LLM(
                model=path, dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                structured_outputs_config={"backend": "guidance"},
            )  # fmt: skip
            self.tokenizer = self.llm.get_tokenizer()
            self.model_path = path

    def close(self) -> None:
        if self.llm is not None:
            import torch

            self.llm = None
            gc.collect()
            torch.cuda.empty_cache()

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import StructuredOutputsParams

        top = max(params.top_logprobs, 1) if params.logprobs else None
        sampling = VllmSampling(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=top,
            structured_outputs=StructuredOutputsParams(grammar=params.grammar) if params.grammar else None,
        )
        with self.lock:
            outputs = []
            for prompt in prompts:  # one kind per call in practice; order is kept either way
                if isinstance(prompt, str):
                    outputs += self.llm.generate([prompt], sampling, use_tqdm=False)
                else:
                    outputs += self.llm.chat([prompt], sampling, use_tqdm=False)
        return [[self._choice(c, len(o.prompt_token_ids or []), params) for c in o.outputs] for o in outputs]

    def _choice(self, c: Any, prompt_tokens: int, params: SamplingParams) -> Generation:
        eos = self.tokenizer.eos_token_id
        ids = [t for t in c.token_ids if t != eos]
        stop = c.stop_reason if isinstance(c.stop_reason, str) else None
        gen = Generation(c.text, c.finish_reason or "length", stop, ids, prompt_tokens=prompt_tokens)
        gen.tokens = [self.tokenizer.decode([t]) for t in ids]
        if params.logprobs and c.logprobs:
            gen.logprobs = [c.logprobs[i][t].logprob for i, t in enumerate(ids)]
            if params.top_logprobs:
                gen.top_logprobs = [
                    {str(lp.decoded_token): lp.logprob for lp in sorted(d.values(), key=lambda x: x.rank)}
                    for d in c.logprobs[: len(ids)]
                ]
        return gen


# -- a remote OpenAI-compatible server --------------------------------------------------------------


class OpenAIEngine:
    """Forwards to any OpenAI-compatible server (``vllm serve``, a hosted model, another policy).

    ``load(name)`` selects another model the remote serves. Token ids are unknown over this API, so
    ``/v1/rollouts`` needs ``tokenizer`` (the remote model's HF id or folder) to build trajectories.
    It does not stream: a streamed request gets the remote's whole text in one chunk at the end.
    Nor does it constrain: OpenAI's API has no grammar parameter (``generate`` refuses one).
    """

    constrains = False

    def __init__(self, base_url: str, api_key: str, model: str | None, tokenizer: str | None = None) -> None:
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key)
        self.model_path = model or self.client.models.list().data[0].id
        self.tokenizer: Any = None
        if tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    def load(self, path: str) -> None:
        self.model_path = path

    def close(self) -> None:
        self.client.close()

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        if params.grammar is not None:
            raise ValueError("the openai engine cannot constrain decoding to a grammar")
        common: dict[str, Any] = {
            "model": self.model_path,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": params.n,
            "stop": list(params.stop) or None,
            "seed": params.seed,
        }
        return [self._one(prompt, params, common) for prompt in prompts]

    def _one(self, prompt: Prompt, params: SamplingParams, common: dict[str, Any]) -> list[Generation]:
        if isinstance(prompt, str):
            lp = max(params.top_logprobs, 1) if params.logprobs else None
            response: Any = self.client.completions.create(prompt=prompt, logprobs=lp, **common)
        else:
            chat: dict[str, Any] = {"messages": prompt, "logprobs": params.logprobs, **common}
            if params.top_logprobs:
                chat["top_logprobs"] = params.top_logprobs
            response = self.client.chat.completions.create(**chat)
        prompt_tokens = response.usage.prompt_tokens if response.usage else 0
        return [_remote_choice(c, prompt_tokens) for c in sorted(response.choices, key=lambda c: c.index)]


def _remote_choice(c: Any, prompt_tokens: int) -> Generation:
    stop = (c.model_extra or {}).get("stop_reason")
    text = c.text if hasattr(c, "text") else (c.message.content or "")
    gen = Generation(text, c.finish_reason or "length", stop if isinstance(stop, str) else None)
    gen.prompt_tokens = prompt_tokens
    lp = c.logprobs
    if lp is not None and getattr(lp, "content", None) is not None:  # chat
        gen.tokens = [t.token for t in lp.content]
        gen.logprobs = [t.logprob for t in lp.content]
        gen.top_logprobs = [{x.token: x.logprob for x in t.top_logprobs} for t in lp.content]
    elif lp is not None and getattr(lp, "tokens", None) is not None:  # completions
        gen.tokens, gen.logprobs = list(lp.tokens), list(lp.token_logprobs)
        gen.top_logprobs = [dict(d or {}) for d in lp.top_logprobs or []]
    return gen
