"""Reward direction: scripted behaviours must come out in the order each paper argues for.

One table, one row per (recipe, better behaviour, worse behaviour). Every behaviour is a scripted
:class:`~hoprl.domain.Episode` on one two-hop question (ARENA: a one-turn completion
over numbered references), scored by the recipe's own rewards through
:func:`hoprl.recipes.scoring.score_episodes`, the path the trainer takes (weighted total of
``reward_funcs()``). The expected order comes from the papers' formulas and the argument each
paper makes for them, never from what the code returns; each row names the terms that decide it,
with the numbers by hand where they are short. ``==`` rows are ties the reward makes on purpose
(an outcome-only reward cannot see the process), asserted so that a change which starts to
separate them is noticed.

Rows marked ``FINDING`` are orders the paper argues for that the reward, as implemented, reverses;
they are ``xfail(strict=True)``: the row keeps the paper's order, and it fails (XPASS) the day the
reward is changed to follow it, so the marker is removed with the fix.

The question: "Who founded the record label that released Blue Harbor?", gold answer Jane Roe,
gold documents Blue Harbor (hop 1) and Acme Records (hop 2). Q1 = "Blue Harbor album label"
retrieves Blue Harbor, Q2 = "Acme Records founder" retrieves Acme Records, dead-end queries
retrieve Harbor Lights (not gold). ``c`` below is the embedder's cosine of Q1 and Q2 (0 < c < 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from hoprl.domain import Episode, Paragraph, Question, RetrievedDoc, Step
from hoprl.recipes import get_recipe
from hoprl.recipes.scoring import score_episodes

torch.set_num_threads(1)

QUESTION = "Who founded the record label that released Blue Harbor?"
ANSWER = "Jane Roe"
ALBUM = RetrievedDoc(id="album", title="Blue Harbor", text="Blue Harbor: an album released by Acme Records.")
LABEL = RetrievedDoc(id="label", title="Acme Records", text="Acme Records is a label founded by Jane Roe.")
NOISE = RetrievedDoc(id="noise", title="Harbor Lights", text="Harbor Lights is a lighthouse museum.")
Q1, Q2 = "Blue Harbor album label", "Acme Records founder"
DEAD = "Blue Harbor lighthouse"
IDEAL = [(Q1, ALBUM), (Q2, LABEL)]
#: what the policy writes after reading each document (Eval-RAR's <evaluate>, when-to-search's <reflect>)
READS = {
    "album": "Blue Harbor was released by Acme Records.",
    "label": "Acme Records was founded by Jane Roe.",
    "noise": "These results do not give what I need.",
}

Search = tuple[str, RetrievedDoc]
Behaviour = Callable[[], tuple[Episode, Question | None]]


def episode(recipe: str, steps: list[Step], answer: str | None, *, answerable: bool = True) -> Episode:
    return Episode(
        recipe=recipe,
        question_id="blue-harbor" if answerable else "green-harbor",
        question=QUESTION if answerable else QUESTION.replace("Blue", "Green"),
        answers=[ANSWER] if answerable else [],
        gold_titles=[ALBUM.title, LABEL.title] if answerable else [],
        steps=steps,
        final_answer=answer,
        refused=answer is None,
        outcome="answer" if answer is not None else "refuse",
    )


# --- search-r1, eval-rar, when-to-search: the tag protocol -----------------------------------


def tag_run(recipe: str, searches: list[Search], answer: str, review: str = "") -> Episode:
    """think/search turns, then think/answer; ``review`` (evaluate / reflect: what the document
    said, :data:`READS`) follows every injected information block."""
    steps, before = [], ""
    for t, (query, doc) in enumerate(searches, 1):
        info = f"<information>\n[1] {doc.title}: {doc.text}\n</information>"
        text = f"{before}<think>I need {query}.</think>\n<search>{query}</search>"
        steps.append(Step(t=t, action="search", text=text, queries=[query], docs=[[doc]], information=info))
        before = f"<{review}>{READS[doc.id]}</{review}>\n" if review else ""
    final = f"{before}<think>I can answer now.</think>\n<answer>{answer}</answer>"
    steps.append(Step(t=len(steps) + 1, action="answer", text=final, answer=answer))
    return episode(recipe, steps, answer)


def reflect_then_answer(recipe: str, answer: str) -> Episode:
    """when-to-search's no-search form: ``<think><reflect><answer>``."""
    text = f"<think>I know.</think>\n<reflect>The founder is {answer}.</reflect>\n<answer>{answer}</answer>"
    return episode(recipe, [Step(t=1, action="answer", text=text, answer=answer)], answer)


def tag_behaviours(recipe: str, review: str) -> dict[str, Behaviour]:
    def run(searches: list[Search], answer: str) -> Episode:
        return tag_run(recipe, searches, answer, review)

    return {
        "ideal": lambda: (run(IDEAL, ANSWER), None),
        "duplicate search": lambda: (run([(Q1, ALBUM), (Q1, ALBUM), (Q2, LABEL)], ANSWER), None),
        "premature wrong answer": lambda: (run([(Q1, ALBUM)], "Acme Records"), None),
        # the second <evaluate> / <reflect> names Jane Roe, the answer does not
        "evaluated gold, answered wrong": lambda: (run(IDEAL, "Acme Records"), None),
        "no search, correct": lambda: (run([], ANSWER), None),
        "no search, correct, think reflect answer": lambda: (reflect_then_answer(recipe, ANSWER), None),
        "no search, wrong, think reflect answer": lambda: (reflect_then_answer(recipe, "Acme Records"), None),
    }


# --- evo-rag -----------------------------------------------------------------------------------


def evo_step(t: int, action: str, payload: Any = None) -> Step:
    """One EVO-RAG step: ``payload`` is a (query, doc) search, or the answer text."""
    if action == "search":
        query, doc = payload
        return Step(t=t, action="search", text=f"<think>t</think><search>{query}</search>", queries=[query],
                    query_kinds=["search"], docs=[[doc]])  # fmt: skip
    if action == "answer":
        return Step(t=t, action="answer", text=f"<think>t</think><answer>{payload}</answer>", answer=payload)
    return Step(t=t, action=action, text=f"<think>t</think><{action}/>")  # backtrack, refuse


def evo_run(plan: list[tuple[str, Any]], *, answerable: bool = True) -> Episode:
    steps = [evo_step(t, action, payload) for t, (action, payload) in enumerate(plan, 1)]
    last = steps[-1]
    return episode("evo-rag", steps, last.answer if last.action == "answer" else None, answerable=answerable)


S1, S2, DEAD_END = ("search", (Q1, ALBUM)), ("search", (Q2, LABEL)), ("search", (DEAD, NOISE))
CORRECT, WRONG = ("answer", ANSWER), ("answer", "Acme Records")
#: four more distinct dead ends, so that the tail of the "late" episodes starts at t = 6
DETOURS = [("search", (q, NOISE)) for q in ("Harbor Lights museum", "lighthouses", "records", "reviews")]
REFUSE, BACKTRACK = ("refuse", None), ("backtrack", None)

EVO: dict[str, Behaviour] = {
    "ideal": lambda: (evo_run([S1, S2, CORRECT]), None),
    "duplicate search": lambda: (evo_run([S1, S1, S2, CORRECT]), None),
    "premature wrong answer": lambda: (evo_run([S1, WRONG]), None),
    "no search, correct": lambda: (evo_run([CORRECT]), None),
    "refusal of an answerable question after the evidence": lambda: (evo_run([S1, S2, REFUSE]), None),
    "unanswerable: refuse after searching": lambda: (evo_run([DEAD_END, REFUSE], answerable=False), None),
    "unanswerable: answer anyway": lambda: (evo_run([DEAD_END, CORRECT], answerable=False), None),
    "dead end, backtrack, recover": lambda: (evo_run([DEAD_END, BACKTRACK, S1, S2, CORRECT]), None),
    "dead end, recover without backtrack": lambda: (evo_run([DEAD_END, S1, S2, CORRECT]), None),
    "dead end, answer": lambda: (evo_run([DEAD_END, WRONG]), None),
    "late: answer at t=7": lambda: (evo_run([S1, *DETOURS, S2, CORRECT]), None),
    "late: duplicate search at t=7": lambda: (evo_run([S1, *DETOURS, S2, S2, CORRECT]), None),
}


# --- r2ag --------------------------------------------------------------------------------------

TAG = {"base": "base-Q", "predicted": "predicted-Q"}
STOP = "<base-Q>stop retrieval</base-Q>\n<predicted-Q>none</predicted-Q>\n<end/>"


def expansion(t: int, *branches: tuple[str, str, RetrievedDoc], think: bool = True) -> Step:
    """One expansion: ``(kind, query, top-1 doc)`` per branch, each in its own tag."""
    subs = "".join(f"<{TAG[kind]}>{query}</{TAG[kind]}>\n" for kind, query, _ in branches)
    text = ("<think>Two documents are needed.</think>\n" if think else "") + subs + "<end/>"
    return Step(t=t, action="search", text=text, queries=[q for _, q, _ in branches],
                query_kinds=[k for k, _, _ in branches], docs=[[d] for _, _, d in branches])  # fmt: skip


def stop(t: int, think: bool = True) -> Step:
    return Step(t=t, action="stop", text=("<think>All found.</think>\n" if think else "") + STOP)


def r2ag_run(*steps: Step, found: list[str] | None = None) -> Episode:
    ep = episode("r2ag", list(steps), None)
    ep.outcome, ep.refused = "stop", False
    if found is not None:  # a forest expansion: the gold documents its tree already holds
        ep.meta["found_titles"] = found
    return ep


A, B, P = ("base", Q1, ALBUM), ("base", Q2, LABEL), ("predicted", Q2, LABEL)
R2AG: dict[str, Behaviour] = {
    "ideal": lambda: (r2ag_run(expansion(1, A, B), stop(2)), None),
    "ideal without <think>": lambda: (r2ag_run(expansion(1, A, B, think=False), stop(2, think=False)), None),
    "hop 2 found by a predicted branch": lambda: (r2ag_run(expansion(1, A, P), stop(2)), None),
    "duplicate branch in one expansion": lambda: (r2ag_run(expansion(1, A, A, B), stop(2)), None),
    "duplicate search in a later expansion": lambda: (
        r2ag_run(expansion(1, A, B), expansion(2, A), stop(3)),
        None,
    ),
    "premature stop": lambda: (r2ag_run(expansion(1, A), stop(2)), None),
    "stop without any search": lambda: (r2ag_run(stop(1)), None),
    "tree holds all gold: stop": lambda: (r2ag_run(stop(1), found=[ALBUM.title, LABEL.title]), None),
    "tree holds all gold: search hop 1 again": lambda: (
        r2ag_run(expansion(1, A), found=[ALBUM.title, LABEL.title]),
        None,
    ),
}


# --- arena -------------------------------------------------------------------------------------

ARENA_QUESTION = Question(
    id="blue-harbor", dataset="direction", split="dev", question=QUESTION, answers=[ANSWER],
    paragraphs=[Paragraph(title=ALBUM.title, text=ALBUM.text, is_gold=True),
                Paragraph(title=NOISE.title, text=NOISE.text, is_gold=False),
                Paragraph(title=LABEL.title, text=LABEL.text, is_gold=True)],
)  # fmt: skip
ANALYSIS = "<analysis>[1] says Acme Records released it; [3] says Jane Roe founded Acme Records.</analysis>"


def arena_run(relevance: str, answer: str, analysis: str = ANALYSIS) -> tuple[Episode, Question]:
    text = f"<relevance>{relevance}</relevance>\n{analysis}\n<answer>{answer}</answer>"
    return episode("arena", [Step(t=1, action="answer", text=text, answer=answer)], answer), ARENA_QUESTION


ARENA: dict[str, Behaviour] = {
    "ideal": lambda: arena_run("[1,3]", ANSWER),
    "over-citation": lambda: arena_run("[1,2,3]", ANSWER),
    "no citation": lambda: arena_run("[]", ANSWER),
    "no analysis": lambda: arena_run("[1,3]", ANSWER, analysis=""),
    "wrong answer": lambda: arena_run("[1,3]", "Acme Records"),
}


def naive_run(text: str, answer: str) -> Episode:
    """naive-rag: the runner retrieved with the question; the policy answers once."""
    return episode("naive-rag", [Step(t=1, action="answer", text=text, answer=answer)], answer)


BEHAVIOURS: dict[str, dict[str, Behaviour]] = {
    "search-r1": tag_behaviours("search-r1", ""),
    "naive-rag": {
        "ideal": lambda: (naive_run(f"<answer>{ANSWER}</answer>", ANSWER), None),
        "wrong answer": lambda: (naive_run("<answer>Acme Records</answer>", "Acme Records"), None),
        "correct, in sentence form": lambda: (naive_run(f"It was {ANSWER}.", f"It was {ANSWER}."), None),
    },
    "eval-rar": tag_behaviours("eval-rar", "evaluate"),
    "when-to-search": tag_behaviours("when-to-search", "reflect"),
    "evo-rag": EVO,
    "r2ag": R2AG,
    "arena": ARENA,
}


def make_recipe(key: str) -> Any:
    """``name`` or ``name/stage``: the recipe with its paper defaults, in that curriculum stage."""
    name, _, stage = key.partition("/")
    recipe = get_recipe(name)
    if stage:
        recipe.curriculum.stage = int(stage) if stage.isdigit() else stage
    return recipe


FINDING = pytest.mark.xfail(strict=True, reason="FINDING: the reward reverses the paper's order (the row)")


def row(recipe: str, better: str, relation: str, worse: str, *marks: Any) -> Any:
    name = f"{recipe}: {better} {relation} {worse}"
    return pytest.param(recipe, better, relation, worse, marks=marks, id=name)


# fmt: off
ROWS = [
    # --- search-r1: R = EM(final answer). Only the outcome is seen.
    # EM 1 vs 0.
    row("search-r1", "ideal", ">", "premature wrong answer"),
    # Both EM 1: an outcome-only reward does not see the redundant search (the baseline's design,
    # and the gap the process rewards of the other recipes are meant to close).
    row("search-r1", "ideal", "==", "duplicate search"),
    # Both EM 1: whether the policy searched at all is invisible to the outcome reward.
    row("search-r1", "ideal", "==", "no search, correct"),

    # --- naive-rag: R = EM; retrieval is the runner's, the policy only answers.
    row("naive-rag", "ideal", ">", "wrong answer"),  # EM 1 vs 0
    # EM 0 for both: a right answer in a sentence is not an exact match (the official metric).
    row("naive-rag", "correct, in sentence form", "==", "wrong answer"),

    # --- eval-rar: R = R_ans if R_ans > 0 else R_eval, R_eval = 0.1 if a gold answer is in <evaluate>.
    # R_ans 1 vs R_eval 0.1: a right answer beats recognising it and answering wrong.
    row("eval-rar", "ideal", ">", "evaluated gold, answered wrong"),
    # R_eval 0.1 vs 0: the paper's process reward, partial credit for evaluating the evidence right.
    row("eval-rar", "evaluated gold, answered wrong", ">", "premature wrong answer"),
    row("eval-rar", "ideal", ">", "premature wrong answer"),  # 1 vs 0
    # R_ans = 1 for both: once the answer is right, R ignores how it was reached (by design).
    row("eval-rar", "ideal", "==", "duplicate search"),
    row("eval-rar", "ideal", "==", "no search, correct"),

    # --- when-to-search: r = r_a + r_s + r_f, b = 0.3; c = cos(Q1, Q2).
    # Stage 1 (r_a = 1 if correct else -1 + b RC):
    #   ideal: 1 - c + 1 = 2 - c; duplicate: r_s = -(c + 1 + c)/3, so 2 - (2c + 1)/3 < 2 - c iff c < 1.
    row("when-to-search/1", "ideal", ">", "duplicate search"),
    #   premature wrong answer after one concise search: -1 + 0.3 + 0 + 1 = 0.3 < 2 - c.
    row("when-to-search/1", "ideal", ">", "premature wrong answer"),
    #   searching is encouraged when wrong (the paper's stage 1): 0.3 vs no search -1 + 0 + 1 = 0.
    row("when-to-search/1", "premature wrong answer", ">", "no search, wrong, think reflect answer"),
    #   the paper's no-search form is think reflect answer (r_f +1, total 2); think answer is
    #   malformed (r_f -1, total 0).
    row("when-to-search/1", "no search, correct, think reflect answer", ">", "no search, correct"),
    # Stage 2 (r_a = 1 - b RC if correct else -1):
    #   a right answer without searching, 1 + 0 + 1 = 2, beats one after two searches,
    #   1 - 0.6 - c + 1 = 1.4 - c: the paper's point, search only when needed.
    row("when-to-search/2", "no search, correct, think reflect answer", ">", "ideal"),
    #   1.4 - c vs 1 - 0.9 - (2c + 1)/3 + 1 = 1.1 - (2c + 1)/3.
    row("when-to-search/2", "ideal", ">", "duplicate search"),
    #   1.4 - c vs -1 + 0 + 1 = 0.
    row("when-to-search/2", "ideal", ">", "premature wrong answer"),
    #   a wrong answer costs -1 whatever the search count in stage 2: 0 and 0.
    row("when-to-search/2", "premature wrong answer", "==", "no search, wrong, think reflect answer"),

    # --- evo-rag: R = sum_t sum_k w_k(t) r_k(t), p = (t-1)/19, w = (1-p) early + p late.
    # Discovery weights at t = 1, 2, 3: w_ret 2.0, 1.947, 1.895; w_dup 0.1, 0.121, 0.142;
    # w_step 0.02, 0.0216, 0.0232; w_ans 0.05, 0.0526, 0.0553; w_ref 0.5; w_bt(2) 0.311.
    # ideal: (2.0 - 0.02) + (1.947 - 0.121 c - 0.0216) + (0.0553 - 0.0232) = 3.938 - 0.121 c.
    # premature wrong answer: 1.98 + (0 - 0.0216) = 1.958 (the second hit's r_ret decides).
    row("evo-rag", "ideal", ">", "premature wrong answer"),
    # no search, correct: 0.05 * 1 - 0.02 = 0.03 (Discovery pays for retrieval gain).
    row("evo-rag", "ideal", ">", "no search, correct"),
    # r_ref: refusing once the retrieved evidence answers the question is -1:
    # R_3 = -0.5 - 0.0232 vs the answer's 0.0553 - 0.0232.
    row("evo-rag", "ideal", ">", "refusal of an answerable question after the evidence"),
    # Unanswerable (no gold answer): after the same dead-end search, refusing earns
    # r_ref = +1 (R_2 = 0.5 - 0.0216); answering earns r_ans = 0 (R_2 = -0.0216).
    row("evo-rag", "unanswerable: refuse after searching", ">", "unanswerable: answer anyway"),
    # A backtrack out of a dead end pays for itself through the hits it leads to:
    # -2.02 - (0.311 + 0.0216) + (1.895 + 1.842 - dup) - (0.0232 + 0.0247) + (0.0605 - 0.0263) ~ 1.37
    # vs answering from the dead end: -2.02 - 0.0216 = -2.04.
    row("evo-rag", "dead end, backtrack, recover", ">", "dead end, answer"),
    # ... and r_bt is a cost by design (-1 per BACKTRACK, weight 0.3 -> 0.5 -> 1.0): the same
    # recovery without the backtrack scores w_bt(2) + one step's w_step more (~0.33 + shifts).
    row("evo-rag", "dead end, recover without backtrack", ">", "dead end, backtrack, recover"),
    # Refinement, late (p(7) = 6/19 >= 0.3, so r_act fires): a duplicate of Q2 at t=7 instead of
    # answering: R_7 = w_ret 0.842 - w_dup 0.721 - w_act 0.674 - w_step 0.066 = -0.619, and the
    # answer moves to t=8 (w_ans 0.432 - w_step 0.068 vs 0.384 - 0.066): difference -0.574.
    row("evo-rag/refinement", "late: answer at t=7", ">", "late: duplicate search at t=7"),
    # FINDING. A verbatim duplicate search that re-hits gold RAISES the return early in either
    # stage: r_ret = +1 again (the formula pays any SEARCH that hits gold), and w_dup is small.
    # Discovery, duplicate of Q1 at t=2: R_2 = 1.947 - 0.121 - 0.0216 = +1.80, so the duplicate
    # episode scores 5.69 - 0.142 c vs the ideal's 3.94 - 0.121 c. Refinement: R_2 = 0.974 -
    # 0.537 - 0.053 = +0.38; 2.41 - 0.574 c vs 2.01 - 0.537 c. The paper's r_dup and r_act exist to
    # penalise redundant queries; only from p >= 0.3 in Refinement does the penalty win (row above).
    row("evo-rag", "ideal", ">", "duplicate search", FINDING),
    row("evo-rag/refinement", "ideal", ">", "duplicate search", FINDING),

    # --- r2ag: R = 0.2 R_MH + 0.3 R_JH + 0.2 R_AP + w R_f (cap 0.02); 0 if <think> is missing or
    # the stop comes before all gold is found.
    # ideal: R_MH = 2, R_AP^b = (1/2)(1/1 + 2/2) = 1, R_f = 0.02, R_JH = 1: 0.4 + 0.2 + 0.02 + 0.3 = 0.92.
    row("r2ag", "ideal", ">", "premature stop"),          # total zeroed: 0.92 vs 0
    row("r2ag", "ideal", ">", "ideal without <think>"),   # total zeroed: 0.92 vs 0
    # Any stop before all gold is found zeroes the total, however far the tree got (the paper:
    # "the total reward is set to zero"): 0 and 0.
    row("r2ag", "premature stop", "==", "stop without any search"),
    # l = 1.25 rewards a predicted branch that hits: R_MH = 1 + 1.25, R_AP = 0.5 + 0.5: 0.97 vs 0.92.
    row("r2ag", "hop 2 found by a predicted branch", ">", "ideal"),
    # FINDING. A repeated branch in one expansion: Eq. 5 sums over branches, so R_MH^b over
    # [A, A, B] is 3 and R_AP^b = (1/2)(1/1 + 2/2 + 3/3) = 1.5 (every branch is gold):
    # 0.6 + 0.3 + 0.02 + 0.3 = 1.22 > 0.92. The option branches="distinct" (A once: R_MH 2,
    # R_AP^b = (1/2)(1 + 0 + 2/3) = 0.833, R = 0.887 < 0.92) keeps the paper's stated intent.
    row("r2ag", "ideal", ">", "duplicate branch in one expansion", FINDING),
    # The paper's training scores each expansion against the tree it grows (found_titles): once
    # the tree holds all gold, stopping (R_JH 0.3 + R_f 0.02 = 0.32) beats re-searching hop 1
    # (R_MH 0, R_AP^b = (1/2)(1) = 0.5: 0.1 + R_f 0.01 = 0.11).
    row("r2ag", "tree holds all gold: stop", ">", "tree holds all gold: search hop 1 again"),
    # FINDING (whole episodes: /v1/answer, PPO/DPO on stored episodes). A later expansion that
    # re-finds A earns R_AP^b = (1/2)(1) = 0.5 again under the printed 1{r_u in g} (R_MH, which
    # counts only new gold, gives 0): 0.92 + 0.2 * 0.5 = 1.02 > 0.92. docs/recipes/r2ag.md records
    # it; the option ap_relevant="new" removes it.
    row("r2ag", "ideal", ">", "duplicate search in a later expansion", FINDING),

    # --- arena: R = format + accuracy + relevance (1 / 0.5 / 0) + bonus 10 when all three are 1.
    row("arena", "ideal", ">", "over-citation"),   # 1 + 1 + 1 + 10 = 13 vs 1 + 1 + 0.5 = 2.5
    row("arena", "over-citation", ">", "no citation"),  # 2.5 vs 1 + 1 + 0 = 2
    row("arena", "ideal", ">", "no analysis"),     # 13 vs 0 + 1 + 1 = 2 (format, hence no bonus)
    row("arena", "ideal", ">", "wrong answer"),    # 13 vs 1 + 0 + 1 = 2
    # The three signals weigh the same; only the bonus tells a complete output apart:
    # a wrong answer citing exactly the gold references and a right one citing none both score 2.
    row("arena", "wrong answer", "==", "no citation"),
]
# fmt: on


@pytest.mark.parametrize(("recipe", "better", "relation", "worse"), ROWS)
def test_reward_direction(recipe: str, better: str, relation: str, worse: str) -> None:
    behaviours = BEHAVIOURS[recipe.partition("/")[0]]
    (ep_better, q_better), (ep_worse, q_worse) = behaviours[better](), behaviours[worse]()
    questions = [q_better, q_worse] if q_better and q_worse else None
    _, (high, low) = score_episodes(make_recipe(recipe), [ep_better, ep_worse], questions)
    if relation == "==":
        assert high == pytest.approx(low, abs=1e-9), (high, low)
    else:
        assert high > low + 1e-6, (high, low)


def test_every_recipe_has_rows_and_every_behaviour_is_used() -> None:
    """The table covers every registered recipe, and no scripted behaviour sits unused."""
    from hoprl.recipes import RECIPES

    covered = {p.values[0].partition("/")[0] for p in ROWS}
    assert covered == set(RECIPES), sorted(set(RECIPES) ^ covered)
    used = {(p.values[0].partition("/")[0], name) for p in ROWS for name in (p.values[1], p.values[3])}
    defined = {(r, name) for r, table in BEHAVIOURS.items() for name in table}
    # the tag recipes share one behaviour table; each uses the part that fits its reward
    unused = {(r, n) for r, n in defined - used if r not in ("search-r1", "eval-rar", "when-to-search")}
    assert not unused, sorted(unused)
