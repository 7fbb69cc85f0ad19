"""Lock-step decoding: concurrent episodes' model calls in rounds, in episode order (repeatable greedy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from anyio import to_thread

from hoprl.agent.runner import run_episode
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Episode, Question
from hoprl.generation.chat import EngineChat, Messages, _Ask
from hoprl.generation.engines import Engine, Generation, SamplingParams

T = TypeVar("T")


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

    def chat(self, episode: int, **options: Any) -> _LockstepChat:
        """Episode ``episode``'s model: a ChatModel whose calls wait for their round (``options``:
        :class:`EngineChat`'s, e.g. the serving ``deadline`` and ``constraint``)."""
        return _LockstepChat(self, episode, **options)

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
                results = await to_thread.run_sync(self.engine.generate, [m for m, _ in group], params)
            except Exception:  # one bad prompt (too long, empty) must not fail its round-mates
                results = None
            for k, (messages, future) in enumerate(group):
                if results is not None:
                    future.set_result(results[k])
                    continue
                try:  # alone, in order: still independent of timing
                    (gens,) = await to_thread.run_sync(self.engine.generate, [messages], params)
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

    def __init__(self, rounds: Lockstep, episode: int, **options: Any) -> None:
        super().__init__(rounds.engine, **options)
        self.rounds, self.episode = rounds, episode

    async def generate(self, messages: Messages, params: SamplingParams) -> list[Generation]:
        return await self.rounds.ask(self.episode, messages, params)
