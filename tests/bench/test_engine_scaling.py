"""bench/engine_scaling.py's arithmetic and prompts (the engines themselves run in the bench)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bench.engine_scaling import bound, fresh, long_prompts
from tests.conftest import shared_file


def test_the_bound_is_amdahls_law_over_prefill_and_decode() -> None:
    rates = {"prefill_1": 1000.0, "prefill_batch": 1000.0, "decode_1": 10.0, "decode_batch": 160.0}
    # alone: 512/1000 + 32/10 = 3.712 s; batched: 512/1000 + 32/160 = 0.712 s
    assert bound(rates, 512, 32) == pytest.approx(3.712 / 0.712)
    # all prefill: a batch gains nothing where prefill does not scale
    assert bound(rates, 512, 0) == pytest.approx(1.0)


def test_long_prompts_are_cut_to_the_asked_size(tokenizer_path: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    prompts = long_prompts(str(shared_file("hotpotqa_dev.jsonl")), 3, 200, tokenizer)
    assert len(prompts) == 3 and prompts[0].startswith("Question: ")
    assert all(190 <= len(tokenizer(p)["input_ids"]) <= 205 for p in prompts)


def test_each_pass_gets_prompts_no_earlier_pass_sent(tokenizer_path: str) -> None:
    """vLLM's prefix cache hashes a prompt block by block (16 tokens) from its start: a pass whose
    first block matches an earlier pass's would be served from the cache. Every prompt of every pass
    differs from every other within that first block."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    prompts = long_prompts(str(shared_file("hotpotqa_dev.jsonl")), 2, 100, tokenizer)
    one, batched = fresh(prompts, "p1-"), fresh(prompts, "pb-")
    assert one == ["[p1-0] " + prompts[0], "[p1-1] " + prompts[1]]
    first_blocks = {tuple(tokenizer(p)["input_ids"][:16]) for p in one + batched}
    assert len(first_blocks) == 4
