"""Verdict cache: Redis when ``JUDGE_REDIS_URL`` is set, else an in-process LRU with a TTL.

A verdict is stored under ``sha256(backend, model, prompt version, kind, inputs)``, so changing
the model or the prompt version never serves a stale verdict. Only verdicts the configured
backend produced are stored; a rules fallback after an LLM failure is not, so the LLM is asked
again once it recovers.

>>> cache_key("rules", "", "rules@1", "answer", {"prediction": "x"})[:12]
'0c9f05089acc'
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from typing import Any, Protocol

import redis.asyncio as aioredis

from services.judge.settings import JudgeSettings


def cache_key(backend: str, model: str, version: str, kind: str, inputs: dict[str, Any]) -> str:
    """Stable hex digest of everything that determines a verdict."""
    payload = {"backend": backend, "model": model, "version": version, "kind": kind, "inputs": inputs}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class VerdictCache(Protocol):
    """What the routes need: batched get and set of JSON-able verdicts."""

    name: str

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]: ...

    async def set_many(self, entries: dict[str, dict[str, Any]]) -> None: ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


class MemoryCache:
    """Least-recently-used dict with a time to live; per process, lost on restart."""

    name = "memory"

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self.entries: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    def _get(self, key: str) -> dict[str, Any] | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if time.monotonic() >= expires:
            del self.entries[key]
            return None
        self.entries.move_to_end(key)
        return value

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        return [self._get(k) for k in keys]

    async def set_many(self, entries: dict[str, dict[str, Any]]) -> None:
        expires = time.monotonic() + self.ttl_s
        for key, value in entries.items():
            self.entries[key] = (expires, value)
            self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        self.entries.clear()


class RedisCache:
    """Verdicts as JSON strings under ``prefix + key``, expiring after ``ttl_s`` (shared by replicas)."""

    name = "redis"

    def __init__(self, url: str, prefix: str, ttl_s: float) -> None:
        self.redis = aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.prefix, self.ttl_ms = prefix, max(1, int(ttl_s * 1000))

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        raw = await self.redis.mget([self.prefix + k for k in keys])
        return [None if value is None else json.loads(value) for value in raw]

    async def set_many(self, entries: dict[str, dict[str, Any]]) -> None:
        if not entries:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, value in entries.items():
                pipe.set(self.prefix + key, json.dumps(value), px=self.ttl_ms)
            await pipe.execute()

    async def ping(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()


def make_cache(settings: JudgeSettings) -> VerdictCache:
    if settings.redis_url:
        return RedisCache(settings.redis_url, settings.cache_prefix, settings.cache_ttl_s)
    return MemoryCache(settings.cache_size, settings.cache_ttl_s)
