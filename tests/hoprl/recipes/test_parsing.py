from __future__ import annotations

import random
import time

import pytest

from hoprl.recipes.parsing import MAX_CHARS, Block, outside_text, parse_tags

TAGS = ["think", "search", "answer", "information"]


def test_well_formed_blocks_in_order_with_stripped_content() -> None:
    text = "<think> hop one </think>\n<search>\tacme founder\n</search>"
    parsed = parse_tags(text, TAGS)
    assert parsed.ok
    assert parsed.tags == ["think", "search"]
    assert parsed.first("search") == Block("search", "acme founder", text.index("<search>"), len(text))
    assert parsed.contents("think") == ["hop one"]


def test_all_first_last() -> None:
    parsed = parse_tags("<search>a</search><search>b</search><answer>c</answer>", TAGS)
    assert [b.content for b in parsed.all("search")] == ["a", "b"]
    assert parsed.first("search").content == "a"  # type: ignore[union-attr]
    assert parsed.last("search").content == "b"  # type: ignore[union-attr]
    assert parsed.first("think") is None


@pytest.mark.parametrize(
    ("text", "tags", "contents", "error"),
    [
        # missing close at the end of a segment: end of text is the close, marked malformed
        ("<think>x</think><search>acme founder", ["think", "search"], ["x", "acme founder"], "unclosed"),
        # missing close mid-text: the block ends where the next known tag opens
        ("<think>reasoning <search>q</search>", ["think", "search"], ["reasoning", "q"], "unclosed"),
        # closing tag with no opening
        ("answer</answer>", ["answer"], [], "stray"),
        ("<answer>a</answer></answer>", ["answer"], ["a"], "stray"),
        # same tag nested: rejected, scanning stops
        ("<answer>a <answer>b</answer></answer>", ["answer"], [], "nested"),
        ("<think>t</think><answer><answer>b</answer>", ["think", "answer"], ["t"], "nested"),
    ],
)
def test_malformed(text: str, tags: list[str], contents: list[str], error: str) -> None:
    parsed = parse_tags(text, tags)
    assert [b.content for b in parsed.blocks] == contents
    assert not parsed.ok
    assert any(e.startswith(error) for e in parsed.errors), parsed.errors


def test_unclosed_block_is_kept_but_flagged() -> None:
    parsed = parse_tags("<answer>Paris", ["answer"])
    block = parsed.first("answer")
    assert block is not None and block.content == "Paris" and not block.closed


@pytest.mark.parametrize("cut", ["</", "</ans", "</answer"])
def test_closing_tag_cut_by_the_token_limit_is_not_content(cut: str) -> None:
    parsed = parse_tags(f"<think>x</think><answer>Paris{cut}", ["think", "answer"])
    block = parsed.first("answer")
    assert block is not None and block.content == "Paris" and not block.closed
    assert not parsed.ok  # still a format error for the strict readers
    # only at the end of the text, and only the block's own tag
    assert parse_tags("<answer>a </b", ["answer"]).blocks[0].content == "a </b"
    assert parse_tags("<answer>1 < 2", ["answer"]).blocks[0].content == "1 < 2"


def test_known_tag_inside_closed_block_is_content() -> None:
    parsed = parse_tags("<think>I could <search>x</search> later</think>", TAGS)
    assert parsed.ok and parsed.tags == ["think"]
    assert parsed.first("think").content == "I could <search>x</search> later"  # type: ignore[union-attr]


def test_unknown_tags_and_unicode_are_plain_content() -> None:
    text = "<think>Über <b>groß</b> 東京 🚀</think><answer>Zürich — 東京</answer>"
    parsed = parse_tags(text, TAGS)
    assert parsed.ok
    assert parsed.contents("answer") == ["Zürich — 東京"]
    assert parsed.contents("think") == ["Über <b>groß</b> 東京 🚀"]


def test_case_and_spacing_variants_are_not_tags() -> None:
    parsed = parse_tags("<Answer>x</Answer> < answer >y</ answer >", ["answer"])
    assert parsed.blocks == [] and parsed.ok


def test_ten_kb_of_garbage_is_a_fast_format_error() -> None:
    rng = random.Random(0)
    alphabet = "<>/ abcdefghijklmnopqrstuvwxyz\n\x00é東"
    garbage = "".join(rng.choice(alphabet) for _ in range(10_240))
    start = time.perf_counter()
    parsed = parse_tags(garbage, TAGS)
    assert time.perf_counter() - start < 0.05
    assert parsed.blocks == [] and parsed.errors[0].startswith("too_long")


@pytest.mark.parametrize(
    "unit", ["<search>", "</search>", "<search>a", "<think><search>", "<answer></answer>", "<<search>>"]
)
def test_adversarial_tag_soup_under_the_cap_parses_fast_and_never_raises(unit: str) -> None:
    text = (unit * (MAX_CHARS // len(unit)))[:MAX_CHARS]
    start = time.perf_counter()
    parsed = parse_tags(text, TAGS)
    assert time.perf_counter() - start < 0.5
    assert isinstance(parsed.errors, list)


def test_empty_and_whitespace() -> None:
    assert parse_tags("", TAGS).blocks == []
    assert parse_tags("<answer>   </answer>", TAGS).contents("answer") == [""]


def test_outside_text() -> None:
    text = "pre <answer>x</answer> mid <think>t</think> post"
    assert outside_text(text, parse_tags(text, TAGS).blocks) == "pre  mid  post"
    clean = " <answer>x</answer>\n"
    assert outside_text(clean, parse_tags(clean, TAGS).blocks) == ""
