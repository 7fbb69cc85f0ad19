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

The transformers engine serves concurrent callers with *flat combining*: each call queues its job,
and whichever caller holds the engine lock decodes every compatible queued job in one left-padded
batch. Same-parameter requests from many clients thus share a batch (the throughput of batch 8
is several times that of batch 1 on a CPU); seeded requests run alone so their output is
reproducible.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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


@dataclass
class _Job:
    rows: list[list[int]]
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: list[Generation] = field(default_factory=list)
    error: BaseException | None = None

    def key(self) -> tuple[Any, ...] | None:
        """Jobs with equal keys decode together; seeded jobs never share a batch (``None``)."""
        if self.params.seed is not None:
            return None
        return (replace(self.params, deadline=None, n=1),)


class TransformersEngine:
    """Any causal LM transformers loads, on CPU (or a GPU when torch sees one).

    Args:
        path: HF id or checkpoint folder.
        threads: torch threads; 1 decodes fastest on a 2-core machine (2 threads measured 3-5x slower).
        max_batch: rows (prompts x n) decoded together at most.
        autocast: decode under bf16 autocast (weights stay in ``dtype``): about 1.1x faster on CPUs
            with AMX (``bench/precision.py``); the tokens can differ from fp32 decoding at near-ties.
    """

    def __init__(
        self, path: str, dtype: str = "float32", threads: int = 1, max_batch: int = 16, autocast: bool = False
    ) -> None:
        import torch

        torch.set_num_threads(threads)
        self.dtype, self.max_batch, self.autocast = dtype, max_batch, autocast
        self.lock = threading.Lock()  # held while decoding; flat combining hands queued jobs over
        self.queue_lock = threading.Lock()
        self.queue: list[_Job] = []
        self.model: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.load(path)

    def load(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = self.dtype if self.dtype == "auto" else getattr(torch, self.dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        with self.lock:  # the new weights are ready: swap between two batches
            self.model, self.tokenizer, self.model_path = model, tokenizer, path

    def close(self) -> None:
        with self.lock:
            self.model = None
        gc.collect()

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a raw prompt, or of chat messages under the chat template (ValueError if none)."""
        tok = self.tokenizer
        if isinstance(prompt, str):
            return list(tok(prompt)["input_ids"])
        if not tok.chat_template:
            raise ValueError(f"the model {self.model_path!r} has no chat template; use /v1/completions")
        text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        # Encoding happens outside the lock, so new jobs queue up while a batch decodes.
        encoded = [self.encode(p) for p in prompts]
        context = self.model.config.max_position_embeddings
        for ids in encoded:
            if not ids:
                raise ValueError("the prompt is empty; send at least one token of text")
            if len(ids) + params.max_tokens > context:
                raise ValueError(
                    f"the prompt has {len(ids)} tokens; with max_tokens={params.max_tokens} that exceeds "
                    f"the model's context of {context} tokens"
                )
        job = _Job([ids for ids in encoded for _ in range(params.n)], params)
        with self.queue_lock:
            self.queue.append(job)
        with self.lock:  # whoever holds the lock serves queued jobs until its own is done
            while not job.done.is_set():
                self._serve(self._take())
        if job.error is not None:
            raise job.error
        return [job.result[i : i + params.n] for i in range(0, len(job.result), params.n)]

    def _take(self) -> list[_Job]:
        """The oldest queued job plus the queued jobs that may share its batch."""
        with self.queue_lock:
            first = self.queue.pop(0)
            jobs, rows, key = [first], len(first.rows), first.key()
            for job in list(self.queue):
                if key is not None and job.key() == key and rows + len(job.rows) <= self.max_batch:
                    self.queue.remove(job)
                    jobs.append(job)
                    rows += len(job.rows)
        return jobs

    def _serve(self, jobs: list[_Job]) -> None:
        import torch

        try:
            params = jobs[0].params
            if params.seed is not None:
                torch.manual_seed(params.seed)
            rows = [(row, job.params.deadline) for job in jobs for row in job.rows]
            sinks = [_sink(job.params.on_text, i) for job in jobs for i in range(len(job.rows))]
            out: list[Generation] = []
            for i in range(0, len(rows), self.max_batch):
                out += self._batch(rows[i : i + self.max_batch], params, sinks[i : i + self.max_batch])
            for job in jobs:
                job.result, out = out[: len(job.rows)], out[len(job.rows) :]
        except Exception as exc:  # handed to every caller of the batch, which re-raises it
            for job in jobs:
                job.error = exc
        for job in jobs:
            job.done.set()

    def _batch(
        self,
        rows: list[tuple[list[int], float | None]],
        params: SamplingParams,
        sinks: Sequence[Callable[[str], None] | None] = (),
    ) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, StoppingCriteriaList

        tok, pad = self.tokenizer, self.tokenizer.pad_token_id
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in rows])
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in rows])
        sample = params.temperature > 0
        config = GenerationConfig(
            max_new_tokens=params.max_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=0 if sample else None,  # OpenAI semantics: no top-k (transformers defaults to 50)
            pad_token_id=pad,
            eos_token_id=self.model.generation_config.eos_token_id or tok.eos_token_id,
            return_dict_in_generate=True,
            output_logits=params.logprobs,
            stop_strings=list(params.stop) or None,
        )
        deadlines = [d for _, d in rows]
        criteria = StoppingCriteriaList([_Deadline(deadlines)] if any(deadlines) else [])
        device = self.model.device.type
        with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=config,
                stopping_criteria=criteria,
                tokenizer=tok,
                streamer=self._streamer(sinks, params),
            )
        new = out.sequences[:, width:]
        logp = torch.stack(out.logits, dim=1).float().log_softmax(-1) if params.logprobs else None
        return [
            self._decode(new[b].tolist(), None if logp is None else logp[b], params, len(rows[b][0]))
            for b in range(len(rows))
        ]

    def _streamer(self, sinks: Sequence[Callable[[str], None] | None], params: SamplingParams) -> Any:
        """A :class:`~services.policy.streaming.RowStreamer` for the rows that stream; None if none does."""
        if not any(sinks):
            return None
        from services.policy.streaming import RowStreamer, TextStream

        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        ends = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.pad_token_id}
        return RowStreamer([sink and TextStream(self.tokenizer, ends, params.stop, sink) for sink in sinks])

    def _decode(self, ids: list[int], logp: Any, params: SamplingParams, prompt_len: int) -> Generation:
        tok = self.tokenizer
        eos = self.model.generation_config.eos_token_id or tok.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) | {tok.pad_token_id}
        end = next((i for i, t in enumerate(ids) if t in eos_ids), None)
        finish = "stop" if end is not None else "length"
        ids = ids[:end]
        text = tok.decode(ids, skip_special_tokens=True)
        stop_reason = None
        hit = find_stop(text, params.stop)
        if hit is not None:
            pos, stop_reason = hit
            finish, text = "stop", text[:pos]
            ids = ids[: self._tokens_through(ids, pos + len(stop_reason))]
        gen = Generation(
            text, finish, stop_reason, ids, [tok.decode([t]) for t in ids], prompt_tokens=prompt_len
        )
        if logp is not None:
            rows = logp[: len(ids)]
            gen.logprobs = [float(rows[i, t]) for i, t in enumerate(ids)]
            if params.top_logprobs:
                values, indices = rows.topk(params.top_logprobs, dim=-1)
                gen.top_logprobs = [
                    {tok.decode([int(i)]): float(v) for v, i in zip(vs, ix, strict=True)}
                    for vs, ix in zip(values, indices, strict=True)
                ]
        return gen

    def _tokens_through(self, ids: list[int], chars: int) -> int:
        """The fewest leading tokens of ``ids`` whose decoded text is at least ``chars`` long."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= chars:
                hi = mid
            else:
                lo = mid + 1
        return hi


def _sink(on_text: Callable[[int, str], None] | None, choice: int) -> Callable[[str], None] | None:
    """Row ``choice``'s text sink: ``on_text`` with the choice index bound."""
    return None if on_text is None else lambda text: on_text(choice, text)


class _Deadline:
    """Stops each row once its deadline (``time.monotonic()``) has passed: bounded work per request."""

    def __init__(self, deadlines: list[float | None]) -> None:
        self.deadlines = deadlines

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        now = time.monotonic()
        return torch.tensor([d is not None and now > d for d in self.deadlines], device=input_ids.device)


# -- vLLM ------------------------------------------------------------------------------------------


class VllmEngine:
    """The real vLLM engine (GPU). ``vllm`` is imported here only: the CPU environment lacks it.

    It does not stream (``LLM.generate`` returns whole outputs): a streamed request gets its text
    in one chunk when decoding ends.
    """

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
            self.llm = LLM(model=path, dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization)
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

        top = max(params.top_logprobs, 1) if params.logprobs else None
        sampling = VllmSampling(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=top,
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
    """

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
