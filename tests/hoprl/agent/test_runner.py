"""Runner limits and control flow, against the live retriever and the scripted model over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from hoprl.agent.runner import run_episode
from hoprl.clients.llm import LLMClient
from hoprl.clients.retriever import AsyncRetrieverClient, RetrieverClient
from hoprl.domain import Action, Episode, Question
from hoprl.recipes.baselines import SearchR1
from hoprl.schemas import Document
from services.local import LocalServer
from tests import scripted_llm as scripted
from tests.conftest import shape

COLLECTION = "runner-limits"
Q = Question(id="q1", dataset="t", split="dev", question="Who founded Acme Records?", answers=["Jane Roe"])
SEARCH = "<think>t</think><search>Acme Records founder</search>"
SEARCH2 = "<think>t</think><search>Jane Roe</search>"
ANSWER = "<think>t</think><answer>Jane Roe</answer>"


class Backtracker(SearchR1):
    """Search-R1 plus a ``<backtrack>`` action (EVO-RAG's), to drive the runner's backtrack path."""

    name: ClassVar[str] = "backtracker"
    stop: ClassVar[list[str]] = ["</search>", "</answer>", "<backtrack>"]

    def parse(self, segment: str) -> Action:
        return Action("backtrack") if segment.endswith("<backtrack>") else super().parse(segment)


class Lenient(SearchR1):
    end_on_format_error: ClassVar[bool] = False


@pytest.fixture(scope="module")
def url(retriever_url: str) -> str:
    docs = [
        Document(id="acme", title="Acme Records", text="Acme Records was founded by Jane Roe."),
        Document(id="jane", title="Jane Roe", text="Jane Roe was born in Velmora."),
    ]
    with RetrieverClient(retriever_url) as client:
        client.ingest(COLLECTION, docs)
    return retriever_url


SHAPE_KEYS = ("max_steps", "max_new_tokens_per_step", "token_budget", "temperature", "search_mode")


def episode(
    url: str, script: list[str], recipe: Any = None, server: dict[str, Any] | None = None, **options: Any
) -> tuple[Episode, Any]:
    app = scripted.create_app({Q.question: script}, **(server or {}))

    async def go(llm_url: str) -> Episode:
        llm = LLMClient(llm_url, model="scripted", timeout=30, retries=0)
        retriever = AsyncRetrieverClient(url)
        try:
            limits = {k: options.pop(k) for k in SHAPE_KEYS if k in options}
            return await run_episode(
                recipe or SearchR1(), Q, llm, retriever, COLLECTION, shape=shape(**limits), **options
            )
        finally:
            await llm.aclose()
            await retriever.aclose()

    with LocalServer(app) as llm_server:
        return asyncio.run(go(llm_server.url + "/v1")), app


def test_search_then_answer(url: str) -> None:
    ep, app = episode(url, [SEARCH, ANSWER], seed=5, sample=2, logprobs=True)
    assert (ep.outcome, ep.final_answer) == ("answer", "Jane Roe")
    assert [s.action for s in ep.steps] == ["search", "answer"]
    assert ep.steps[0].docs[0][0].title == "Acme Records"
    assert [r["seed"] for r in app.state.requests] == [7, 7]  # seed + sample
    assert len(ep.meta["logprobs"]) == 2 and ep.meta["finish_reasons"] == ["stop", "stop"]
    assert ep.meta["tokens"] > 0


def test_format_error_ends_the_episode(url: str) -> None:
    ep, _ = episode(url, ["The answer is probably Jane.", ANSWER])
    assert ep.outcome == "format_error" and len(ep.steps) == 1
    assert ep.steps[0].action == "format_error" and ep.steps[0].error


def test_format_error_can_continue(url: str) -> None:
    ep, app = episode(url, ["no tags here", ANSWER], recipe=Lenient())
    assert ep.outcome == "answer" and [s.action for s in ep.steps] == ["format_error", "answer"]
    assert app.state.requests[1]["messages"][-1] == {"role": "assistant", "content": "no tags here"}


def test_eval_rar_injects_the_retry_message_and_goes_on(url: str) -> None:
    """Eval-RAR (Algorithm 1): an invalid action gets the retry message as the next user turn."""
    from hoprl.agent.tokens import episode_messages
    from hoprl.recipes.eval_rar import RETRY_MESSAGE, SEARCH_R1_RETRY_MESSAGE, EvalRAR

    evaluated = "<evaluate>[1] says Jane Roe founded it.</evaluate>\n" + ANSWER
    ep, app = episode(url, ["I think it is Jane.", SEARCH, evaluated], recipe=EvalRAR())
    assert ep.outcome == "answer" and [s.action for s in ep.steps] == ["format_error", "search", "answer"]
    # Algorithm 1, line 22: y <- y + "My action is wrong. Let me try again."
    assert ep.steps[0].information == RETRY_MESSAGE == "My action is wrong. Let me try again."
    second = app.state.requests[1]["messages"]
    assert second[-2:] == [
        {"role": "assistant", "content": "I think it is Jane."},
        {"role": "user", "content": RETRY_MESSAGE},
    ]
    # the retry text is injected, like <information>: a user turn of the linear record (mask 0)
    assert {"role": "user", "content": RETRY_MESSAGE} in episode_messages(ep)
    ended, _ = episode(url, ["I think it is Jane.", ANSWER], recipe=EvalRAR(retry_invalid=False))
    assert ended.outcome == "format_error" and len(ended.steps) == 1
    old, _ = episode(url, ["I think it is Jane.", ANSWER], recipe=EvalRAR(retry_text="search-r1"))
    assert old.steps[0].information == SEARCH_R1_RETRY_MESSAGE and "invalid" in SEARCH_R1_RETRY_MESSAGE


def test_eval_rar_requires_an_evaluation_after_every_information(url: str) -> None:
    """Algorithm 1, lines 16-18: after <information> comes <evaluate>; a segment that skips it is an
    invalid action (line 22's retry), and the requirement holds until an evaluation is written.
    The first segment (no information yet) needs none."""
    from hoprl.recipes.eval_rar import RETRY_MESSAGE, EvalRAR

    evaluated = "<evaluate>[1] says Jane Roe founded Acme Records.</evaluate>\n" + ANSWER
    ep, _ = episode(url, [SEARCH, ANSWER, ANSWER, evaluated], recipe=EvalRAR())
    assert [s.action for s in ep.steps] == ["search", "format_error", "format_error", "answer"]
    assert ep.steps[1].error == "no <evaluate> block after <information> (Algorithm 1, line 17)"
    assert ep.steps[1].information == ep.steps[2].information == RETRY_MESSAGE
    assert (ep.outcome, ep.final_answer) == ("answer", "Jane Roe")
    # an evaluation and a second search: the next information asks for its own evaluation
    searched = "<evaluate>Jane Roe founded it; her birthplace is missing.</evaluate>\n" + SEARCH2
    again, _ = episode(url, [SEARCH, searched, ANSWER], recipe=EvalRAR(retry_invalid=False))
    assert [s.action for s in again.steps] == ["search", "search", "format_error"]
    # search-r1 has no such rule: the same answer right after information is accepted
    plain, _ = episode(url, [SEARCH, ANSWER])
    assert plain.outcome == "answer"


def test_step_cap(url: str) -> None:
    ep, _ = episode(url, [SEARCH, SEARCH2, SEARCH, ANSWER], max_steps=3)
    assert ep.outcome == "step_cap" and len(ep.steps) == 3 and ep.final_answer is None


def test_token_budget(url: str) -> None:
    # the scripted server counts 16 tokens for SEARCH cut before its stop string; the injected
    # documents then push step 2 past 60
    ep, app = episode(url, [SEARCH, SEARCH2, SEARCH, ANSWER], token_budget=60)
    assert ep.outcome == "token_budget" and [s.action for s in ep.steps] == ["search", "search"]
    assert [r["max_tokens"] for r in app.state.requests] == [60, 60 - 16]
    assert ep.meta["tokens"] > 60


def test_token_budget_cuts_a_segment(url: str) -> None:
    ep, app = episode(url, [SEARCH, SEARCH2, ANSWER], token_budget=25)
    assert [r["max_tokens"] for r in app.state.requests] == [25, 25 - 16]
    assert ep.outcome == "token_budget" and ep.steps[-1].error == "segment cut at max_tokens=9"


def test_segment_cut_by_max_tokens_is_a_format_error(url: str) -> None:
    ep, _ = episode(url, ["<think>" + "word " * 50 + "</think>" + ANSWER], max_new_tokens_per_step=10)
    assert ep.outcome == "format_error" and ep.steps[0].error == "segment cut at max_tokens=10"


def test_a_recipe_may_accept_a_truncated_segment(url: str) -> None:
    """naive-rag's answer is plain text: cut at max_tokens it is still the (truncated) answer."""
    from hoprl.recipes.baselines import NaiveRAG

    ep, _ = episode(
        url, ["Jane Roe founded it " + "and more " * 40], recipe=NaiveRAG(), max_new_tokens_per_step=10
    )
    assert ep.outcome == "answer" and ep.final_answer and ep.final_answer.startswith("Jane Roe")
    assert ep.steps[0].queries == [Q.question]  # the one retrieval, with the question


def test_server_that_does_not_name_the_stop(url: str) -> None:
    ep, _ = episode(url, [SEARCH, ANSWER], server={"report_stop_reason": False})
    assert [s.text for s in ep.steps] == [SEARCH, ANSWER]


def test_backtrack_drops_the_last_search_from_the_chat(url: str) -> None:
    script = [SEARCH, SEARCH2, "<think>wrong path</think><backtrack>", SEARCH2, ANSWER]
    ep, app = episode(url, script, recipe=Backtracker(), server={"sequential": True})
    assert [s.action for s in ep.steps] == ["search", "search", "backtrack", "search", "answer"]
    assert ep.outcome == "answer" and ep.retrieval_count == 3
    after = app.state.requests[3]["messages"]  # the request right after the backtrack
    assert [m["content"] for m in after if m["role"] == "assistant"] == [SEARCH]
    assert sum(m["role"] == "user" for m in after) == 2  # question + the first search's information


def test_backtrack_with_nothing_to_drop(url: str) -> None:
    ep, _ = episode(url, ["<backtrack>", ANSWER], recipe=Backtracker(), server={"sequential": True})
    assert ep.steps[0].error and ep.outcome == "answer"


def test_timeout_keeps_the_steps_so_far(url: str) -> None:
    ep, _ = episode(url, [SEARCH, SEARCH2, ANSWER], server={"delay_s": 0.4}, timeout_s=1.0)
    assert ep.outcome == "timeout" and 1 <= len(ep.steps) < 3
    assert all(s.action == "search" and s.docs for s in ep.steps)
    assert ep.timings["total"] < 1.5


def test_a_blank_query_finds_nothing_and_the_episode_goes_on(url: str) -> None:
    """``<search> </search>`` used to reach the retriever, whose 422 (no visible character) failed
    the episode (a 502 from /v1/rollouts); a blank query finds no documents now."""
    ep, _ = episode(url, ["<think>t</think><search> \x00 </search>", ANSWER])
    assert (ep.outcome, ep.final_answer) == ("answer", "Jane Roe"), ep
    assert ep.steps[0].action == "search" and ep.steps[0].docs == [[]]
