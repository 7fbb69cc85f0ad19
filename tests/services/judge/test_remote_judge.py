"""RemoteJudge: the ``hoprl.judging.Judge`` protocol over HTTP, used by EVO-RAG's refusal reward."""

from __future__ import annotations

import importlib.resources

import pytest

from hoprl.agent.trajectory import Episode, RetrievedDoc, Step
from hoprl.clients.judge import JudgeVerdict, RemoteJudge
from hoprl.judging import Judge, RulesJudge
from hoprl.recipes.evo_rag import score_episode
from services.judge.prompts import ANSWER_PROMPTS, ANSWERABLE_PROMPTS, load_prompt

from .conftest import ScriptedLLM, llm_judge

QUESTION = "Where was the founder of Acme Records born?"


def refusal_episode(evidence: str, answers: list[str]) -> Episode:
    doc = RetrievedDoc(id="roe", title="Jane Roe", text=evidence)
    steps = [
        Step(t=1, action="search", text="", queries=["Jane Roe"], docs=[[doc]]),
        Step(t=2, action="refuse", text=""),
    ]
    return Episode(
        recipe="evo-rag",
        question_id="q",
        question=QUESTION,
        answers=answers,
        gold_titles=["Jane Roe"],
        steps=steps,
    )


@pytest.mark.parametrize(
    ("evidence", "answers", "r_ref"),
    [
        ("Jane Roe was born in Paris.", ["Paris"], -1.0),  # answerable: refusing is wrong
        ("Jane Roe founded Acme Records.", ["Paris"], 1.0),  # the evidence lacks the answer
        ("Jane Roe was born in Paris.", [], 1.0),  # no answer exists
    ],
)
def test_refusal_reward_through_the_service_matches_rules(
    rules_url: str, evidence: str, answers: list[str], r_ref: float
) -> None:
    remote: Judge = RemoteJudge(rules_url)
    episode = refusal_episode(evidence, answers)
    local = score_episode(episode, RulesJudge(), "refinement")
    served = score_episode(episode, remote, "refinement")
    assert served.steps[1].signals == local.steps[1].signals
    assert served.steps[1].signals["r_ref"] == r_ref
    trail = served.meta["evo_rag"]["refusal"]
    assert trail["backend"] == "rules" and trail["version"] == "rules@1" and trail["fallback"] is False


def test_remote_judge_answers_like_rules_judge(rules_url: str) -> None:
    remote, rules = RemoteJudge(rules_url), RulesJudge()
    for prediction, references in [("The Eiffel Tower.", ["Eiffel Tower"]), ("Lyon", ["Paris"])]:
        got = remote.answer(prediction, references, question="Which landmark?")
        assert isinstance(got, JudgeVerdict)
        assert got.model_dump(include=set(rules.answer(prediction, references).model_fields_set)) == (
            rules.answer(prediction, references).model_dump()
        )
    with pytest.raises(ValueError, match="references"):
        remote.answer("x", [])
    remote.close()


def test_an_llm_refusal_check_through_the_service() -> None:
    """With the openai backend the LLM decides answerability, and the trail records its prompt."""
    llm = ScriptedLLM({"Jane Roe founded Acme Records.": "NO"}, default="YES")
    with llm_judge(llm) as url:
        remote = RemoteJudge(url)
        served = score_episode(
            refusal_episode("Jane Roe founded Acme Records.", ["Paris"]), remote, "discovery"
        )
        remote.close()
    assert served.steps[1].signals["r_ref"] == 1.0
    trail = served.meta["evo_rag"]["refusal"]
    assert (trail["backend"], trail["version"], trail["fallback"]) == ("openai", "answerable@1", False)


def test_prompts_ship_as_package_data() -> None:
    """Every prompt loads through importlib.resources, i.e. from wherever the package is installed."""
    folder = importlib.resources.files("services.judge.prompts")
    for version in ANSWER_PROMPTS | ANSWERABLE_PROMPTS:
        assert folder.joinpath(f"{version}.txt").is_file()
        prompt = load_prompt(version)
        assert "{question}" in prompt.template and "{references}" in prompt.template
    with pytest.raises(ValueError, match="known"):
        load_prompt("answer_equivalence@9")
