"""EVO-RAG's protocol: the action parser and the scripted expert."""

from __future__ import annotations

import pytest

from hoprl.data.synthetic import generate, hops_for
from hoprl.recipes.evo_rag import EvoRag, parse_action


@pytest.mark.parametrize(
    ("segment", "kind", "payload"),
    [
        ("<think>hop 1</think><search>Acme founder</search>", "search", ["Acme founder"]),
        ("<search>  Acme founder </search>", "search", ["Acme founder"]),
        ("<think>dead end</think><backtrack/>", "backtrack", None),
        ("<think>done</think><answer>Paris</answer>", "answer", "Paris"),
        ("<think>no such fact</think><refuse/>", "refuse", None),
        ("<think>maybe <refuse/> later</think><search>x</search>", "search", ["x"]),  # marker in think
        ("<think>unclosed thought <search>x</search>", "search", ["x"]),
    ],
)
def test_parse_valid(segment, kind, payload):
    action = parse_action(segment)
    assert action.kind == kind
    if kind == "search":
        assert action.queries == payload and action.query_kinds == ["search"]
    if kind == "answer":
        assert action.answer == payload


@pytest.mark.parametrize(
    "segment",
    [
        "<think>hmm</think><search>Acme founder",  # missing closing tag
        "<search>a <search>b</search>",  # nested
        "<answer>a <search>b</search></answer>",  # a tag inside the answer
        "<search>   </search>",  # empty
        "<search>a</search><answer>b</answer>",  # two actions
        "<backtrack/><refuse/>",
        "<think>only thinking</think>",
        "",
        "x" * 10_240,  # 10 KB of garbage
        "<search>" * 2_000,
    ],
)
def test_parse_malformed_is_format_error(segment):
    action = parse_action(segment)
    assert action.kind == "format_error" and action.error


@pytest.fixture(scope="module")
def questions():
    return generate(seed=1, n_entities=80, n_train=20, n_dev=5, n_test=5)["train"]


def replay(recipe: EvoRag, text: str) -> list:
    """Split an expert completion at the stop sequences, as the runner would, and parse."""
    segments, rest = [], text
    while rest.strip():
        cut = min((rest.find(s) + len(s) for s in recipe.stop if s in rest), default=len(rest))
        segments.append(rest[:cut])
        rest = rest[cut:]
    return [recipe.parse(s) for s in segments]


def test_expert_searches_each_hop_then_answers_or_refuses(questions):
    recipe = EvoRag()
    answerable = next(q for q in questions if q.answers)
    actions = replay(recipe, recipe.expert(answerable))
    assert [a.queries[0] for a in actions[:-1]] == [h.query for h in hops_for(answerable)]
    assert actions[-1].kind == "answer" and actions[-1].answer == answerable.answers[0]
    unanswerable = next(q for q in questions if not q.answers)
    assert replay(recipe, recipe.expert(unanswerable))[-1].kind == "refuse"


def test_expert_noise_inserts_a_wrong_search_and_backtrack(questions):
    recipe = EvoRag()
    q = next(q for q in questions if q.answers)
    actions = replay(recipe, recipe.expert(q, noise=1.0, seed=3))
    kinds = [a.kind for a in actions]
    assert kinds == ["search", "backtrack", "search"] * len(hops_for(q)) + ["answer"]
    distractors = {p.title for p in q.paragraphs if not p.is_gold}
    assert actions[0].queries[0] in distractors
    assert recipe.expert(q, noise=0.5, seed=3) == recipe.expert(q, noise=0.5, seed=3)
