"""The judge's HTTP API on the rules backend: verdict tables, batching, errors, health."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient

from hoprl.clients.judge import JudgeClient
from hoprl.judging import RULES_VERSION, RulesJudge
from hoprl.schemas.judge import AnswerableItem, AnswerItem, JudgeVerdict
from services.judge.app import create_app
from services.judge.backends import make_backend
from services.judge.cache import cache_key, make_cache
from services.judge.routes import backend_of, cache_of
from services.judge.settings import JudgeSettings

from .conftest import judge_service

# (prediction, references, verdict, score, rationale starts with)
ANSWER_TABLE = [
    ("The Eiffel Tower.", ["Eiffel Tower"], True, 1.0, "normalised exact match"),
    ("It was born in Paris, France", ["Paris"], True, 2 / 7, "a reference occurs"),  # F1: P 1/6, R 1
    ("Paris", ["City of Light", "Paris"], True, 1.0, "normalised exact match"),  # an alias
    ("Jane Marie Roe", ["Jane Roe"], True, 0.8, "token F1 0.80 >= 0.8"),
    ("Lyon", ["Paris"], False, 0.0, "token F1 0.00 < 0.8"),
    ("", ["Paris"], False, 0.0, "the prediction is empty"),  # an empty prediction is allowed, and wrong
    # nothing never matches nothing over HTTP either (these were "normalised exact match", verdict true)
    ("the", ["a"], False, 0.0, "the prediction is empty after normalisation"),
    ("!!!", ["???"], False, 0.0, "the prediction is empty after normalisation"),
    ("\x00", ["\x00"], False, 0.0, "the prediction is empty after normalisation"),
    ("Pedro Rodriguez", ["Pedro Rodríguez"], True, 1.0, "normalised exact match"),  # accents folded
    ("not Paris", ["Paris"], False, 2 / 3, "a reference occurs only after a negation"),  # P 1/2, R 1
]

# (question, evidence, references, verdict, score)
ANSWERABLE_TABLE = [
    ("Where was Jane Roe born?", ["Jane Roe was born in Paris."], ["Paris"], True, 1.0),
    ("Where was Jane Roe born?", ["Jane Roe founded Acme."], ["Paris"], False, 0.0),
    ("Where was Jane Roe born?", ["Jane Roe was born in Paris."], [], False, 0.0),  # no answer exists
    ("Where was Jane Roe born?", ["Jane Roe was born in Paris."], None, True, 1.0),  # overlap heuristic
    ("Where was Jane Roe born?", [], None, False, 0.0),
]


def test_health_and_ready(rules_url: str) -> None:
    assert httpx.get(f"{rules_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{rules_url}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "backend": "rules", "cache": "memory", "model": None}


def test_answer_verdicts_follow_the_rules_table(rules_url: str) -> None:
    items = [AnswerItem(prediction=p, references=r) for p, r, *_ in ANSWER_TABLE]
    with JudgeClient(rules_url) as client:
        verdicts = client.answer(items)
    for (prediction, _, verdict, score, why), got in zip(ANSWER_TABLE, verdicts, strict=True):
        assert (got.verdict, got.rationale[: len(why)]) == (verdict, why), prediction
        assert got.score == pytest.approx(score)
        assert (got.backend, got.version, got.fallback, got.fallback_reason) == (
            "rules",
            RULES_VERSION,
            False,
            None,
        )


def test_answerable_verdicts_follow_the_rules_table(rules_url: str) -> None:
    items = [AnswerableItem(question=q, evidence=e, references=r) for q, e, r, *_ in ANSWERABLE_TABLE]
    with JudgeClient(rules_url) as client:
        verdicts = client.answerable(items)
    rules = RulesJudge()
    for (q, e, r, verdict, score), got in zip(ANSWERABLE_TABLE, verdicts, strict=True):
        assert (got.verdict, got.score) == (verdict, pytest.approx(score)), (e, r)
        assert got.rationale == rules.answerable(q, e, r).rationale


def test_same_inputs_same_verdicts_across_services(rules_url: str) -> None:
    """Determinism: a fresh service (empty cache) decides exactly as the warm one did."""
    items = [AnswerItem(question="q?", prediction=p, references=r) for p, r, *_ in ANSWER_TABLE]
    with JudgeClient(rules_url) as client:
        first = client.answer(items)
    with judge_service() as other, JudgeClient(other) as client:
        again = client.answer(items)
    strip = {"cached"}
    assert [v.model_dump(exclude=strip) for v in first] == [v.model_dump(exclude=strip) for v in again]


def test_repeated_items_in_one_batch_are_judged_once_and_kept_in_order(rules_url: str) -> None:
    body = {
        "items": [
            {"prediction": "Lyon", "references": ["Paris"]},
            {"prediction": "Paris", "references": ["Paris"]},
        ]
    }
    verdicts = httpx.post(f"{rules_url}/v1/judge/answer", json={"items": body["items"] * 3}).json()[
        "verdicts"
    ]
    assert [v["verdict"] for v in verdicts] == [False, True] * 3


@pytest.mark.parametrize(
    ("path", "body", "status", "error", "names"),
    [
        ("/v1/judge/answer", {"items": []}, 422, "invalid_request", "items"),
        (
            "/v1/judge/answer",
            {"items": [{"prediction": "x", "references": []}]},
            422,
            "invalid_request",
            "items.0.references",
        ),
        (
            "/v1/judge/answer",
            {"items": [{"references": ["x"]}]},
            422,
            "invalid_request",
            "items.0.prediction",
        ),
        (
            "/v1/judge/answer",
            {"items": [{"prediction": "x", "references": ["y"], "extra": 1}]},
            422,
            "invalid_request",
            "items.0.extra",
        ),
        ("/v1/judge/answerable", {"items": [{"question": "q"}]}, 422, "invalid_request", "items.0.evidence"),
        ("/v1/judge/answerable", {"items": []}, 422, "invalid_request", "items"),
        ("/v1/judge/answerable", "{not json", 400, "malformed_json", "JSON"),
    ],
)
def test_bad_input_is_a_4xx_json_body_naming_the_problem(
    rules_url: str, path: str, body: object, status: int, error: str, names: str
) -> None:
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    response = httpx.post(f"{rules_url}{path}", headers={"content-type": "application/json"}, **kwargs)
    assert response.status_code == status, response.text
    assert response.json()["error"] == error and names in response.json()["message"]


def test_oversized_batch_is_422_and_the_limit_is_published() -> None:
    """JUDGE_MAX_BATCH as set is the document's maxItems, so a batch over it breaks the schema: 422."""
    with judge_service(max_batch=2) as url:
        spec = httpx.get(f"{url}/openapi.json").json()
        assert spec["components"]["schemas"]["AnswerRequest"]["properties"]["items"]["maxItems"] == 2
        items = [{"prediction": "x", "references": ["x"]}] * 3
        response = httpx.post(f"{url}/v1/judge/answer", json={"items": items})
        assert response.status_code == 422
        assert (
            response.json()["error"] == "batch_too_large" and "JUDGE_MAX_BATCH" in response.json()["message"]
        )
        ok = httpx.post(f"{url}/v1/judge/answerable", json={"items": [{"question": "q", "evidence": []}] * 2})
        assert ok.status_code == 200


def test_openapi_declares_the_routes_and_error_models(rules_url: str) -> None:
    spec = httpx.get(f"{rules_url}/openapi.json").json()
    operations = {op["operationId"]: op for path in spec["paths"].values() for op in path.values()}
    assert {"judge_answer", "judge_answerable", "healthz", "readyz"} <= set(operations)
    assert {"413", "422"} <= set(operations["judge_answer"]["responses"])


def test_routes_take_the_backend_and_cache_through_dependencies() -> None:
    """The routes read the backend and the cache through ``backend_of`` / ``cache_of``: a test
    hands them its own. The cache given here already holds a verdict for the item, one the rules
    would never reach, so only the given cache can have answered.

    No lifespan runs (a TestClient outside ``with``), so the app's own state never exists.
    """
    settings = JudgeSettings()
    app = create_app(settings)
    client = TestClient(app)
    item = AnswerItem(prediction="Lyon", references=["Paris"])
    missing = client.post("/v1/judge/answer", json={"items": [item.model_dump()]})
    assert (missing.status_code, missing.json()["error"]) == (503, "not_ready")
    backend, cache = make_backend(settings), make_cache(settings)
    key = cache_key(backend.name, backend.model, backend.answer_version, "answer", item.model_dump())
    stored = JudgeVerdict(verdict=True, score=0.5, rationale="stored by the test", backend="rules",
                          version=backend.answer_version)  # fmt: skip
    asyncio.run(cache.set_many({key: stored.model_dump()}))
    app.dependency_overrides[backend_of] = lambda: backend
    app.dependency_overrides[cache_of] = lambda: cache
    (verdict,) = client.post("/v1/judge/answer", json={"items": [item.model_dump()]}).json()["verdicts"]
    assert verdict == stored.model_dump() | {"cached": True}
    assert client.get("/readyz").json() == {"status": "ready", "backend": "rules", "cache": "memory",
                                            "model": None}  # fmt: skip
