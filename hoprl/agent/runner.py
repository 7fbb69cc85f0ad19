"""The episode runner: drive any recipe through a multi-turn chat with a model and a retriever.

One episode is a chat. Each step asks the chat endpoint for the next *segment* with the recipe's
stop sequences (the client re-appends the stop text), appends it as an assistant message and
parses it with ``recipe.parse`` into an :class:`~hoprl.recipes.base.Action`:

- ``search``: all the step's queries go to the retriever in one batch call (``recipe.top_k`` hits
  each); ``recipe.information(docs)`` is appended as a *user* message. That text is injected
  (mask 0), recorded in ``Step.information``.
- ``backtrack`` (EVO-RAG): the conversation returns to its state before the last search step that
  is still in it (that step's assistant and information messages, and anything after them, are
  dropped; the backtrack segment itself is not appended). Every step stays in the episode record.
- ``answer`` / ``refuse`` / ``stop``: the episode ends with that outcome.
- ``format_error``: recorded as a step; ends the episode (outcome ``format_error``) unless the
  recipe sets ``retry_message`` (that text is injected as a user turn, mask 0, recorded in
  ``Step.information``, and the episode goes on: Search-R1's and Eval-RAR's invalid-action
  message) or ``end_on_format_error = False`` (the segment stays in the chat and the episode goes
  on). A segment cut by ``max_tokens`` (finish reason ``length``) is a format error, since its
  last block is truncated.

Limits: ``max_steps`` segments (outcome ``step_cap``); ``token_budget`` tokens of completion, i.e.
the growth of the context since the initial prompt (generated + injected + chat-template tokens,
as the server counts them in ``usage``; outcome ``token_budget``); ``timeout_s`` wall seconds for
the whole episode (outcome ``timeout``, steps so far kept).

Optional recipe hooks beyond :class:`~hoprl.recipes.base.Recipe`, read with ``getattr``:

- ``retrieve_first: bool | "without_references" = False``: before step 1 the runner searches once
  with the question and builds the prompt with ``recipe.messages(question, docs=docs)``
  (``"without_references"``: only for a question that brings no paragraphs of its own, ARENA's
  references when an application asks a bare question). That retrieval is recorded on
  step 1 (``queries == [question]``, its ``docs``), so retrieval counts and recall see it; its
  text lives in the prompt, not in ``Step.information``.
- ``retry_message: str = ""`` and ``end_on_format_error: bool = True`` (see above).
- ``parse_after_information(segment) -> Action``: parses the segments that follow an injected
  information turn until one parses as a valid action (a retry does not lift it), in place of
  ``parse``: Eval-RAR's, which requires the ``<evaluate>`` of its Algorithm 1, line 17.
- ``accept_truncated: bool = False``: parse a segment cut at ``max_tokens`` instead of making it a
  format error (the naive-rag baseline, whose answer is plain text).

Timings (seconds): ``retrieval``, ``generation`` and ``total``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hoprl.domain import Action, Completion, Episode, EpisodeShape, Question, RetrievedDoc, SearchMode, Step
from hoprl.schemas import VISIBLE
from hoprl.schemas.retriever import Hit

log = logging.getLogger(__name__)


class ChatModel(Protocol):
    """What the runner needs of a model: :class:`hoprl.clients.llm.LLMClient`'s ``chat`` (over HTTP),
    or an in-process adapter with the same signature (the policy service's own engine)."""

    async def chat(
        self,
        messages: list[dict[str, str]],
        *,
        stop: list[str] | None = None,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        n: int = 1,
        logprobs: bool = False,
    ) -> list[Completion]: ...


class Searcher(Protocol):
    """What the runner needs of a retriever: :class:`hoprl.clients.retriever.AsyncRetrieverClient`'s
    ``search`` (over HTTP), or anything with the same signature."""

    async def search(
        self, collection: str, queries: list[str], *, top_k: int = 5, mode: SearchMode = "hybrid"
    ) -> list[list[Hit]]: ...


class AgentRecipe(Protocol):
    """What the runner needs of a recipe (read-only members, so class or instance attributes fit)."""

    @property
    def name(self) -> str: ...
    @property
    def stop(self) -> list[str]: ...
    @property
    def top_k(self) -> int: ...
    def messages(self, question: Question) -> list[dict[str, str]]: ...
    def parse(self, segment: str) -> Action: ...
    def information(self, docs: list[list[RetrievedDoc]]) -> str: ...


@dataclass(frozen=True)
class RunOptions:
    """One episode's shape (its limits and decoding, :class:`~hoprl.domain.EpisodeShape`) and the
    sampling choices that are the caller's alone; see :func:`run_episode`."""

    shape: EpisodeShape
    top_p: float = 1.0
    seed: int | None = None
    timeout_s: float | None = None
    logprobs: bool = False


class _Run:
    """State of one episode while it runs (the chat so far, budgets, timings)."""

    def __init__(
        self,
        recipe: AgentRecipe,
        question: Question,
        llm: ChatModel,
        retriever: Searcher,
        collection: str,
        opts: RunOptions,
        sample: int,
    ) -> None:
        self.recipe, self.question, self.llm, self.retriever = recipe, question, llm, retriever
        self.collection, self.opts = collection, opts
        self.stop = list(recipe.stop if opts.shape.stop is None else opts.shape.stop)
        self.episode = Episode(
            recipe=recipe.name,
            question_id=question.id,
            question=question.question,
            answers=list(question.answers),
            gold_titles=list(question.gold_titles),
            sample=sample,
            outcome="step_cap",
            # What the knowledge base holds for this question: answerability judgements (EVO-RAG's
            # r_ref) look at it, so refusing before searching cannot pass for a valid refusal.
            meta={"gold_evidence": [p.text for p in question.paragraphs if p.is_gold]},
        )
        self.episode.timings = {"retrieval": 0.0, "generation": 0.0}
        self.seed = None if opts.seed is None else opts.seed + sample
        self.messages: list[dict[str, str]] = []
        self.search_starts: list[int] = []  # index of each live search step's assistant message
        self.first_docs: list[list[RetrievedDoc]] | None = None
        self.after_information = False  # an information turn awaits its first valid segment
        self.prompt_tokens: int | None = None
        self.used = 0

    async def retrieve(self, queries: list[str]) -> list[list[RetrievedDoc]]:
        """Each query's documents; a query without a visible character (``<search> </search>``)
        finds none, as the retriever would refuse to search it (its 422 failed the episode)."""
        start = time.perf_counter()
        asked = [i for i, q in enumerate(queries) if re.search(VISIBLE, q)]
        hits = (
            await self.retriever.search(
                self.collection,
                [queries[i] for i in asked],
                top_k=self.opts.shape.top_k or self.recipe.top_k,
                mode=self.opts.shape.search_mode,
            )
            if asked
            else []
        )
        self.episode.timings["retrieval"] += time.perf_counter() - start
        found = dict(zip(asked, hits, strict=True))
        return [
            [RetrievedDoc(id=h.id, title=h.title, text=h.text, score=h.score) for h in found.get(i, [])]
            for i in range(len(queries))
        ]

    async def generate(self, max_tokens: int) -> Completion:
        start = time.perf_counter()
        (completion,) = await self.llm.chat(
            self.messages,
            stop=self.stop,
            max_tokens=max_tokens,
            temperature=self.opts.shape.temperature,
            top_p=self.opts.top_p,
            seed=self.seed,
            logprobs=self.opts.logprobs,
        )
        self.episode.timings["generation"] += time.perf_counter() - start
        usage = completion.usage
        if self.prompt_tokens is None:
            self.prompt_tokens = usage.get("prompt_tokens", 0)
        self.used = usage.get("prompt_tokens", 0) - self.prompt_tokens + usage.get("completion_tokens", 0)
        return completion

    async def start(self) -> None:
        first = getattr(self.recipe, "retrieve_first", False)
        if first is True or (first == "without_references" and not self.question.paragraphs):
            self.first_docs = await self.retrieve([self.question.question])
            messages = self.recipe.messages(self.question, docs=self.first_docs)  # type: ignore[call-arg]
        else:
            messages = self.recipe.messages(self.question)
        self.episode.prompt = [dict(m) for m in messages]
        self.messages = [dict(m) for m in messages]

    async def run(self) -> None:
        await self.start()
        # A recipe's own cap (EVO-RAG's T_max) bounds the run too: its scheduler is defined up to it.
        shape = self.opts.shape
        cap = min(shape.max_steps, getattr(self.recipe, "max_steps", shape.max_steps))
        for t in range(1, cap + 1):
            remaining = shape.token_budget - self.used
            if remaining <= 0:
                self.episode.outcome = "token_budget"
                return
            max_tokens = min(shape.max_new_tokens_per_step, remaining)
            completion = await self.generate(max_tokens)
            if self.opts.logprobs:
                self.episode.meta.setdefault("logprobs", []).append(completion.logprobs)
            self.episode.meta.setdefault("finish_reasons", []).append(completion.finish_reason)
            if completion.finish_reason == "length" and not getattr(self.recipe, "accept_truncated", False):
                action = Action("format_error", error=f"segment cut at max_tokens={max_tokens}")
                if max_tokens < shape.max_new_tokens_per_step:
                    self.record(t, completion.text, action)
                    self.episode.outcome = "token_budget"
                    return
            else:
                action = self.parse(completion.text)
            if await self.act(t, completion.text, action):
                return

    async def timed(self) -> Episode:
        """:meth:`run` within ``timeout_s`` (else outcome ``timeout``); the episode, with its total
        seconds and the tokens it used."""
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.opts.timeout_s):
                await self.run()
        except TimeoutError:
            self.episode.outcome = "timeout"
        self.episode.timings["total"] = time.perf_counter() - start
        self.episode.meta["tokens"] = self.used
        return self.episode

    def parse(self, text: str) -> Action:
        """The recipe's parse, or its ``parse_after_information`` right after an information turn."""
        after = getattr(self.recipe, "parse_after_information", None)
        return after(text) if after is not None and self.after_information else self.recipe.parse(text)

    async def act(self, t: int, text: str, action: Action) -> bool:
        """Apply one parsed action; True when the episode is over."""
        if action.kind == "search" and not action.queries:
            action = Action("format_error", error="search action without queries")
        if action.kind != "format_error":
            self.after_information = action.kind == "search"
        step = self.record(t, text, action)
        if action.kind == "search":
            step.docs = await self.retrieve(action.queries)
            step.information = self.recipe.information(step.docs)
            self.search_starts.append(len(self.messages))
            self.messages.append({"role": "assistant", "content": text})
            self.messages.append({"role": "user", "content": step.information})
            return False
        if action.kind == "backtrack":
            if self.search_starts:
                del self.messages[self.search_starts.pop() :]
            else:
                step.error = "nothing to backtrack: no search step in the conversation"
            return False
        retry = getattr(self.recipe, "retry_message", "") if action.kind == "format_error" else ""
        if retry:  # the recipe's retry text is injected (mask 0) and the episode goes on
            step.information = retry
            self.messages.append({"role": "assistant", "content": text})
            self.messages.append({"role": "user", "content": retry})
            return False
        if action.kind == "format_error" and not getattr(self.recipe, "end_on_format_error", True):
            self.messages.append({"role": "assistant", "content": text})
            return False
        self.episode.outcome = action.kind
        self.episode.final_answer = action.answer
        self.episode.refused = action.kind == "refuse"
        return True

    def record(self, t: int, text: str, action: Action) -> Step:
        step = Step(
            t=t,
            action=action.kind,
            text=text,
            queries=list(action.queries),
            query_kinds=list(action.query_kinds) or ["search"] * len(action.queries),
            answer=action.answer,
            error=action.error,
        )
        if t == 1 and self.first_docs is not None:
            step.queries = [self.question.question, *step.queries]
            step.query_kinds = ["search", *step.query_kinds]
            step.docs = list(self.first_docs)
        self.episode.steps.append(step)
        return step


async def run_episode(
    recipe: AgentRecipe,
    question: Question,
    llm: ChatModel,
    retriever: Searcher,
    collection: str,
    *,
    sample: int = 0,
    **options: Any,
) -> Episode:
    """Run one episode of ``recipe`` on ``question``; never raises on model output.

    Args:
        collection: the retriever collection to search.
        sample: index of this sample among a question's group; with ``seed`` set, each request
            uses ``seed + sample`` so a group's samples differ reproducibly.
        options: the fields of :class:`RunOptions`: ``shape`` (the episode's
            :class:`~hoprl.domain.EpisodeShape`: steps, tokens a step, budget, temperature, documents
            a search, stop strings, search mode) and the caller's ``top_p``, ``seed``, ``timeout_s``,
            ``logprobs``.

    Retriever and model transport errors propagate: a rollout without its evidence is not an
    episode to train on.
    """
    opts = RunOptions(**options)
    ep = await _Run(recipe, question, llm, retriever, collection, opts, sample).timed()
    log.debug("episode %s/%d: %s after %d steps", question.id, sample, ep.outcome, len(ep.steps))
    return ep


async def run_episodes(
    recipe: AgentRecipe,
    questions: Sequence[Question],
    llm: ChatModel,
    retriever: Searcher,
    collection: str,
    *,
    n_samples: int = 1,
    concurrency: int = 8,
    **options: Any,
) -> list[Episode]:
    """``n_samples`` episodes per question, at most ``concurrency`` at a time.

    Returned question-major: the samples of a question are contiguous (a GRPO group), in
    ``sample`` order.
    """
    semaphore = asyncio.Semaphore(concurrency)

    async def one(question: Question, sample: int) -> Episode:
        async with semaphore:
            return await run_episode(recipe, question, llm, retriever, collection, sample=sample, **options)

    return list(await asyncio.gather(*(one(q, s) for q in questions for s in range(n_samples))))
