"""A synthetic multi-hop world, generated deterministically from a seed.

The world is a set of fictional entities (people, cities, countries, companies, bands, films,
rivers) with made-up pronounceable names, typed attributes (birth year, population, genre, ...)
and functional relations (``born_in``, ``founded_by``, ``located_in``, ...: at most one target
each, so every noun phrase like "the founder of Velmora Records" names exactly one entity).
Each entity has ONE paragraph stating its facts in natural sentences, with a few phrasings.

Questions, in :class:`SyntheticQuestion` (the common :class:`~hoprl.schemas.Question` plus
``hops``, the gold reasoning chain):

* ``bridge-N`` (N = 2..4): a chain of N facts, one paragraph per fact, e.g. "In which country is
  the city where the founder of Velmora Records was born?" (bridge-3).
* ``comparison``: "Which company was founded first, X or Y?" (two paragraphs).
* unanswerable (a configurable share, ``answers == []``): a bridge chain whose last fact was
  *withheld* when the world was built, so no paragraph anywhere states it. Its chain paragraphs
  are still marked gold: they are the evidence one would read before refusing.

Each question carries 10 paragraphs (gold plus look-alike distractors: same kind of entity or a
shared name word), like HotpotQA's distractor setting.

>>> splits = generate(seed=1, n_entities=80, n_train=20, n_dev=5, n_test=5)
>>> sorted(splits), len(splits["train"])
(['dev', 'test', 'train'], 20)
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from hoprl.schemas import Paragraph, Question

DATASET = "synthetic"
PARAGRAPHS_PER_QUESTION = 10


class Hop(BaseModel):
    """One step of a gold reasoning chain: read ``title``'s paragraph to learn ``relation``."""

    title: str = Field(description="title of the paragraph that states this hop's fact")
    relation: str = Field(description="relation or attribute read here, e.g. 'founded_by'; '' if unknown")
    query: str = Field(description="a good search query for this hop's paragraph")
    answer: str | None = Field(
        description="the intermediate answer; None when the fact is absent (synthetic, withheld) or "
        "unknown (a real benchmark's bridge hop, whose relation is '')"
    )


class SyntheticQuestion(Question):
    """A common-schema question plus its gold hop chain (readers of the common schema ignore it)."""

    hops: list[Hop] = Field(default_factory=list)


@dataclass(frozen=True)
class _Fact:
    ask: str  # the question asking for this fact, "{x}" = the subject's noun phrase
    query: str  # words appended to the subject's title to search for the fact
    says: tuple[str, ...]  # sentence phrasings, "{s}" = subject name, "{o}" = rendered value
    np: str = ""  # relations only: noun phrase naming the target, "{x}" = subject phrase


# fact -> (the question asking for it, words that search for it, and for relations the noun phrase
# naming the target, "" for attributes); "{x}" is the subject's noun phrase.
_ASKS: dict[str, tuple[str, str, str]] = {
    "born_in": ("In which city was {x} born?", "birthplace", "the city where {x} was born"),
    "member_of": ("Which band did {x} play in?", "band member", "the band that {x} played in"),
    "located_in": ("In which country is {x}?", "country", "the country that contains {x}"),
    "capital": ("What is the capital of {x}?", "capital", "the capital of {x}"),
    "founded_by": ("Who founded {x}?", "founder", "the founder of {x}"),
    "headquartered_in": (
        "In which city is {x} headquartered?",
        "headquarters",
        "the city where {x} is headquartered",
    ),
    "formed_in": ("In which city was {x} formed?", "formed hometown", "the city where {x} was formed"),
    "signed_to": ("Which label is {x} signed to?", "record label", "the label that {x} is signed to"),
    "directed_by": ("Who directed {x}?", "director", "the director of {x}"),
    "flows_through": (
        "Which country does {x} flow through?",
        "country",
        "the country that {x} flows through",
    ),
    "birth_year": ("In what year was {x} born?", "birth year", ""),
    "population": ("What is the population of {x}?", "population", ""),
    "independence_year": ("In what year did {x} become independent?", "independence year", ""),
    "founding_year": ("In what year was {x} founded?", "founding year", ""),
    "formed_year": ("In what year was {x} formed?", "formation year", ""),
    "genre": ("What genre of music does {x} play?", "genre", ""),
    "release_year": ("In what year was {x} released?", "release year", ""),
    "length_km": ("How long is {x}?", "length", ""),
}
# fact -> the ways a paragraph states it; "{s}" is the subject's name, "{o}" the rendered value.
_SAYS: dict[str, tuple[str, ...]] = {
    "born_in": ("{s} was born in the city of {o}.", "{s} is a native of {o}."),
    "member_of": ("{s} played in the band {o}.", "{s} was a member of {o}."),
    "located_in": ("{s} is located in {o}.", "{s} lies in {o}."),
    "capital": ("The capital of {s} is {o}.", "{s} has its capital in {o}."),
    "founded_by": ("{s} was founded by {o}.", "{o} founded {s}."),
    "headquartered_in": ("{s} is headquartered in {o}.", "The head office of {s} is in {o}."),
    "formed_in": ("{s} was formed in the city of {o}.", "{s} got together in {o}."),
    "signed_to": ("{s} is signed to {o}.", "{s} records for the label {o}."),
    "directed_by": ("{s} was directed by {o}.", "{o} directed {s}."),
    "flows_through": ("{s} flows through {o}.", "{s} runs across {o}."),
    "birth_year": ("{s} was born in {o}.", "{s}'s year of birth is {o}."),
    "population": ("{s} has a population of {o}.", "About {o} people live in {s}."),
    "independence_year": ("{s} became independent in {o}.", "{s} gained its independence in {o}."),
    "founding_year": ("{s} was established in {o}.", "{s} opened for business in {o}."),
    "formed_year": ("{s} formed in {o}.", "{s} began performing together in {o}."),
    "genre": ("{s} plays {o}.", "The music of {s} is usually described as {o}."),
    "release_year": ("{s} was released in {o}.", "{s} premiered in {o}."),
    "length_km": ("{s} is {o} long.", "{s} runs for {o} from source to mouth."),
}
_FACTS = {key: _Fact(ask, query, _SAYS[key], np) for key, (ask, query, np) in _ASKS.items()}

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

# A withheld located_in or capital would still be implied by the other side's paragraph
# ("The capital of Doravia is Tarsk"), so those two facts are never withheld.
_NEVER_WITHHELD = ("located_in", "capital")

# Share of each kind among the entities; people dominate because most relations point to them.
_KIND_SHARES = dict(country=0.06, city=0.18, person=0.34, band=0.10, company=0.14, film=0.12, river=0.06)
_INTROS = {
    "country": ("{s} is a country.", "{s} is a small republic."),
    "city": ("{s} is a city.", "{s} is an old market town.", "{s} is a harbour city."),
    "person": ("{s} is {occupation}.", "{s} worked as {occupation}."),
    "band": ("{s} is a band.", "{s} is a music group."),
    "company": ("{s} is a company.", "{s} is a privately held business."),
    "film": ("{s} is a film.", "{s} is a feature film."),
    "river": ("{s} is a river.", "{s} is a river known for its fishing."),
}
_OCCUPATIONS = ("a painter", "an engineer", "a novelist", "a chemist", "an architect", "a film director")
_GENRES = ("folk rock", "synth pop", "jazz fusion", "post-punk", "bluegrass", "dream pop")
_ONSETS = ("b", "br", "d", "dr", "f", "g", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "th", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ou")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m")


@dataclass
class Entity:
    """One fictional entity; ``withheld`` lists facts that were removed from the world."""

    name: str
    kind: str
    attrs: dict[str, int | str] = field(default_factory=dict)
    rels: dict[str, str] = field(default_factory=dict)
    withheld: list[str] = field(default_factory=list)
    text: str = ""

    def value(self, key: str) -> str:
        """The fact ``key`` as its paragraph states it (relations: the target's name)."""
        return self.rels[key] if key in self.rels else render_value(key, self.attrs[key])


@dataclass
class World:
    """All entities of one seed; :meth:`paragraphs` is the retrieval corpus."""

    seed: int
    entities: list[Entity]
    by_name: dict[str, Entity] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_name = {e.name: e for e in self.entities}

    def paragraphs(self) -> list[Paragraph]:
        return [Paragraph(title=e.name, text=e.text) for e in self.entities]


def render_value(key: str, value: int | str) -> str:
    """How an attribute value is written in paragraphs and gold answers."""
    if key == "population":
        return f"{value:,}"
    if key == "length_km":
        return f"{value} km"
    return str(value)


def _aliases(key: str, value: int | str) -> list[str]:
    """Gold answer first, then the other ways a correct prediction may write it."""
    if key == "population":
        return [f"{value:,}", str(value)]
    if key == "length_km":
        return [f"{value} km", str(value), f"{value} kilometres"]
    return [render_value(key, value)]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    ).capitalize()


def _name(kind: str, rng: random.Random, roots: list[str], firsts: list[str]) -> str:
    """A made-up name; roots are reused on purpose so look-alike names ("Velmora", "Velmora
    Records", "Return to Velmora") exist and distractors are hard."""
    root = rng.choice(roots) if roots and rng.random() < 0.3 else _word(rng, rng.choice((2, 2, 3)))
    if kind == "person":
        return f"{rng.choice(firsts)} {root}"
    roots.append(root)
    if kind == "country":
        suffix = rng.choice(("ia", "ora", "land"))
        return root + ("r" + suffix if root[-1] in "aeiou" and suffix != "land" else suffix)
    if kind == "company":
        return f"{root} {rng.choice(('Records', 'Motors', 'Systems', 'Foods', 'Textiles'))}"
    if kind == "band":
        return f"The {root} {rng.choice(('Tides', 'Lanterns', 'Owls', 'Engines'))}"
    if kind == "film":
        return rng.choice(("Night over {w}", "The {w} Affair", "Return to {w}", "{w} Rising")).format(w=root)
    if kind == "river":
        return f"{root} River"
    return root


def _make_entities(rng: random.Random, n_entities: int) -> dict[str, list[Entity]]:
    roots: list[str] = []
    firsts = [_word(rng, 2) for _ in range(max(8, n_entities // 10))]
    taken: set[str] = set()
    by_kind: dict[str, list[Entity]] = {}
    for kind, share in _KIND_SHARES.items():
        by_kind[kind] = []
        while len(by_kind[kind]) < max(2, round(share * n_entities)):
            name = _name(kind, rng, roots, firsts)
            if name not in taken:
                taken.add(name)
                by_kind[kind].append(Entity(name, kind))
    return by_kind


def _assign_facts(rng: random.Random, k: dict[str, list[Entity]]) -> None:
    """Attributes and relations; dependent years stay plausible (a founder is born first)."""
    for e in k["country"]:
        e.attrs["independence_year"] = rng.randint(1800, 1990)
    for e in k["city"]:
        e.attrs["population"] = rng.randint(30, 30_000) * 100
        e.rels["located_in"] = rng.choice(k["country"]).name
    for e in k["country"]:
        cities = [c.name for c in k["city"] if c.rels["located_in"] == e.name]
        if cities:
            e.rels["capital"] = rng.choice(cities)
    for e in k["person"]:
        e.attrs["birth_year"] = rng.randint(1900, 1985)
        e.attrs["occupation"] = rng.choice(_OCCUPATIONS)
        e.rels["born_in"] = rng.choice(k["city"]).name
        if rng.random() < 0.5:
            e.rels["member_of"] = rng.choice(k["band"]).name
    people = {p.name: p for p in k["person"]}
    for e in k["band"]:
        e.attrs["formed_year"] = rng.randint(1960, 2015)
        e.attrs["genre"] = rng.choice(_GENRES)
        e.rels["formed_in"] = rng.choice(k["city"]).name
        if rng.random() < 0.7:
            e.rels["signed_to"] = rng.choice(k["company"]).name
    for e in k["company"]:
        e.rels["founded_by"] = rng.choice(k["person"]).name
        born = int(people[e.rels["founded_by"]].attrs["birth_year"])
        e.attrs["founding_year"] = min(2020, born + rng.randint(22, 60))
        e.rels["headquartered_in"] = rng.choice(k["city"]).name
    for e in k["film"]:
        e.rels["directed_by"] = rng.choice(k["person"]).name
        born = int(people[e.rels["directed_by"]].attrs["birth_year"])
        e.attrs["release_year"] = min(2023, born + rng.randint(25, 60))
    for e in k["river"]:
        e.attrs["length_km"] = rng.randint(40, 3000)
        e.rels["flows_through"] = rng.choice(k["country"]).name


def _withhold(rng: random.Random, entities: list[Entity], share: float) -> None:
    """Remove one fact from a ``share`` of entities: the material for unanswerable questions."""
    for e in entities:
        keys = [key for key in [*e.attrs, *e.rels] if key in _FACTS and key not in _NEVER_WITHHELD]
        if keys and rng.random() < share:
            key = rng.choice(keys)
            e.attrs.pop(key, None)
            e.rels.pop(key, None)
            e.withheld.append(key)


def _paragraph(rng: random.Random, e: Entity) -> str:
    intro = rng.choice(_INTROS[e.kind]).format(s=e.name, occupation=e.attrs.get("occupation", ""))
    facts = [key for key in _FACTS if key in e.attrs or key in e.rels]
    return " ".join(
        [intro, *(rng.choice(_FACTS[key].says).format(s=e.name, o=e.value(key)) for key in facts)]
    )


def build_world(seed: int = 0, n_entities: int = 300, withheld_share: float = 0.2) -> World:
    """Build the world of ``seed``: same arguments, same entities, facts and paragraphs."""
    if n_entities < 40:
        raise ValueError(f"n_entities={n_entities} is too small for 4-hop chains; use at least 40")
    rng = random.Random(seed)
    by_kind = _make_entities(rng, n_entities)
    entities = [e for kind in _KIND_SHARES for e in by_kind[kind]]
    _assign_facts(rng, by_kind)
    _withhold(rng, entities, withheld_share)
    for e in entities:
        e.text = _paragraph(rng, e)
    return World(seed=seed, entities=entities)


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
        finals = [k for k in last.attrs if k in _FACTS]
        finals += [k for k, target in last.rels.items() if target not in names]
    else:
        finals = list(last.withheld)
    if not finals:
        return None
    final = rng.choice(finals)
    phrase = chain[0].name
    for key in keys:
        phrase = _FACTS[key].np.format(x=phrase)
    steps = [*zip(chain, [*keys, final], strict=True)]
    hops = [
        Hop(
            title=e.name,
            relation=k,
            query=f"{e.name} {_FACTS[k].query}",
            answer=e.value(k) if k not in e.withheld else None,
        )
        for e, k in steps
    ]
    answers: list[str] = []
    if answerable:
        answers = [last.rels[final]] if final in last.rels else _aliases(final, last.attrs[final])
    return _Draft(_FACTS[final].ask.format(x=phrase), answers, f"bridge-{n_hops}", chain, hops)


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
        Hop(title=e.name, relation=key, query=f"{e.name} {_FACTS[key].query}", answer=e.value(key))
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
    raise ValueError(
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
) -> dict[str, list[SyntheticQuestion]]:
    """Questions over ``build_world(seed, n_entities)``, split into train / dev / test.

    ``max_hops`` keeps only chains of at most that many hops (2: two-hop bridges and comparisons,
    the shortest episodes, for quick runs on a CPU); ``None`` mixes two to four.
    ``n_entities`` defaults to 300, or 600 with ``max_hops=2``: a world of 300 holds too few
    distinct two-hop chains for the 900 questions.

    Question ids are ``syn{seed}-{split}-{index}`` and unique across splits; the unanswerable
    share is exact (rounded) over all splits together and spread across them by the shuffle.
    """
    if not 0.0 <= unanswerable_share < 1.0:
        raise ValueError(f"unanswerable_share must be in [0, 1), got {unanswerable_share}")
    if n_entities is None:
        n_entities = 600 if max_hops == 2 else 300
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
    return splits


def write_jsonl(path: str | Path, questions: Iterable[Question]) -> int:
    """Write one JSON object per line (``hops`` included for synthetic questions); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for q in questions:
            f.write(q.model_dump_json() + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[SyntheticQuestion]:
    """Read synthetic questions back with their ``hops`` (a common-schema file gives ``hops=[]``)."""
    with Path(path).open(encoding="utf-8") as f:
        return [SyntheticQuestion.model_validate_json(line) for line in f if line.strip()]


def hops_for(question: Question) -> list[Hop]:
    """The gold hop chain of a question.

    Synthetic questions carry theirs. For a real benchmark question the chain is a best effort:
    one hop per gold paragraph, ``query`` = its title, ``relation`` = "" (unknown). Order: the
    paragraph whose title the question names comes first (the bridge entity is usually named),
    the one containing the gold answer last, and that last hop's ``answer`` is the gold answer;
    other intermediate answers are unknown (None).
    """
    if isinstance(question, SyntheticQuestion) and question.hops:
        return list(question.hops)
    gold = [p for p in question.paragraphs if p.is_gold] or [
        p for p in question.paragraphs if p.title in question.gold_titles
    ]
    answer = question.answers[0] if question.answers else None
    text = question.question.lower()

    def contains_answer(p: Paragraph) -> bool:
        return answer is not None and answer.lower() in p.text.lower()

    ordered = sorted(gold, key=lambda p: (p.title.lower() not in text, contains_answer(p)))
    return [
        Hop(
            title=p.title,
            relation="",
            query=p.title,
            answer=answer if i == len(ordered) - 1 and contains_answer(p) else None,
        )
        for i, p in enumerate(ordered)
    ]
