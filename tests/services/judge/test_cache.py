"""The verdict cache on both stores: the real Redis on 127.0.0.1:6379 and the in-process LRU.

A cache hit is proven by the scripted LLM's request count: the second identical call must not
reach the model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from hoprl.clients.judge import JudgeClient
from hoprl.schemas.judge import AnswerableItem, AnswerItem
from services.judge.cache import MemoryCache, cache_key

from .conftest import REDIS_URL, ScriptedLLM, judge_service, llm_judge

ITEMS = [
    AnswerItem(question="Where was Jane Roe born?", prediction="Paris, France", references=["Paris"]),
    AnswerItem(question="Where was Jane Roe born?", prediction="Lyon", references=["Paris"]),
]


@pytest.fixture(params=["memory", "redis"])
def cache_settings(request: pytest.FixtureRequest) -> Iterator[dict[str, object]]:
    """Judge settings for one cache store (Redis under a key prefix unique to the test)."""
    if request.param == "memory":
        yield {}
    else:
        yield {"redis_url": REDIS_URL, "cache_prefix": request.getfixturevalue("redis_prefix")}


def test_second_identical_call_is_cached_and_skips_the_llm(cache_settings: dict[str, object]) -> None:
    llm = ScriptedLLM({"Predicted answer: Paris, France": "YES"}, default="NO")
    with llm_judge(llm, **cache_settings) as url, JudgeClient(url) as client:
        first = client.answer(ITEMS)
        assert len(llm.requests) == 2
        second = client.answer(ITEMS)
        assert len(llm.requests) == 2  # no new LLM call
        # a new input in the batch is the only one sent to the model
        third = client.answer([*ITEMS, AnswerItem(prediction="Paris", references=["Paris"])])
        assert len(llm.requests) == 3
    assert [v.cached for v in first] == [False, False] and [v.cached for v in second] == [True, True]
    assert [v.cached for v in third] == [True, True, False]
    strip = {"cached"}
    assert [v.model_dump(exclude=strip) for v in first] == [v.model_dump(exclude=strip) for v in second]


def test_rules_verdicts_are_cached_too(cache_settings: dict[str, object]) -> None:
    item = AnswerableItem(
        question="Where was Jane Roe born?", evidence=["Born in Paris."], references=["Paris"]
    )
    with judge_service(**cache_settings) as url, JudgeClient(url) as client:
        first, second = client.answerable([item])[0], client.answerable([item])[0]
    assert (first.cached, second.cached) == (False, True)
    assert first.model_dump(exclude={"cached"}) == second.model_dump(exclude={"cached"})


def test_the_shared_cache_outlives_a_restart_but_not_a_prompt_change(redis_prefix: str) -> None:
    """A restarted judge reuses Redis verdicts; switching prompts asks the model again."""
    llm = ScriptedLLM({"Predicted answer": "YES", "Student's answer": "Wrong"})
    shared = {"redis_url": REDIS_URL, "cache_prefix": redis_prefix}
    with llm_judge(llm, **shared) as url, JudgeClient(url) as client:
        assert client.answer(ITEMS[:1])[0].verdict is True
    with llm_judge(llm, **shared) as url, JudgeClient(url) as client:
        assert client.answer(ITEMS[:1])[0].cached is True
    with llm_judge(llm, answer_prompt="answer_validation@1", **shared) as url, JudgeClient(url) as client:
        verdict = client.answer(ITEMS[:1])[0]
    assert (verdict.verdict, verdict.cached, verdict.version) == (False, False, "answer_validation@1")
    assert len(llm.requests) == 2


def test_redis_entries_live_under_the_prefix_with_the_ttl(redis_prefix: str) -> None:
    settings = {"redis_url": REDIS_URL, "cache_prefix": redis_prefix, "cache_ttl_s": 60}
    with judge_service(**settings) as url, JudgeClient(url) as client:
        client.answer(ITEMS)
        assert client.ready()
    store = redis.Redis.from_url(REDIS_URL)
    keys = list(store.scan_iter(match=redis_prefix + "*"))
    assert len(keys) == 2
    assert all(0 < store.pttl(k) <= 60_000 for k in keys)
    store.close()


def test_readyz_names_an_unreachable_redis() -> None:
    with judge_service(redis_url="redis://127.0.0.1:9/0") as url, JudgeClient(url) as client:
        assert not client.ready()
        response = client.http.get("/readyz")
        judged = client.http.post(
            "/v1/judge/answer", json={"items": [{"prediction": "a", "references": ["a"]}]}
        )
    assert response.json()["error"] == "redis_unavailable"
    assert judged.status_code == 503 and judged.json()["error"] == "cache_unavailable"


def test_memory_cache_expires_and_evicts_least_recently_used() -> None:
    async def scenario() -> None:
        cache = MemoryCache(max_entries=2, ttl_s=0.2)
        await cache.set_many({"a": {"v": 1}, "b": {"v": 2}})
        assert await cache.get_many(["a"]) == [{"v": 1}]  # "a" is now the most recently used
        await cache.set_many({"c": {"v": 3}})
        assert await cache.get_many(["a", "b", "c"]) == [{"v": 1}, None, {"v": 3}]
        time.sleep(0.25)
        assert await cache.get_many(["a", "c"]) == [None, None]

    asyncio.run(scenario())


def test_cache_key_covers_backend_model_version_kind_and_inputs() -> None:
    base = ("openai", "m", "answer_equivalence@1", "answer", {"prediction": "x"})
    keys = {
        cache_key(*base),
        cache_key("rules", *base[1:]),
        cache_key(base[0], "other-model", *base[2:]),
        cache_key(*base[:2], "answer_validation@1", *base[3:]),
        cache_key(*base[:3], "answerable", base[4]),
        cache_key(*base[:4], {"prediction": "y"}),
    }
    assert len(keys) == 6 and cache_key(*base) == cache_key(*base)
