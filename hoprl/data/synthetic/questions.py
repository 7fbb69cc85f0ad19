"""Questions over a synthetic world: bridge chains of two to four hops, comparisons, unanswerables.

Each question carries 10 paragraphs (gold plus look-alike distractors: same kind of entity or a
shared name word), like HotpotQA's distractor setting; :func:`generate` splits them into train /
dev / test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hoprl.data.synthetic.schema import Hop, SyntheticQuestion
from hoprl.data.synthetic.world import FACTS, Entity, World, aliases, build_world
from hoprl.domain import Paragraph

DATASET = "synthetic"
PARAGRAPHS_PER_QUESTION = 10

# Comparison templates: attribute -> (question, True if the smaller value wins).
_COMPARISONS: dict[str, tuple[str, bool]] = {
    "birth_year": ("Who was born first, {a} or {b}?", True),
    "founding_year": ("Which company was founded first, {a} or {b}?", True),
    "formed_year": ("Which band was formed first, {a} or {b}?", True),
    "release_year": ("Which film was released first, {a} or {b}?", True),
    "independence_year": ("Which country became independent first, {a} or {b}?", True),
    "population": ("Which city has the larger population, {a} or {b}?", False),
    "length_km": ("Which river is longer, {a} or {b}?", False),
}


@dataclass
class _Draft:
    question: str
    answers: list[str]
    type: str
    chain: list[Entity]
    hops: list[Hop]


def _walk(world: World, rng: random.Random, n_hops: int) -> tuple[list[Entity], list[str]] | None:
    """A random path of ``n_hops - 1`` known relations through distinct entities."""
    chain, keys = [rng.choice(world.entities)], []
    for _ in range(n_hops - 1):
        names = {e.name for e in chain}
        options = [key for key, target in chain[-1].rels.items() if target not in names]
        if not options:
            return None
        keys.append(rng.choice(options))
        chain.append(world.by_name[chain[-1].rels[keys[-1]]])
    return chain, keys


def _bridge(world: World, rng: random.Random, n_hops: int, answerable: bool) -> _Draft | None:
    walked = _walk(world, rng, n_hops)
    if walked is None:
        return None
    chain, keys = walked
    last, names = chain[-1], {e.name for e in chain}
    if answerable:
        finals = [k for k in last.attrs if k in FACTS]
        finals += [k for k, target in last.rels.items() if target not in names]
    else:
        finals = list(last.withheld)
    if not finals:
        return None
    final = rng.choice(finals)
    phrase = chain[0].name
    for key in keys:
        phrase = FACTS[key].np.format(x=phrase)
    steps = [*zip(chain, [*keys, final], strict=True)]
    hops = [
        Hop(
            title=e.name,
            relation=k,
            query=f"{e.name} {FACTS[k].query}",
            answer=e.value(k) if k not in e.withheld else None,
        )
        for e, k in steps
    ]
    answers: list[str] = []
    if answerable:
        answers = [last.rels[final]] if final in last.rels else aliases(final, last.attrs[final])
    return _Draft(FACTS[final].ask.format(x=phrase), answers, f"bridge-{n_hops}", chain, hops)


def _comparison(world: World, rng: random.Random) -> _Draft | None:
    key = rng.choice(list(_COMPARISONS))
    template, smaller_wins = _COMPARISONS[key]
    pool = [e for e in world.entities if key in e.attrs]
    if len(pool) < 2:
        return None
    a, b = rng.sample(pool, 2)
    va, vb = int(a.attrs[key]), int(b.attrs[key])
    if va == vb:
        return None
    winner = a if (va < vb) == smaller_wins else b
    hops = [
        Hop(title=e.name, relation=key, query=f"{e.name} {FACTS[key].query}", answer=e.value(key))
        for e in (a, b)
    ]
    return _Draft(template.format(a=a.name, b=b.name), [winner.name], "comparison", [a, b], hops)


def _distractors(world: World, rng: random.Random, gold: list[Entity], n: int) -> list[Entity]:
    """The ``n`` entities that look most like the gold ones: shared name words, then same kind."""
    gold_words = {w.lower() for e in gold for w in e.name.split() if len(w) > 3}
    kinds = {e.kind for e in gold}
    names = {e.name for e in gold}

    def likeness(e: Entity) -> float:
        shared = len(gold_words & {w.lower() for w in e.name.split()})
        return 2.0 * shared + (e.kind in kinds) + rng.random()

    candidates = [e for e in world.entities if e.name not in names]
    return sorted(candidates, key=likeness, reverse=True)[:n]


def _to_question(world: World, rng: random.Random, draft: _Draft, qid: str, split: str) -> SyntheticQuestion:
    distractors = _distractors(world, rng, draft.chain, PARAGRAPHS_PER_QUESTION - len(draft.chain))
    paragraphs = [Paragraph(title=e.name, text=e.text, is_gold=True) for e in draft.chain]
    paragraphs += [Paragraph(title=e.name, text=e.text) for e in distractors]
    rng.shuffle(paragraphs)
    return SyntheticQuestion(
        id=qid,
        dataset=DATASET,
        split=split,
        question=draft.question,
        answers=draft.answers,
        type=draft.type,
        paragraphs=paragraphs,
        gold_titles=[e.name for e in draft.chain],
        hops=draft.hops,
    )


#: answerable question kinds, their share of the mix and their hop counts
_KIND_WEIGHTS = {"bridge-2": 0.3, "bridge-3": 0.25, "bridge-4": 0.15, "comparison": 0.3}
_KIND_HOPS = {"bridge-2": 2, "bridge-3": 3, "bridge-4": 4, "comparison": 2}


def _plan(
    rng: random.Random, total: int, unanswerable_share: float, max_hops: int | None = None
) -> list[tuple[str, bool]]:
    """(type, answerable) per question: answerable ones mix bridge-2/3/4 and comparison (2 hops);
    ``max_hops`` leaves out the longer chains (the weights of the rest keep their proportions)."""
    n_unanswerable = round(unanswerable_share * total)
    if max_hops is not None and max_hops < 2:
        raise ValueError(f"max_hops must be at least 2 (every question has two hops), got {max_hops}")
    kinds = [k for k in _KIND_WEIGHTS if max_hops is None or _KIND_HOPS[k] <= max_hops]
    weights = [_KIND_WEIGHTS[k] for k in kinds]
    bridges = [_KIND_HOPS[k] for k in kinds if k.startswith("bridge")]
    answerable = rng.choices(kinds, weights, k=total - n_unanswerable)
    unanswerable = [f"bridge-{bridges[i % len(bridges)]}" for i in range(n_unanswerable)]
    plan = [(t, True) for t in answerable] + [(t, False) for t in unanswerable]
    rng.shuffle(plan)
    return plan


class WorldTooSmall(ValueError):
    """The world holds too few distinct questions of a kind for the splits asked for."""


class ExtrasTooMany(WorldTooSmall):
    """The world of the splits holds too few distinct questions for the extra test questions asked for."""


def _draft(world: World, rng: random.Random, kind: str, answerable: bool, seen: set[str]) -> _Draft:
    for _ in range(2_000):
        if kind == "comparison":
            draft = _comparison(world, rng)
        else:
            draft = _bridge(world, rng, int(kind.split("-")[1]), answerable)
        # A bridge answer already named in the question would make the chain pointless.
        trivial = (
            draft is not None
            and kind != "comparison"
            and any(a.lower() in draft.question.lower() for a in draft.answers)
        )
        if draft is not None and not trivial and draft.question not in seen:
            seen.add(draft.question)
            return draft
    raise WorldTooSmall(
        f"could not draw a new {kind} question; use more entities (n_entities) or fewer questions"
    )


def generate(
    seed: int = 0,
    n_entities: int | None = None,
    n_train: int = 600,
    n_dev: int = 150,
    n_test: int = 150,
    unanswerable_share: float = 0.15,
    max_hops: int | None = None,
    extra_test: int = 0,
) -> dict[str, list[SyntheticQuestion]]:
    """Questions over ``build_world(seed, n_entities)``, split into train / dev / test.

    ``max_hops`` keeps only chains of at most that many hops (2: two-hop bridges and comparisons,
    the shortest episodes, for quick runs on a CPU); ``None`` mixes two to four.
    ``n_entities`` defaults to the smallest world that holds the questions: 300 entities, or 600
    with ``max_hops=2`` (a world of 300 holds too few distinct two-hop chains for the 900
    questions), and where a seed's world holds too few (four of the seeds 0-7 with ``max_hops=2``
    run out of distinct unanswerable chains, their withheld facts being too few), 1.5x and then
    2x that. Seeds that fit the first size keep the world and questions they always had.

    Question ids are ``syn{seed}-{split}-{index}`` and unique across splits; the unanswerable
    share is exact (rounded) over all splits together and spread across them by the shuffle.

    ``extra_test`` appends that many test questions, drawn in the same world after every other
    question: the world, the three splits' questions and every id stay those of ``extra_test=0``,
    so a larger test set (``make demo-rl``'s) leaves ``make run``'s seeds as they were. The extras
    are all answerable: the withheld facts of seed 0's two-hop world run out before 150 more
    questions at the 15% share, and a recipe without a refusal action is scored on answerable
    questions only. A world too small for the extras raises :class:`ExtrasTooMany` without trying
    a larger world (that would change every question).
    """
    if not 0.0 <= unanswerable_share < 1.0:
        raise ValueError(f"unanswerable_share must be in [0, 1), got {unanswerable_share}")
    if n_entities is None:
        base = 600 if max_hops == 2 else 300
        for size in (base, base * 3 // 2):
            try:
                return generate(seed, size, n_train, n_dev, n_test, unanswerable_share, max_hops, extra_test)
            except ExtrasTooMany:
                raise
            except WorldTooSmall:
                continue
        n_entities = base * 2
    world = build_world(seed, n_entities)
    rng = random.Random(seed * 1_000_003 + 7)  # independent of the world's stream
    seen: set[str] = set()
    drafts = [
        _draft(world, rng, kind, ok, seen)
        for kind, ok in _plan(rng, n_train + n_dev + n_test, unanswerable_share, max_hops)
    ]
    splits: dict[str, list[SyntheticQuestion]] = {}
    start = 0
    for split, size in (("train", n_train), ("dev", n_dev), ("test", n_test)):
        splits[split] = [
            _to_question(world, rng, d, f"syn{seed}-{split}-{i:05d}", split)
            for i, d in enumerate(drafts[start : start + size])
        ]
        start += size
    if extra_test > 0:
        try:
            extras = [_draft(world, rng, k, ok, seen) for k, ok in _plan(rng, extra_test, 0.0, max_hops)]
        except WorldTooSmall as exc:
            raise ExtrasTooMany(
                f"the world of seed {seed} holds fewer than {extra_test} more test questions: {exc}"
            ) from None
        splits["test"] += [
            _to_question(world, rng, d, f"syn{seed}-test-{n_test + i:05d}", "test")
            for i, d in enumerate(extras)
        ]
    return splits
