"""Lock-step decoding: each round holds every live episode, in episode order, whatever the timing.

The real default model decodes. Random pauses (and, for whole episodes, the live retriever behind
a client that answers after a random delay) make the episodes reach the model in another order on
each run.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest

from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import EpisodeShape, Question
from hoprl.generation.engines import Generation, Prompt, SamplingParams
from hoprl.generation.lockstep import Lockstep, lockstep_episodes
from hoprl.generation.transformers_engine import TransformersEngine
from hoprl.recipes import get_recipe

from .conftest import COLLECTION

QUESTIONS = [
    Question(id=f"q{i}", dataset="tiny", split="dev", question=q, answers=[a])
    for i, (q, a) in enumerate([
        ("Who founded Acme Records?", "Jane Roe"),
        ("Where was the founder of Acme Records born?", "Velmora"),
        ("What is the capital of Ostland?", "Velmora"),
        ("Which river flows through Velmora?", "Ansk"),
        ("How long is the river through the capital of Ostland?", "412 km"),
    ])
]  # fmt: skip
OPTIONS = {"shape": EpisodeShape(max_steps=4, max_new_tokens_per_step=24, token_budget=160, temperature=0.0)}
CHAT = [{"role": "user", "content": "Name three colors."}]


class CountingEngine(TransformersEngine):
    """The real engine, noting how many prompts each ``generate`` call decodes together."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.calls: list[int] = []

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append(len(prompts))
        return super().generate(prompts, params)


class JitteryRetriever(AsyncRetrieverClient):
    """The live retriever, answering each search after a random delay of up to 0.3 s."""

    def __init__(self, url: str, seed: int) -> None:
        super().__init__(url)
        self.random = random.Random(seed)

    async def search(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(self.random.uniform(0, 0.3))
        return await super().search(*args, **kwargs)


@pytest.fixture(scope="module")
def engine(model_path: str) -> CountingEngine:
    return CountingEngine(model_path)


def conversations(engine: CountingEngine, seed: int) -> tuple[list[list[str]], list[list[int]]]:
    """Six episodes of 1-3 greedy turns (episode i takes i % 3 + 1), each turn after a random pause
    (the stand-in for retrieval); every episode's replies, and the rounds."""
    pause = random.Random(seed)

    async def episode(rounds: Lockstep, i: int) -> list[str]:
        messages, replies = [{"role": "user", "content": f"Count from {i} to {i + 5}."}], []
        for _ in range(i % 3 + 1):
            await asyncio.sleep(pause.uniform(0, 0.2))
            (reply,) = await rounds.chat(i).chat(messages, max_tokens=6, temperature=0.0)
            replies.append(reply.text)
            messages += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "Go on."}]
        return replies

    async def run() -> tuple[list[list[str]], list[list[int]]]:
        rounds = Lockstep(engine, 6)
        found = await asyncio.gather(*(rounds.run(i, episode(rounds, i)) for i in range(6)))
        return list(found), rounds.rounds

    return asyncio.run(run())


def test_rounds_hold_every_live_episode_in_order(engine: CountingEngine) -> None:
    engine.calls.clear()
    replies, rounds = conversations(engine, seed=1)
    assert rounds == [[0, 1, 2, 3, 4, 5], [1, 2, 4, 5], [2, 5]]
    assert engine.calls == [6, 4, 2]  # one batch a round: the pauses never split one
    assert [len(r) for r in replies] == [1, 2, 3, 1, 2, 3]


def test_greedy_replies_repeat_whatever_the_timing(engine: CountingEngine) -> None:
    engine.calls.clear()
    first = conversations(engine, seed=1)
    again = conversations(engine, seed=2)
    assert again == first and engine.calls == [6, 4, 2] * 2


def test_lockstep_episodes_repeat_whatever_the_retrieval_latency(
    engine: CountingEngine, indexed: str
) -> None:
    async def run(seed: int) -> list[Any]:
        retriever = JitteryRetriever(indexed, seed)
        try:
            return await lockstep_episodes(get_recipe("naive-rag"), QUESTIONS, engine, retriever, COLLECTION,
                                           **OPTIONS)  # fmt: skip
        finally:
            await retriever.aclose()

    first, again = asyncio.run(run(1)), asyncio.run(run(2))
    assert [e.retrieval_count for e in first] == [1] * len(QUESTIONS)  # naive-rag: the question, once
    assert [e.question_id for e in first] == [q.id for q in QUESTIONS]
    docs = [[[(d.id, d.score) for d in docs] for s in e.steps for docs in s.docs] for e in first]
    docs_again = [[[(d.id, d.score) for d in docs] for s in e.steps for docs in s.docs] for e in again]
    assert docs_again == docs
    assert [[s.text for s in e.steps] for e in again] == [[s.text for s in e.steps] for e in first]


def test_a_prompt_that_fails_does_not_fail_its_round_mates(engine: CountingEngine) -> None:
    too_long = [{"role": "user", "content": "word " * 9000}]  # beyond SmolLM2's 8,192-token context

    async def run() -> list[Any]:
        rounds = Lockstep(engine, 2)
        ask = {"max_tokens": 8, "temperature": 0.0}
        return await asyncio.gather(
            rounds.run(0, rounds.chat(0).chat(CHAT, **ask)),
            rounds.run(1, rounds.chat(1).chat(too_long, **ask)),
            return_exceptions=True,
        )

    ok, failed = asyncio.run(run())
    assert isinstance(failed, ValueError) and "context" in str(failed)
    (alone,) = engine.generate([CHAT], SamplingParams(max_tokens=8, temperature=0))[0]
    assert ok[0].text == alone.text
