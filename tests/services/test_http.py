"""HTTP hygiene, the same on all four services, over real HTTP (:mod:`services.errors`).

- a lone UTF-16 surrogate in a JSON string is a 4xx naming where it is (the retriever's search and
  the policy's answer and OpenAI routes answered 500);
- a 405 carries ``Allow`` with every method of the path (it carried none);
- a body that is not JSON, sent to a JSON route, is a 415 (it was a 422 about a "dictionary");
- an unknown ``<SERVICE>_*`` environment variable fails the settings, naming it and the valid ones
  (it was ignored, and the service started on defaults);
- every status code a route raises is declared in its OpenAPI document.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

from hoprl.generation.model import resolve_model
from services.errors import ERROR_RESPONSES, ApiError, install_error_handlers
from services.judge.app import create_app as judge_app
from services.judge.settings import JudgeSettings
from services.local import LocalServer
from services.policy.app import create_app as policy_app
from services.policy.settings import PolicySettings
from services.retriever.app import create_app as retriever_app
from services.retriever.settings import RetrieverSettings
from services.trainer.app import create_app as trainer_app
from services.trainer.settings import TrainerSettings
from tests.fuzz import fuzz

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("retriever", "judge", "trainer", "policy")


def make_apps(tmp: Path, retriever_url: str) -> dict[str, FastAPI]:
    """One app per service, as small as each can be (the policy on the bundled model, capped)."""
    model = resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")
    return {
        "retriever": retriever_app(RetrieverSettings(storage_path=tmp / "qdrant")),
        "judge": judge_app(JudgeSettings()),
        "trainer": trainer_app(
            TrainerSettings(
                database_url=f"sqlite:///{tmp / 'registry.db'}",
                runs_dir=tmp / "runs",
                retriever_url=retriever_url,
                poll_interval_s=24 * 3600,
            )
        ),
        "policy": policy_app(
            PolicySettings(
                engine="transformers",
                model=model,
                retriever_url=retriever_url,
                max_tokens=4,
                max_steps=1,
                max_new_tokens_per_step=4,
                token_budget=64,
            )
        ),
    }


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory, retriever_url: str) -> Iterator[dict[str, str]]:
    apps = make_apps(tmp_path_factory.mktemp("http"), retriever_url)
    servers = {name: LocalServer(app) for name, app in apps.items()}
    try:
        for server in servers.values():
            server.__enter__()
        yield {name: server.url for name, server in servers.items()}
    finally:
        for server in servers.values():
            if server.url:
                server.__exit__(None, None, None)


def error_message(response: httpx.Response) -> str:
    """The message of either JSON error shape: ours, or OpenAI's envelope on its routes."""
    body = response.json()
    error = body["error"]
    return str(error["message"] if isinstance(error, dict) else body["message"])


LONE = '"\\ud800"'  # JSON text: a high surrogate with no low one after it
SURROGATES = [  # (service, path, JSON body with @ for the lone surrogate, where the message points)
    ("retriever", "/v1/search", '{"collection": "tiny", "queries": [@]}', "queries.0"),
    ("retriever", "/v1/search", '{"collection": "t", "queries": ["a"], "filter": {@: "x"}}', "filter.<key>"),
    ("retriever", "/v1/collections/c/documents", '{"documents": [{"id": "a", "text": @}]}',
     "documents.0.text"),
    ("retriever", "/retrieve", '{"queries": [@]}', "queries.0"),
    ("judge", "/v1/judge/answer", '{"items": [{"prediction": @, "references": ["a"]}]}',
     "items.0.prediction"),
    ("trainer", "/v1/jobs", '{"recipe": "search-r1", "dataset": @}', "dataset"),
    ("policy", "/v1/answer", '{"question": @}', "question"),
    ("policy", "/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": @}]}',
     "messages.0.content"),
    ("policy", "/v1/completions", '{"model": "m", "prompt": @}', "prompt"),
    ("policy", "/v1/rollouts", '{"questions": [{"id": @}]}', "questions.0.id"),
]  # fmt: skip
JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(("service", "path", "body", "where"), SURROGATES)
def test_a_lone_surrogate_is_a_4xx_naming_where(
    urls: dict[str, str], service: str, path: str, body: str, where: str
) -> None:
    response = httpx.post(urls[service] + path, content=body.replace("@", LONE), headers=JSON)
    assert response.status_code in (400, 422), response.text  # 400: OpenAI's code for a bad request
    message = error_message(response)
    assert "lone UTF-16 surrogate" in message and where in message, message


def test_surrogate_bytes_in_utf8_are_refused_too(urls: dict[str, str]) -> None:
    """UTF-8 cannot encode a surrogate; Python's JSON reader still decodes the three bytes to one."""
    body = b'{"question": "\xed\xa0\x80"}'
    response = httpx.post(
        urls["policy"] + "/v1/answer", content=body, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text
    assert "error" in response.json()


def test_paired_surrogates_are_one_character_and_pass(urls: dict[str, str]) -> None:
    body = '{"items": [{"prediction": "\\ud83d\\ude00", "references": ["\\ud83d\\ude00"]}]}'
    response = httpx.post(urls["judge"] + "/v1/judge/answer", content=body, headers=JSON)
    assert response.status_code == 200 and response.json()["verdicts"][0]["verdict"] is True


@pytest.mark.parametrize(
    ("service", "method", "path", "allowed"),
    [
        ("retriever", "PATCH", "/v1/collections/c", "GET, PUT, DELETE"),
        ("retriever", "GET", "/v1/search", "POST"),
        ("judge", "GET", "/v1/judge/answer", "POST"),
        ("trainer", "DELETE", "/v1/jobs", "GET, POST"),
        ("trainer", "GET", "/v1/jobs/job-1/cancel", "POST"),
        ("policy", "GET", "/v1/answer", "POST"),
        ("policy", "GET", "/v1/chat/completions", "POST"),
        ("policy", "PUT", "/healthz", "GET"),
    ],
)
def test_405_names_every_allowed_method(
    urls: dict[str, str], service: str, method: str, path: str, allowed: str
) -> None:
    response = httpx.request(method, urls[service] + path)
    assert response.status_code == 405, response.text
    assert set(response.headers["allow"].split(", ")) == set(allowed.split(", "))
    assert allowed in error_message(response) or response.json()["error"]


@pytest.mark.parametrize(
    ("service", "path"),
    [
        ("retriever", "/v1/search"),
        ("retriever", "/v1/collections/c/documents"),
        ("judge", "/v1/judge/answerable"),
        ("trainer", "/v1/jobs"),
        ("policy", "/v1/answer"),
        ("policy", "/v1/chat/completions"),
    ],
)
@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_a_415(
    urls: dict[str, str], service: str, path: str, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(urls[service] + path, content=b'{"question": "x"}', headers=headers)
    assert response.status_code == 415, response.text
    assert "Content-Type: application/json" in error_message(response)


@pytest.mark.parametrize(
    ("settings", "known"),
    [
        (RetrieverSettings, "RETRIEVER_STORAGE_PATH"),
        (JudgeSettings, "JUDGE_MAX_TOKENS"),
        (TrainerSettings, "TRAINER_RUNS_DIR"),
        (PolicySettings, "POLICY_MAX_TOKENS"),
    ],
)
def test_an_unknown_environment_variable_fails_the_settings(
    monkeypatch: pytest.MonkeyPatch, settings: type[BaseSettings], known: str
) -> None:
    prefix = known.split("_")[0] + "_"
    monkeypatch.setenv(known, os.environ.get(known, "8" if "TOKENS" in known else "/tmp/x"))
    settings()  # every variable it reads is fine
    monkeypatch.setenv(f"{prefix}MAX_TOKEN", "8")
    with pytest.raises(ValidationError) as info:
        settings()
    message = str(info.value)
    assert f"unknown environment variable {prefix}MAX_TOKEN" in message and known in message, message


def test_a_misspelt_variable_gets_a_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLICY_MAX_TOKEN", "8")
    with pytest.raises(ValidationError, match=r"POLICY_MAX_TOKEN \(did you mean POLICY_MAX_TOKENS\?\)"):
        PolicySettings()


def test_aliases_outside_the_prefix_are_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVER_QDRANT_URL", "http://127.0.0.1:6333")
    monkeypatch.setenv("TRAINER_DATABASE_URL", "sqlite:///x.db")
    assert RetrieverSettings().qdrant_url == "http://127.0.0.1:6333"
    assert TrainerSettings().database_url == "sqlite:///x.db"


def test_a_service_with_an_unknown_variable_does_not_start(tmp_path: Path) -> None:
    """Started as users start it: uvicorn exits non-zero and says which variable and which exist."""
    env = {**os.environ, "JUDGE_MAX_TOKEN": "8"}
    started = subprocess.run(
        [sys.executable, "-m", "uvicorn", "services.judge.app:app", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert started.returncode != 0
    assert "unknown environment variable JUDGE_MAX_TOKEN" in started.stderr, started.stderr[-2000:]
    assert "JUDGE_MAX_TOKENS" in started.stderr


# -- every status code a route raises is declared ----------------------------------------------

#: calls whose first argument is the status code the route answers
RAISERS = {"ApiError", "error_response", "openai_error"}


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every APIRoute of an app, inside included routers too."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):  # FastAPI keeps included routers whole
            yield from api_routes(route.original_router.routes)


def raised_codes(endpoint: Callable[..., Any]) -> set[int]:
    """Status codes ``endpoint`` raises, itself or through its module's functions it calls.

    Read from the source: every ``ApiError(<code>, ...)`` (and ``error_response`` /
    ``openai_error``) in the endpoint and, transitively, in the functions of its own module that
    it calls by name. Calls into other modules are not followed; the fuzzer's status-code check
    (tests/fuzz.py) covers what they answer at run time.
    """
    module = inspect.getmodule(endpoint)
    assert module is not None
    tree = ast.parse(textwrap.dedent(inspect.getsource(module)))
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    codes: set[int] = set()
    todo, seen = [endpoint.__name__], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in ast.walk(functions[name]):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            first = node.args[0] if node.args else None
            if node.func.id in RAISERS and isinstance(first, ast.Constant) and isinstance(first.value, int):
                codes.add(first.value)
            else:
                todo.append(node.func.id)
    return codes


def declared(responses: dict[str, Any]) -> Callable[[int], bool]:
    keys = set(responses)
    return lambda code: str(code) in keys or f"{code // 100}XX" in keys or "default" in keys


@pytest.mark.parametrize("service", SERVICES)
def test_every_status_code_a_route_raises_is_declared(tmp_path: Path, service: str) -> None:
    app = make_apps(tmp_path, "http://127.0.0.1:9")[service]
    spec = app.openapi()["paths"]
    checked = 0
    for route in api_routes(app.router.routes):
        if not route.include_in_schema:
            continue
        for method in route.methods:
            responses = spec[route.path_format][method.lower()]["responses"]
            undeclared = sorted(c for c in raised_codes(route.endpoint) if not declared(responses)(c))
            assert undeclared == [], (
                f"{method} {route.path_format} raises {undeclared} but declares {sorted(responses)}"
            )
            checked += 1
    assert checked >= 3


def test_the_declaration_check_sees_an_undeclared_code() -> None:
    """Guard against a vacuous pass: the trainer's cancel raises 409, which the check must find."""
    from services.trainer.routes import cancel_job

    assert 409 in raised_codes(cancel_job) and 404 in raised_codes(cancel_job)
    assert not declared({"200": {}, "404": {}})(409)


class ToyBody(BaseModel):
    x: int


def toy_app() -> FastAPI:
    """A route that fails on large numbers and one that answers a status it does not declare."""
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/boom", responses=ERROR_RESPONSES)
    def boom(body: ToyBody) -> dict[str, int]:
        if body.x > 5:
            raise RuntimeError("boom")
        return {"x": body.x}

    @app.post("/teapot", responses=ERROR_RESPONSES)
    def teapot(body: ToyBody) -> dict[str, int]:
        raise ApiError(418, "teapot", "undeclared")

    return app


def test_the_fuzzer_reports_what_it_finds() -> None:
    """Guard against a vacuous pass of the fuzz tests: both faults of :func:`toy_app` are reported,
    each with a curl command, and the run goes on after the first failure."""
    with LocalServer(toy_app()) as server:
        report = fuzz(server.url, "toy", 20)
    assert report.server_errors > 0 and report.statuses[418] > 0
    assert any("POST /boom: " in f and "ServerError" in f and "curl -X POST" in f for f in report.failures)
    assert any("POST /teapot: " in f and "UndefinedStatusCode" in f for f in report.failures)
    assert report.per_operation["POST /boom"] >= 20
