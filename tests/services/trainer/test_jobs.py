"""``services.trainer.jobs``: the collection a job's episodes search."""

from __future__ import annotations

import pytest

from hoprl.domain import Question
from hoprl.schemas.trainer import JobRequest
from services.trainer.jobs import ensure_collection
from services.trainer.settings import TrainerSettings

#: an open-domain question (NQ): an answer, no paragraphs to retrieve from
OPEN = [Question(id="nq0", dataset="nq", split="train", question="who wrote hamlet", answers=["Shakespeare"])]


def test_a_named_corpus_is_searched_as_named() -> None:
    request = JobRequest(recipe="search-r1", dataset="nq_train.jsonl", collection="wiki18")
    assert ensure_collection(request, OPEN, TrainerSettings(retriever_url="http://127.0.0.1:9")) == "wiki18"


def test_questions_without_paragraphs_need_a_corpus() -> None:
    request = JobRequest(recipe="search-r1", dataset="nq_train.jsonl")
    with pytest.raises(ValueError, match=r"carry no paragraphs .* name it as the job's collection"):
        ensure_collection(request, OPEN, TrainerSettings(retriever_url="http://127.0.0.1:9"))
