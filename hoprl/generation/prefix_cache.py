"""Prefix caching: the keys and values of finished rows, so a conversation's next turn prefills only
what is new.

An agent episode is one growing chat: each step's prompt is the previous prompt, the previous
reply and the injected documents. Without a cache every step prefills the whole chat again, so an
episode's prefill grows with the square of its length (a four-step search-r1 episode on HotpotQA
prefilled ~3,900 tokens where ~1,800 were new). Prompts that share a system prompt share its
prefix too. vLLM does the same on GPU (automatic prefix caching); this is the CPU engine's.

The cache holds whole rows (a token sequence and its per-layer key/value tensors) up to a token
capacity, least recently used first out; a row whose tokens begin a newer row is dropped when the
newer one comes (the newer covers it). A lookup returns the longest cached prefix of a prompt.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import count

import numpy as np
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv heads, positions, head dim]

#: shorter shared prefixes are not worth a lookup hit (the chat template's first tokens alone)
MIN_PREFIX = 16


class PrefixCache:
    """Thread-safe LRU of ``(token ids, key/value tensors)`` holding at most ``capacity`` tokens."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lock = threading.Lock()
        self.entries: OrderedDict[int, tuple[np.ndarray, KV]] = OrderedDict()
        self.tokens = 0
        self.ids = count()
        self.hits = self.reused = 0  # lookups that found a prefix, and the prompt tokens they saved

    def lookup(self, ids: list[int]) -> tuple[int, KV] | None:
        """The longest cached prefix of ``ids`` as ``(length, key/value tensors of that length)``."""
        if not self.capacity:
            return None
        prompt = np.asarray(ids)
        with self.lock:
            best, best_key = 0, None
            for key, (tokens, _) in self.entries.items():
                n = _common(tokens, prompt)
                if n > best:
                    best, best_key = n, key
            if best_key is None or best < MIN_PREFIX:
                return None
            self.entries.move_to_end(best_key)
            kv = self.entries[best_key][1]
            self.hits += 1
            self.reused += best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv]

    def add(self, ids: list[int], kv: KV) -> None:
        """Keep ``ids`` with their keys and values (tensors owned by the cache: pass copies)."""
        n = len(ids)
        if not self.capacity or n > self.capacity or n < MIN_PREFIX:
            return
        tokens = np.asarray(ids)
        with self.lock:
            for key, (old, _) in list(self.entries.items()):
                if _common(old, tokens) == len(old):  # the new row extends it
                    self._drop(key)
            while self.tokens + n > self.capacity:
                self._drop(next(iter(self.entries)))
            self.entries[next(self.ids)] = (tokens, kv)
            self.tokens += n

    def clear(self) -> None:
        """Forget every row (their keys and values belong to weights that have since changed)."""
        with self.lock:
            self.entries.clear()
            self.tokens = 0

    def _drop(self, key: int) -> None:
        tokens, _ = self.entries.pop(key)
        self.tokens -= len(tokens)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
