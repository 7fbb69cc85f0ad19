"""Hugging Face hub datasets mapped into the common question schema.

Each entry of :data:`HUB` names the hub repository, its config and a row mapper. The mappers are
plain functions over one row, so they are tested on rows written by the tests (the hub is not
reachable from every machine); :func:`load_hub` is the same code with ``datasets.load_dataset``.

Open-domain sets without paragraphs (Bamboogle, NQ, TriviaQA, PopQA) get ``paragraphs = []``:
they are answered against a corpus you index yourself (e.g. a Wikipedia dump).

The ``test`` splits the open-domain papers report (Eval-RAR App. A.4, Table 4: NQ 3,610, TriviaQA
11,313, PopQA 14,267, Bamboogle 125) are, on the hub: NQ-open's ``validation`` split (its 3,610
questions are the open-domain NQ test set; NQ-open has no other held-out split), TriviaQA's
``validation`` split of the ``unfiltered.nocontext`` config (11,313 questions; the ``rc`` configs'
validation is another set), PopQA's and Bamboogle's ``test``. :func:`hub_location` names the
repository, config and split each (dataset, split) reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hoprl.domain import Paragraph, Question, unknown

Row = dict[str, Any]


def _dedupe(answers: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(a.strip() for a in answers if a and a.strip()))


def _hotpot_like(row: Row, dataset: str, split: str) -> Question:
    """HotpotQA and 2WikiMultiHopQA: context as {title: [...], sentences: [[...]]} or [[title, [sents]]]."""
    context = row["context"]
    if isinstance(context, dict):
        pairs = list(zip(context["title"], context["sentences"], strict=True))
    else:
        pairs = [(c[0], c[1]) for c in context]
    facts = row.get("supporting_facts") or []
    gold = set(facts["title"]) if isinstance(facts, dict) else {f[0] for f in facts}
    paragraphs = [Paragraph(title=t, text="".join(s).strip(), is_gold=t in gold) for t, s in pairs]
    answers = _dedupe([row["answer"], *row.get("answer_aliases", [])])
    return Question(
        id=str(row.get("id") or row.get("_id")),
        dataset=dataset,
        split=split,
        question=row["question"],
        answers=answers,
        type=row.get("type"),
        paragraphs=paragraphs,
        gold_titles=[p.title for p in paragraphs if p.is_gold],
    )


def hotpotqa(row: Row, split: str) -> Question:
    return _hotpot_like(row, "hotpotqa", split)


def twowiki(row: Row, split: str) -> Question:
    return _hotpot_like(row, "2wiki", split)


def musique(row: Row, split: str) -> Question:
    paragraphs = [
        Paragraph(title=p["title"], text=p["paragraph_text"], is_gold=bool(p["is_supporting"]))
        for p in row["paragraphs"]
    ]
    answerable = row.get("answerable", True)
    hops = len(row.get("question_decomposition") or []) or None
    return Question(
        id=row["id"],
        dataset="musique",
        split=split,
        question=row["question"],
        answers=_dedupe([row["answer"], *row.get("answer_aliases", [])]) if answerable else [],
        type=f"{hops}hop" if hops else None,
        paragraphs=paragraphs,
        gold_titles=[p.title for p in paragraphs if p.is_gold],
    )


def _open_domain(dataset: str, qid: str, question: str, answers: Iterable[str], split: str) -> Question:
    return Question(id=qid, dataset=dataset, split=split, question=question, answers=_dedupe(answers))


def bamboogle(row: Row, split: str) -> Question:
    """Bamboogle rows carry no id: one is derived from the question text, the same in every process
    (Python's ``hash`` of a string is salted per process), so runs can be paired question by question."""
    qid = str(row.get("id") or "bamboogle-" + hashlib.sha1(row["Question"].encode()).hexdigest()[:12])
    return _open_domain("bamboogle", qid, row["Question"], [row["Answer"]], split)


def nq(row: Row, split: str) -> Question:
    qid = str(row.get("id") or row["question"])
    return _open_domain("nq", qid, row["question"], row["answer"], split)


def triviaqa(row: Row, split: str) -> Question:
    answer = row["answer"]
    return _open_domain(
        "triviaqa", row["question_id"], row["question"], [answer["value"], *answer.get("aliases", [])], split
    )


def popqa(row: Row, split: str) -> Question:
    possible = row["possible_answers"]
    answers = json.loads(possible) if isinstance(possible, str) else possible
    return _open_domain("popqa", str(row["id"]), row["question"], answers, split)


@dataclass(frozen=True)
class HubSpec:
    path: str
    config: str | None
    mapper: Callable[[Row, str], Question]
    splits: dict[str, str]  # our split name -> the hub's
    #: our split name -> the config that holds it, where it is not ``config``
    split_configs: dict[str, str] = field(default_factory=dict)


HUB: dict[str, HubSpec] = {
    "hotpotqa": HubSpec(
        "hotpotqa/hotpot_qa", "distractor", hotpotqa, {"train": "train", "dev": "validation"}
    ),
    "hotpotqa-fullwiki": HubSpec(
        "hotpotqa/hotpot_qa", "fullwiki", hotpotqa, {"train": "train", "dev": "validation"}
    ),
    "2wiki": HubSpec("framolfese/2WikiMultihopQA", None, twowiki, {"train": "train", "dev": "validation"}),
    "musique": HubSpec("dgslibisey/MuSiQue", None, musique, {"train": "train", "dev": "validation"}),
    "bamboogle": HubSpec("chiayewken/bamboogle", None, bamboogle, {"dev": "test", "test": "test"}),
    "nq": HubSpec(
        "google-research-datasets/nq_open",
        None,
        nq,
        {"train": "train", "dev": "validation", "test": "validation"},
    ),
    "triviaqa": HubSpec(
        "mandarjoshi/trivia_qa",
        "rc.nocontext",
        triviaqa,
        {"train": "train", "dev": "validation", "test": "validation"},
        {"test": "unfiltered.nocontext"},
    ),
    "popqa": HubSpec("akariasai/PopQA", None, popqa, {"dev": "test", "test": "test"}),
}


def hub_location(name: str, split: str) -> tuple[str, str | None, str]:
    """``(repository, config, hub split)`` that ``name``'s ``split`` is read from.

    >>> hub_location("triviaqa", "test")
    ('mandarjoshi/trivia_qa', 'unfiltered.nocontext', 'validation')
    """
    if name not in HUB:
        raise unknown("dataset", name, HUB)
    spec = HUB[name]
    if split not in spec.splits:
        raise ValueError(f"{name} has no split {split!r}; valid: {', '.join(spec.splits)}")
    return spec.path, spec.split_configs.get(split, spec.config), spec.splits[split]


def load_hub(
    name: str, split: str = "dev", limit: int | None = None, data_files: str | list[str] | None = None
) -> list[Question]:
    """Load ``name`` from the Hugging Face hub (or local files in the hub's row format).

    Args:
        name: a key of :data:`HUB`, e.g. ``"hotpotqa"``.
        split: ``train`` / ``dev`` / ``test`` (mapped to the hub's split names).
        limit: keep the first ``limit`` questions.
        data_files: JSON/JSONL files with hub-shaped rows, read instead of the hub (offline use).
    """
    import datasets

    path, config, hub_split = hub_location(name, split)
    spec = HUB[name]
    if data_files is not None:
        rows = datasets.load_dataset("json", data_files=data_files, split="train")
    else:
        rows = datasets.load_dataset(path, config, split=hub_split)
    out: list[Question] = []
    for row in rows:
        if limit is not None and len(out) >= limit:
            break
        out.append(spec.mapper(dict(row), split))
    return out
