"""Questions over the synthetic world: determinism, derivable answers, unanswerable share."""

import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from hoprl.data.synthetic import PARAGRAPHS_PER_QUESTION, SyntheticQuestion, build_world, generate, hops_for
from hoprl.data.synthetic.questions import WorldTooSmall
from hoprl.domain import Paragraph, Question
from hoprl.judging import RulesJudge
from hoprl.metrics.answer import normalize_answer

SEED = 11
SMALL = {"n_entities": 80, "n_train": 30, "n_dev": 10, "n_test": 10}


@pytest.fixture(scope="module")
def splits() -> dict[str, list[SyntheticQuestion]]:
    return generate(seed=SEED)  # the default sizes: 300 entities, 600 / 150 / 150 questions


@pytest.fixture(scope="module")
def questions(splits: dict[str, list[SyntheticQuestion]]) -> list[SyntheticQuestion]:
    return [q for qs in splits.values() for q in qs]


def _number(value: str) -> int:
    return int(value.replace(",", "").removesuffix(" km"))


def _paragraph(q: Question, title: str) -> Paragraph:
    return next(p for p in q.paragraphs if p.title == title)


def test_same_seed_same_data_other_seed_other_data() -> None:
    first, again, other = generate(seed=5, **SMALL), generate(seed=5, **SMALL), generate(seed=6, **SMALL)
    dump = {k: [q.model_dump() for q in v] for k, v in first.items()}
    assert dump == {k: [q.model_dump() for q in v] for k, v in again.items()}
    assert dump != {k: [q.model_dump() for q in v] for k, v in other.items()}
    assert build_world(5, 80).paragraphs() == build_world(5, 80).paragraphs()


def test_same_seed_same_data_across_processes() -> None:
    """String hashing is salted per process; generation must not depend on set or dict-of-set order."""
    code = (
        "import hashlib, pathlib, tempfile; from hoprl.data.jsonl import write_questions; "
        "from hoprl.data.synthetic import generate; "
        "p = pathlib.Path(tempfile.mkdtemp()) / 'q.jsonl'; "
        "write_questions(p, generate(seed=4, n_entities=60, n_train=20, n_dev=5, n_test=5)['train']); "
        "print(hashlib.sha256(p.read_bytes()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": salt},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for salt in ("1", "2")
    }
    assert len(digests) == 1
    assert len(digests.pop().strip()) == 64  # a real sha256, not two empty outputs


def test_default_sizes_and_split_labels(splits: dict[str, list[SyntheticQuestion]]) -> None:
    assert {k: len(v) for k, v in splits.items()} == {"train": 600, "dev": 150, "test": 150}
    assert all(q.split == name and q.dataset == "synthetic" for name, qs in splits.items() for q in qs)
    assert len(build_world(SEED).entities) == 300


def test_ids_and_questions_are_unique(questions: list[SyntheticQuestion]) -> None:
    assert len({q.id for q in questions}) == len(questions)
    assert len({q.question for q in questions}) == len(questions)


def test_all_types_present_and_unanswerable_share(questions: list[SyntheticQuestion]) -> None:
    types = Counter(q.type for q in questions)
    assert set(types) == {"bridge-2", "bridge-3", "bridge-4", "comparison"}
    assert sum(not q.answerable for q in questions) == round(0.15 * 900)
    assert {len(q.hops) for q in questions if q.type == "bridge-4"} == {4}


def test_paragraph_sets_look_like_the_distractor_setting(questions: list[SyntheticQuestion]) -> None:
    for q in questions:
        titles = [p.title for p in q.paragraphs]
        assert len(titles) == PARAGRAPHS_PER_QUESTION == len(set(titles))
        assert set(q.gold_titles) <= set(titles)
        assert {p.title for p in q.paragraphs if p.is_gold} == set(q.gold_titles)
        assert [h.title for h in q.hops] == q.gold_titles


def test_bridge_answers_follow_from_the_gold_chain(questions: list[SyntheticQuestion]) -> None:
    for q in (q for q in questions if q.answerable and q.type != "comparison"):
        for hop, following in zip(q.hops, q.hops[1:], strict=False):
            assert hop.answer == following.title  # each hop's answer is the next paragraph
        for hop in q.hops:
            assert hop.answer is not None and hop.answer in _paragraph(q, hop.title).text
            assert hop.title in hop.query
        assert q.hops[-1].answer == q.answers[0]
        assert normalize_answer(q.answers[0]) not in normalize_answer(q.question)


def test_comparison_answers_follow_from_the_two_values(questions: list[SyntheticQuestion]) -> None:
    for q in (q for q in questions if q.type == "comparison"):
        a, b = q.hops
        assert a.answer and b.answer and a.answer in _paragraph(q, a.title).text
        smaller_wins = "first" in q.question
        values = {h.title: _number(h.answer or "") for h in q.hops}
        expected = (min if smaller_wins else max)(values, key=values.__getitem__)
        assert q.answers == [expected]


def test_unanswerable_questions_miss_exactly_the_last_fact(questions: list[SyntheticQuestion]) -> None:
    world = build_world(SEED)
    judge = RulesJudge()
    for q in (q for q in questions if not q.answerable):
        assert q.type in {"bridge-2", "bridge-3", "bridge-4"} and q.answers == []
        assert q.hops[-1].answer is None
        assert all(h.answer is not None for h in q.hops[:-1])
        last = world.by_name[q.hops[-1].title]
        assert q.hops[-1].relation in last.withheld
        assert q.hops[-1].relation not in last.attrs and q.hops[-1].relation not in last.rels
    answerable = [q for q in questions if q.answerable]
    gold_evidence = [[p.text for p in q.paragraphs if p.is_gold] for q in answerable]
    assert all(
        judge.answerable(q.question, ev, q.answers).verdict
        for q, ev in zip(answerable, gold_evidence, strict=True)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_entities": 20}, "at least 40"),
        ({"unanswerable_share": 1.0}, "unanswerable_share"),
        ({"n_entities": 40, "n_train": 20_000, "n_dev": 0, "n_test": 0}, "more entities"),
        ({"max_hops": 1}, "max_hops must be at least 2"),
    ],
)
def test_bad_sizes_name_the_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate(seed=0, **kwargs)


def test_max_hops_keeps_only_short_chains_and_the_default_is_unchanged() -> None:
    short = generate(seed=SEED, max_hops=2)  # 600 entities by default: enough two-hop chains
    kinds = Counter(q.type for qs in short.values() for q in qs)
    assert set(kinds) == {"bridge-2", "comparison"} and sum(kinds.values()) == 900
    assert all(len(hops_for(q)) == 2 for qs in short.values() for q in qs)
    three = generate(seed=SEED, max_hops=3, **SMALL)
    assert {q.type for qs in three.values() for q in qs} <= {"bridge-2", "bridge-3", "comparison"}
    # Leaving max_hops out draws exactly what it drew before the option existed.
    assert generate(seed=SEED, **SMALL) == generate(seed=SEED, max_hops=None, **SMALL)


def test_every_seed_of_the_two_hop_world_draws_its_questions() -> None:
    """``synthetic:SEED:2`` on any seed: with 600 entities seeds 2, 5, 6 and 7 ran out of distinct
    unanswerable two-hop chains (``make run DATASET=synthetic:2:2`` stopped at prepare_data); the
    default world grows to 900 for them, and the seeds that fit 600 keep their questions."""
    for seed in range(8):
        splits = generate(seed=seed, max_hops=2)
        assert {k: len(v) for k, v in splits.items()} == {"train": 600, "dev": 150, "test": 150}
        unanswerable = sum(not q.answers for qs in splits.values() for q in qs)
        assert unanswerable == round(0.15 * 900), seed
    with pytest.raises(WorldTooSmall, match="more entities"):
        generate(seed=2, max_hops=2, n_entities=600)
    assert generate(seed=0, max_hops=2) == generate(seed=0, max_hops=2, n_entities=600)
    assert generate(seed=2, max_hops=2) == generate(seed=2, max_hops=2, n_entities=900)


def test_extra_test_questions_append_to_the_same_world_and_splits() -> None:
    """``extra_test`` (``synthetic:SEED:2:300``, make demo-rl): 150 more test questions drawn after the
    others, answerable, distinct from every question of the world's splits; the world, every split's questions
    and the first 150 test questions are those without it, so make run's seeds do not move."""
    for seed in (0, 1, 2):
        base, grown = generate(seed=seed, max_hops=2), generate(seed=seed, max_hops=2, extra_test=150)
        assert grown["train"] == base["train"] and grown["dev"] == base["dev"]
        assert grown["test"][:150] == base["test"] and len(grown["test"]) == 300
        extras = grown["test"][150:]
        assert [q.id for q in extras] == [f"syn{seed}-test-{i:05d}" for i in range(150, 300)]
        texts = [q.question for qs in grown.values() for q in qs]
        assert len(set(texts)) == len(texts) == 1050
        assert all(q.answers for q in extras)  # answerable: seed 0's withheld facts run out at 15%
        assert {q.type for q in extras} == {"bridge-2", "comparison"}


def test_too_many_extra_test_questions_name_the_world_and_keep_its_size() -> None:
    """A world too small for the extras says so; it does not move to a larger world (which would
    redraw every question of the seed)."""
    from hoprl.data.synthetic.questions import ExtrasTooMany

    with pytest.raises(ExtrasTooMany, match="seed 11 holds fewer than 5000 more test questions"):
        generate(seed=SEED, max_hops=2, extra_test=5000)
