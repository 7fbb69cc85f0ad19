"""Every recipe's reward on whole episodes, worked out by hand from the paper's printed equations.

Each episode goes through :func:`hoprl.recipes.scoring.score_episodes`, the path the trainer and
``hoprl reward`` take, with the recipe's defaults. The expected totals come from the equations
cited beside them (the papers as ``docs/papers.md`` cites them), never from what the code returns.
"""

from __future__ import annotations

import pytest

from hoprl.domain import Episode, Paragraph, Question, RetrievedDoc, Step
from hoprl.recipes import get_recipe
from hoprl.recipes.scoring import score_episodes
from tests.episodes import answer as answer_step
from tests.episodes import episode, search

GOLD = ["Jane Roe"]
INFO = "<information>\n[1] Acme Records: founded by Jane Roe.\n</information>"


def doc(title: str, text: str = "") -> RetrievedDoc:
    return RetrievedDoc(id=title, title=title, text=text or f"text of {title}")


def total(recipe_name: str, episode: Episode, question: Question | None = None, **config: object) -> float:
    recipe = get_recipe(recipe_name, **config)
    _, (value,) = score_episodes(recipe, [episode], [question])
    return value


# --- R2AG: Eq. 5 (Sec. 2.4) and App. B.2 ----------------------------------------------------------
# R = 0.2 R_MH + 0.3 R_JH + 0.2 R_AP + w R_f (w R_f <= 0.02 over the episode, 0.01 per segment)
# R_MH^* = sum_{u=1}^{x_*} 1{r_u in g, r_u not in r_prior};  R_MH = R_MH^b + 1.25 R_MH^p
# R_AP^* = (1/|g|) sum_{u=1}^{t_*} ((1/u) sum_{z<=u} 1{r_z in g}) 1{r_u in g}, t_b = 4, t_p = 2
# R_JH = 1{|r~ cap g| = |g|, stop}

R2AG_TAG = {"base": "base-Q", "predicted": "predicted-Q"}


def r2ag_search(t: int, *subs: tuple[str, str]) -> Step:
    """One expansion after a <think>: ``subs`` are (kind, top-1 title) branches in emission order."""
    text = "<think>plan</think>" + "".join(f"<{R2AG_TAG[k]}>q {x}</{R2AG_TAG[k]}>" for k, x in subs)
    return Step(
        t=t,
        action="search",
        text=text + "<end/>",
        queries=[f"q {x}" for _, x in subs],
        query_kinds=[k for k, _ in subs],
        docs=[[doc(x)] for _, x in subs],
    )


def r2ag_stop(t: int) -> Step:
    text = "<think>done</think><base-Q>stop retrieval</base-Q><predicted-Q>none</predicted-Q><end/>"
    return Step(t=t, action="stop", text=text)


def r2ag_episode(*steps: Step) -> Episode:
    return Episode(recipe="r2ag", question_id="q", question="?", gold_titles=["A", "B"], steps=list(steps))


R2AG_CASES = [
    (
        # two base branches find the same new gold document A (gold {A, B}):
        # R_MH^b = 1{A} + 1{A} = 2; R_AP^b = (1/2)(P@1*1 + P@2*1) = (1/2)(1 + 2/2) = 1;
        # R_f = 2 * 0.01 = 0.02. R = 0.2*2 + 0.2*1 + 0.02 = 0.62 (counting A once gave 0.32)
        "same new gold twice",
        r2ag_episode(r2ag_search(1, ("base", "A"), ("base", "A"))),
        0.62,
    ),
    (
        # four base branches re-find A: R_MH^b = 4; R_AP^b = (1/2)(1 + 1 + 1 + 1) = 2 (every
        # P@u = u/u = 1); R_f = 4 * 0.01 capped at 0.02. R = 0.8 + 0.4 + 0.02 = 1.22
        "four branches on one gold document",
        r2ag_episode(r2ag_search(1, *[("base", "A")] * 4)),
        1.22,
    ),
    (
        # step 1: base A (new). R_MH = 1, R_AP^b = (1/2)(1) = 0.5, R_f 0.01.
        # step 2: base A (in r_prior), B, B (new twice). R_MH^b = 0 + 1 + 1 = 2;
        # R_AP^b over [A, B, B], all gold: (1/2)(1/1 + 2/2 + 3/3) = 1.5; R_f 3 segments, 0.01 left.
        # step 3: stop with A and B found: R_JH = 1; R_f cap reached.
        # R = 0.2*(1 + 2) + 0.3*1 + 0.2*(0.5 + 1.5) + 0.02 = 0.6 + 0.3 + 0.4 + 0.02 = 1.32
        "repeat across and within steps, then stop",
        r2ag_episode(
            r2ag_search(1, ("base", "A")),
            r2ag_search(2, ("base", "A"), ("base", "B"), ("base", "B")),
            r2ag_stop(3),
        ),
        1.32,
    ),
    (
        # base A, base X, predicted B, then stop: R_MH = 1 + 1.25*1 = 2.25;
        # R_AP = (1/2)(1*1 + (1/2)*0) + (1/2)(1*1) = 1; R_JH = 1; R_f 0.02.
        # R = 0.45 + 0.3 + 0.2 + 0.02 = 0.97
        "base and predicted, then stop",
        r2ag_episode(r2ag_search(1, ("base", "A"), ("base", "X"), ("predicted", "B")), r2ag_stop(2)),
        0.97,
    ),
]


@pytest.mark.parametrize(("name", "episode", "expected"), R2AG_CASES, ids=[c[0] for c in R2AG_CASES])
def test_r2ag_eq5(name: str, episode: Episode, expected: float) -> None:
    assert total("r2ag", episode) == pytest.approx(expected)


def test_r2ag_distinct_option_is_the_earlier_reading() -> None:
    # branches="distinct": A counts once, R_MH = 1; the repeat is not relevant again,
    # R_AP^b = (1/2)(1 + 0) = 0.5. R = 0.2 + 0.1 + 0.02 = 0.32
    assert total("r2ag", R2AG_CASES[0][1], branches="distinct") == pytest.approx(0.32)


# --- when-to-search: Eqs. 6-12 (Sec. 3.3) ---------------------------------------------------------
# r_sum = r_a + r_s + r_f (Eq. 12); r_f = +-1 (Eq. 6); r_s = 0 / -1 for RC <= 1 (concise / not),
# -avg_sim for RC > 1 (Eq. 9), avg_sim = sum_{i<j} cos(m_i, m_j) / (N(N-1)) (Eq. 8);
# r_a stage 1: 1 if correct else -1 + 0.3 RC (Eq. 10); stage 2: 1 - 0.3 RC if correct else -1 (Eq. 11).
# Identical queries embed to the same unit vector: cos = 1.


def wts_episode(queries: list[str], answer: str, reflect_first: bool = True) -> Episode:
    """think + search per query, reflect after each result, then think + answer."""
    steps, review = [], ""
    for t, q in enumerate(queries, 1):
        steps.append(search(t, q, INFO, before=review))
        review = "<reflect>It names the founder.</reflect>\n"
    closing = "<think>done</think>\n" if queries else "<think>t</think>\n"
    if not queries and reflect_first:
        closing += "<reflect>I know it.</reflect>\n"
    steps.append(answer_step(len(queries) + 1, f"{review}{closing}<answer>{answer}</answer>", answer))
    return episode("when-to-search", steps, answer, GOLD)


WTS_CASES = [
    (
        # N = 2 identical queries: avg_sim = 1 / (2*1) = 0.5, r_s = -0.5; correct in stage 1: r_a = 1;
        # well formed: r_f = 1. r = 1 - 0.5 + 1 = 1.5 (the mean over the one pair gave 1.0)
        "two identical queries, correct, stage 1",
        wts_episode(["Acme founder", "Acme founder"], "Jane Roe"),
        1,
        1.5,
    ),
    (
        # N = 3 identical: 3 pairs, avg_sim = 3 / (3*2) = 0.5, r_s = -0.5; wrong in stage 1:
        # r_a = -1 + 0.3*3 = -0.1; r_f = 1. r = 1 - 0.5 - 0.1 = 0.4
        "three identical queries, wrong, stage 1",
        wts_episode(["Acme founder"] * 3, "John Doe"),
        1,
        0.4,
    ),
    (
        # one query phrased as a question (not concise): r_s = -1; correct in stage 2:
        # r_a = 1 - 0.3*1 = 0.7; r_f = 1. r = 1 - 1 + 0.7 = 0.7
        "one question-shaped query, correct, stage 2",
        wts_episode(["Who founded Acme Records?"], "Jane Roe"),
        2,
        0.7,
    ),
    (
        # no search and no <reflect> (think answer is neither printed form): r_f = -1; RC = 0:
        # r_s = 0; correct in stage 1: r_a = 1. r = 0
        "no search, malformed, correct",
        wts_episode([], "Jane Roe", reflect_first=False),
        1,
        0.0,
    ),
]


@pytest.mark.parametrize(("name", "episode", "stage", "expected"), WTS_CASES, ids=[c[0] for c in WTS_CASES])
def test_when_to_search_eqs_6_to_12(name: str, episode: Episode, stage: int, expected: float) -> None:
    recipe = get_recipe("when-to-search")
    recipe.curriculum.stage = stage
    _, (value,) = score_episodes(recipe, [episode], [None])
    assert value == pytest.approx(expected, abs=1e-4)


def test_when_to_search_pairs_option() -> None:
    # avg_sim="pairs": the one pair's cosine 1 / 1 pair: r_s = -1, r = 1 - 1 + 1 = 1.0
    recipe = get_recipe("when-to-search", avg_sim="pairs")
    _, (value,) = score_episodes(recipe, [WTS_CASES[0][1]], [None])
    assert value == pytest.approx(1.0, abs=1e-4)


# --- Eval-RAR: Eqs. 2-5 (Sec. 4.2) -----------------------------------------------------------------
# R_ans = 1{exists a: a = y_ans} (Eq. 2, normalised EM); R_eval = r_eval = 0.1 if a gold answer is
# contained in the concatenated <evaluate> blocks (Eqs. 3-4); R = R_ans if R_ans > 0 else R_eval (Eq. 5)


def eval_rar_episode(evaluate: str, answer: str) -> Episode:
    text = f"<evaluate>{evaluate}</evaluate><think>t</think><answer>{answer}</answer>"
    steps = [search(1, "Acme founder", INFO, sep=""), answer_step(2, text, answer)]
    return episode("eval-rar", steps, answer, GOLD)


EVAL_RAR_CASES = [
    # correct answer ("Jane Roe." normalises to "jane roe"): R_ans = 1, R = 1
    ("correct", eval_rar_episode("Nothing useful.", "Jane Roe."), 1.0),
    # wrong answer, "Jane Roe" inside <evaluate>: R_ans = 0, R_eval = 0.1, R = 0.1
    ("wrong, gold evaluated", eval_rar_episode("The founder is Jane Roe.", "John Doe"), 0.1),
    # wrong answer, gold nowhere in <evaluate>: R = R_eval = 0
    ("wrong, gold not evaluated", eval_rar_episode("The founder is unknown.", "John Doe"), 0.0),
    # correct answer and gold evaluated: R_ans = 1 > 0, so R = R_ans = 1 (not 1.1)
    ("correct and evaluated", eval_rar_episode("It is Jane Roe.", "Jane Roe"), 1.0),
]


@pytest.mark.parametrize(("name", "episode", "expected"), EVAL_RAR_CASES, ids=[c[0] for c in EVAL_RAR_CASES])
def test_eval_rar_eqs_2_to_5(name: str, episode: Episode, expected: float) -> None:
    assert total("eval-rar", episode) == pytest.approx(expected)


# --- ARENA: Sec. 3.3 and App. C.1 ---------------------------------------------------------------
# R = format + accuracy + relevance + bonus; format 1 (relevance, analysis, answer in order) else 0;
# accuracy 1 on normalised EM (lowercase, no punctuation or articles, "_" -> " ", spaces collapsed);
# relevance 1 full / 0.5 partial / 0 none; bonus 10 when the three are all 1.

ARENA_Q = Question(
    id="a1",
    dataset="t",
    split="dev",
    question="Where is Acme Records based?",
    answers=["New York"],
    paragraphs=[
        Paragraph(title="Beta", text="Beta is a band.", is_gold=False),
        Paragraph(title="Acme Records", text="Acme Records is based in New York.", is_gold=True),
    ],
)


def arena_episode(text: str, answer: str) -> Episode:
    return Episode(
        recipe="arena",
        question_id="a1",
        question=ARENA_Q.question,
        answers=["New York"],
        final_answer=answer,
        steps=[Step(t=1, action="answer", answer=answer, text=text)],
    )


def arena_text(refs: str, answer: str) -> str:
    return f"<relevance>{refs}</relevance><analysis>[2] says so.</analysis><answer>{answer}</answer>"


ARENA_CASES = [
    # everything right: 1 + 1 + 1 + 10 = 13
    ("all right", arena_episode(arena_text("[2]", "New York"), "New York"), 13.0),
    # "the New_York" normalises to "new york" (App. C.1: articles removed, "_" -> " "): accuracy 1,
    # so 1 + 1 + 1 + 10 = 13 (SQuAD's normalisation deletes "_": "newyork", accuracy 0, R = 2)
    ("underscore answer", arena_episode(arena_text("[2]", "the New_York"), "the New_York"), 13.0),
    # cites [1, 2] for gold {2}: partial, 0.5; no bonus. 1 + 1 + 0.5 = 2.5
    ("partial relevance", arena_episode(arena_text("[1,2]", "New York"), "New York"), 2.5),
    # answer before analysis (not in order): format 0; wrong answer 0; cites [1] only: none 0. R = 0
    (
        "all wrong",
        arena_episode("<relevance>[1]</relevance><answer>Boston</answer><analysis>x</analysis>", "Boston"),
        0.0,
    ),
    # §3.3's format check asks for the three parts in order, nothing about brackets: "2" names
    # gold {2}, so format 1 + accuracy 1 + relevance 1 + bonus 10 = 13
    ("unbracketed list", arena_episode(arena_text("2", "New York"), "New York"), 13.0),
    # a sentence before the parts: still the three parts in order, 1 + 1 + 1 + 10 = 13
    ("text before", arena_episode("Here it is. " + arena_text("[2]", "New York"), "New York"), 13.0),
]


@pytest.mark.parametrize(("name", "episode", "expected"), ARENA_CASES, ids=[c[0] for c in ARENA_CASES])
def test_arena_sec_3_3(name: str, episode: Episode, expected: float) -> None:
    assert total("arena", episode, ARENA_Q) == pytest.approx(expected)


def test_arena_squad_option() -> None:
    # answer_norm="squad": "the new_york" -> "newyork" != "new york": 1 + 0 + 1 + 0 = 2
    assert total("arena", ARENA_CASES[1][1], ARENA_Q, answer_norm="squad") == pytest.approx(2.0)


def test_arena_strict_format_option() -> None:
    # format_check="strict" (the earlier reading) wants "[2]": format 0 and so no bonus, 0 + 1 + 1 = 2
    assert total("arena", ARENA_CASES[4][1], ARENA_Q, format_check="strict") == pytest.approx(2.0)


# --- EVO-RAG: Sec. 3.3, Table 2, Sec. 3.6 -------------------------------------------------------------
# R = sum_t R_t, R_t = sum_k w_k(t) r_k(t), w_k(t) = (1 - p) w_early + p w_late, p = (t-1)/(T_max-1).
# Discovery (Start -> Mid) / Refinement (Mid -> End), Table 2:
#   ret 2.0/1.0/0.5  act 1.5/0.8/0.4  dup 0.1/0.5/1.2  bt 0.3/0.5/1.0  ref 0.5  step 0.02/0.05/0.10
#   ans 0.05/0.10/1.00
# r_ret = +1 / -1 on a SEARCH that hits / misses gold; r_dup = -max_{j<t} cos(q_t, q_j);
# r_act = -1[r_dup < 0] on a SEARCH with p >= 0.3; r_bt = -1 on BACKTRACK; r_ref = +1 / -1 on a
# REFUSE the judge finds unanswerable / answerable; r_step = -1 every step; r_ans = (EM + F1) / 2.

ACME = doc("Acme Records", "Acme Records was founded by Jane Roe.")
BETA = doc("Beta", "Beta is a band.")


def evo_episode(*steps: Step) -> Episode:
    return Episode(
        recipe="evo-rag",
        question_id="q",
        question="Who founded Acme Records?",
        answers=GOLD,
        gold_titles=["Acme Records"],
        steps=list(steps),
    )


def evo_search(t: int, query: str, hit: RetrievedDoc) -> Step:
    return Step(t=t, action="search", text=f"<search>{query}</search>", queries=[query], docs=[[hit]])


def evo_answer(t: int, answer: str) -> Step:
    return Step(t=t, action="answer", answer=answer, text=f"<answer>{answer}</answer>")


EVO_CASES = [
    (
        # Discovery, T_max = 20. t=1 (p=0): hit, r_ret = 1 (w 2.0), r_step = -1 (w 0.02): 1.98.
        # t=2 (p=1/19): w_ans = (18*0.05 + 0.10)/19 = 1/19, w_step = (18*0.02 + 0.05)/19 = 0.41/19;
        # exact answer r_ans = (1 + 1)/2 = 1: 1/19 - 0.41/19 = 0.59/19. R = 1.98 + 0.59/19
        "hit then exact answer",
        evo_episode(evo_search(1, "Acme founder", ACME), evo_answer(2, "Jane Roe")),
        {},
        "discovery",
        1.98 + 0.59 / 19,
    ),
    (
        # Discovery, T_max = 20. t=1: miss, -2.0 - 0.02 = -2.02.
        # t=2 (p=1/19) BACKTRACK: w_bt = (18*0.3 + 0.5)/19 = 5.9/19; -5.9/19 - 0.41/19 = -6.31/19.
        # t=3 (p=2/19) REFUSE; "Beta is a band." lacks "Jane Roe": unanswerable, r_ref = +1 (w 0.5);
        # w_step = (17*0.02 + 2*0.05)/19 = 0.44/19: 0.5 - 0.44/19.
        # R = -2.02 - 6.31/19 + 0.5 - 0.44/19 = -1.52 - 6.75/19
        "miss, backtrack, justified refusal",
        evo_episode(
            evo_search(1, "Beta band", BETA),
            Step(t=2, action="backtrack", text="<backtrack/>"),
            Step(t=3, action="refuse", text="<refuse/>"),
        ),
        {},
        "discovery",
        -1.52 - 6.75 / 19,
    ),
    (
        # Refinement, T_max = 3: p = 0, 0.5, 1; endpoints Mid -> End.
        # t=1: hit, w_ret 1.0, w_step 0.05: 1.0 - 0.05 = 0.95.
        # t=2: the same query again (cos 1): r_dup = -1, r_act = -1 (p = 0.5 >= 0.3), miss r_ret = -1;
        # w_ret = (1.0 + 0.5)/2 = 0.75, w_act = (0.8 + 0.4)/2 = 0.6, w_dup = (0.5 + 1.2)/2 = 0.85,
        # w_step = (0.05 + 0.10)/2 = 0.075: -0.75 - 0.6 - 0.85 - 0.075 = -2.275.
        # t=3: "Jane Roe Smith": EM 0, F1 = 2*(2/3)*1/(2/3 + 1) = 0.8, r_ans = 0.4; w_ans = 1.0,
        # w_step = 0.10: 0.4 - 0.1 = 0.3. R = 0.95 - 2.275 + 0.3 = -1.025
        "repeated query late, partial answer",
        evo_episode(
            evo_search(1, "Acme founder", ACME),
            evo_search(2, "Acme founder", BETA),
            evo_answer(3, "Jane Roe Smith"),
        ),
        {"t_max": 3},
        "refinement",
        -1.025,
    ),
]


@pytest.mark.parametrize(
    ("name", "episode", "config", "stage", "expected"), EVO_CASES, ids=[c[0] for c in EVO_CASES]
)
def test_evo_rag_sec_3_3(
    name: str, episode: Episode, config: dict[str, int], stage: str, expected: float
) -> None:
    recipe = get_recipe("evo-rag", **config)
    recipe.curriculum.stage = stage
    _, (value,) = score_episodes(recipe, [episode], [None])
    assert value == pytest.approx(expected, abs=1e-4)
