"""Can one search find both paragraphs of a two-hop question? (the when-to-search stage-2 premise)

    python bench/one_search.py --dataset synthetic:0:2 --n 150

Indexes the world's train + dev paragraphs in an embedded retriever (the default settings) and
counts, over the first ``--n`` dev questions with two gold hops, how often the top ``--k`` hits
hold the second hop's paragraph when the query is the first hop's gold query (the SFT expert's
first search), and hold both hops' paragraphs when the query is the question itself or its
keywords (:func:`~hoprl.recipes.when_to_search.keyword_query`, the adaptive expert's first search).
"""

from __future__ import annotations

import argparse
import tempfile

from hoprl.data.corpus import pool
from hoprl.data.sources import load
from hoprl.data.synthetic import hops_for
from hoprl.recipes.when_to_search import keyword_query
from hoprl.schemas.retriever import SearchRequest
from services.retriever.index import HybridIndex
from services.retriever.settings import RetrieverSettings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="synthetic:0:2")
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--k", type=int, default=3)
    args = p.parse_args()
    dev = load(args.dataset, "dev")
    with tempfile.TemporaryDirectory() as tmp:
        index = HybridIndex(RetrieverSettings(storage_path=tmp))
        documents = pool(load(args.dataset, "train") + dev)
        index.create("world", documents)
        index.ingest("world", documents)

        def titles(query: str) -> set[str]:
            hits = index.search(SearchRequest(collection="world", queries=[query], top_k=args.k))
            return {h.title for h in hits.results[0]}

        n = after_first_hop = with_question = with_keywords = 0
        for q in dev:
            hops = hops_for(q)
            if len(hops) != 2:
                continue
            n += 1
            after_first_hop += hops[1].title in titles(hops[0].query)
            with_question += {hops[0].title, hops[1].title} <= titles(q.question)
            with_keywords += {hops[0].title, hops[1].title} <= titles(keyword_query(q.question))
            if n == args.n:
                break
        index.close()
    print(f"{n} two-hop dev questions, top {args.k}:")
    print(f"  first-hop query finds the second hop's paragraph: {after_first_hop}")
    print(f"  the question as the query finds both paragraphs:  {with_question}")
    print(f"  its keywords as the query find both paragraphs:   {with_keywords}")


if __name__ == "__main__":
    main()
