"""The OpenAI-compatible engine: forwards to a remote server (``vllm serve``, a hosted model, a policy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hoprl.generation.engines import Generation, Prompt, SamplingParams


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
