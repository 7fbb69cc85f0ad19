"""Fuzz the retriever on both embedded engines from its OpenAPI document (:mod:`tests.fuzz`): no
5xx, only declared answers, JSON error bodies; stateful scenarios follow the document's links
(create a collection, ingest into it, search it, read it, delete it)."""

from __future__ import annotations

from collections.abc import Callable

from hoprl.clients.retriever import RetrieverClient
from tests.fuzz import examples, fuzz_clean

from .conftest import CORPUS


def restore(url: str) -> Callable[[], None]:
    """Back to the fixture's state: only the ``tiny`` collection, with its documents."""

    def reset() -> None:
        with RetrieverClient(url) as client:
            for info in client.collections():
                for holder in info.leases:  # a scenario may have leased it
                    client.lease(info.name, holder, held=False)
                if info.name != "tiny":
                    client.delete(info.name)
            client.ingest("tiny", CORPUS)

    return reset


def test_no_server_errors(service: str) -> None:
    # The scenarios go create -> use -> read -> delete through the links of the OpenAPI document.
    links = ("PUT /v1/collections/{name} -> [200] ", "] IngestDocuments ", "] Search ", "] GetCollection ",
             "] DeleteCollection ")  # fmt: skip
    report = fuzz_clean(service, "retriever", links=links, max_examples=examples(20),
                        stateful_scenarios=examples(20), reset=restore(service))  # fmt: skip
    assert len(report.per_operation) >= 9 and report.statuses[200] > 0 and report.statuses[422] > 0
