"""The retriever's HTTP API on both Qdrant engines: search modes, ingest, collections, errors."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.schemas import Document
from services.retriever.app import create_app
from services.retriever.index import HybridIndex
from services.retriever.routes import index_of
from services.retriever.settings import RetrieverSettings
from services.retriever.sparse import tie_factor

from .conftest import CORPUS


def test_health_and_ready(service: str) -> None:
    assert httpx.get(f"{service}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{service}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


@pytest.mark.parametrize("mode", ["dense", "sparse", "hybrid"])
def test_search_finds_the_matching_document(service: str, mode: str) -> None:
    with RetrieverClient(service) as client:
        hits = client.search(
            "tiny", ["Who founded Acme Records?", "river through Velmora"], top_k=3, mode=mode
        )
    assert hits[0][0].id == "acme"
    assert "ansk" in [h.id for h in hits[1]][:2]
    assert [h.rank for h in hits[0]] == list(range(1, len(hits[0]) + 1))
    assert hits[0][0].title == "Acme Records" and hits[0][0].metadata == {"kind": "company"}


def test_hybrid_fuses_dense_and_sparse(service: str) -> None:
    """Qdrant's RRF adds 1 / ((rank0 + 1) / w + k - 1) per list.

    With k = 2 and w = 1 a first place gives 1 / (1 + 1) = 0.5, so first in both lists scores 1.0.
    """
    body = {
        "collection": "tiny",
        "queries": ["Acme Records founded 1961 Jane Roe"],
        "top_k": 1,
        "mode": "hybrid",
        "feedback": False,
    }
    hits = httpx.post(f"{service}/v1/search", json=body).json()["results"][0]
    assert hits[0]["id"] == "acme"
    assert hits[0]["score"] == pytest.approx(1.0, rel=1e-4)


BRIDGE = [
    Document(id="velvet", title="Velvet (album)", text="Velvet is a 1999 album released by Korvan Sound."),
    Document(
        id="korvan", title="Korvan Sound", text="Korvan Sound is an independent company run by Mira Osk."
    ),
    Document(
        id="lumo",
        title="Lumo Records",
        text="Lumo Records is a label that released many albums; "
        "it was founded in 1970 and the label released albums every year.",
    ),
    Document(
        id="brisk",
        title="Brisk Label",
        text="Brisk Label, a record label, was founded by two brothers and released its first album in 1980.",
    ),
    Document(
        id="oak", title="Oak Tunes", text="Oak Tunes is a label founded in 1975 that released folk albums."
    ),
]


def test_feedback_round_finds_the_bridge_entity(service: str) -> None:
    """The second round queries with the first round's top paragraph, which names the bridge entity."""
    question = "Who founded the label that released the album Velvet?"
    with RetrieverClient(service) as client:
        client.ingest("bridge", BRIDGE)
        rank = {}
        for feedback in (False, True):
            body = {"collection": "bridge", "queries": [question], "top_k": 5, "feedback": feedback}
            hits = httpx.post(f"{service}/v1/search", json=body).json()["results"][0]
            rank[feedback] = [h["id"] for h in hits]
        client.delete("bridge")
    assert rank[True][0] == "velvet"
    assert "korvan" in rank[True][:3]
    assert rank[True].index("korvan") < rank[False].index("korvan")


@pytest.mark.parametrize("feedback", [False, True])
def test_equal_scores_come_back_in_one_order(service: str, feedback: bool) -> None:
    """Velmora and Ansk tie after RRF (each first in one list, second in the other); the engine
    orders such ties arbitrarily per call, the retriever by doc id, so a search always repeats."""
    body = {"collection": "tiny", "queries": ["Which river flows through Velmora?"], "top_k": 3,
            "mode": "hybrid", "feedback": feedback}  # fmt: skip
    seen = set()
    with httpx.Client(base_url=service) as http:
        for _ in range(20):
            hits = http.post("/v1/search", json=body).json()["results"][0]
            seen.add(tuple((h["id"], h["score"]) for h in hits))
    (only,) = seen
    if not feedback:  # the tie itself, broken by id
        assert [doc for doc, _ in only[:2]] == ["ansk", "velmora"] and only[0][1] == only[1][1]


#: 40 documents that BM25 scores alike for "delta": one "delta" and one word of their own each
TIED = [Document(id=f"tie-{i:02d}", title=f"Report {i}", text=f"delta {w}") for i, w in enumerate(
    "amber basalt cobalt dune ember fjord garnet heath indigo jasper kelp lagoon marble nectar onyx "
    "pumice quartz russet sable tundra umber velvet willow xenon yarrow zephyr acorn birch cedar "
    "dahlia elm fern gorse hazel iris juniper kestrel lichen moss nettle".split()
)]  # fmt: skip


def test_equal_bm25_scores_rank_alike_in_every_build(service: str) -> None:
    """Three collections of the same documents, the last ingested in reverse: the engine's own order
    of equal scores differs between builds; the documents' tie factors (``sparse.tie_factor``) put
    them in the order of their ids' hashes in each, so two builds of one corpus search alike.
    (Dense scores depend on which texts share an embedding batch, so the reversed build is compared
    by BM25 only.)"""
    queries = ["delta", "delta amber report"]
    builds = {"ties-a": TIED, "ties-b": TIED, "ties-c": TIED[::-1]}
    with RetrieverClient(service) as client:
        results = {}
        for name, documents in builds.items():
            client.ingest(name, documents)
            for mode in ("sparse", "hybrid"):
                hits = client.search(name, queries, top_k=10, mode=mode)
                results[name, mode] = [[(h.id, round(h.score, 6)) for h in row] for row in hits]
            client.delete(name)
    expected = sorted((d.id for d in TIED), key=tie_factor, reverse=True)[:10]
    assert [doc for doc, _ in results["ties-a", "sparse"][0]] == expected
    assert results["ties-a", "sparse"] == results["ties-b", "sparse"] == results["ties-c", "sparse"]
    assert results["ties-a", "hybrid"] == results["ties-b", "hybrid"]


def test_filter_restricts_to_payload(service: str) -> None:
    with RetrieverClient(service) as client:
        hits = client.search("tiny", ["founded"], top_k=5, filter={"kind": "company"})[0]
        assert {h.id for h in hits} == {"acme", "brio"}
        either = client.search("tiny", ["founded"], top_k=5, filter={"kind": ["city", "river"]})[0]
        assert {h.id for h in either} == {"velmora", "ansk"}
        assert client.search("tiny", ["founded"], filter={"kind": 1961, "no-such.field": ["x"]}) == [[]]


@pytest.mark.parametrize(
    ("filter", "named"),
    [
        ({"kind": None}, "null"),
        ({"kind": 1.5}, "1.5"),
        ({"kind": {"nested": "company"}}, "nested"),
        ({"kind": True}, "true"),
        ({"kind": []}, "[]"),
        ({"kind": ["company", 1]}, '"company", 1'),
        ({"kind": [None]}, "[null]"),
        ({"kind": 2**63}, str(2**63)),
        ({"kind": 2**53}, str(2**53)),  # past I-JSON's safe integers (the schema's maximum)
        ({"": "company"}, "''"),
        ({"the kind": "company"}, "'the kind'"),
        ({"kind.": "company"}, "'kind.'"),
    ],
)
def test_a_filter_qdrant_cannot_run_is_a_422_naming_it(service: str, filter: dict, named: str) -> None:
    """Each was a 500 (Qdrant: "invalid JSON path", or a failed conversion of the value)."""
    body = {"collection": "tiny", "queries": ["founded"], "filter": filter}
    response = httpx.post(f"{service}/v1/search", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_request"
    message = response.json()["message"]
    assert message.startswith("filter: filter") and named in message, message


def test_ingest_is_idempotent_by_id(service: str) -> None:
    with RetrieverClient(service) as client:
        first = client.ingest("idem", CORPUS[:3])
        again = client.ingest("idem", [*CORPUS[:3], Document(id="new", title="N", text="A new document.")])
        assert (first.points, again.points) == (3, 4)
        changed = Document(id="acme", title="Acme Records", text="Acme Records moved to Tessa in 2001.")
        assert client.ingest("idem", [changed]).points == 4
        top = client.search("idem", ["Acme moved to Tessa"], top_k=1)[0][0]
        assert top.id == "acme" and "2001" in top.text
        client.delete("idem")


def test_collections_list_create_delete(service: str) -> None:
    with RetrieverClient(service) as client:
        assert httpx.put(f"{service}/v1/collections/empty").status_code == 200
        names = {c.name: c.points for c in client.collections()}
        assert names["tiny"] == len(CORPUS) and names["empty"] == 0
        client.delete("empty")
        assert "empty" not in {c.name for c in client.collections()}
        with pytest.raises(ServiceError) as err:
            client.delete("empty")
        assert err.value.status == 404


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"collection": "tiny", "queries": [""]}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["   "]}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": []}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["x"], "top_k": 0}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["x"], "top_k": 101}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["x"], "mode": "bm42"}, 422, "invalid_request"),
        ({"collection": "nope", "queries": ["x"]}, 404, "collection_not_found"),
        ({"collection": "tiny", "queries": ["x"] * 257}, 422, "invalid_request"),  # past the schema's 256
        ({"collection": "tiny", "queries": ["x"], "surprise": 1}, 422, "invalid_request"),
        # not even one visible character, too long, or a type the schema does not name
        ({"collection": "tiny", "queries": ["\x00\x00"]}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["\t\u3000\n"]}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["x" * 8193]}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["x"], "top_k": "5"}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["x"], "top_k": True}, 422, "invalid_request"),
        ({"collection": "tiny", "queries": ["x"], "feedback": 0}, 422, "invalid_request"),
    ],
)
def test_bad_search_input_is_a_json_4xx(service: str, body: dict, status: int, error: str) -> None:
    response = httpx.post(f"{service}/v1/search", json=body)
    assert response.status_code == status
    assert response.json()["error"] == error
    assert response.json()["message"]


def test_malformed_json_and_bad_names(service: str) -> None:
    bad = httpx.post(
        f"{service}/v1/search",
        content=b'{"collection": "tiny", "queries": [',
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400 and bad.json()["error"] == "malformed_json"
    bad_name = httpx.post(f"{service}/v1/collections/..%20x/documents", json={"documents": []})
    assert 400 <= bad_name.status_code < 500 and "error" in bad_name.json()


def test_bad_ingest_loses_nothing(service: str) -> None:
    """A rejected batch writes nothing: the collection keeps exactly what it had."""
    too_many = {"documents": [{"id": f"d{i}", "text": "x"} for i in range(4097)]}
    empty_text = {"documents": [{"id": "ok", "text": "fine"}, {"id": "bad", "text": ""}]}
    nul_text = {"documents": [{"id": "ok", "text": "fine"}, {"id": "bad", "text": "\x00\x00 "}]}
    for body, status in [(too_many, 422), (empty_text, 422), (nul_text, 422), ({"documents": []}, 422)]:
        response = httpx.post(f"{service}/v1/collections/tiny/documents", json=body)
        assert response.status_code == status, response.text
    with RetrieverClient(service) as client:
        assert {c.name: c.points for c in client.collections()}["tiny"] == len(CORPUS)


def test_search_r1_retrieve_route(service: str) -> None:
    body = {"queries": ["Who founded Acme Records?"], "topk": 2, "return_scores": True, "collection": "tiny"}
    result = httpx.post(f"{service}/retrieve", json=body).json()["result"]
    assert len(result) == 1 and len(result[0]) == 2
    assert result[0][0]["document"]["contents"].startswith('"Acme Records"\n')
    plain = httpx.post(f"{service}/retrieve", json={**body, "return_scores": False}).json()["result"]
    assert plain[0][0]["id"] == "acme"
    missing = httpx.post(f"{service}/retrieve", json={"queries": ["x"]})
    assert missing.status_code == 404 and missing.json()["error"] == "collection_not_found"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"queries": [""]}, "queries.0: String should have at least 1 character"),
        ({"queries": ["ok", " \x00 "]}, "queries.1: must hold at least one visible character"),
        ({"queries": ["x"], "topk": "3"}, "topk: Input should be a JSON number, not str"),
    ],
)
def test_search_r1_route_names_what_is_wrong(service: str, body: dict, where: str) -> None:
    """``/retrieve {"queries": [""]}`` answered 422 with pydantic's URL line as its only message and
    ``detail: null``; it names the field and the rule now, with the error list in ``detail``."""
    response = httpx.post(f"{service}/retrieve", json=body | {"collection": "tiny"})
    assert response.status_code == 422, response.text
    assert response.json()["message"].startswith(where) and response.json()["detail"], response.text


def test_lowered_size_limits_name_their_settings(tmp_path: Path) -> None:
    """Each RETRIEVER_MAX_* setting lowers its limit below the schema's ceiling, on /v1/search and
    on /retrieve alike; the document publishes it, and the 422 names the field, the limit and the
    setting."""
    limits = {"max_queries": 2, "max_query_chars": 10, "max_top_k": 3, "max_documents": 1}
    app = create_app(RetrieverSettings(storage_path=tmp_path / "unused", **limits))
    client = TestClient(app)
    index = HybridIndex(RetrieverSettings(storage_path=tmp_path / "own", **limits))
    try:
        index.ingest("own", CORPUS[:2])
        app.dependency_overrides[index_of] = lambda: index
        cases = [
            ("/v1/search", {"queries": ["a", "b", "c"]}, 422,
             "queries: 3 in one request; the limit is 2 (RETRIEVER_MAX_QUERIES)"),
            ("/v1/search", {"queries": ["a", "x" * 11]}, 422,
             "queries[1]: 11 characters; the limit is 10 (RETRIEVER_MAX_QUERY_CHARS)"),
            ("/v1/search", {"queries": ["a"], "top_k": 4}, 422,
             "top_k must be between 1 and 3 (RETRIEVER_MAX_TOP_K)"),
            ("/retrieve", {"queries": ["x" * 11]}, 422, "queries[0]: 11 characters; the limit is 10"),
            ("/retrieve", {"queries": ["a"], "topk": 4}, 422,
             "topk must be between 1 and 3 (RETRIEVER_MAX_TOP_K)"),
        ]  # fmt: skip
        for path, body, status, message in cases:
            response = client.post(path, json=body | {"collection": "own"})
            assert (response.status_code, response.json()["message"][: len(message)]) == (status, message)
        fits = client.post(
            "/v1/search", json={"collection": "own", "queries": ["Acme", "x" * 10], "top_k": 3}
        )
        assert fits.status_code == 200, fits.text
        docs = {"documents": [d.model_dump() for d in CORPUS[:2]]}
        too_many = client.post("/v1/collections/own/documents", json=docs)
        assert too_many.status_code == 422 and "(RETRIEVER_MAX_DOCUMENTS)" in too_many.json()["message"]
        spec = client.get("/openapi.json").json()["components"]["schemas"]  # the settings, as set
        assert spec["SearchRequest"]["properties"]["queries"]["maxItems"] == 2
        assert spec["SearchRequest"]["properties"]["queries"]["items"]["maxLength"] == 10
        assert spec["RetrieveRequest"]["properties"]["topk"]["maximum"] == 3
    finally:
        index.close()


def test_routes_take_the_index_through_a_dependency(tmp_path: Path) -> None:
    """The routes and /readyz read the index through ``index_of``: a test hands them its own.

    No lifespan runs (a TestClient outside ``with``), so the app's own index never exists.
    """
    app = create_app(RetrieverSettings(storage_path=tmp_path / "unused"))
    client = TestClient(app)
    missing = client.get("/v1/collections")
    assert (missing.status_code, missing.json()["error"]) == (503, "not_ready")
    index = HybridIndex(RetrieverSettings(storage_path=tmp_path / "own", max_top_k=3))
    try:
        index.ingest("own", CORPUS[:2])
        app.dependency_overrides[index_of] = lambda: index
        assert [c["name"] for c in client.get("/v1/collections").json()] == ["own"]
        hits = client.post("/v1/search", json={"collection": "own", "queries": ["Acme"], "top_k": 1})
        assert hits.json()["results"][0][0]["id"] == "acme"
        too_many = client.post("/v1/search", json={"collection": "own", "queries": ["Acme"], "top_k": 4})
        assert too_many.json()["error"] == "top_k_out_of_range"  # the override's own limit (3)
        assert client.get("/readyz").json()["collections"] == 1
    finally:
        index.close()


def test_a_leased_collection_cannot_be_deleted(service: str) -> None:
    """A lease (a trainer's queued or running job) holds the collection: DELETE is a 409 naming the
    holders until each releases it; leasing and releasing are idempotent, a missing collection 404."""
    with RetrieverClient(service) as client:
        client.ingest("leased", CORPUS[:2])
        assert client.lease("leased", "job-aaa").leases == ["job-aaa"]
        assert client.lease("leased", "job-bbb").leases == client.lease("leased", "job-bbb").leases
        refused = httpx.delete(f"{service}/v1/collections/leased")
        assert (refused.status_code, refused.json()["error"]) == (409, "collection_in_use"), refused.text
        assert "job-aaa, job-bbb" in refused.json()["message"]
        assert refused.json()["detail"] == {"leases": ["job-aaa", "job-bbb"]}
        assert client.info("leased").leases == ["job-aaa", "job-bbb"]
        assert client.search("leased", ["Acme"], top_k=1)[0]  # a lease keeps the collection usable
        client.lease("leased", "job-aaa", held=False)
        assert client.lease("leased", "job-aaa", held=False).leases == ["job-bbb"]
        assert httpx.delete(f"{service}/v1/collections/leased").status_code == 409
        client.lease("leased", "job-bbb", held=False)
        client.delete("leased")
    missing = httpx.put(f"{service}/v1/collections/leased/leases/job-aaa")
    assert (missing.status_code, missing.json()["error"]) == (404, "collection_not_found")
