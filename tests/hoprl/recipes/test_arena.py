"""ARENA rewards: format + accuracy + relevance + bonus 10 (only when all three are 1), by hand."""

from __future__ import annotations

import pytest

from hoprl.data.synthetic import Hop, SyntheticQuestion
from hoprl.domain import Episode, Paragraph, Question, RetrievedDoc, Step
from hoprl.recipes import get_recipe
from hoprl.recipes.arena import Arena, expert_analysis, make_arena_reward

PARAGRAPHS = [
    Paragraph(title=f"T{i}", text=f"text {i}", is_gold=i in (2, 4)) for i in range(1, 6)
]  # gold references: [2] and [4]
GOLD = ["Paris"]


def out(relevance: str, answer: str = "Paris", analysis: str = "2 says X; 4 says Y.") -> str:
    return f"<relevance>{relevance}</relevance>\n<analysis>{analysis}</analysis>\n<answer>{answer}</answer>"


# (completion, format, accuracy, relevance) — each judged by hand
ROWS = [
    (out("[2,4]"), 1, 1, 1.0),  # all three: bonus
    (out("[4, 2]"), 1, 1, 1.0),  # order and spaces inside the list do not matter
    (out("[2]"), 1, 1, 0.5),  # partial overlap
    (out("[2,4,5]"), 1, 1, 0.5),  # superset: partial
    (out("[1,3]"), 1, 1, 0.0),  # disjoint
    (out("[]"), 1, 1, 0.0),  # nothing cited
    (out("[2,4]", answer="the paris."), 1, 1, 1.0),  # normalised EM
    (out("[2,4]", answer="Lyon"), 1, 0, 1.0),  # wrong answer: no bonus
    (out("2 and 4"), 1, 1, 1.0),  # §3.3 asks for no brackets: the numbers are read, format 1
    ("<analysis>a</analysis><relevance>[2,4]</relevance><answer>Paris</answer>", 0, 1, 1.0),  # order
    ("<relevance>[2,4]</relevance><answer>Paris</answer>", 0, 1, 1.0),  # analysis missing
    ("Sure! " + out("[2,4]"), 1, 1, 1.0),  # text outside the parts: still the three in order
    ("<relevance>[2,4]</relevance><analysis>a</analysis><answer>Paris", 0, 1, 1.0),  # unclosed answer
    (out("[2,4]") + out("[2,4]"), 0, 1, 1.0),  # blocks repeated
    ("no tags at all", 0, 0, 0.0),
]


@pytest.mark.parametrize(("text", "fmt", "acc", "rel"), ROWS)
def test_arena_rewards(text: str, fmt: int, acc: int, rel: float) -> None:
    bonus = 10.0 if (fmt, acc, rel) == (1, 1, 1.0) else 0.0
    kwargs = {"answers": [GOLD], "paragraphs": [PARAGRAPHS]}
    parts = [fn([""], [text], **kwargs) for fn in Arena().reward_funcs()]
    assert parts == [[float(fmt)], [float(acc)], [rel], [bonus]]
    assert make_arena_reward()([""], [text], **kwargs) == [fmt + acc + rel + bonus]


def test_names_versions_and_paragraph_dicts() -> None:
    funcs = Arena().reward_funcs()
    assert [f.__name__ for f in funcs] == ["arena_format", "arena_accuracy", "arena_relevance", "arena_bonus"]
    versions = [f.__version__ for f in funcs]  # type: ignore[attr-defined]
    assert versions == ["arena_format@2", "arena_accuracy@2", "arena_relevance@1", "arena_bonus@2"]
    dicts = [p.model_dump() for p in PARAGRAPHS]  # the dataset column as JSON rows
    assert make_arena_reward()([""], [out("[2,4]")], answers=[GOLD], paragraphs=[dicts]) == [13.0]


def test_rewards_from_episodes_and_missing_paragraphs() -> None:
    ep = Episode(
        recipe="arena",
        question_id="q",
        question="q",
        answers=GOLD,
        final_answer="Paris",
        steps=[Step(t=1, action="answer", text=out("[2]"), answer="Paris")],
    )
    assert make_arena_reward()([""], [""], episodes=[ep], paragraphs=[PARAGRAPHS]) == [2.5]
    with pytest.raises(ValueError, match="paragraphs"):
        make_arena_reward()([""], [""], episodes=[ep])


def test_config_constants() -> None:
    recipe = get_recipe("arena", bonus=5.0, relevance_partial=0.25)
    kwargs = {"answers": [GOLD], "paragraphs": [PARAGRAPHS]}
    assert make_arena_reward(recipe.config)([""], [out("[2,4]")], **kwargs) == [8.0]
    assert make_arena_reward(recipe.config)([""], [out("[4]")], **kwargs) == [2.25]


def test_messages_number_the_question_paragraphs_and_expert_is_perfect() -> None:
    q = Question(id="q", dataset="d", split="dev", question="Where?", answers=GOLD, paragraphs=PARAGRAPHS)
    recipe = Arena()
    system, user = (m["content"] for m in recipe.messages(q))
    # Table 1: the question and the numbered references, each in its tag
    assert user.startswith("<question>Where?</question>\n<references>\n[1] T1: text 1\n[2] T2: text 2")
    assert user.endswith("[5] T5: text 5\n</references>")
    # Table 1's instruction shows the three sections and no example answer to repeat
    assert "EXACTLY three sections" in system and "<answer>[ answer with ONLY a short phrase" in system
    assert "Lisbon" not in system
    expert = recipe.expert(q)
    assert recipe.parse(expert).answer == "Paris"
    assert make_arena_reward()([""], [expert], answers=[GOLD], paragraphs=[PARAGRAPHS]) == [13.0]
    noisy = recipe.expert(q, noise=1.0, seed=0)
    assert make_arena_reward()([""], [noisy], answers=[GOLD], paragraphs=[PARAGRAPHS]) == [2.5]


def test_expert_analysis_cites_each_hop_by_number() -> None:
    paragraphs = [
        Paragraph(title="Dear Brother", text="A song recorded by Hank Williams and Audrey.", is_gold=True),
        Paragraph(title="Other", text="Unrelated."),
        Paragraph(title="Hank Williams Jr.", text="Randall Hank Williams, born 1949.", is_gold=True),
    ]
    q = Question(id="q", dataset="hotpotqa", split="dev", question="Who was on Dear Brother?",
                 answers=["Randall Hank Williams"], paragraphs=paragraphs)  # fmt: skip
    # the paragraph the question names comes first; the one holding the answer last, with it
    assert expert_analysis(q) == (
        "[1] is about Dear Brother. [3] Hank Williams Jr.: the answer is Randall Hank Williams."
    )
    hops = [Hop(title="T2", relation="founded_by", query="T2 founder", answer="Ann"),
            Hop(title="T4", relation="born_in", query="Ann born", answer="Paris")]  # fmt: skip
    synthetic = SyntheticQuestion(id="s", dataset="synthetic", split="dev", question="Where?",
                                  answers=GOLD, paragraphs=PARAGRAPHS, hops=hops)  # fmt: skip
    assert expert_analysis(synthetic) == "[2] T2: the founded by is Ann. [4] T4: the born in is Paris."


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        (out("[2,4]"), 1),
        (out("2 and 4"), 0),  # not a bracketed list
        ("Sure! " + out("[2,4]"), 0),  # text outside the blocks
        (out("[2,4]", answer=""), 0),  # empty answer
    ],
)
def test_strict_format_option_keeps_the_earlier_reading(text: str, fmt: int) -> None:
    kwargs = {"answers": [GOLD], "paragraphs": [PARAGRAPHS]}
    (format_reward, *_) = Arena(format_check="strict").reward_funcs()
    assert format_reward([""], [text], **kwargs) == [float(fmt)]


def answered(text: str, docs: list[list[RetrievedDoc]] | None = None) -> Episode:
    step = Step(t=1, action="answer", text=text, answer="Paris", docs=docs or [])
    return Episode(recipe="arena", question_id="q", question="Where?", steps=[step])


def test_cited_sources_are_the_named_references_only() -> None:
    recipe = Arena()
    given = Question(id="q", dataset="api", split="serve", question="Where?", paragraphs=PARAGRAPHS)
    # given paragraphs: [4] and [2] named, [9] names nothing; in number order
    named = recipe.cited_sources(answered(out("[4, 2, 9]")), given)
    assert named == [("paragraph:2", "T2"), ("paragraph:4", "T4")]
    # retrieved references, numbered as format_docs numbers them (the repeated d1 once)
    hits = [[RetrievedDoc(id=f"d{i}", title=f"D{i}", text="x") for i in (1, 2, 3)]]
    hits.append([RetrievedDoc(id="d1", title="D1", text="x"), RetrievedDoc(id="d4", title="D4", text="x")])
    bare = Question(id="q", dataset="api", split="serve", question="Where?")
    assert recipe.cited_sources(answered(out("[4]"), hits), bare) == [("d4", "D4")]
    assert recipe.cited_sources(answered("no relevance block", hits), bare) == []
