"""Async chat client for the agent loop, on the official ``openai`` package.

Works against any OpenAI-compatible server: the project's policy service, vLLM, or a remote API.

**Stop text is kept.** OpenAI-compatible servers cut the stop sequence out of the returned text, but
the protocols need it (``<search>q</search>`` must end in ``</search>`` to be a well-formed block and
to be trained on). :meth:`LLMClient.chat` re-appends it with this rule:

1. ``finish_reason == "stop"`` and the server names the matched stop string (vLLM's ``stop_reason``)
   -> append that string.
2. ``finish_reason == "stop"`` and no stop string is named (an end-of-sequence token, or a server
   that does not report it) -> append the closing tag the protocol expects: the stop sequence
   ``</tag>`` whose ``<tag>`` was opened last in the text and is still unclosed. With no such tag
   nothing is appended (the model simply ended its turn).
3. Any other finish reason (``length``: cut by ``max_tokens``) -> nothing is appended; the parser
   sees an unclosed block.

Text that already ends with a stop string (servers that include it) is left as it is. Token
logprobs, when asked, cover only what the server generated, never the re-appended text.
"""

from __future__ import annotations

import logging
from typing import Any, TypedDict, Unpack

from openai import AsyncOpenAI

from hoprl.clients.http import api_key as service_api_key
from hoprl.domain import Completion

log = logging.getLogger(__name__)


class ChatOptions(TypedDict, total=False):
    """How a chat request samples: the one definition of the keyword arguments of
    :meth:`LLMClient.chat` and :meth:`hoprl.generation.chat.EngineChat.chat` (a key left out takes
    :data:`CHAT_DEFAULTS`)."""

    stop: list[str] | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    n: int
    logprobs: bool


CHAT_DEFAULTS: ChatOptions = {"max_tokens": 256, "temperature": 1.0, "top_p": 1.0, "seed": None, "n": 1,
                              "logprobs": False}  # fmt: skip


def chat_options(options: ChatOptions) -> ChatOptions:
    """``options`` over :data:`CHAT_DEFAULTS`, with ``stop`` always a list (``[]`` for none)."""
    return {**CHAT_DEFAULTS, **options, "stop": list(options.get("stop") or [])}


def expected_close(text: str, stop: list[str]) -> str | None:
    """The stop ``</tag>`` whose ``<tag>`` was opened last in ``text`` and not closed after it.

    >>> expected_close("<think>a</think><search>acme founder", ["</search>", "</answer>"])
    '</search>'
    """
    best, best_pos = None, -1
    for s in stop:
        if not (s.startswith("</") and s.endswith(">")):
            continue
        opening = "<" + s[2:]
        pos = text.rfind(opening)
        if pos > best_pos and text.find(s, pos) == -1:
            best, best_pos = s, pos
    return best


def restore_stop(text: str, finish_reason: str | None, stop_reason: Any, stop: list[str]) -> str | None:
    """Which stop text to re-append to ``text`` (see the module docstring); ``None`` for none."""
    if finish_reason != "stop" or not stop or any(text.endswith(s) for s in stop):
        return None
    if isinstance(stop_reason, str) and stop_reason in stop:
        return stop_reason
    return expected_close(text, stop)


class LLMClient:
    """``await LLMClient(base_url, model).chat(messages, stop=["</search>"])`` -> completions.

    Args:
        base_url: the server's OpenAI root, e.g. ``http://127.0.0.1:8002/v1``.
        model: model name sent with each request.
        api_key: the bearer key; default ``$HOPRL_API_KEY`` (the policy service's key), else
            ``"EMPTY"`` (vLLM's convention: servers without auth accept any key).
        timeout: seconds per request.
        retries: retries on connection errors, 408/409/429 and 5xx (the SDK's backoff).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = 2,
    ) -> None:
        self.model = model
        key = service_api_key(api_key) or "EMPTY"
        self.client = AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=retries)

    async def chat(self, messages: list[dict[str, str]], **options: Unpack[ChatOptions]) -> list[Completion]:
        """One chat request; returns ``n`` completions with their stop text restored."""
        o = chat_options(options)
        stop, logprobs = o["stop"] or [], o["logprobs"]
        kwargs: dict[str, Any] = {}
        if stop:
            kwargs["stop"] = stop
        if o["seed"] is not None:
            kwargs["seed"] = o["seed"]
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=o["max_tokens"],
            temperature=o["temperature"],
            top_p=o["top_p"],
            n=o["n"],
            logprobs=logprobs,
            **kwargs,
        )
        usage = {}
        if response.usage is not None:
            usage = response.usage.model_dump(include={"prompt_tokens", "completion_tokens"})
        out = []
        for choice in sorted(response.choices, key=lambda c: c.index):
            text = choice.message.content or ""
            stop_reason = (choice.model_extra or {}).get("stop_reason")
            appended = restore_stop(text, choice.finish_reason, stop_reason, stop)
            lps = None
            if logprobs and choice.logprobs and choice.logprobs.content is not None:
                lps = [(t.token, t.logprob) for t in choice.logprobs.content]
            out.append(Completion(text + (appended or ""), choice.finish_reason, appended, lps, usage))
        log.debug("chat: %d choices, usage %s", len(out), usage)
        return out

    async def aclose(self) -> None:
        await self.client.close()
