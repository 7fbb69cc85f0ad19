"""The papers' training sets (hoprl.data.mixtures) built from ../shared/data: the parts each config
names, drawn with the config's seed, validation apart from training, evaluation questions kept out,
and the sampling recorded (in the registry too, through prepare_data's splits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.data import dataset_name, sampling, split_questions, write_splits
from hoprl.data.jsonl import DataError, load_questions
from hoprl.data.mixtures import TrainingData, build, paper_spec, paper_training_set, question_key
from hoprl.data.sources import load
from hoprl.domain import Question

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data holds the benchmark samples")


def texts(questions: list[Question]) -> set[str]:
    return {question_key(q.question) for q in questions}


def test_evo_rag_draws_hotpotqa_training_questions_and_keeps_every_evaluation_item_out() -> None:
    """App. A.1: up to 1,000 HotpotQA training questions, none of them an evaluation question. The
    folder's hotpotqa_train.jsonl holds 110 questions (its README), so all 110 are taken."""
    built = build(TrainingData.model_validate({
        "train": ["hotpotqa:train:1000"], "dev": ["hotpotqa:dev"],
        "exclude": ["hotpotqa:dev", "2wiki:dev", "musique:dev", "bamboogle:test"], "seed": 0,
    }), DATA)  # fmt: skip
    train, dev = built.splits["train"], built.splits["dev"]
    assert len(train) == 110 and {q.dataset for q in train} == {"hotpotqa"}
    assert len(dev) == 528  # hotpotqa_dev.jsonl, whole
    evaluation = [
        q
        for name in ("hotpotqa_dev", "2wiki_dev", "musique_dev")
        for q in load_questions(DATA / f"{name}.jsonl")
    ]
    assert not texts(train) & texts(evaluation)
    assert built.record["parts"][-1] == {
        "part": "hotpotqa:train:1000",
        "role": "train",
        "available": 110,
        "taken": 110,
    }
    assert built.record["missing"] == ["bamboogle:test"]  # the folder has no Bamboogle file
    assert built.record["seed"] == 0 and built.record["source"] == str(DATA)


def test_when_to_search_splits_2wiki_80_20_without_overlap() -> None:
    """App. B.3: 80% of 2WikiMultiHopQA's training data trains, 20% validates; 2wiki_train.jsonl
    holds 500 distinct questions: round(500 x 0.2) = 100 validate, 400 train."""
    built = paper_training_set("when-to-search", str(DATA))
    train, dev = built.splits["train"], built.splits["dev"]
    assert (len(train), len(dev)) == (400, 100)
    assert not {q.id for q in train} & {q.id for q in dev}
    assert {q.id for q in train + dev} == {q.id for q in load_questions(DATA / "2wiki_train.jsonl")}


def test_r2ag_validates_on_training_splits_apart_from_its_training_questions() -> None:
    """App. B.2: 150 2WikiMultiHopQA and 150 MuSiQue training questions validate, apart from the
    500 / 3,000 / 1,174 that train. The folder holds 110 / 500 / 111: the validation parts draw
    first (150 of 500; all 111 MuSiQue), training takes what is left (110 + 350 + 0)."""
    built = paper_training_set("r2ag", str(DATA))
    train, dev = built.splits["train"], built.splits["dev"]
    assert (len(dev), len(train)) == (150 + 111, 110 + 350 + 0)
    assert not {q.id for q in train} & {q.id for q in dev}
    taken = {p["part"]: p["taken"] for p in built.record["parts"]}
    assert taken == {"2wiki:train:150": 150, "musique:train:150": 111, "hotpotqa:train:500": 110,
                     "2wiki:train:3000": 350, "musique:train:1174": 0}  # fmt: skip


def test_the_seed_orders_the_draw() -> None:
    spec = {"train": ["2wiki:train:50"], "seed": 0}
    first = build(TrainingData.model_validate(spec), DATA).splits["train"]
    again = build(TrainingData.model_validate(spec), DATA).splits["train"]
    other = build(TrainingData.model_validate({**spec, "seed": 1}), DATA).splits["train"]
    assert [q.id for q in first] == [q.id for q in again] and len(first) == 50
    assert [q.id for q in first] != [q.id for q in other]


def test_repeated_and_excluded_questions_never_train() -> None:
    """A question repeated in its split counts once; one whose text (case and spaces aside) is in
    an excluded set is kept out of training, though a validation part may still hold it."""

    def q(qid: str, text: str, split: str) -> Question:
        return Question(id=qid, dataset="toy", split=split, question=text, answers=["x"])

    rows = {
        ("toy", "train"): [
            q("a", "Who wrote X?", "train"), q("b", "who  wrote x?", "train"), q("c", "Where is Y?", "train")
        ],
        ("toy", "dev"): [q("d", "WHERE is y?", "dev")],
    }  # fmt: skip
    built = build(
        TrainingData(train=["toy:train"], exclude=["toy:dev"]), loader=lambda d, s: rows.get((d, s))
    )
    assert [x.id for x in built.splits["train"]] == ["a"]
    assert (built.record["duplicates"], built.record["excluded"]) == (1, 1)


def test_a_part_is_dataset_split_and_count() -> None:
    with pytest.raises(ValueError, match="dataset:split"):
        TrainingData(train=["hotpotqa:training:10"])
    with pytest.raises(DataError, match="no training questions"):
        build(TrainingData(train=["nq:train"]), DATA)  # the folder has no NQ file
    assert paper_spec("paper:r2ag:../shared/data") == ("r2ag", "../shared/data")
    assert paper_spec("paper:evo-rag") == ("evo-rag", None) and paper_spec("hotpotqa") is None


def test_a_job_loads_a_papers_training_set_by_name() -> None:
    spec = f"paper:when-to-search:{DATA}"
    assert len(load(spec, "train")) == 400 and len(load(spec, "dev", limit=7)) == 7
    assert load(spec, "train", seed=5)[0].id == load(spec, "train")[0].id  # the config's seed, not the job's


def test_prepare_data_writes_the_splits_with_the_sampling(tmp_path: Path) -> None:
    """prepare_data's writing task; the flow registers the sampling (tests/flows/test_flows.py)."""
    spec = f"paper:evo-rag:{DATA}"
    assert dataset_name(spec) == "paper-evo-rag"
    splits = split_questions(spec, seed=0)
    assert (len(splits["train"]), len(splits["dev"]) + len(splits["test"])) == (110, 528)
    written = write_splits.fn(spec, 0, None, str(tmp_path))
    assert written["counts"] == {"train": 110, "dev": 264, "test": 264}  # 528 dev questions halved
    assert written["sampling"] == sampling(spec) and written["sampling"]["recipe"] == "evo-rag"
    assert len(load_questions(written["paths"]["train"])) == 110
