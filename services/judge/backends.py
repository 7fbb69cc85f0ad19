"""The two ways the judge decides: rules (embedded) and an LLM behind an OpenAI-compatible API.

Both backends take a batch of items and return one :class:`JudgeVerdict` per item, in order.
:class:`OpenAIBackend` asks the model with a versioned prompt at temperature 0 and a fixed seed,
retries transient failures with exponential backoff, and when no usable reply comes back it
returns the rules verdict instead, marked ``backend="rules"``, ``fallback=True`` and the reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from functools import partial

import openai
from openai import AsyncOpenAI

from hoprl.judging import RulesJudge, Verdict
from hoprl.schemas.judge import AnswerableItem, AnswerItem, JudgeVerdict
from services.judge.prompts import Prompt, load_prompt, render_answer, render_answerable
from services.judge.settings import JudgeSettings

log = logging.getLogger("hoprl.services.judge")

# Transient failures worth another attempt; others (bad key, unknown model) fail at once.
RETRYABLE = (
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.InternalServerError,
    openai.RateLimitError,
)
THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
WORD = re.compile(r"[a-z]+")


class LLMUnavailable(Exception):
    """Every attempt at a call failed with a transient error."""


def parse_verdict(reply: str, positive: tuple[str, ...], negative: tuple[str, ...]) -> bool | None:
    """The verdict a model's reply states, or ``None`` when it states none or both.

    Reasoning in ``<think>...</think>`` is ignored. A reply that starts with a verdict word wins
    ("No. The prediction names ..."); otherwise the reply must use words of one polarity only
    ("**Answer:** YES"). Matching is by whole lower-case words, so "incorrect" is not "correct".

    >>> parse_verdict("<think>yes or no?</think> **NO**", ("yes",), ("no",))
    False
    >>> parse_verdict("Verdict: Correct.", ("correct",), ("wrong", "incorrect")) is True
    True
    """
    words = WORD.findall(THINK.sub(" ", reply).lower())
    if words and (words[0] in positive or words[0] in negative):
        return words[0] in positive
    seen = {w in positive for w in words if w in positive or w in negative}
    return seen.pop() if len(seen) == 1 else None


def _service_verdict(verdict: Verdict, **marks: object) -> JudgeVerdict:
    return JudgeVerdict.model_validate(verdict.model_dump() | marks)


class RulesBackend:
    """:class:`hoprl.judging.RulesJudge` (normalised EM, containment, F1) for a batch."""

    name = "rules"
    model = ""

    def __init__(self) -> None:
        self.rules = RulesJudge()
        self.answer_version = self.answerable_version = self.rules.version

    async def answer(self, items: list[AnswerItem]) -> list[JudgeVerdict]:
        return [_service_verdict(self.rules.answer(i.prediction, i.references, i.question)) for i in items]

    async def answerable(self, items: list[AnswerableItem]) -> list[JudgeVerdict]:
        return [_service_verdict(self.rules.answerable(i.question, i.evidence, i.references)) for i in items]

    async def ready(self) -> str | None:
        """``None`` when ready, else what is missing (the rules need nothing)."""
        return None

    async def close(self) -> None:
        return None


class OpenAIBackend:
    """An LLM judge over any OpenAI-compatible chat API (GPT, vLLM, hoprl's policy service)."""

    name = "openai"

    def __init__(self, settings: JudgeSettings) -> None:
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "no-key"
        # The backend's own retry loop (with backoff and the fallback) replaces the client's.
        self.client = AsyncOpenAI(
            base_url=settings.openai_base_url, api_key=key, timeout=settings.timeout_s, max_retries=0
        )
        self.settings = settings
        self.model = str(settings.model)
        self.answer_prompt = load_prompt(settings.answer_prompt)
        self.answerable_prompt = load_prompt(settings.answerable_prompt)
        self.answer_version = self.answer_prompt.version
        self.answerable_version = self.answerable_prompt.version
        self.rules = RulesJudge()

    async def answer(self, items: list[AnswerItem]) -> list[JudgeVerdict]:
        texts = [render_answer(self.answer_prompt, i.question, i.prediction, i.references) for i in items]
        rules = [partial(self.rules.answer, i.prediction, i.references, i.question) for i in items]
        return await self._judge(self.answer_prompt, texts, rules)

    async def answerable(self, items: list[AnswerableItem]) -> list[JudgeVerdict]:
        texts = [
            render_answerable(self.answerable_prompt, i.question, i.evidence, i.references) for i in items
        ]
        rules = [partial(self.rules.answerable, i.question, i.evidence, i.references) for i in items]
        return await self._judge(self.answerable_prompt, texts, rules)

    async def _judge(
        self, prompt: Prompt, texts: list[str], rules: Sequence[Callable[[], Verdict]]
    ) -> list[JudgeVerdict]:
        """Every text asked of the model under ``prompt`` (``concurrency`` at a time); one the model
        fails on gets its rules' verdict, marked as a fallback with the reason."""
        limit = asyncio.Semaphore(self.settings.concurrency)

        async def one(text: str, fallback: Callable[[], Verdict]) -> JudgeVerdict:
            async with limit:
                verdict = await self._ask(prompt, text)
            if isinstance(verdict, str):
                return _service_verdict(fallback(), fallback=True, fallback_reason=verdict)
            return verdict

        return list(await asyncio.gather(*(one(t, r) for t, r in zip(texts, rules, strict=True))))

    async def _ask(self, prompt: Prompt, text: str) -> JudgeVerdict | str:
        """The model's verdict on ``text``, or a string saying why there is none."""
        try:
            reply = await self._complete(text)
        except LLMUnavailable as exc:
            log.warning("judge LLM unavailable, falling back to rules: %s", exc)
            return f"LLM unavailable: {exc}"
        except openai.OpenAIError as exc:
            log.warning("judge LLM call refused, falling back to rules: %s", exc)
            return f"LLM call failed: {type(exc).__name__}: {exc}"
        decided = parse_verdict(reply, prompt.positive, prompt.negative)
        if decided is None:
            log.warning("unparseable judge reply, falling back to rules: %r", reply[:200])
            return f"LLM reply states no verdict: {reply[:200]!r}"
        rationale = f"{self.model} replied {reply.strip()[:300]!r}"
        return JudgeVerdict(
            verdict=decided,
            score=float(decided),
            rationale=rationale,
            backend=self.name,
            version=prompt.version,
        )

    async def _complete(self, text: str) -> str:
        """One chat completion at temperature 0, retried with exponential backoff on transient errors."""
        s = self.settings
        for attempt in range(s.retries + 1):
            try:
                response = await self.client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": text}],
                    temperature=0.0,
                    seed=s.seed,
                    max_tokens=s.max_tokens,
                )
                # No choice at all reads as an empty reply: unparseable, so the rules decide.
                return (response.choices[0].message.content or "") if response.choices else ""
            except RETRYABLE as exc:
                if attempt == s.retries:
                    raise LLMUnavailable(
                        f"{attempt + 1} attempt(s) failed, last {type(exc).__name__}: {exc}"
                    ) from exc
                delay = s.backoff_s * 2**attempt
                log.info("judge LLM attempt %d failed (%s); retrying in %.2fs", attempt + 1, exc, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")

    async def ready(self) -> str | None:
        """``None`` when the endpoint answers and serves the model, else what is wrong."""
        probe = self.client.with_options(timeout=min(self.settings.timeout_s, 5.0), max_retries=0)
        try:
            served = [m.id async for m in probe.models.list()]
        except openai.OpenAIError as exc:
            return f"the LLM endpoint {self.settings.openai_base_url} did not answer: {exc}"
        if self.model not in served:
            return f"the LLM endpoint does not serve model {self.model!r}; it serves {served}"
        return None

    async def close(self) -> None:
        await self.client.close()


Backend = RulesBackend | OpenAIBackend


def make_backend(settings: JudgeSettings) -> Backend:
    return OpenAIBackend(settings) if settings.backend == "openai" else RulesBackend()
