"""The synthetic world: fictional entities, their facts, and one paragraph per entity.

Entities (people, cities, countries, companies, bands, films, rivers) get made-up pronounceable
names, typed attributes and functional relations (at most one target each); a share of them has
one fact *withheld* (the material for unanswerable questions). :data:`FACTS` holds, per fact, the
question asking for it and the sentences that state it; :func:`build_world` is deterministic.

>>> world = build_world(seed=1, n_entities=80)
>>> len(world.paragraphs()) == len(world.entities)
True
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hoprl.domain import Paragraph


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
#: every fact a world may hold: how a question asks for it, a search finds it, a paragraph says it
FACTS = {key: _Fact(ask, query, _SAYS[key], np) for key, (ask, query, np) in _ASKS.items()}

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


def aliases(key: str, value: int | str) -> list[str]:
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
        keys = [key for key in [*e.attrs, *e.rels] if key in FACTS and key not in _NEVER_WITHHELD]
        if keys and rng.random() < share:
            key = rng.choice(keys)
            e.attrs.pop(key, None)
            e.rels.pop(key, None)
            e.withheld.append(key)


def _paragraph(rng: random.Random, e: Entity) -> str:
    intro = rng.choice(_INTROS[e.kind]).format(s=e.name, occupation=e.attrs.get("occupation", ""))
    facts = [key for key in FACTS if key in e.attrs or key in e.rels]
    return " ".join([intro, *(rng.choice(FACTS[key].says).format(s=e.name, o=e.value(key)) for key in facts)])


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
