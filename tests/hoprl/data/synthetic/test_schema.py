"""The synthetic question's schema: a JSONL round trip, and the hop chain of any question."""

from pathlib import Path

from hoprl.data.jsonl import write_questions
from hoprl.data.synthetic import generate, hops_for, read_jsonl
from hoprl.domain import Paragraph, Question

SMALL = {"n_entities": 80, "n_train": 30, "n_dev": 10, "n_test": 10}


def test_jsonl_round_trips_through_the_common_schema(tmp_path: Path) -> None:
    qs = generate(seed=2, **SMALL)["dev"]
    path = tmp_path / "synthetic" / "dev.jsonl"
    assert write_questions(path, qs) == len(qs)
    common = [Question.model_validate_json(line) for line in path.read_text().splitlines()]
    assert common == [Question.model_validate(q.model_dump()) for q in qs]
    assert not hasattr(common[0], "hops")
    assert read_jsonl(path) == qs


def test_hops_for_synthetic_and_benchmark_questions() -> None:
    synthetic = generate(seed=2, **SMALL)["dev"][0]
    assert synthetic.hops and hops_for(synthetic) == synthetic.hops
    real = Question(
        id="h1",
        dataset="hotpotqa",
        split="dev",
        answers=["1912"],
        question="When was the founder of Acme Works born?",
        paragraphs=[
            Paragraph(title="Jo Bell", text="Jo Bell (born 1912) was an engineer.", is_gold=True),
            Paragraph(title="Other", text="Unrelated."),
            Paragraph(title="Acme Works", text="Acme Works was founded by Jo Bell.", is_gold=True),
        ],
        gold_titles=["Jo Bell", "Acme Works"],
    )
    hops = hops_for(real)
    assert [h.title for h in hops] == ["Acme Works", "Jo Bell"]  # named first, answer last
    assert [h.query for h in hops] == ["Acme Works", "Jo Bell"]
    assert [h.answer for h in hops] == [None, "1912"]
    assert {h.relation for h in hops} == {""}
