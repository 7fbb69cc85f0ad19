"""R2AG: the Top-Survivor reward recomputed by hand from Eq. 5 / App. B.2, the protocol, the forest.

Every expected number below is derived in the comments from the paper's formulas (Eq. 5, App. B.2):

    R     = a R_MH + b R_JH + g R_AP + w R_f            a=0.2, b=0.3, g=0.2, w=1, l=1.25
    R_MH  = R_MH^b + l R_MH^p   per type, the branches whose top-1 document is gold and new
    R_AP  = R_AP^b + R_AP^p     each (1/|g|) sum_{u<=t} P@u 1{r_u in g}, t = 4 base / 2 predicted
    R_JH  = 1 on a stop when every gold document has been retrieved
    R_f   = 0.01 per <base-Q>/<predicted-Q> segment after a <think>; w R_f <= 0.02
    R     = 0 when a <think> is missing or the stop comes before all gold is found
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hoprl.agent.runner import run_episode
from hoprl.clients.retriever import AsyncRetrieverClient, RetrieverClient
from hoprl.data.corpus import pool
from hoprl.data.synthetic import generate, hops_for
from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.evaluation import ensure_indexed
from hoprl.recipes.r2ag import (
    SIGNALS,
    Node,
    R2ag,
    R2agConfig,
    RetrievalTree,
    average_precision,
    context,
    documents,
    episode_return,
    episode_step_rewards,
    expand,
    finished,
    grow_forest,
    parse_expansion,
    protocol,
    prune,
    score_episode,
    survivors,
)
from hoprl.training.sft import ExpertChat, expert_episodes
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.settings import RetrieverSettings
from tests.conftest import shape

Receive = Callable[[], Awaitable[dict[str, Any]]]
TAG = {"base": "base-Q", "predicted": "predicted-Q"}
STOP = "<base-Q>stop retrieval</base-Q><predicted-Q>none</predicted-Q>"


def doc(title: str) -> RetrievedDoc:
    return RetrievedDoc(id=title, title=title, text=f"text of {title}")


def expansion(t: int, *subs: tuple[str, str], think: bool = True) -> Step:
    """A search step; ``subs`` are (kind, top-1 title) pairs, each query named after its title."""
    text = ("<think>plan</think>" if think else "") + "".join(f"<{TAG[k]}>q {x}</{TAG[k]}>" for k, x in subs)
    return Step(t=t, action="search", text=text + "<end/>", queries=[f"q {x}" for _, x in subs],
                query_kinds=[k for k, _ in subs], docs=[[doc(x)] for _, x in subs])  # fmt: skip


def stop(t: int, think: bool = True) -> Step:
    return Step(t=t, action="stop", text=("<think>done</think>" if think else "") + STOP + "<end/>")


def ep(*steps: Step, gold: tuple[str, ...] = ("A", "B"), found: list[str] | None = None) -> Episode:
    meta = {"found_titles": found} if found else {}
    return Episode(recipe="r2ag", question_id="q", question="?", gold_titles=list(gold), steps=list(steps),
                   meta=meta)  # fmt: skip


def totals(episode: Episode, config: R2agConfig | None = None) -> dict[str, float]:
    """Per signal, its sum over the scored episode, plus the Top-Survivor total."""
    scored = score_episode(episode, config)
    out = {name: sum(s.signals[name] for s in scored.steps) for name in SIGNALS}
    return out | {"R": episode_return(scored, config)}


# --- the worked example ---------------------------------------------------------------------


def test_worked_example_is_0_67() -> None:
    """Gold {A, B}; one expansion with <think>: base->A, base->X, predicted->B.

    | term    | by hand                                                         | value |
    |---------|-----------------------------------------------------------------|-------|
    | R_MH^b  | new gold among the base top-1 results {A, X}: A                  | 1     |
    | R_MH^p  | new gold among the predicted top-1 results {B}: B                | 1     |
    | R_MH    | 1 + 1.25 * 1                                                    | 2.25  |
    | R_AP^b  | (1/|g|)(P@1 * 1{A in g} + P@2 * 1{X in g}) = (1/2)(1*1 + 1/2*0)  | 0.5   |
    | R_AP^p  | (1/|g|)(P@1 * 1{B in g}) = (1/2)(1*1)                            | 0.5   |
    | R_AP    | 0.5 + 0.5                                                       | 1.0   |
    | R_JH    | no stop                                                         | 0     |
    | R_f     | 3 segments after <think> * 0.01 = 0.03; w R_f capped at 0.02     | 0.02  |
    | R       | 0.2 * 2.25 + 0.3 * 0 + 0.2 * 1.0 + 0.02                          | 0.67  |
    """
    episode = ep(expansion(1, ("base", "A"), ("base", "X"), ("predicted", "B")))
    assert totals(episode) == pytest.approx({"r_mh": 2.25, "r_jh": 0.0, "r_ap": 1.0, "r_f": 0.02, "R": 0.67})
    # uncapped: R_f = 0.03, so 0.45 + 0.2 + 0.03 = 0.68
    assert totals(episode, R2agConfig(format_cap=1.0))["R"] == pytest.approx(0.68)
    parts = score_episode(episode).meta["r2ag"]["steps"][0]
    assert parts == pytest.approx({"mh_base": 1, "mh_pred": 1, "ap_base": 0.5, "ap_pred": 0.5})


# --- the reward, table-driven ---------------------------------------------------------------

CASES: list[tuple[str, Episode, R2agConfig, dict[str, float]]] = [
    (
        # stop after all gold is found. Step 1: R_MH^b = 2 (A, B new); R_AP^b = (1/2)(1*1 + 1*1)
        # = 1 (P@2 = 2/2). Step 2: R_JH = 1. R_f: 2 segments, then the stop's 2 (base-Q "stop
        # retrieval", predicted-Q "none") = 0.04, capped at 0.02. R = 0.4 + 0.3 + 0.2 + 0.02.
        "stop after all gold",
        ep(expansion(1, ("base", "A"), ("base", "B")), stop(2)),
        R2agConfig(),
        {"r_mh": 2.0, "r_jh": 1.0, "r_ap": 1.0, "r_f": 0.02, "R": 0.92},
    ),
    (
        # the same episode without <think> in the stop turn: the total reward is 0
        "missing think (stop turn)",
        ep(expansion(1, ("base", "A"), ("base", "B")), stop(2, think=False)),
        R2agConfig(),
        {"r_mh": 0.0, "r_jh": 0.0, "r_ap": 0.0, "r_f": 0.0, "R": 0.0},
    ),
    (
        "missing think (search turn)",
        ep(expansion(1, ("base", "A"), ("base", "X"), ("predicted", "B"), think=False)),
        R2agConfig(),
        {"r_mh": 0.0, "r_jh": 0.0, "r_ap": 0.0, "r_f": 0.0, "R": 0.0},
    ),
    (
        # B is never found, yet the policy stops: premature, the total reward is 0
        "premature stop",
        ep(expansion(1, ("base", "A")), stop(2)),
        R2agConfig(),
        {"r_mh": 0.0, "r_jh": 0.0, "r_ap": 0.0, "r_f": 0.0, "R": 0.0},
    ),
    (
        # base->A twice (Eq. 5 sums over branches): R_MH^b = 1{A new} + 1{A new} = 2;
        # R_AP^b = (1/2)(P@1*1 + P@2*1) = (1/2)(1 + 1) = 1; R_f = 0.02. R = 0.4 + 0.2 + 0.02.
        "duplicate gold in one step",
        ep(expansion(1, ("base", "A"), ("base", "A"))),
        R2agConfig(),
        {"r_mh": 2.0, "r_jh": 0.0, "r_ap": 1.0, "r_f": 0.02, "R": 0.62},
    ),
    (
        # the earlier reading: A counts once, R_MH^b = 1; the repeat is not relevant again,
        # R_AP^b = (1/2)(1*1 + 1/2*0) = 0.5. R = 0.2 + 0.1 + 0.02
        "option: distinct documents",
        ep(expansion(1, ("base", "A"), ("base", "A"))),
        R2agConfig(branches="distinct"),
        {"r_mh": 1.0, "r_jh": 0.0, "r_ap": 0.5, "r_f": 0.02, "R": 0.32},
    ),
    (
        # A again in step 2: not newly retrieved, R_MH = 0 there; R_AP^b is the printed
        # 1{r_u in g}, 0.5 in both steps. R_f 0.01 + 0.01. R = (0.2 + 0.1 + 0.01) + (0.1 + 0.01).
        "duplicate gold across steps",
        ep(expansion(1, ("base", "A")), expansion(2, ("base", "A"))),
        R2agConfig(),
        {"r_mh": 1.0, "r_jh": 0.0, "r_ap": 1.0, "r_f": 0.02, "R": 0.42},
    ),
    (
        # A by a base and a predicted branch: each type counts its own new gold, R_MH = 1 + 1.25;
        # R_AP = 0.5 + 0.5; R = 0.45 + 0.2 + 0.02
        "same gold by both types",
        ep(expansion(1, ("base", "A"), ("predicted", "A"))),
        R2agConfig(),
        {"r_mh": 2.25, "r_jh": 0.0, "r_ap": 1.0, "r_f": 0.02, "R": 0.67},
    ),
    (
        # Gold A..E; base X, A, B, C, D (5 > t = 4), predicted Y, Z, E (3 > t = 2).
        # R_MH^b = 4 (A-D: R_MH has no cut-off), R_MH^p = 1 (E): R_MH = 4 + 1.25 = 5.25.
        # R_AP^b over X, A, B, C: (1/5)(1/2 + 2/3 + 3/4) = 0.383333; R_AP^p over Y, Z: 0.
        # R_f = 8 segments, capped 0.02. R = 1.05 + 0.0766667 + 0.02.
        "more than t branches",
        ep(
            expansion(1, *[("base", x) for x in "XABCD"], *[("predicted", x) for x in "YZE"]),
            gold=("A", "B", "C", "D", "E"),
        ),
        R2agConfig(),
        {"r_mh": 5.25, "r_jh": 0.0, "r_ap": (1 / 2 + 2 / 3 + 3 / 4) / 5, "r_f": 0.02, "R": 1.1466667},
    ),
    (
        # The tree already holds A: R_MH^b = 0, R_MH^p = 1 (B); R_AP = 0.5 + 0.5 as printed.
        # R = 0.2 * 1.25 + 0.2 * 1.0 + 0.02
        "gold already in the tree",
        ep(expansion(1, ("base", "A"), ("predicted", "B")), found=["a"]),
        R2agConfig(),
        {"r_mh": 1.25, "r_jh": 0.0, "r_ap": 1.0, "r_f": 0.02, "R": 0.47},
    ),
    (
        # <think> earns nothing: one segment after it = 0.01 (R_MH = 1, R_AP = 0.5)
        "think earns nothing",
        ep(expansion(1, ("base", "A"))),
        R2agConfig(),
        {"r_mh": 1.0, "r_jh": 0.0, "r_ap": 0.5, "r_f": 0.01, "R": 0.31},
    ),
    (
        # w = 0.5: the cap is on w R_f, so R_f may reach 0.04; 3 segments = 0.03, w R_f = 0.015.
        # R = 0.45 + 0.2 + 0.015
        "cap on w R_f",
        ep(expansion(1, ("base", "A"), ("base", "X"), ("predicted", "B"))),
        R2agConfig(w=0.5),
        {"r_mh": 2.25, "r_jh": 0.0, "r_ap": 1.0, "r_f": 0.03, "R": 0.665},
    ),
    (
        # no gold at all (unanswerable): stopping at once retrieves "every" gold document,
        # R_JH = 1; R_f = 0.02. R = 0.3 + 0.02
        "unanswerable, immediate stop",
        ep(stop(1), gold=()),
        R2agConfig(),
        {"r_mh": 0.0, "r_jh": 1.0, "r_ap": 0.0, "r_f": 0.02, "R": 0.32},
    ),
    (
        # the project's earlier readings, as options, on the worked example:
        # R_MH / |G| = 2.25 / 2; R_AP = mean(0.5, 0.5) = 0.5. R = 0.225 + 0.1 + 0.02
        "options: fraction + mean",
        ep(expansion(1, ("base", "A"), ("base", "X"), ("predicted", "B"))),
        R2agConfig(multi_hit="fraction", ap_kinds="mean"),
        {"r_mh": 1.125, "r_jh": 0.0, "r_ap": 0.5, "r_f": 0.02, "R": 0.345},
    ),
    (
        # ap_relevant="new", ap_norm="missing" with A already found: base ranking A (old, not
        # relevant), predicted B (new): R_AP^b = 0, R_AP^p = (1/min(2, 1)) * 1 = 1.
        # R = 0.2 * 1.25 + 0.2 * 1 + 0.02
        "options: new + missing",
        ep(expansion(1, ("base", "A"), ("predicted", "B")), found=["A"]),
        R2agConfig(ap_relevant="new", ap_norm="missing"),
        {"r_mh": 1.25, "r_jh": 0.0, "r_ap": 1.0, "r_f": 0.02, "R": 0.47},
    ),
]


@pytest.mark.parametrize(("name", "episode", "config", "expected"), CASES, ids=[c[0] for c in CASES])
def test_top_survivor_by_hand(
    name: str, episode: Episode, config: R2agConfig, expected: dict[str, float]
) -> None:
    assert totals(episode, config) == pytest.approx(expected)


def test_zeroing_names_its_reason_and_keeps_the_sums_before() -> None:
    premature = score_episode(ep(expansion(1, ("base", "A")), stop(2)))
    assert premature.meta["r2ag"]["zeroed"] == "stop before all gold found"
    assert premature.meta["r2ag"]["before_zeroing"]["r_mh"] == 1.0
    no_think = score_episode(ep(expansion(1, ("base", "A"), think=False)))
    assert no_think.meta["r2ag"]["zeroed"] == "missing <think>"
    assert all(v == 0.0 for s in no_think.steps for v in s.signals.values())


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        ("<think>p</think><base-Q>q A</base-Q><end/>", 1),
        ("<base-Q>q A</base-Q><think>p</think><predicted-Q>q B</predicted-Q>", 1),  # before <think>: none
        ("<think>p</think><base-Q>q A</base-Q><base-Q></base-Q><predicted-Q>q B", 1),  # empty, unclosed
    ],
)
def test_format_counts_closed_segments_after_think(text: str, segments: int) -> None:
    step = expansion(1, ("base", "A"))
    step.text = text
    assert totals(ep(step), R2agConfig(format_cap=1.0))["r_f"] == pytest.approx(0.01 * segments)


def test_unclosed_think_is_a_missing_think() -> None:
    step = expansion(1, ("base", "A"))
    step.text = "<think>plan <base-Q>q A</base-Q>"
    assert totals(ep(step))["R"] == 0.0


def test_step_rewards_sum_to_the_total() -> None:
    # step 1: 0.2*2 + 0.2*1 + 0.02 = 0.62; step 2: 0.3 (the cap is used up)
    scored = score_episode(ep(expansion(1, ("base", "A"), ("base", "B")), stop(2)))
    assert episode_step_rewards(scored) == pytest.approx([0.62, 0.3])


def test_scripted_expansions_in_the_papers_order() -> None:
    """One expansion of a tree that already holds A (gold {A, B}), as the forest scores it:
    new gold (0.2*1 + 0.2*0.5 + 0.01 = 0.31) > re-finding A (R_MH = 0; R_AP^b = 0.5 as printed:
    0.1 + 0.01 = 0.11) > a miss (format only, 0.01) > a premature stop = a missing <think> = 0;
    stopping once the tree holds A and B earns R_JH (0.3 + 0.02)."""
    new = ep(expansion(2, ("base", "B")), found=["A"])
    redundant = ep(expansion(2, ("base", "A")), found=["A"])
    miss = ep(expansion(2, ("base", "X")), found=["A"])
    premature = ep(stop(2), found=["A"])
    no_think = ep(expansion(2, ("base", "B"), think=False), found=["A"])
    rewards = [totals(e)["R"] for e in (new, redundant, miss, premature, no_think)]
    assert rewards == pytest.approx([0.31, 0.11, 0.01, 0.0, 0.0])
    assert totals(ep(stop(3), found=["A", "B"]))["R"] == pytest.approx(0.32)


def test_average_precision_by_hand() -> None:
    assert average_precision([True, False, True], 2) == pytest.approx((1 / 1 + 2 / 3) / 2)
    assert average_precision([False, True], 2) == pytest.approx((1 / 2) / 2)
    assert average_precision([True], 0) == 0.0


def test_reward_funcs_versions_and_values() -> None:
    funcs = R2ag().reward_funcs()
    assert [getattr(f, "__version__", None) for f in funcs] == ["r2ag_total@3"] + [
        f"r2ag_{s}@3" for s in SIGNALS
    ]
    episodes = [ep(expansion(1, ("base", "A"), ("base", "B")), stop(2))]
    assert funcs[0](["p"], ["c"], episodes=episodes) == [pytest.approx(0.92)]
    assert episodes[0].meta["r2ag"]["version"] == "r2ag@3"
    assert funcs[2](["p"], ["c"], episodes=episodes) == [1.0]  # r_jh


# --- the forest -----------------------------------------------------------------------------


def node(title: str, *children: Node) -> Node:
    return Node(f"q {title}", "base", doc(title), list(children))


def paths(tree: RetrievalTree) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()

    def walk(n: Node, prefix: tuple[str, ...]) -> None:
        here = (*prefix, n.doc.title if n.doc else "-")
        if not n.children:
            out.add(here)
        for c in n.children:
            walk(c, here)

    for c in tree.root.children:
        walk(c, ())
    return out


def test_prune_keeps_only_branches_that_hit_gold() -> None:
    root = Node("question", "question", None, [
        node("A", node("x1"), node("B")),  # the non-hit child x1 of the hit A is cut
        node("x2", node("B")),  # a miss is cut with everything under it
        node("x3"),
    ])  # fmt: skip
    tree = RetrievalTree("?", ["A", "B"], root, "q")
    pruned = prune(tree)
    assert paths(pruned) == {("A", "B")}
    assert len(paths(tree)) == 4  # the original is untouched
    assert prune(tree, ["z"]).root.children == []


def test_algorithm_1_every_unfinished_response_makes_a_tree_of_the_next_forest() -> None:
    """Algorithm 1 at level 0 for one tree (the root) and G = 5 responses: each response extends
    the tree (RRT_{u_i}^{1}); as none holds both gold documents and stops, each is pruned to its
    gold branches and kept, including the early stop and the miss (the root alone: App. B.1
    propagates "RRTs that ... contain no accurate branches at all"). The forest is a set: the
    third response prunes to the first's tree, the miss to the stop's."""
    forest = [RetrievalTree("?", ["A", "B"], Node("?", "question"), "q")]
    responses = [
        expansion(1, ("base", "A"), ("base", "x")),
        expansion(1, ("predicted", "B")),
        expansion(1, ("base", "A"), ("base", "y")),  # prunes to the same tree as response 0
        stop(1),  # early: reward 0 (App. B.2), and the tree stays in the forest
        expansion(1, ("base", "x")),  # no gold: the root alone, like the stop's
    ]
    grown, done = grow_forest(forest, [responses])
    assert done == 0
    assert [paths(t) for t in grown] == [{("A",)}, {("B",)}, set()]
    assert forest[0].root.children == []  # the input forest is not modified
    assert [documents(t) for t in grown] == [[doc("A")], [doc("B")], []]


def test_a_tree_holding_every_gold_document_leaves_the_forest_only_on_a_stop() -> None:
    """Algorithm 1's exit: |r~ ∩ g| = |g| and stop. The same full tree stays when the response
    searches on (it must still learn to stop), and a partial tree stays after a stop."""
    full = RetrievalTree("?", ["A", "B"], Node("?", "question", None, [node("A", node("B"))]), "q")
    grown, done = grow_forest([full], [[stop(3), expansion(3, ("base", "x"))]])
    assert done == 1 and [paths(t) for t in grown] == [{("A", "B")}]
    assert finished(full, stop(3)) and not finished(full, expansion(3, ("base", "x")))
    partial = RetrievalTree("?", ["A", "B"], Node("?", "question", None, [node("A")]), "q")
    assert not finished(partial, stop(2))


def test_new_vertices_hang_under_the_tip_and_the_prompt_reads_the_trees_documents() -> None:
    tree = RetrievalTree("?", ["A", "B", "C"], Node("?", "question", None, [node("A")]), "q")
    grown = expand(tree, expansion(2, ("base", "B"), ("predicted", "C")))
    assert paths(grown) == {("A", "B"), ("A", "C")} and paths(tree) == {("A",)}
    assert [d.title for d in documents(grown)] == ["A", "B", "C"]
    assert expand(tree, stop(2)).root.key() == tree.root.key()  # a stop adds nothing
    # the next level hangs under the first deepest vertex, B
    assert paths(expand(grown, expansion(3, ("base", "D")))) == {("A", "B", "D"), ("A", "C")}


def test_survivors_is_a_set_and_width_keeps_the_most_gold_first() -> None:
    one = RetrievalTree("?", ["A", "B"], Node("?", "question", None, [node("A")]), "q")
    two = RetrievalTree("?", ["A", "B"], Node("?", "question", None, [node("A"), node("B")]), "q")
    other = RetrievalTree("?", ["C"], Node("?", "question", None, [node("C")]), "r")
    assert survivors([one, two, other], width=1) == [two, other]
    assert survivors([one, two, other, prune(one)]) == [one, two, other]


def test_context_renders_surviving_branches() -> None:
    root = Node("question", "question", None, [node("A", node("x1")), node("x3")])
    text = context(prune(RetrievalTree("?", ["A"], root)))
    assert "- [base] q A -> A: text of A" in text
    assert "x1" not in text and "x3" not in text
    assert context(RetrievalTree("?", [], Node("?", "question"))) == ""


# --- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "kind", "queries", "kinds"),
    [
        (
            "<think>p</think><base-Q>a</base-Q><predicted-Q>b</predicted-Q><end/>",
            "search",
            ["a", "b"],
            ["base", "predicted"],
        ),
        ("<think>p</think>\n<predicted-Q> b </predicted-Q>", "search", ["b"], ["predicted"]),
        ("<think>p</think><base-Q>a</base-Q><predicted-Q>none</predicted-Q>", "search", ["a"], ["base"]),
        (f"<think>all found</think>\n{STOP}\n<end/>", "stop", [], []),
        ("<think>all found</think><base-Q>Stop retrieval.</base-Q><end/>", "stop", [], []),
        ("<think>stop retrieval? no</think><base-Q>a</base-Q>", "search", ["a"], ["base"]),
        ("<think>unclosed <base-Q>a</base-Q>", "search", ["a"], ["base"]),
    ],
)
def test_parse_valid(segment: str, kind: str, queries: list[str], kinds: list[str]) -> None:
    action = parse_expansion(segment)
    assert (action.kind, action.queries, action.query_kinds) == (kind, queries, kinds)


@pytest.mark.parametrize(
    "segment",
    [
        "<think>all found</think>\nstop retrieval\n<end/>",  # the stop outside its tag
        "<think>p</think><base-Q>a</base-Q> stop retrieval",
        "<think>p</think><base-Q>a</base-Q><base-Q>stop retrieval</base-Q>",  # a stop beside a query
        "<think>p</think><predicted-Q>none</predicted-Q>",  # no query and no stop
        "<think>p</think><base-Q>a",  # missing closing tag
        "<base-Q>a <base-Q>b</base-Q>",  # nested
        "<base-Q>a <predicted-Q>b</predicted-Q></base-Q>",  # a tag inside a sub-query
        "<base-Q> </base-Q>",
        "<think>p</think>",
        "",
        "</base-Q>",
        "z" * 10_240,
        "<base-Q>" * 2_000,
    ],
)
def test_parse_malformed_is_format_error(segment: str) -> None:
    action = parse_expansion(segment)
    assert action.kind == "format_error" and action.error


def test_protocol_surface() -> None:
    recipe = R2ag(l_max=3)
    assert (recipe.name, recipe.top_k, recipe.max_steps) == ("r2ag", 1, 4)
    assert "<base-Q>stop retrieval</base-Q>" in recipe.messages(generate(seed=1)["train"][0])[0]["content"]
    info = recipe.information([[doc("A")], []])
    assert "[1] (Title: A) text of A" in info and "[2] (no document)" in info
    with pytest.raises(ValueError):
        R2ag(lam=1.0)


# --- the stop signal never reaches the retriever (real retriever over HTTP) -------------------


class QueryLog:
    """ASGI middleware that records the queries of every ``POST /v1/search`` the retriever receives."""

    def __init__(self, app: Any, sink: list[str]) -> None:
        self.app, self.sink = app, sink

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/search":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recording() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                self.sink.extend(json.loads(b"".join(chunks))["queries"])
            return message

        await self.app(scope, recording, send)


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    return generate(seed=1, n_entities=80, n_train=20, n_dev=5, n_test=5)


def test_stop_signal_never_reaches_the_retriever(world: dict[str, Any], tmp_path: Path) -> None:
    """The expert (the SFT path), a premature stopper and a policy that writes "none" predictions
    run through the agent loop against a real retriever; the retriever sees only real queries."""
    questions = [q for q in world["train"] if q.answers][:3]
    received: list[str] = []
    app = create_app(RetrieverSettings(storage_path=tmp_path / "qdrant"))
    app.add_middleware(QueryLog, sink=received)
    with LocalServer(app) as server:
        with RetrieverClient(server.url) as client:
            ensure_indexed(client, "r2ag-stop", pool(questions))
        received.clear()
        recipe = R2ag()
        experts = asyncio.run(expert_episodes(recipe, questions, server.url, "r2ag-stop"))
        q = questions[0]
        scripts = {
            "premature": [
                f"<think>one will do</think><base-Q>{hops_for(q)[0].query}</base-Q><end/>",
                f"<think>done</think>{STOP}<end/>",
            ],
            "prose stop": ["<think>done</think>stop retrieval<end/>"],
            "none only": ["<think>?</think><predicted-Q>none</predicted-Q><end/>"],
        }

        async def scripted(segments: list[str]) -> Episode:
            retriever = AsyncRetrieverClient(server.url)
            try:
                return await run_episode(
                    recipe, q, ExpertChat(segments), retriever, "r2ag-stop", shape=shape(max_steps=6)
                )
            finally:
                await retriever.aclose()

        others = {name: asyncio.run(scripted(s)) for name, s in scripts.items()}
    sent = [query for e in [*experts, *others.values()] for query in e.queries]
    # every query the episodes record reached the retriever, nothing else (the expert's episodes run
    # concurrently, so their queries arrive in any order)
    assert sorted(received) == sorted(sent)
    assert received and not {x.casefold() for x in received} & {"stop retrieval", "none"}
    assert [e.outcome for e in experts] == ["stop"] * len(questions)
    assert [e.retrieval_count for e in experts] == [len(hops_for(x)) for x in questions]
    assert (others["premature"].outcome, others["premature"].retrieval_count) == ("stop", 1)
    assert [others[k].outcome for k in ("prose stop", "none only")] == ["format_error"] * 2
    # the expert's episodes earn the paper's reward: one base-Q per hop finds every gold document
    # (R_MH^b = hops, R_AP^b = (1/|g|) * hops * 1 = 1 when the hops are the gold set), the stop R_JH = 1,
    # and R_f is capped at 0.02; the premature stop earns 0.
    for e in experts:
        hops = len(hops_for(questions[experts.index(e)]))
        assert totals(e) == pytest.approx({"r_mh": hops, "r_jh": 1.0, "r_ap": 1.0, "r_f": 0.02,
                                           "R": 0.2 * hops + 0.3 + 0.2 + 0.02})  # fmt: skip
    assert totals(others["premature"])["R"] == 0.0


def test_top_t_caps_the_sub_queries_an_expansion_retrieves() -> None:
    """App. C.2 / Table A.6: at evaluation only the first t branches of an expansion are retrieved;
    top-k sets the documents per sub-query (Table 5: k = 2). Training's defaults keep every branch, k = 1."""
    segment = "<think>t</think>\n<base-Q>a</base-Q>\n<base-Q>b</base-Q>\n<predicted-Q>c</predicted-Q>\n<end/>"
    assert R2ag().parse(segment).queries == ["a", "b", "c"] and R2ag().top_k == 1
    capped = R2ag(top_t=2, top_k=2)
    action = capped.parse(segment)
    assert (action.queries, action.query_kinds, capped.top_k) == (["a", "b"], ["base", "base"], 2)
    assert R2ag(top_t=1).parse(segment).queries == ["a"]
    assert R2ag(top_t=1).parse(protocol.stop_segment("done")).kind == "stop"
