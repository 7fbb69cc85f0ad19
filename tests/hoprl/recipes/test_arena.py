"""ARENA rewards: format + accuracy + relevance + bonus 10 (only when all three are 1), by hand."""

from __future__ import annotations

import pytest

from hoprl.data.synthetic import Hop, SyntheticQuestion
from hoprl.domain import Episode, Paragraph, Question, Step
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
    (out("2 and 4"), 0, 1, 1.0),  # not a bracketed list: format 0, the numbers are still read
    ("<analysis>a</analysis><relevance>[2,4]</relevance><answer>Paris</answer>", 0, 1, 1.0),  # order
    ("<relevance>[2,4]</relevance><answer>Paris</answer>", 0, 1, 1.0),  # analysis missing
    ("Sure! " + out("[2,4]"), 0, 1, 1.0),  # text outside the blocks
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
    assert versions == ["arena_format@1", "arena_accuracy@2", "arena_relevance@1", "arena_bonus@1"]
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
    user = recipe.messages(q)[1]["content"]
    assert "[1] T1: text 1\n[2] T2: text 2" in user and user.endswith("Question: Where?")
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
