"""Fuzz the retriever on both embedded engines from its OpenAPI document (:mod:`tests.fuzz`): no
5xx, only declared answers, JSON error bodies; stateful scenarios follow the document's links
(create a collection, ingest into it, search it, read it, delete it)."""

from __future__ import annotations

from collections.abc import Callable

from hoprl.clients.retriever import RetrieverClient
from tests.fuzz import examples, fuzz, save

from .conftest import CORPUS


def restore(url: str) -> Callable[[], None]:
    """Back to the fixture's state: only the ``tiny`` collection, with its documents."""

    def reset() -> None:
        with RetrieverClient(url) as client:
            for info in client.collections():
                if info.name != "tiny":
                    client.delete(info.name)
            client.ingest("tiny", CORPUS)

    return reset


def test_no_server_errors(service: str) -> None:
    report = fuzz(service, "retriever", examples(20), stateful_scenarios=examples(20), reset=restore(service))
    save(report)
    assert report.failures == [], "\n".join(report.failures)
    assert len(report.per_operation) >= 9 and report.statuses[200] > 0 and report.statuses[422] > 0
    # The scenarios went create -> use -> read -> delete through the links of the OpenAPI document.
    followed = " ".join(report.transitions)
    links = ["PUT /v1/collections/{name} -> [200] ", "] IngestDocuments ", "] Search ", "] GetCollection "]
    for link in [*links, "] DeleteCollection "]:
        assert link in followed, sorted(report.transitions)
