"""Continuous batching: requests join a running batch at the next token, whatever their parameters.

Before, the engine decoded one left-padded batch of same-parameter requests from start to end: a
request that came in while a batch ran waited for all of it (16 concurrent /v1/answer clients
were slower than one). Now each call joins the running batch as soon as its prompt is prefilled.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from hoprl.generation.engines import Generation, SamplingParams
from hoprl.generation.transformers_engine import TransformersEngine

COUNTING = "1, 2, 3, 4, 5,"  # the model keeps counting: every one of max_tokens is used


@pytest.fixture(scope="module")
def engine(model_path: str) -> TransformersEngine:
    return TransformersEngine(model_path)


def test_a_later_request_joins_the_running_batch(engine: TransformersEngine) -> None:
    """B arrives while A decodes, with other max_tokens, stop and temperature: it shares A's steps
    and ends long before A does (it used to wait for A's whole batch)."""
    started = threading.Event()
    ended: dict[str, float] = {}
    results: dict[str, Generation] = {}

    def run(name: str, prompt: str, params: SamplingParams) -> None:
        (results[name],) = engine.generate([prompt], params)[0]
        ended[name] = time.monotonic()

    long = SamplingParams(max_tokens=96, temperature=0, on_text=lambda _c, _t: started.set())
    a = threading.Thread(target=run, args=("a", COUNTING, long))
    a.start()
    assert started.wait(120)  # A is decoding
    run("b", "The capital of France is", SamplingParams(max_tokens=6, temperature=0.7, stop=("\n",)))
    a.join()
    assert results["a"].finish_reason == "length" and len(results["a"].token_ids) == 96
    assert 1 <= len(results["b"].token_ids) <= 6
    assert ended["b"] < ended["a"] and engine.batcher.widest >= 2  # B decoded in A's steps


def test_rows_of_one_call_with_different_lengths_are_each_exact(engine: TransformersEngine) -> None:
    """A short row leaves the batch when it ends; the long one goes on and equals its run alone."""
    greedy = SamplingParams(max_tokens=24, temperature=0, stop=("7",))
    prompts = [COUNTING, "Name three colors."]
    alone = [engine.generate([p], greedy)[0][0] for p in prompts]
    together = [g[0] for g in engine.generate(prompts, greedy)]
    assert [g.text for g in together] == [g.text for g in alone]
    assert together[0].stop_reason == "7" and together[0].finish_reason == "stop"


def test_closing_fails_the_calls_it_holds(model_path: str) -> None:
    engine = TransformersEngine(model_path)
    errors: list[BaseException] = []
    started = threading.Event()

    def run() -> None:
        params = SamplingParams(max_tokens=200, temperature=0, on_text=lambda _c, _t: started.set())
        try:
            engine.generate([COUNTING], params)
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)  # a caller left waiting must not hang the exit
    thread.start()
    assert started.wait(120)
    engine.close()
    thread.join(60)
    assert not thread.is_alive() and errors and "closed" in str(errors[0])


def test_closing_while_rows_join_the_batch_fails_them(model_path: str) -> None:
    """close() lands after the decode thread took the prefilled rows and before they are in the
    batch: neither list close() reads holds them, so the decode thread fails them as it stops
    (before, their caller waited for ever and the interpreter could not exit)."""
    engine = TransformersEngine(model_path)
    batcher = engine.batcher
    merge = batcher._merge

    def close_then_merge(staged: object) -> None:
        batcher.close()  # from the decode thread: close() joins only the prefill thread
        merge(staged)

    batcher._merge = close_then_merge
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.generate([COUNTING], SamplingParams(max_tokens=200, temperature=0))
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive() and errors and "closed" in str(errors[0])
    engine.close()


def test_prefix_cache_keeps_the_longest_rows_within_capacity() -> None:
    """Plain data: the longest cached prefix wins, a row extending an older one replaces it, and
    the least recently used rows leave first once the token capacity is full."""
    import torch

    from hoprl.generation.prefix_cache import PrefixCache

    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.full((1, 1, n, 2), float(n)), torch.zeros(1, 1, n, 2))]

    cache = PrefixCache(capacity=100)
    first = list(range(20))
    cache.add(first, kv(20))
    cache.add([*first, *range(100, 110)], kv(30))  # the same chat, one turn on: replaces the first
    assert len(cache.entries) == 1 and cache.tokens == 30
    hit = cache.lookup([*first, 100, 101, 7, 7])
    assert hit is not None and hit[0] == 22 and hit[1][0][0].shape == (1, 1, 22, 2)
    assert cache.lookup([5, *first]) is None  # no common prefix
    other = list(range(200, 260))
    cache.add(other, kv(60))
    cache.add(list(range(300, 320)), kv(20))  # 30 + 60 + 20 > 100: the least recently used leaves
    assert cache.tokens == 80 and cache.lookup(first) is None and cache.lookup(other) is not None


def test_a_chat_turn_reuses_the_previous_turn(engine: TransformersEngine) -> None:
    """The next turn of a chat prefills only what is new, and says the same as a full prefill."""
    chat = [
        {"role": "system", "content": "You are a helpful assistant who answers in one sentence."},
        {"role": "user", "content": "Name three colors."},
    ]
    greedy = SamplingParams(max_tokens=16, temperature=0, logprobs=True)
    (first,) = engine.generate([chat], greedy)[0]
    turn = [*chat, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And animals?"}]
    prefixes = engine.batcher.prefixes
    hits, reused = prefixes.hits, prefixes.reused
    (cached,) = engine.generate([turn], greedy)[0]
    assert (
        prefixes.hits == hits + 1
        and prefixes.reused - reused >= first.prompt_tokens + len(first.token_ids) - 2
    )
    capacity, prefixes.capacity = prefixes.capacity, 0
    try:
        (full,) = engine.generate([turn], greedy)[0]
    finally:
        prefixes.capacity = capacity
    assert cached.text == full.text
    assert cached.logprobs == pytest.approx(full.logprobs, abs=1e-3)


def test_counters_count_the_prompt_tokens_prefilled_and_the_rows_decoded(engine: TransformersEngine) -> None:
    """Two samples of one prompt share its prefill (every prompt token once) and decode together:
    the first of 8 tokens comes from the prefill, the other 7 from 7 steps of 2 rows. Asked again,
    the prompt is a cached prefix: only its last token is computed (its logits are the point)."""
    prompt = COUNTING + " 6, 7, 8,"
    tokens = len(engine.encode(prompt))
    engine.batcher.prefixes.clear()  # earlier tests' rows hold this prompt as a prefix
    greedy = SamplingParams(max_tokens=8, temperature=0, n=2)
    for prefilled in (tokens, 1):
        before = replace(engine.batcher.counters)
        rows = engine.generate([prompt], greedy)[0]
        assert [len(g.token_ids) for g in rows] == [8, 8]
        used = engine.batcher.counters.since(before)
        assert (used.prefill_tokens, used.decode_steps, used.decode_rows) == (prefilled, 7, 14)
        assert used.prefill_s > 0 and used.decode_s > 0


def test_a_bf16_prefill_decodes_in_fp32_and_reuses_its_turns(model_path: str) -> None:
    """``prefill_autocast`` alone: prompts prefill under bf16, the batch's cache stays in the
    weights' fp32 (what the decode steps and the prefix cache hold), a next turn prefills only its
    new tokens on top of an fp32 prefix, and greedy counting says what the fp32 engine says."""
    import torch

    mixed, plain = TransformersEngine(model_path, prefill_autocast=True), TransformersEngine(model_path)
    try:
        assert (mixed.batcher.prefill_autocast, mixed.batcher.autocast) == (True, False)
        greedy = SamplingParams(max_tokens=12, temperature=0)
        (first,) = mixed.generate([COUNTING], greedy)[0]
        assert first.text == plain.generate([COUNTING], greedy)[0][0].text
        stored = [kv for _, kv in mixed.batcher.prefixes.entries.values()]
        assert stored and {t.dtype for layers in stored for k, v in layers for t in (k, v)} == {torch.float32}
        turn = COUNTING + first.text + " 20,"
        before = replace(mixed.batcher.counters)
        (second,) = mixed.generate([turn], greedy)[0]
        used = mixed.batcher.counters.since(before)
        assert 0 < used.prefill_tokens < len(mixed.encode(turn)) and len(second.token_ids) == 12
    finally:
        mixed.close()
        plain.close()
