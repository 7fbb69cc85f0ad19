"""The policy's agent work: ``/v1/answer`` and ``/v1/rollouts`` run recipes in-process.

The episode runner (:mod:`hoprl.agent.runner`) talks to a model through ``chat()``; here that is
:class:`EngineChat`, an adapter with :class:`hoprl.clients.llm.LLMClient`'s signature that calls the
service's own engine instead of HTTP to itself. It restores stop text by the client's rule, so an
episode served here equals one run against the service over HTTP.

``/v1/answer`` decodes each step under the recipe's action grammar (:class:`Constraint`,
:mod:`hoprl.agent.grammar`; ``POLICY_CONSTRAINED_DECODING``, on by default, or the request's
``constrained``), so every step parses to an action. ``/v1/rollouts`` never does: training must
see the policy's own mistakes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import openai
from starlette.concurrency import run_in_threadpool

from hoprl.agent.grammar import Grammar, Turn, grammar
from hoprl.agent.runner import run_episode
from hoprl.agent.tokens import to_token_trajectory
from hoprl.agent.trajectory import Episode, TokenTrajectory
from hoprl.clients.http import ServiceError
from hoprl.clients.llm import Completion, restore_stop
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.recipes import RECIPES, get_recipe
from hoprl.schemas import Question
from hoprl.schemas.policy import AnswerRequest, AnswerResponse, Citation, Rollout, RolloutRequest, Timings
from services.errors import ApiError
from services.policy.engines import Engine, Generation, SamplingParams
from services.policy.settings import PolicySettings

T = TypeVar("T")


Messages = list[dict[str, str]]
_Ask = tuple[Messages, SamplingParams, "asyncio.Future[list[Generation]]"]


def completions(gens: list[Generation], stop: list[str], logprobs: bool) -> list[Completion]:
    """One prompt's generations as LLMClient's completions (stop text restored by its rule)."""
    usage = {"prompt_tokens": gens[0].prompt_tokens, "completion_tokens": sum(len(g.token_ids) for g in gens)}
    out = []
    for g in gens:
        appended = restore_stop(g.text, g.finish_reason, g.stop_reason, stop)
        lps = list(zip(g.tokens, g.logprobs, strict=True)) if logprobs and g.logprobs else None
        out.append(Completion(g.text + (appended or ""), g.finish_reason, appended, lps, usage))
    return out


def sampling_params(
    stop: list[str], max_tokens: int, temperature: float, top_p: float, seed: int | None, n: int,
    logprobs: bool, deadline: float | None = None, grammar: str | None = None,
) -> SamplingParams:  # fmt: skip
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, n=n, stop=tuple(stop),
                          seed=seed, logprobs=logprobs, deadline=deadline, grammar=grammar)  # fmt: skip


#: tokens an information turn is assumed to take before the episode has shown one
INFORMATION_GUESS = 512


@dataclass(frozen=True)
class Constraint:
    """Serve an episode under its recipe's action grammar (:mod:`hoprl.agent.grammar`).

    Args:
        recipe: the recipe's name (its grammar family).
        max_steps: the episode's step cap.
        step_tokens: the runner's full ``max_tokens`` per step (a call asking for fewer means the
            runner's token budget is nearly spent).
        token_budget: the episode's budget of context growth (the runner's ``token_budget``).
        count: tokens of a chat under the model's template.

    A step may only end the episode (the grammar's *final* turn) when it is the last allowed step,
    or when the budget could not hold this step, the documents a search would bring (as many
    tokens as the largest information turn so far) and a closing step after them: otherwise the
    runner would stop the episode for its budget with no answer.
    """

    recipe: str
    max_steps: int
    step_tokens: int
    token_budget: int
    count: Callable[[Messages], int]

    def grammar(
        self, messages: Messages, step: int, max_tokens: int, grown: int, information: int
    ) -> Grammar | None:
        """The grammar of step ``step`` (0-based) after ``messages``, the chat having ``grown`` tokens
        since its first prompt; None when even the tags do not fit in ``max_tokens`` (that step
        decodes free and the response says so)."""
        after = len(messages) >= 2 and messages[-2]["role"] == "assistant"
        try:
            final = step + 1 >= self.max_steps or max_tokens < self.step_tokens
            if not final:
                normal = grammar(self.recipe, max_tokens=max_tokens, turn=Turn(after, False))
                closing = grammar(self.recipe, max_tokens=max_tokens, turn=Turn(True, True))
                final = grown + normal.longest + information + closing.longest > self.token_budget
                if not final:
                    return normal
            return grammar(self.recipe, max_tokens=max_tokens, turn=Turn(after, True))
        except ValueError:
            return None


def chat_tokens(tokenizer: Any) -> Callable[[Messages], int]:
    """``count(messages)``: tokens of a chat under ``tokenizer``'s template, as the engine encodes it."""

    def count(messages: Messages) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


class EngineChat:
    """``await EngineChat(engine).chat(messages, stop=[...])``: LLMClient's ``chat`` on the local engine.

    Args:
        deadline: ``time.monotonic()`` after which generation stops (the request's timeout).
        logprobs: always ask the engine for log-probs (rollouts), whatever the runner asks.
        constraint: decode each step under the recipe's grammar (serving only; None = free, as
            rollouts and training always are).

    Every call's generation is kept in ``calls`` (one per runner step, in order) and the name of
    the grammar it was decoded under in ``grammars`` (None: free).
    """

    def __init__(
        self, engine: Engine, deadline: float | None = None, logprobs: bool = False,
        constraint: Constraint | None = None,
    ) -> None:  # fmt: skip
        self.engine, self.deadline, self.logprobs, self.constraint = engine, deadline, logprobs, constraint
        self.calls: list[Generation] = []
        self.grammars: list[str | None] = []
        self.sizes: list[int] = []  # tokens of the chat at each constrained call

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
    ) -> list[Completion]:
        stop = list(stop or [])
        rule = self.rule(messages, max_tokens) if self.constraint else None
        params = sampling_params(stop, max_tokens, temperature, top_p, seed, n, logprobs or self.logprobs,
                                 self.deadline, rule.lark if rule else None)  # fmt: skip
        gens = await self.generate(messages, params)
        self.calls.extend(gens)
        self.grammars.extend([rule.name if rule else None] * len(gens))
        return completions(gens, stop, logprobs)

    async def generate(self, messages: Messages, params: SamplingParams) -> list[Generation]:
        (gens,) = await run_in_threadpool(self.engine.generate, [messages], params)
        return gens

    def rule(self, messages: Messages, max_tokens: int) -> Grammar | None:
        """The constraint's grammar for the next step, from the chat's growth so far."""
        assert self.constraint is not None
        self.sizes.append(self.constraint.count(messages))
        turns = zip(self.sizes, self.sizes[1:], self.calls, strict=False)
        information = max((after - before - len(g.token_ids) for before, after, g in turns), default=0)
        grown = self.sizes[-1] - self.sizes[0]
        step = len(self.calls)
        return self.constraint.grammar(messages, step, max_tokens, grown, max(information, INFORMATION_GUESS))


class Lockstep:
    """The model calls of a fixed set of concurrent episodes, decoded in rounds in episode order.

    A round waits until every live episode has asked for its next turn (or ended), then decodes
    all those asks, sorted by episode index, with one engine call per set of sampling parameters.
    Which prompts share a batch then depends on the episodes alone, never on timing (retrieval
    latency, thread scheduling), so greedy decoding is exactly repeatable. The engine's own
    first-come batching is not: padding to another batch's width changes the rounding, which
    flips near-ties (5 of 100 greedy dev answers differed between two processes).

        rounds = Lockstep(engine, len(questions))
        episodes = await asyncio.gather(*(
            rounds.run(i, run_episode(recipe, q, rounds.chat(i), retriever, collection))
            for i, q in enumerate(questions)
        ))
    """

    def __init__(self, engine: Engine, episodes: int) -> None:
        self.engine = engine
        self.live = set(range(episodes))
        self.asks: dict[int, _Ask] = {}
        self.rounds: list[list[int]] = []  # the episodes decoded in each round, in order
        self.decoding: asyncio.Task[None] | None = None

    def chat(self, episode: int) -> _LockstepChat:
        """Episode ``episode``'s model: a ChatModel whose calls wait for their round."""
        return _LockstepChat(self, episode)

    async def run(self, episode: int, work: Awaitable[T]) -> T:
        """Await ``work`` (the episode); when it ends, however, later rounds stop waiting for it."""
        try:
            return await work
        finally:
            self.live.discard(episode)
            self._maybe_start()

    async def ask(self, episode: int, messages: Messages, params: SamplingParams) -> list[Generation]:
        future: asyncio.Future[list[Generation]] = asyncio.get_running_loop().create_future()
        self.asks[episode] = (messages, params, future)
        self._maybe_start()
        return await future

    def _maybe_start(self) -> None:
        if self.asks and len(self.asks) >= len(self.live) and self.decoding is None:
            asks, self.asks = sorted(self.asks.items()), {}
            self.rounds.append([i for i, _ in asks])
            self.decoding = asyncio.get_running_loop().create_task(self._decode(asks))

    async def _decode(self, asks: list[tuple[int, _Ask]]) -> None:
        try:
            await self._decode_groups(asks)
        finally:
            self.decoding = None
            self._maybe_start()  # the episodes that asked again while this round decoded

    async def _decode_groups(self, asks: list[tuple[int, _Ask]]) -> None:
        groups: dict[SamplingParams, list[tuple[Messages, asyncio.Future[list[Generation]]]]] = {}
        for _, (messages, params, future) in asks:
            groups.setdefault(params, []).append((messages, future))
        for params, group in groups.items():
            try:
                results = await run_in_threadpool(self.engine.generate, [m for m, _ in group], params)
            except Exception:  # one bad prompt (too long, empty) must not fail its round-mates
                results = None
            for k, (messages, future) in enumerate(group):
                if results is not None:
                    future.set_result(results[k])
                    continue
                try:  # alone, in order: still independent of timing
                    (gens,) = await run_in_threadpool(self.engine.generate, [messages], params)
                    future.set_result(gens)
                except Exception as exc:
                    future.set_exception(exc)


async def lockstep_episodes(
    recipe: Any,
    questions: list[Question],
    engine: Engine,
    retriever: AsyncRetrieverClient,
    collection: str,
    **options: Any,
) -> list[Episode]:
    """One episode per question, all at once, decoded in :class:`Lockstep` rounds (``options``:
    :func:`hoprl.agent.runner.run_episode`'s): with ``temperature=0`` the same checkpoint gives
    the same episodes in any process, whatever the retriever's latency."""
    rounds = Lockstep(engine, len(questions))
    return list(
        await asyncio.gather(*(
            rounds.run(i, run_episode(recipe, q, rounds.chat(i), retriever, collection, **options))
            for i, q in enumerate(questions)
        ))
    )  # fmt: skip


class _LockstepChat(EngineChat):
    """One episode's view of a :class:`Lockstep` (the runner's ChatModel): its calls wait for their round."""

    def __init__(self, rounds: Lockstep, episode: int) -> None:
        super().__init__(rounds.engine)
        self.rounds, self.episode = rounds, episode

    async def generate(self, messages: Messages, params: SamplingParams) -> list[Generation]:
        return await self.rounds.ask(self.episode, messages, params)


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
    def recipe(self, name: str) -> Any:
        if name not in RECIPES:
            raise ApiError(
                422, "unknown_recipe", f"unknown recipe {name!r}; valid recipes: {sorted(RECIPES)}"
            )
        return get_recipe(name)

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
        recipe = self.recipe(body.recipe or s.default_recipe)
        max_steps = self.bounded("max_steps", body.max_steps or s.max_steps, s.max_steps, "POLICY_MAX_STEPS")
        collection = body.collection or s.default_collection
        await self.check_collection(collection)
        q = Question(id=uuid.uuid4().hex, dataset="api", split="serve", question=question)
        constraint = self.constraint(body, recipe, max_steps)
        chat = EngineChat(self.engine, deadline=time.monotonic() + s.request_timeout_s, constraint=constraint)
        with self.admitted():
            run = self.episode(
                recipe, q, collection, chat, max_steps=max_steps, temperature=0.0,
                max_new_tokens_per_step=s.max_tokens_per_step, token_budget=s.token_budget,
            )  # fmt: skip
            ep = await within(s.request_timeout_s, run)
        return AnswerResponse(
            answer=ep.final_answer,
            refused=ep.refused,
            citations=citations(ep),
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
        )

    def constraint(self, body: AnswerRequest, recipe: Any, max_steps: int) -> Constraint | None:
        """The grammar constraint of an answer request: the request's ``constrained``, else the
        setting (on by default); an engine that cannot constrain serves free unless the request asks."""
        wanted = self.settings.constrained_decoding if body.constrained is None else body.constrained
        if not wanted:
            return None
        if not self.engine.constrains:
            if body.constrained:
                raise ApiError(
                    422, "constraint_unsupported",
                    f"the {self.settings.engine} engine cannot constrain decoding to a grammar; "
                    "send constrained=false",
                )  # fmt: skip
            return None
        cap = min(max_steps, getattr(recipe, "max_steps", max_steps))
        s = self.settings
        return Constraint(
            recipe.name, cap, s.max_tokens_per_step, s.token_budget, chat_tokens(self.engine.tokenizer)
        )

    async def rollouts(self, body: RolloutRequest) -> list[Rollout]:
        s, sp = self.settings, body.sampling
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ApiError(422, "no_tokenizer", "rollouts need a tokenizer: set POLICY_TOKENIZER")
        recipe = self.recipe(body.recipe)
        total = len(body.questions) * body.n_samples
        if total > s.max_rollouts:
            raise ApiError(
                413, "batch_too_large",
                f"{total} episodes (questions x n_samples) in one request; the limit is {s.max_rollouts} "
                "(POLICY_MAX_ROLLOUTS)",
            )  # fmt: skip
        for q in body.questions:  # a question's own paragraphs enter its prompt (ARENA's references)
            self.bounded("question_chars", len(q.question), s.max_question_chars, "POLICY_MAX_QUESTION_CHARS")
            chars = len(q.question) + sum(len(p.title) + len(p.text) for p in q.paragraphs)
            self.bounded("prompt_chars", chars, s.max_prompt_chars, "POLICY_MAX_PROMPT_CHARS")
        self.bounded("max_tokens", sp.max_tokens, s.max_tokens_per_step, "POLICY_MAX_TOKENS_PER_STEP")
        self.bounded("max_steps", sp.max_steps, s.max_steps, "POLICY_MAX_STEPS")
        budget = self.bounded(
            "token_budget", sp.token_budget or s.token_budget, s.token_budget, "POLICY_TOKEN_BUDGET"
        )
        await self.check_collection(body.collection)
        deadline = time.monotonic() + s.request_timeout_s
        options = {
            "max_steps": sp.max_steps, "max_new_tokens_per_step": sp.max_tokens, "token_budget": budget,
            "temperature": sp.temperature, "top_p": sp.top_p, "seed": sp.seed, "search_mode": sp.search_mode,
        }  # fmt: skip

        async def one(question: Question, sample: int) -> Rollout:
            chat = EngineChat(self.engine, deadline=deadline, logprobs=True)
            ep = await self.episode(recipe, question, body.collection, chat, sample=sample, **options)
            traj = to_token_trajectory(ep, tokenizer)
            traj.logprobs = aligned_logprobs(traj, ep, chat.calls)
            return Rollout(episode=ep, trajectory=traj)

        with self.admitted():
            jobs = [one(q, i) for q in body.questions for i in range(body.n_samples)]
            return list(await within(s.request_timeout_s, asyncio.gather(*jobs)))


def citations(episode: Episode) -> list[Citation]:
    """Every document the episode retrieved, first occurrence first."""
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
