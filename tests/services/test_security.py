"""API keys over real HTTP: the four services started with ``HOPRL_API_KEY`` set, as compose runs them.

Every protected route is found by walking each app's route table (a route added later is covered
without touching this file): no key -> 401 with ``WWW-Authenticate: Bearer`` and the JSON error
body, a wrong key -> 403, the right key -> past the check. The probes and docs stay open, the admin
route keeps its own token, the official ``openai`` client works with the key, and the project's
clients and a real Prefect flow send the key from the environment (the policy passes it on to the
retriever it searches).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from prefect.testing.utilities import prefect_test_harness
from starlette.routing import BaseRoute

from hoprl.clients.http import ServiceError
from hoprl.clients.judge import JudgeClient
from hoprl.clients.llm import LLMClient
from hoprl.clients.policy import PolicyClient
from hoprl.clients.retriever import RetrieverClient
from hoprl.clients.trainer import TrainerClient
from hoprl.domain import EpisodeShape
from hoprl.generation.model import resolve_model
from hoprl.schemas import Document
from hoprl.schemas.judge import AnswerItem
from services.judge.app import create_app as create_judge
from services.judge.settings import JudgeSettings
from services.local import LocalServer
from services.policy.app import create_app as create_policy
from services.policy.settings import PolicySettings
from services.retriever.app import create_app as create_retriever
from services.retriever.settings import RetrieverSettings
from services.security import OPEN_PATHS
from services.trainer.app import create_app as create_trainer
from services.trainer.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-api-key-2f7c1d9e"
ADMIN_TOKEN = "test-admin-token-41b3"
COLLECTION = "security-tiny"
CORPUS = [
    Document(id="acme", title="Acme Records", text="Acme Records was founded in 1961 by Jane Roe."),
    Document(id="roe", title="Jane Roe", text="Jane Roe was born in Velmora, a city in Ostland."),
]


@dataclass
class Service:
    app: FastAPI
    url: str


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    """The four services with ``HOPRL_API_KEY`` set in the environment (and so in their clients)."""
    tmp = tmp_path_factory.mktemp("security")
    model = resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOPRL_API_KEY", KEY)
        mp.setenv("HOPRL_DATABASE_URL", f"sqlite:///{tmp / 'registry.db'}")
        mp.setenv("HOPRL_RUNS_DIR", str(tmp / "runs"))
        retriever = create_retriever(RetrieverSettings(storage_path=tmp / "qdrant"))
        with LocalServer(retriever) as r:
            judge = create_judge(JudgeSettings())
            database = f"sqlite:///{tmp / 'registry.db'}"
            trainer = create_trainer(
                TrainerSettings(database_url=database, runs_dir=tmp / "jobs", retriever_url=r.url)
            )
            policy_settings = PolicySettings(
                engine="transformers", model=model, retriever_url=r.url, default_collection=COLLECTION,
                default_recipe="naive-rag", admin_token=ADMIN_TOKEN, max_tokens=8, max_steps=2,
                max_new_tokens_per_step=16, token_budget=512,
            )  # fmt: skip
            policy = create_policy(policy_settings)
            with LocalServer(judge) as j, LocalServer(trainer) as t, LocalServer(policy) as p:
                yield {
                    "retriever": Service(retriever, r.url),
                    "judge": Service(judge, j.url),
                    "trainer": Service(trainer, t.url),
                    "policy": Service(policy, p.url),
                }


def api_routes(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every API route, through included routers (FastAPI >= 0.150 nests them)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from api_routes(inner.routes, prefix + route.include_context.prefix)  # type: ignore[attr-defined]
        elif isinstance(route, APIRoute):
            yield prefix + route.path, route.methods or set()


def protected_routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path with every parameter filled) of each route the key guards."""
    out: list[tuple[str, str]] = []
    for path, methods in api_routes(app.routes):
        if path in OPEN_PATHS or path.startswith("/v1/admin/"):
            continue
        out.extend((method, re.sub(r"\{[^}]+\}", "nope-0", path)) for method in sorted(methods))
    return out


# Operations each service must have among its protected routes: the walk cannot come back empty.
EXPECTED = {
    "retriever": {("DELETE", "/v1/collections/nope-0"), ("POST", "/v1/search"), ("POST", "/retrieve")},
    "judge": {("POST", "/v1/judge/answer"), ("POST", "/v1/judge/answerable")},
    "trainer": {("POST", "/v1/jobs"), ("POST", "/v1/jobs/nope-0/cancel"), ("GET", "/v1/jobs")},
    "policy": {("POST", "/v1/answer"), ("POST", "/v1/rollouts"), ("POST", "/v1/chat/completions")},
}


def error_of(response: httpx.Response) -> tuple[str, str]:
    """(code, message) of the JSON error body, or of OpenAI's envelope on the OpenAI routes."""
    body = response.json()
    error = body["error"] if isinstance(body["error"], dict) else body
    return error.get("code") or error["error"], error["message"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_protected_route_answers_401_403_or_passes(keyed: dict[str, Service], name: str) -> None:
    service = keyed[name]
    routes = protected_routes(service.app)
    assert EXPECTED[name] <= set(routes), routes
    with httpx.Client(base_url=service.url, timeout=120) as http:
        for method, path in [*routes, ("GET", "/v1/no-such-route")]:
            body: dict[str, object] | None = {} if method in ("POST", "PUT", "PATCH") else None
            missing = http.request(method, path, json=body)
            assert missing.status_code == 401, (method, path, missing.text)
            assert missing.headers["www-authenticate"] == "Bearer"
            code, message = error_of(missing)
            assert code == "unauthorized" and "HOPRL_API_KEY" in message, (method, path)
            basic = http.request(method, path, json=body, headers={"Authorization": f"Basic {KEY}"})
            assert basic.status_code == 401, (method, path)
            wrong = http.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}x"})
            assert (wrong.status_code, error_of(wrong)[0]) == (403, "forbidden"), (method, path)
            right = http.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
            assert right.status_code not in (401, 403) and right.status_code < 500, (method, path, right.text)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_probes_and_docs_are_open_and_openapi_shows_the_lock(keyed: dict[str, Service], name: str) -> None:
    with httpx.Client(base_url=keyed[name].url, timeout=60) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200, http.get("/readyz").text
        assert http.get("/docs").status_code == 200
        spec = http.get("/openapi.json").json()
    scheme = spec["components"]["securitySchemes"]["ApiKey"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            if path in ("/healthz", "/readyz"):
                assert "security" not in operation, path
            elif path.startswith("/v1/admin/"):
                assert operation["security"] == [{"AdminToken": []}], path
            else:
                assert operation["security"] == [{"ApiKey": []}], path
                assert {"401", "403"} <= set(operation["responses"]), path


def test_admin_route_keeps_its_own_token(keyed: dict[str, Service]) -> None:
    with httpx.Client(base_url=keyed["policy"].url, timeout=60) as http:
        body = {"path": "/no/such/checkpoint"}
        assert http.post("/v1/admin/checkpoint", json=body).status_code == 401
        api_key = {"Authorization": f"Bearer {KEY}"}
        assert http.post("/v1/admin/checkpoint", json=body, headers=api_key).status_code == 403
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert http.post("/v1/admin/checkpoint", json=body, headers=admin).status_code not in (401, 403)


def test_the_openai_client_works_with_the_key(keyed: dict[str, Service]) -> None:
    base = f"{keyed['policy'].url}/v1"
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens >= 1
    text = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4)
    assert text.choices[0].text
    with pytest.raises(openai.PermissionDeniedError) as info:
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    assert info.value.code == "forbidden" and "HOPRL_API_KEY" in info.value.message


def test_llm_client_reads_the_key_from_the_environment(keyed: dict[str, Service]) -> None:
    with PolicyClient(keyed["policy"].url) as policy:
        model = policy.model()

    async def chat() -> str:
        llm = LLMClient(f"{keyed['policy'].url}/v1", model=model, retries=0)
        try:
            (reply,) = await llm.chat([{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0)
            return reply.text
        finally:
            await llm.aclose()

    assert asyncio.run(chat())


def test_project_clients_send_the_key_and_services_pass_it_on(keyed: dict[str, Service]) -> None:
    with RetrieverClient(keyed["retriever"].url) as retriever:  # HOPRL_API_KEY from the environment
        retriever.ingest(COLLECTION, CORPUS)
        assert retriever.search(COLLECTION, ["Who founded Acme Records?"], top_k=1)[0][0].id == "acme"
    for key, status in (("", 401), ("wrong", 403)):  # an explicit api_key wins over the environment
        with (
            RetrieverClient(keyed["retriever"].url, api_key=key) as other,
            pytest.raises(ServiceError) as info,
        ):
            other.collections()
        assert info.value.status == status
    # The policy searches the keyed retriever: without the key it would answer 502 (retriever 401).
    with PolicyClient(keyed["policy"].url) as policy:
        reply = policy.answer("Who founded Acme Records?", recipe="naive-rag", collection=COLLECTION)
    assert "acme" in [c.doc_id for c in reply.citations]
    with JudgeClient(keyed["judge"].url) as judge:
        assert judge.answer([AnswerItem(prediction="Jane Roe", references=["Jane Roe"])])[0].verdict
    with TrainerClient(keyed["trainer"].url) as trainer:
        assert trainer.list() == []


def test_a_prefect_flow_sends_the_key(keyed: dict[str, Service]) -> None:
    """prepare_data -> build_index -> evaluate -> collect_rollouts, as the pipeline runs them (fan-out
    eager), against the keyed services."""
    from flows import fanout
    from flows.data import build_index, prepare_data
    from flows.evaluate import evaluate
    from flows.rollouts import collect_rollouts
    from flows.runs import registry

    fanout.use_eager(True)

    with prefect_test_harness(server_startup_timeout=120):
        registry().create_run("keyed", "naive-rag", "grpo", "default", {}, 0)
        data = prepare_data("synthetic", "keyed", limit=2)
        index = build_index("keyed", data, keyed["retriever"].url)
        urls = keyed["policy"].url, keyed["retriever"].url, keyed["judge"].url
        result = evaluate(
            "keyed", "baseline", data["paths"]["test"], index["collection"], "naive-rag", *urls, limit=2
        )
        episode = EpisodeShape(max_steps=1, max_new_tokens_per_step=8, token_budget=64)
        rollouts = collect_rollouts(
            "keyed", 1, data["paths"]["dev"], index["collection"], "naive-rag", *urls[:2], 1, shape=episode
        )
    assert index["points"] > 0 and result["evaluation_id"] and 0 <= result["metrics"]["em"] <= 1
    assert rollouts["written"] == 1


def test_an_unset_key_is_open_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("HOPRL_API_KEY", raising=False)
        app = create_retriever(RetrieverSettings(storage_path=tmp_path / "qdrant"))
    with caplog.at_level(logging.WARNING, logger="hoprl.security"), LocalServer(app) as server:
        assert httpx.get(f"{server.url}/v1/collections").status_code == 200
    assert any("HOPRL_API_KEY is unset" in r.getMessage() for r in caplog.records)


def test_a_key_that_cannot_be_sent_fails_at_start(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOPRL_API_KEY", "two words")
        with pytest.raises(ValueError, match="HOPRL_API_KEY must be printable ASCII"):
            create_judge(JudgeSettings())


def test_collection_404s_do_not_list_the_other_collections(keyed: dict[str, Service]) -> None:
    with RetrieverClient(keyed["retriever"].url) as retriever:
        retriever.ingest("tenant-a-private", CORPUS[:1])
    with httpx.Client(base_url=keyed["retriever"].url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        answers = [
            http.get("/v1/collections/nope"),
            http.delete("/v1/collections/nope"),
            http.post("/v1/search", json={"collection": "nope", "queries": ["x"]}),
        ]
        for response in answers:
            assert (response.status_code, response.json()["error"]) == (404, "collection_not_found")
            assert "tenant-a-private" not in response.text and "GET /v1/collections" in response.text
        assert "tenant-a-private" in http.get("/v1/collections").text  # listing them is its own route


def test_a_policy_with_another_key_than_its_retriever_says_so(
    tmp_path: Path, keyed: dict[str, Service]
) -> None:
    model = resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOPRL_API_KEY", "another-key-9d1e")
        settings = PolicySettings(
            engine="transformers",
            model=model,
            retriever_url=keyed["retriever"].url,
            default_recipe="naive-rag",
        )
        with (
            LocalServer(create_policy(settings)) as policy,
            PolicyClient(policy.url) as client,
            pytest.raises(ServiceError) as info,
        ):
            client.answer("Who founded Acme Records?", collection=COLLECTION)
    assert info.value.status == 502 and "HOPRL_API_KEY" in str(info.value)
