"""The policy's agent work: ``/v1/answer`` and ``/v1/rollouts`` run recipes in-process.

Episodes talk to the service's own engine through :class:`hoprl.generation.chat.EngineChat`
(LLMClient's ``chat()`` without HTTP to itself), so an episode served here equals one run against
the service over HTTP.

``/v1/answer`` decodes each step under the recipe's action grammar
(:class:`hoprl.generation.chat.Constraint`; ``POLICY_CONSTRAINED_DECODING``, on by default, or the
request's ``constrained``), so every step parses to an action. ``/v1/rollouts`` never does:
training must see the policy's own mistakes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import openai
from pydantic import ValidationError

from hoprl.agent.runner import run_episode
from hoprl.agent.tokens import to_token_trajectory
from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Episode, EpisodeShape, Question, TokenTrajectory
from hoprl.generation.chat import Constraint, EngineChat, chat_tokens
from hoprl.generation.engines import Engine, Generation
from hoprl.recipes import RECIPES, get_recipe
from hoprl.schemas.policy import AnswerRequest, AnswerResponse, Citation, Rollout, RolloutRequest, Timings
from services.errors import ApiError
from services.policy.settings import PolicySettings

T = TypeVar("T")


class Policy:
    """The service's state: settings, the engine, the retriever client and the admission count."""

    def __init__(self, settings: PolicySettings, engine: Engine) -> None:
        self.settings, self.engine = settings, engine
        self.retriever = AsyncRetrieverClient(settings.retriever_url, timeout=settings.request_timeout_s)
        self.in_flight = 0

    @property
    def model_id(self) -> str:
        return self.settings.served_model_name or self.engine.model_path.rstrip("/").split("/")[-1]

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """Count a generation request in; beyond ``max_concurrent_generations`` answer 429."""
        if self.in_flight >= self.settings.max_concurrent_generations:
            raise ApiError(
                429, "busy", f"{self.in_flight} generation requests in flight, the limit is "
                f"{self.settings.max_concurrent_generations} (POLICY_MAX_CONCURRENT_GENERATIONS); "
                "retry later",
            )  # fmt: skip
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        await self.retriever.aclose()

    # -- validation ----------------------------------------------------------------------------
    def recipe(self, name: str, config: dict[str, Any] | None = None) -> Any:
        if name not in RECIPES:
            raise ApiError(
                422, "unknown_recipe", f"unknown recipe {name!r}; valid recipes: {sorted(RECIPES)}"
            )
        try:
            return get_recipe(name, **(config or {}))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ApiError(409, "invalid_recipe_config", f"recipe_config for {name}: {problems}") from None

    async def check_collection(self, name: str) -> None:
        """Ask the retriever whether ``name`` exists: 404 naming it if not, 503 if it does not answer."""
        try:
            response = await self.retriever.http.get(f"/v1/collections/{quote(name, safe='')}")
        except httpx.TransportError as exc:
            raise ApiError(503, "retriever_unavailable", f"the retriever did not answer: {exc}") from None
        if response.status_code == 404:
            raise ApiError(
                404, "collection_not_found",
                f"collection {name!r} does not exist in the retriever at {self.settings.retriever_url}; "
                "index documents into it first",
            )  # fmt: skip
        if response.status_code in (401, 403):  # the services run with different HOPRL_API_KEYs
            raise ApiError(
                502, "retriever_error",
                f"the retriever at {self.settings.retriever_url} refused this service's HOPRL_API_KEY "
                f"(HTTP {response.status_code}); give both services the same key",
            )  # fmt: skip
        if response.status_code >= 400:
            message = response.json().get("message", response.text)
            raise ApiError(422, "invalid_collection", f"collection {name!r}: {message}")

    def bounded(self, name: str, value: int, limit: int, setting: str) -> int:
        if value > limit:
            raise ApiError(422, f"{name}_too_large", f"{name}={value} exceeds the limit {limit} ({setting})")
        return value

    # -- episodes ------------------------------------------------------------------------------
    async def episode(
        self, recipe: Any, question: Question, collection: str, chat: EngineChat, **options: Any
    ) -> Episode:
        """One episode; retriever failures become 5xx JSON answers, model output never fails it."""
        try:
            return await run_episode(recipe, question, chat, self.retriever, collection, **options)
        except httpx.TransportError as exc:
            raise ApiError(503, "retriever_unavailable", f"the retriever did not answer: {exc}") from None
        except ServiceError as exc:
            raise ApiError(502, "retriever_error", f"the retriever answered {exc}") from None
        except openai.APIError as exc:  # engine=openai: the remote model server failed a step
            raise ApiError(
                502, "engine_error", f"the model server at {self.settings.openai_base_url} failed: {exc}"
            ) from None

    async def answer(self, body: AnswerRequest) -> AnswerResponse:
        s = self.settings
        question = body.question.strip()
        if not question:
            raise ApiError(422, "empty_question", "question is empty; send at least one word")
        self.bounded("question_chars", len(question), s.max_question_chars, "POLICY_MAX_QUESTION_CHARS")
        recipe = self.recipe(body.recipe or s.default_recipe, body.recipe_config)
        if body.max_steps is not None:
            self.bounded("max_steps", body.max_steps, s.max_steps, "POLICY_MAX_STEPS")
        shape, limited = self.answer_shape(body)
        chars = len(question) + sum(len(p.title) + len(p.text) for p in body.paragraphs)
        self.bounded("prompt_chars", chars, s.max_prompt_chars, "POLICY_MAX_PROMPT_CHARS")
        collection = body.collection or s.default_collection
        await self.check_collection(collection)
        q = Question(
            id=uuid.uuid4().hex, dataset="api", split="serve", question=question, paragraphs=body.paragraphs
        )
        constraint = self.constraint(body, recipe, shape)
        chat = EngineChat(self.engine, deadline=time.monotonic() + s.request_timeout_s, constraint=constraint)
        with self.admitted():
            run = self.episode(recipe, q, collection, chat, shape=shape, top_p=body.top_p, seed=body.seed)
            ep = await within(s.request_timeout_s, run)
        return AnswerResponse(
            answer=ep.final_answer,
            refused=ep.refused,
            citations=citations(ep, recipe, q),
            steps=ep.steps if body.return_trace else None,
            timings=Timings(
                retrieval_s=ep.timings.get("retrieval", 0.0),
                generation_s=ep.timings.get("generation", 0.0),
                total_s=ep.timings.get("total", 0.0),
            ),
            recipe=recipe.name,
            outcome=ep.outcome,
            model=self.model_id,
            constrained=bool(chat.grammars) and None not in chat.grammars,
            grammar=chat.grammars[0] if chat.grammars and None not in chat.grammars else None,
            shape=shape.model_copy(update={"grammar": constraint is not None}),
            limited=limited,
        )

    def answer_shape(self, body: AnswerRequest) -> tuple[EpisodeShape, list[str]]:
        """The episode an answer runs: the request's shape (a protocol's), else the service's
        (:meth:`PolicySettings.serving_shape`), with the request's own ``max_steps``, ``temperature``
        and ``constrained`` over it; then each limit above the service's lowered to it, named in the
        returned list."""
        s = self.settings
        update: dict[str, Any] = {}
        if body.max_steps is not None:
            update["max_steps"] = body.max_steps
        if body.shape is None or "temperature" in body.model_fields_set:
            update["temperature"] = body.temperature
        if body.constrained is not None:
            update["grammar"] = body.constrained
        shape = (body.shape or s.serving_shape()).model_copy(update=update)
        limited = []
        for name, cap, setting in (
            ("max_steps", s.max_steps, "POLICY_MAX_STEPS"),
            ("max_new_tokens_per_step", s.max_new_tokens_per_step, "POLICY_MAX_NEW_TOKENS_PER_STEP"),
            ("token_budget", s.token_budget, "POLICY_TOKEN_BUDGET"),
        ):
            if getattr(shape, name) > cap:
                limited.append(f"{name} {getattr(shape, name)} -> {cap} ({setting})")
                shape = shape.model_copy(update={name: cap})
        return shape, limited

    def constraint(self, body: AnswerRequest, recipe: Any, shape: EpisodeShape) -> Constraint | None:
        """The grammar constraint of an answer's ``shape`` (its ``grammar``: the request's
        ``constrained``, else the shape's, else the setting, on by default); an engine that cannot
        constrain serves free unless the request asks."""
        if not shape.grammar:
            return None
        if not self.engine.constrains:
            if body.constrained:
                raise ApiError(
                    422, "constraint_unsupported",
                    f"the {self.settings.engine} engine cannot constrain decoding to a grammar; "
                    "send constrained=false",
                )  # fmt: skip
            return None
        cap = min(shape.max_steps, getattr(recipe, "max_steps", shape.max_steps))
        return Constraint(
            recipe.name,
            cap,
            shape.max_new_tokens_per_step,
            shape.token_budget,
            chat_tokens(self.engine.tokenizer),
        )

    async def rollouts(self, body: RolloutRequest) -> list[Rollout]:
        s, sp = self.settings, body.sampling
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ApiError(422, "no_tokenizer", "rollouts need a tokenizer: set POLICY_TOKENIZER")
        recipe = self.recipe(body.recipe)
        total = len(body.questions) * body.n_samples
        if total > s.max_rollouts:  # 422 when one factor breaks the published schema, else 409
            over = max(len(body.questions), body.n_samples) > s.max_rollouts
            raise ApiError(
                422 if over else 409, "batch_too_large",
                f"{total} episodes (questions x n_samples) in one request; the limit is {s.max_rollouts} "
                "(POLICY_MAX_ROLLOUTS)",
            )  # fmt: skip
        for q in body.questions:  # a question's own paragraphs enter its prompt (ARENA's references)
            self.bounded("question_chars", len(q.question), s.max_question_chars, "POLICY_MAX_QUESTION_CHARS")
            chars = len(q.question) + sum(len(p.title) + len(p.text) for p in q.paragraphs)
            self.bounded("prompt_chars", chars, s.max_prompt_chars, "POLICY_MAX_PROMPT_CHARS")
        shape = sp.shape
        self.bounded("max_new_tokens_per_step", shape.max_new_tokens_per_step, s.max_new_tokens_per_step,
                     "POLICY_MAX_NEW_TOKENS_PER_STEP")  # fmt: skip
        self.bounded("max_steps", shape.max_steps, s.max_steps, "POLICY_MAX_STEPS")
        self.bounded("token_budget", shape.token_budget, s.token_budget, "POLICY_TOKEN_BUDGET")
        await self.check_collection(body.collection)
        deadline = time.monotonic() + s.request_timeout_s
        options = {"shape": shape, "top_p": sp.top_p, "seed": sp.seed}

        async def one(question: Question, sample: int) -> Rollout:
            chat = EngineChat(self.engine, deadline=deadline, logprobs=True)
            ep = await self.episode(recipe, question, body.collection, chat, sample=sample, **options)
            traj = to_token_trajectory(ep, tokenizer)
            traj.logprobs = aligned_logprobs(traj, ep, chat.calls)
            return Rollout(episode=ep, trajectory=traj)

        with self.admitted():
            jobs = [one(q, i) for q in body.questions for i in range(body.n_samples)]
            return list(await within(s.request_timeout_s, asyncio.gather(*jobs)))


def citations(episode: Episode, recipe: Any = None, question: Question | None = None) -> list[Citation]:
    """What the answer cites: a recipe's ``cited_sources`` hook where it has one (ARENA: the
    references named in ``<relevance>``), else every document the episode retrieved, first
    occurrence first."""
    cited = getattr(recipe, "cited_sources", None)
    if cited is not None and question is not None:
        return [Citation(doc_id=doc_id, title=title) for doc_id, title in cited(episode, question)]
    seen: dict[str, Citation] = {}
    for step in episode.steps:
        for docs in step.docs:
            for d in docs:
                seen.setdefault(d.id, Citation(doc_id=d.id, title=d.title))
    return list(seen.values())


def aligned_logprobs(traj: TokenTrajectory, episode: Episode, calls: list[Generation]) -> list[float] | None:
    """Per completion token: the engine's log-prob on mask-1 tokens, 0.0 elsewhere.

    The trajectory's tokens are the canonical tokenization of the episode's text; they carry the
    engine's log-probs only where each step's tokens are exactly the ids the engine generated
    (not so when a stop text was re-appended that the model did not emit, or when the model chose
    a non-canonical tokenization). Otherwise ``None``: the trainer recomputes them.
    """
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(traj.mask):
        if m and (not runs or runs[-1][1] != i):
            runs.append((i, i + 1))
        elif m:
            runs[-1] = (runs[-1][0], i + 1)
    generated = [g for g, step in zip(calls, episode.steps, strict=False) if step.text]
    if len(calls) != len(episode.steps) or len(runs) != len(generated):
        return None
    out = [0.0] * len(traj.completion_ids)
    for (start, end), gen in zip(runs, generated, strict=True):
        if gen.logprobs is None or traj.completion_ids[start:end] != gen.token_ids:
            return None
        out[start:end] = gen.logprobs
    return out


async def within(seconds: float, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, or 504 with a JSON body once ``seconds`` have passed."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise ApiError(
            504, "timeout", f"the request took longer than {seconds:g} s (POLICY_REQUEST_TIMEOUT_S)"
        ) from None
