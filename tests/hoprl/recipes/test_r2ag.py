"""R2AG: Top-Survivor reward pieces recomputed by hand, the forest, and expansion parsing."""

from __future__ import annotations

import pytest

from hoprl.agent.trajectory import Episode, RetrievedDoc, Step
from hoprl.data.synthetic import generate, hops_for
from hoprl.recipes.r2ag import (
    SIGNALS,
    Node,
    R2ag,
    R2agConfig,
    RetrievalTree,
    average_precision,
    context,
    episode_return,
    episode_step_rewards,
    expand,
    parse_expansion,
    prune,
    score_episode,
)

GOLD = ["A", "B", "C", "D"]


def doc(title: str) -> RetrievedDoc:
    return RetrievedDoc(id=title, title=title, text=f"text of {title}")


def expansion(t: int, *subs: tuple[str, str], think: bool = True) -> Step:
    """A search step; ``subs`` are (kind, top-1 title) pairs, the query named after the title."""
    tags = {"base": "base-Q", "predicted": "predicted-Q"}
    text = ("<think>plan</think>" if think else "") + "".join(
        f"<{tags[k]}>q {x}</{tags[k]}>" for k, x in subs
    )
    return Step(
        t=t,
        action="search",
        text=text + "<end/>",
        queries=[f"q {x}" for _, x in subs],
        query_kinds=[k for k, _ in subs],
        docs=[[doc(x)] for _, x in subs],
    )


def stop(t: int, think: bool = True) -> Step:
    return Step(t=t, action="stop", text=("<think>done</think>" if think else "") + "stop retrieval<end/>")


def ep(*steps: Step, gold: list[str] = GOLD, found: list[str] | None = None) -> Episode:
    meta = {"found_titles": found} if found else {}
    return Episode(
        recipe="r2ag", question_id="q", question="?", gold_titles=gold, steps=list(steps), meta=meta
    )


def signals(episode: Episode) -> list[dict[str, float]]:
    return [s.signals for s in score_episode(episode).steps]


# --- average precision ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relevant", "cutoff", "missing", "expected"),
    [
        ([True, False, True], 4, 2, (1 / 1 + 2 / 3) / 2),
        ([False, True], 2, 3, (1 / 2) / 2),  # denominator min(k=2, m=3) = 2
        ([True, True], 4, 2, 1.0),
        ([False, False, False, False, True], 4, 1, 0.0),  # the hit is past the cut-off
        ([True], 4, 0, 0.0),  # nothing was missing
        ([], 4, 2, 0.0),
    ],
)
def test_average_precision_by_hand(relevant, cutoff, missing, expected):
    assert average_precision(relevant, cutoff, missing) == pytest.approx(expected)


def test_branch_ap_ranks_base_and_predicted_separately():
    step = expansion(
        1,
        ("base", "A"),
        ("base", "X"),
        ("base", "A"),
        ("base", "B"),
        ("base", "C"),
        ("predicted", "Y"),
        ("predicted", "D"),
    )
    # base ranking A, X, A (already credited), B | C cut off at 4; missing = 4
    ap_base = (1 / 1 + 2 / 4) / 4
    # predicted ranking Y, D; cut-off 2; denominator min(2, 4) = 2
    ap_pred = (1 / 2) / 2
    assert signals(ep(step))[0]["r_ap"] == pytest.approx((ap_base + ap_pred) / 2)


def test_branch_ap_counts_only_gold_new_to_the_episode():
    s = signals(ep(expansion(1, ("base", "A")), expansion(2, ("base", "A"), ("base", "B"))))
    assert s[0]["r_ap"] == pytest.approx((1 / 1) / 4)  # A at rank 1; denominator min(k=4, m=4)
    # step 2: A is old, B new at rank 2; missing before = 3 -> (1/2) / 3
    assert s[1]["r_ap"] == pytest.approx((1 / 2) / 3)


# --- multi-hit, joint-hit -------------------------------------------------------------------


def test_multi_hit_weights_predicted_hits_by_lambda():
    step = expansion(1, ("base", "A"), ("predicted", "B"), ("base", "C"), ("predicted", "C"), ("base", "X"))
    # new gold: A (base, 1), B (predicted, 1.25), C (hit by both: counted once, 1.25); / |G| = 4
    assert signals(ep(step))[0]["r_mh"] == pytest.approx((1 + 1.25 + 1.25) / 4)
    custom = score_episode(ep(step), R2agConfig(l=2.0)).steps[0].signals["r_mh"]
    assert custom == pytest.approx((1 + 2 + 2) / 4)


def test_multi_hit_skips_gold_found_earlier():
    s = signals(ep(expansion(1, ("base", "A")), expansion(2, ("base", "A"), ("predicted", "B")), found=["D"]))
    assert [x["r_mh"] for x in s] == pytest.approx([1 / 4, 1.25 / 4])
    already = signals(ep(expansion(1, ("base", "D")), found=["d"]))  # found titles match normalised
    assert already[0]["r_mh"] == 0.0


@pytest.mark.parametrize(
    ("found_all", "expected"),
    [(True, 1.0), (False, 0.0)],
)
def test_joint_hit_needs_all_gold_and_a_stop(found_all, expected):
    titles = ["A", "B", "C", "D"] if found_all else ["A", "B", "C"]
    s = signals(ep(expansion(1, *[("base", x) for x in titles]), stop(2)))
    assert s[1]["r_jh"] == expected
    assert s[0]["r_jh"] == 0.0


def test_no_joint_hit_without_stop():
    s = signals(ep(expansion(1, *[("base", x) for x in GOLD])))
    assert [x["r_jh"] for x in s] == [0.0]


# --- format reward --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # think + 4 base-Q = 5 blocks, then think = 1 block: 0.06
        ([expansion(1, *[("base", x) for x in GOLD]), stop(2)], [0.05, 0.01]),
        # <think> missing in one step zeroes the whole R_f
        ([expansion(1, *[("base", x) for x in GOLD]), stop(2, think=False)], [0.0, 0.0]),
        ([expansion(1, *[("base", x) for x in GOLD], think=False), stop(2)], [0.0, 0.0]),
        # stop before all gold is found zeroes it too
        ([expansion(1, ("base", "A"), ("predicted", "B")), stop(2)], [0.0, 0.0]),
        # no stop yet: the blocks count
        ([expansion(1, ("base", "A"), ("predicted", "B"))], [0.03]),
    ],
)
def test_format_reward_and_its_zeroing_rules(steps, expected):
    assert [x["r_f"] for x in signals(ep(*steps))] == pytest.approx(expected)


def test_unclosed_or_empty_blocks_earn_nothing():
    step = expansion(1, ("base", "A"))
    step.text = "<think>plan</think><base-Q>q A</base-Q><base-Q></base-Q><predicted-Q>q B"
    assert signals(ep(step))[0]["r_f"] == pytest.approx(0.02)


def test_top_survivor_total_by_hand():
    episode = ep(
        expansion(1, ("base", "A"), ("predicted", "B")), expansion(2, ("base", "C"), ("base", "D")), stop(3)
    )
    a, b, g, w = 0.2, 0.3, 0.2, 1.0
    mh = [(1 + 1.25) / 4, 2 / 4, 0.0]
    ap = [(1.0 / 4 + (1 / 1) / 2) / 2, (1 + 1) / 2, 0.0]  # step 2: 2 missing, both hit, AP = 1
    jh = [0.0, 0.0, 1.0]
    fmt = [0.03, 0.03, 0.01]
    expected = [a * m + b * j + g * p + w * f for m, j, p, f in zip(mh, jh, ap, fmt, strict=True)]
    scored = score_episode(episode)
    assert episode_step_rewards(scored) == pytest.approx(expected)
    assert episode_return(scored) == pytest.approx(sum(expected))


def test_reward_funcs_versions_and_values():
    funcs = R2ag().reward_funcs()
    versions = [getattr(f, "__version__", None) for f in funcs]
    assert versions == ["r2ag_total@1"] + [f"r2ag_{s}@1" for s in SIGNALS]
    episodes = [ep(expansion(1, *[("base", x) for x in GOLD]), stop(2))]
    total = funcs[0](["p"], ["c"], episodes=episodes)
    assert total == [pytest.approx(0.2 * 1 + 0.3 * 1 + 0.2 * 1 + 0.06)]
    assert "r2ag" in episodes[0].meta
    assert funcs[2](["p"], ["c"], episodes=episodes) == [1.0]  # r_jh


# --- forest ---------------------------------------------------------------------------------


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


def test_prune_keeps_exactly_the_gold_hit_branches():
    root = Node("question", "question", None, [
        node("A", node("x1")),  # gold at the top: the branch survives with its miss below
        node("x2", node("B")),  # gold at the bottom
        node("x3", node("x4")),  # no gold anywhere: dropped
        node("x5", node("x6"), node("C")),  # only the C branch survives
    ])  # fmt: skip
    tree = RetrievalTree("?", ["A", "B", "C"], root)
    assert paths(prune(tree)) == {("A", "x1"), ("x2", "B"), ("x5", "C")}
    assert paths(prune(tree, ["c"])) == {("x5", "C")}
    assert len(paths(tree)) == 5  # the original is untouched
    assert prune(RetrievalTree("?", ["Z"], root)).root.children == []


def test_expand_adds_one_level_per_frontier_node_up_to_l_max():
    tree = RetrievalTree("?", ["A", "B"], Node("?", "question"))
    forest = [tree]
    assert tree.frontier() == [tree.root]
    assert expand(forest, [[expansion(1, ("base", "A"), ("predicted", "x"))]]) == 2
    assert [n.kind for n in tree.frontier()] == ["base", "predicted"]
    # the A leaf gets a child, the x leaf stops
    assert expand(forest, [[expansion(2, ("base", "B")), stop(2)]]) == 1
    assert [n.doc.title for n in tree.frontier() if n.doc] == ["B"]
    assert tree.found_titles() == ["a", "b"]
    with pytest.raises(ValueError, match="2 expansions for 1 frontier"):
        expand(forest, [[stop(3), stop(3)]])
    for level in range(3, 6):
        expand(forest, [[expansion(level, ("base", f"y{level}"))]])
    assert tree.frontier() == []  # five levels below the question: L_MAX reached


def test_context_renders_surviving_branches():
    root = Node("question", "question", None, [node("A", node("x1")), node("x3")])
    text = context(prune(RetrievalTree("?", ["A"], root)))
    assert "- [base] q A -> A: text of A" in text
    assert "  - [base] q x1 -> x1" in text
    assert "x3" not in text
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
        ("<think>all found</think>\nstop retrieval\n<end/>", "stop", [], []),
        ("<think>nothing left</think> None.", "stop", [], []),
        ("<think>stop retrieval? no</think><base-Q>a</base-Q>", "search", ["a"], ["base"]),
        ("<think>unclosed <base-Q>a</base-Q>", "search", ["a"], ["base"]),
    ],
)
def test_parse_valid(segment, kind, queries, kinds):
    action = parse_expansion(segment)
    assert (action.kind, action.queries, action.query_kinds) == (kind, queries, kinds)


@pytest.mark.parametrize(
    "segment",
    [
        "<think>p</think><base-Q>a",  # missing closing tag
        "<think>p</think><base-Q>a</base-Q><predicted-Q>b",
        "<base-Q>a <base-Q>b</base-Q>",  # nested
        "<base-Q>a <predicted-Q>b</predicted-Q></base-Q>",  # a tag inside a sub-query
        "<base-Q> </base-Q>",  # empty
        "<base-Q>a</base-Q> stop retrieval",  # sub-queries and a stop
        "<think>p</think> I have none of the facts yet",  # 'none' in prose is no stop
        "<think>p</think>",
        "",
        "</base-Q>",  # stray closing tag
        "z" * 10_240,  # 10 KB of garbage
        "<base-Q>" * 2_000,
    ],
)
def test_parse_malformed_is_format_error(segment):
    action = parse_expansion(segment)
    assert action.kind == "format_error" and action.error


def test_expert_one_base_query_per_hop_then_stop():
    q = next(q for q in generate(seed=1, n_entities=80, n_train=20, n_dev=5, n_test=5)["train"] if q.answers)
    recipe = R2ag()
    first, second = recipe.expert_segments(q)
    assert recipe.expert(q) == first + second
    assert all(s.endswith(recipe.stop[0]) for s in (first, second))
    action = recipe.parse(first)
    assert action.queries == [h.query for h in hops_for(q)]
    assert set(action.query_kinds) == {"base"}
    assert recipe.parse(second).kind == "stop"


def test_protocol_surface():
    recipe = R2ag(l_max=3)
    assert (recipe.name, recipe.top_k, recipe.max_steps) == ("r2ag", 1, 4)
    info = recipe.information([[doc("A")], []])
    assert "[1] (Title: A) text of A" in info and "[2] (no document)" in info
    with pytest.raises(ValueError):
        R2ag(lam=1.0)
