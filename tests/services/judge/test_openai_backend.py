"""The openai backend against a scripted OpenAI-compatible endpoint over real HTTP.

The LLM API is the one thing outside the machine, so it is scripted; the judge, its client and
the HTTP in between are real.
"""

from __future__ import annotations

import httpx
import pytest

from hoprl.clients.judge import JudgeClient
from hoprl.judging import RULES_VERSION
from hoprl.schemas.judge import AnswerableItem, AnswerItem
from services.judge.backends import parse_verdict
from services.judge.prompts import load_prompt

from .conftest import LLM_MODEL, ScriptedLLM, judge_service, llm_judge

YES_NO = (("yes",), ("no",))


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("YES", True),
        ("no", False),
        ("No.", False),
        ("**Yes**", True),
        ("Answer: NO", False),
        ("Final verdict - yes, both name the same city.", True),
        ("<think>Is it yes or no? The names differ.</think>\nNO", False),
        ("No, the prediction names Lyon, yes.", False),  # the first word decides
        ("The two are equivalent.", None),
        ("maybe yes, maybe no", None),  # both polarities, no leading verdict
        ("", None),
        ("yesterday nobody knew", None),  # whole words only
    ],
)
def test_parse_yes_no(reply: str, expected: bool | None) -> None:
    assert parse_verdict(reply, *YES_NO) is expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Correct", True),
        ("Wrong", False),
        ("Incorrect.", False),
        ("Mark: correct", True),
        ("The answer is incorrect", False),
    ],
)
def test_parse_correct_wrong(reply: str, expected: bool) -> None:
    prompt = load_prompt("answer_validation@1")
    assert parse_verdict(reply, prompt.positive, prompt.negative) is expected


def test_llm_verdicts_record_the_prompt_and_send_temperature_zero() -> None:
    llm = ScriptedLLM({"Predicted answer: the capital of France": "YES", "Predicted answer: Lyon": "NO"})
    items = [
        AnswerItem(
            question="Where was Jane Roe born?", prediction="the capital of France", references=["Paris"]
        ),
        AnswerItem(
            question="Where was Jane Roe born?", prediction="Lyon", references=["Paris", "City of Light"]
        ),
    ]
    with llm_judge(llm, seed=7) as url, JudgeClient(url) as client:
        verdicts = client.answer(items)
        ready = httpx.get(f"{url}/readyz").json()
    assert [(v.verdict, v.score) for v in verdicts] == [(True, 1.0), (False, 0.0)]
    assert {(v.backend, v.version, v.fallback) for v in verdicts} == {
        ("openai", "answer_equivalence@1", False)
    }
    assert "replied 'YES'" in verdicts[0].rationale
    assert ready == {"status": "ready", "backend": "openai", "cache": "memory", "model": LLM_MODEL}
    assert len(llm.requests) == 2
    for request in llm.requests:
        assert (request["model"], request["temperature"], request["seed"]) == (LLM_MODEL, 0.0, 7)
    prompt = next(r["messages"][0]["content"] for r in llm.requests if "Lyon" in r["messages"][0]["content"])
    assert (
        "Where was Jane Roe born?" in prompt
        and "- Paris\n- City of Light" in prompt
        and "YES or NO" in prompt
    )


def test_teacher_prompt_and_answerable_prompt() -> None:
    llm = ScriptedLLM({"Student's answer: Paris": "Correct", "[2] Jane Roe was born in Paris.": "YES"})
    with llm_judge(llm, answer_prompt="answer_validation@1") as url, JudgeClient(url) as client:
        answer = client.answer([AnswerItem(prediction="Paris", references=["Paris"])])[0]
        answerable = client.answerable(
            [
                AnswerableItem(
                    question="Where was Jane Roe born?", evidence=["Acme.", "Jane Roe was born in Paris."]
                )
            ]
        )[0]
    assert (answer.verdict, answer.version) == (True, "answer_validation@1")
    assert (answerable.verdict, answerable.backend, answerable.version) == (True, "openai", "answerable@1")
    assert any("(none known)" in r["messages"][0]["content"] for r in llm.requests)


def test_when_to_search_judge_prompt_is_app_b4() -> None:
    """App. B.4's "Instruction for Judge LLM": a flexible semantic match, one word YES or NO."""
    llm = ScriptedLLM({"Prediction: the capital of France": "YES", "Prediction: Lyon": "NO"})
    items = [
        AnswerItem(prediction="the capital of France", references=["Paris"]),
        AnswerItem(prediction="Lyon", references=["Paris", "City of Light"]),
    ]
    with llm_judge(llm, answer_prompt="when_to_search_judge@1") as url, JudgeClient(url) as client:
        verdicts = client.answer(items)
    assert [(v.verdict, v.version) for v in verdicts] == [
        (True, "when_to_search_judge@1"), (False, "when_to_search_judge@1")
    ]  # fmt: skip
    prompt = next(r["messages"][0]["content"] for r in llm.requests if "Lyon" in r["messages"][0]["content"])
    assert prompt.startswith(
        "You are an evaluation assistant. Your task is to determine whether the given prediction "
        "semantically matches any of the reference answers. This is a flexible match: even if the "
        "wording is different, if the meaning is the same, consider it a match."
    )
    assert "Reference Answers:\n- Paris\n- City of Light" in prompt
    assert "- YES → if the prediction expresses the same meaning as any of the reference answers." in prompt
    assert prompt.rstrip().endswith("Only respond with YES or NO.")


def test_transient_errors_are_retried_then_succeed() -> None:
    llm = ScriptedLLM(default="YES", fail_first=2, fail_status=503)
    with llm_judge(llm, retries=2) as url, JudgeClient(url) as client:
        verdict = client.answer([AnswerItem(prediction="Lyon", references=["Paris"])])[0]
    assert (verdict.verdict, verdict.backend, verdict.fallback) == (True, "openai", False)
    assert len(llm.requests) == 3


def test_a_failing_llm_falls_back_to_rules_after_the_retries() -> None:
    llm = ScriptedLLM(default="NO", fail_first=10**6, fail_status=500)
    with llm_judge(llm, retries=2) as url, JudgeClient(url) as client:
        verdict = client.answer([AnswerItem(prediction="The Eiffel Tower", references=["Eiffel Tower"])])[0]
        again = client.answer([AnswerItem(prediction="The Eiffel Tower", references=["Eiffel Tower"])])[0]
    assert (verdict.verdict, verdict.backend, verdict.version, verdict.fallback) == (
        True,
        "rules",
        RULES_VERSION,
        True,
    )
    assert verdict.fallback_reason is not None and "3 attempt(s) failed" in verdict.fallback_reason
    assert "InternalServerError" in verdict.fallback_reason
    # the fallback was not cached: the second call asked the LLM again (3 more attempts)
    assert not again.cached and again.fallback and len(llm.requests) == 6


def test_a_slow_llm_times_out_then_falls_back_to_rules() -> None:
    llm = ScriptedLLM(default="NO", delay_s=0.6)
    with llm_judge(llm, timeout_s=0.2, retries=1) as url, JudgeClient(url) as client:
        verdict = client.answerable([AnswerableItem(question="q", evidence=["Paris"], references=["Paris"])])[
            0
        ]
    assert (verdict.verdict, verdict.backend, verdict.fallback) == (True, "rules", True)
    assert "2 attempt(s) failed" in str(verdict.fallback_reason) and "Timeout" in str(verdict.fallback_reason)
    assert len(llm.requests) == 2


def test_a_client_error_is_not_retried() -> None:
    llm = ScriptedLLM(fail_first=10**6, fail_status=400)
    with llm_judge(llm, retries=3) as url, JudgeClient(url) as client:
        verdict = client.answer([AnswerItem(prediction="Lyon", references=["Paris"])])[0]
    assert verdict.fallback and "BadRequestError" in str(verdict.fallback_reason)
    assert len(llm.requests) == 1


def test_an_unparseable_reply_falls_back_to_rules() -> None:
    llm = ScriptedLLM(default="The two answers look similar to me.")
    with llm_judge(llm) as url, JudgeClient(url) as client:
        verdict = client.answer([AnswerItem(prediction="Paris", references=["Paris"])])[0]
    assert (verdict.verdict, verdict.backend, verdict.fallback) == (True, "rules", True)
    assert "states no verdict" in str(verdict.fallback_reason)


def test_readyz_names_a_missing_endpoint_or_model() -> None:
    with llm_judge(ScriptedLLM(), model="not-served") as url:
        response = httpx.get(f"{url}/readyz")
    assert response.status_code == 503 and response.json()["error"] == "llm_unavailable"
    assert "'not-served'" in response.json()["message"]
    with judge_service(backend="openai", openai_base_url="http://127.0.0.1:9/v1", model="m") as url:
        response = httpx.get(f"{url}/readyz")
        # the judge still answers, from the rules, while the LLM is down
        verdict = httpx.post(
            f"{url}/v1/judge/answer", json={"items": [{"prediction": "a", "references": ["a"]}]}
        )
    assert response.status_code == 503 and "did not answer" in response.json()["message"]
    assert verdict.json()["verdicts"][0]["fallback"] is True
