"""``POST /v1/answer`` end to end: the real model, a live retriever, the recipe's agent loop."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from hoprl.clients.policy import AsyncPolicyClient, PolicyClient, ServiceError
from hoprl.recipes import RECIPES
from services.local import LocalServer
from services.policy.app import create_app

from .conftest import COLLECTION, CORPUS, small_settings

INDEXED = {d.id for d in CORPUS}


def test_health_and_ready(policy_url: str) -> None:
    assert httpx.get(f"{policy_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{policy_url}/readyz").json()
    assert ready["status"] == "ready" and ready["model"] == "smollm2-135m-instruct"
    assert ready["engine"] == "transformers"  # pinned by small_settings (the default, auto, may be vllm)


def test_not_ready_names_the_missing_retriever(model_path: str) -> None:
    settings = small_settings("http://127.0.0.1:9", model_path)  # nothing listens on port 9
    with LocalServer(create_app(settings)) as server:
        response = httpx.get(f"{server.url}/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["error"] == "retriever_unavailable" and body["detail"]["model"] is True


@pytest.mark.parametrize("recipe", ["naive-rag", "search-r1"])
def test_answer_shape_citations_and_timings(policy_url: str, recipe: str) -> None:
    with PolicyClient(policy_url) as policy:
        reply = policy.answer("Who founded Acme Records?", recipe=recipe, return_trace=True)
    assert reply.recipe == recipe and reply.model == "smollm2-135m-instruct"
    assert reply.steps is not None and 1 <= len(reply.steps) <= 3
    assert reply.outcome in ("answer", "refuse", "stop", "step_cap", "token_budget", "format_error")
    retrieved = {d.id for step in reply.steps for docs in step.docs for d in docs}
    assert {c.doc_id for c in reply.citations} == retrieved <= INDEXED
    if recipe == "naive-rag":  # retrieves with the question before the model speaks
        assert reply.citations and reply.citations[0].doc_id == "acme"
        assert reply.citations[0].title == "Acme Records" and reply.timings.retrieval_s > 0
    t = reply.timings
    assert t.generation_s > 0 and t.total_s >= t.generation_s + t.retrieval_s - 1e-6
    assert (reply.answer is None) or isinstance(reply.answer, str)


def test_arena_retrieves_references_for_a_bare_question(policy_url: str) -> None:
    """An application's question brings no references: ARENA retrieves the paper's 10 (Table 2,
    HotpotQA / 2Wiki) with the question before its single turn; the tiny collection holds 4
    documents, so min(10, 4) = 4 references. Its citations are the ones it names, never more
    (tests/services/policy/test_arena_citations.py checks which)."""
    with PolicyClient(policy_url) as policy:
        reply = policy.answer("Who founded Acme Records?", recipe="arena", return_trace=True)
    assert reply.recipe == "arena" and reply.steps is not None and len(reply.steps) == 1
    assert reply.steps[0].queries == ["Who founded Acme Records?"]
    assert {d.id for docs in reply.steps[0].docs for d in docs} == INDEXED
    assert {c.doc_id for c in reply.citations} <= INDEXED
    assert reply.timings.retrieval_s > 0


def test_answer_without_trace_omits_steps(policy_url: str) -> None:
    with PolicyClient(policy_url) as policy:
        reply = policy.answer("Where was Jane Roe born?", max_steps=1)
    assert reply.steps is None


@pytest.mark.parametrize(
    ("body", "status", "error", "names"),
    [
        ({"question": "  "}, 422, "invalid_request", "question: must hold at least one visible character"),
        ({"question": "\x00\x00"}, 422, "invalid_request", "visible character"),  # answered after 16.8 s
        (
            {"question": "q?", "max_steps": "2"},
            422,
            "invalid_request",
            "max_steps: Input should be a JSON number",
        ),
        (
            {"question": "q?", "return_trace": 1},
            422,
            "invalid_request",
            "return_trace: Input should be true or false",
        ),
        ({"question": "q?", "seed": 2**53}, 422, "invalid_request", "seed"),
        (
            {"question": "q?", "recipe": "search-r1", "paragraphs": [{"title": "t", "text": "x"}]},
            422,
            "invalid_request",
            "recipe 'search-r1' searches its collection",
        ),
        (
            {"question": "q?", "paragraphs": [{"title": "t", "text": "x"}]},
            422,
            "invalid_request",
            "the default recipe (POLICY_DEFAULT_RECIPE)",
        ),
        ({"question": "x" * 301}, 422, "question_chars_too_large", "300"),
        ({"question": "q?", "recipe": "magic"}, 422, "unknown_recipe", "naive-rag"),
        ({"question": "q?", "collection": "nope"}, 404, "collection_not_found", "'nope'"),
        ({"question": "q?", "collection": "bad name!"}, 422, "invalid_request", "collection"),
        ({"question": "q?", "max_steps": 50}, 422, "max_steps_too_large", "POLICY_MAX_STEPS"),
        ({"question": "q?", "max_steps": 0}, 422, "invalid_request", "max_steps"),
        ({"question": "q?", "colection": "typo"}, 422, "invalid_request", "colection"),
    ],
)
def test_answer_rejects_bad_input(
    policy_url: str, body: dict[str, object], status: int, error: str, names: str
) -> None:
    response = httpx.post(f"{policy_url}/v1/answer", json=body)
    assert response.status_code == status, response.text
    reply = response.json()
    assert reply["error"] == error and names in reply["message"]
    if error == "unknown_recipe":
        assert all(name in reply["message"] for name in RECIPES)


def test_concurrent_clients_all_succeed(policy_url: str) -> None:
    """Eight clients at once: the engine batches or queues them; none fails."""

    async def main() -> list[str]:
        policy = AsyncPolicyClient(policy_url)
        try:
            questions = [f"Who founded Acme Records? ({i})" for i in range(8)]
            replies = await asyncio.gather(*(policy.answer(q, max_steps=1) for q in questions))
        finally:
            await policy.aclose()
        return [r.outcome for r in replies]

    assert len(asyncio.run(main())) == 8


def test_timeout_answers_504(indexed: str, model_path: str) -> None:
    settings = small_settings(indexed, model_path, request_timeout_s=0.05, max_new_tokens_per_step=24)
    with (
        LocalServer(create_app(settings)) as server,
        PolicyClient(server.url) as policy,
        pytest.raises(ServiceError) as caught,
    ):
        policy.answer("Who founded Acme Records?", collection=COLLECTION)
    assert caught.value.status == 504 and caught.value.body["error"] == "timeout"


def test_busy_answers_429(indexed: str, model_path: str) -> None:
    settings = small_settings(indexed, model_path, max_concurrent_generations=1)

    async def main(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            body = {"question": "Who founded Acme Records?", "max_steps": 1}
            replies = await asyncio.gather(*(http.post("/v1/answer", json=body) for _ in range(3)))
        return sorted(r.status_code for r in replies)

    with LocalServer(create_app(settings)) as server:
        statuses = asyncio.run(main(server.url))
    assert statuses[0] == 200 and 429 in statuses
