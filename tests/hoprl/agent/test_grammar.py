"""Action grammars: each admits its recipe's protocol, and everything it admits parses to an action.

The grammars are checked with llguidance (the library the engines constrain with) over the
default model's tokenizer: the scripted experts' segments are accepted whole, and random walks
through each grammar (a random allowed token at every step, fixed seeds) always give text that
the recipe's own ``parse`` reads as an action, never a format error.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from hoprl.agent.grammar import GRAMMARS, Turn, grammar
from hoprl.data.synthetic import generate
from hoprl.domain import Question
from hoprl.generation.model import resolve_model
from hoprl.generation.rows import allowed_tokens
from hoprl.recipes import RECIPES, get_recipe

ROOT = Path(__file__).resolve().parents[3]
Tokenizers = tuple[Any, Any]  # (the transformers tokenizer, llguidance's)
TURNS = [Turn(), Turn(after_information=True), Turn(final=True), Turn(after_information=True, final=True)]
ENDINGS = {"answer", "refuse", "stop"}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizers:
    path = resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")
    hf: Any = AutoTokenizer.from_pretrained(path)
    return hf, llguidance.hf.from_tokenizer(hf)


def matcher(tokenizer: Tokenizers, lark: str) -> llguidance.LLMatcher:
    m = llguidance.LLMatcher(tokenizer[1], lark, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def test_every_recipe_has_a_grammar_and_unknown_names_list_them() -> None:
    assert set(GRAMMARS) == set(RECIPES)
    with pytest.raises(KeyError, match="unknown grammar 'magic'; valid: arena, eval-rar, evo-rag"):
        grammar("magic")


def test_longest_segment_fits_max_tokens_and_too_few_tokens_is_an_error() -> None:
    for name in GRAMMARS:
        for turn in TURNS:
            for max_tokens in (256, 200, 180):
                assert grammar(name, max_tokens=max_tokens, turn=turn).longest <= max_tokens
    assert grammar("search-r1").name == "search-r1@1"
    with pytest.raises(ValueError, match="too small for the r2ag grammar"):
        grammar("r2ag", max_tokens=64)


def caps(lark: str) -> dict[str, int]:
    """The token cap of each free-text rule of a grammar's Lark text (``think_text[max_tokens=12]``)."""
    found = re.findall(r"^(\w+)_\w+\[max_tokens=(\d+)\]", lark, flags=re.MULTILINE)
    return {name: int(cap) for name, cap in found}


def test_caps_shrink_alike_and_answers_keep_eight_tokens() -> None:
    """Tags count one token per byte. when-to-search's first turn is ``<think>t</think>\\n`` (16 bytes)
    then ``<search>q</search>`` (17) or ``<reflect>r</reflect>\\n<answer>a</answer>`` (37): its longest
    segment is 16 + t + max(17 + q, 37 + r + a); with the caps t 48, r 40, q 24, a 24 that is 165.

    At 100 tokens all caps scale alike: without text 16 + max(17, 37) = 53, so the scale is
    (100 - 53) / (165 - 53) = 0.4196: t = int(20.1) = 20, r = int(16.8) = 16, q = a = int(10.07) = 10
    (16 + 20 + 63 = 99 tokens).
    At 64 the same scale, 11 / 112, would leave a = q = 2: they keep 8 instead and the thoughts
    shrink alone: 16 + max(25, 45) = 61 without thoughts, scale (64 - 61) / (149 - 61), t = r = 1
    (63 tokens). Before, every block fell to 1 token and the answers were cut to their first token.
    """
    assert caps(grammar("when-to-search", max_tokens=100).lark) == {
        "think": 20, "review": 16, "query": 10, "answer": 10
    }  # fmt: skip
    short = {"think": 1, "review": 1, "query": 8, "answer": 8}
    assert caps(grammar("when-to-search", max_tokens=64).lark) == short
    assert grammar("when-to-search", max_tokens=64).longest == 63


def expert_questions() -> list[Question]:
    """Synthetic questions of 2 to 4 hops, answerable or not (EVO-RAG's expert refuses those)."""
    return list(generate(seed=3, n_entities=80, n_train=0, n_dev=12, n_test=0)["dev"])


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_expert_segments_are_in_the_grammar(tokenizer: Tokenizers, name: str) -> None:
    """The scripted expert writes the protocol as its recipe defines it: every segment is admitted,
    turn by turn (the last one also by the final-step grammar, which keeps only the endings)."""
    recipe, hf = get_recipe(name), tokenizer[0]
    for question in expert_questions():
        segments = recipe.expert_segments(question)
        for i, segment in enumerate(segments):
            turns = [Turn(after_information=i > 0)]
            if recipe.parse(segment).kind in ENDINGS:
                turns.append(Turn(after_information=i > 0, final=True))
            for turn in turns:
                m = matcher(tokenizer, grammar(name, turn=turn).lark)
                ids = hf(segment, add_special_tokens=False)["input_ids"]
                assert m.consume_tokens(ids), (name, turn, segment, m.get_error())
                assert m.is_accepting(), (name, turn, segment)


def random_walk(tokenizer: Tokenizers, lark: str, rng: random.Random) -> str:
    """Text of a random path through the grammar: a uniformly random allowed token each step."""
    hf, lltok = tokenizer
    m = matcher(tokenizer, lark)
    ids: list[int] = []
    eos = hf.eos_token_id
    while True:
        allowed = allowed_tokens(m, lltok.vocab_size)
        assert allowed is not None, (lark, hf.decode(ids))
        choices = [t for t in allowed.nonzero().flatten().tolist() if t != eos]
        if not choices:  # only the end of sequence is left: the segment is complete
            return str(hf.decode(ids))
        token = rng.choice(choices)
        assert m.consume_token(token)
        ids.append(token)


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_random_walks_through_the_grammar_parse_to_actions(tokenizer: Tokenizers, name: str) -> None:
    """Whatever the constrained model writes, the recipe's own parser reads an action from it, and
    the final-step grammar only ever ends the episode."""
    recipe, rng = get_recipe(name), random.Random(f"walk-{name}")
    for turn in TURNS:
        lark = grammar(name, max_tokens=256, turn=turn).lark
        for _ in range(4):
            text = random_walk(tokenizer, lark, rng)
            action = recipe.parse(text)
            assert action.kind != "format_error", (name, turn, text, action.error)
            if turn.final:
                assert action.kind in ENDINGS, (name, text, action)
            if name == "r2ag" and turn == Turn():
                assert action.kind == "search", text  # nothing is retrieved yet: no stop
