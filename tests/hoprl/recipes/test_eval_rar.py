"""Eval-RAR reward: R = R_ans if R_ans > 0 else R_eval, recomputed by hand per row."""

from __future__ import annotations

import pytest

from hoprl.domain import Episode, Question
from hoprl.recipes import get_recipe
from hoprl.recipes.eval_rar import EvalRAR, answer_reward, evaluate_text, make_evaluate_reward
from tests.episodes import answer as answer_step
from tests.episodes import episode as scripted
from tests.episodes import search

GOLD = ["Jane Roe", "J. Roe"]
INFO = "<information>\n[1] Acme: founded by Jane Roe in 1990.\n</information>"


def episode(evaluations: list[str], answer: str | None) -> Episode:
    """A search episode: one search step per evaluation, then the answer (if any)."""
    steps, review = [], ""
    for t, ev in enumerate(evaluations, 1):
        steps.append(search(t, f"q{t}", INFO, before=review, sep=""))
        review = f"<evaluate>{ev}</evaluate>\n"
    if answer is not None:
        steps.append(answer_step(len(steps) + 1, f"{review}<answer>{answer}</answer>"))
    outcome = "answer" if answer else "step_cap"
    return scripted("eval-rar", steps, answer, GOLD, "Who founded Acme?", outcome=outcome)


# (evaluate blocks, final answer, R_ans by hand, gold in evaluate by hand)
ROWS = [
    (["Acme was founded by Jane Roe."], "Jane Roe", 1.0, True),  # EM 1 wins: 1, not 1.1
    (["Nothing useful here."], "Jane Roe", 1.0, False),
    (["Acme was founded by Jane Roe."], "John Doe", 0.0, True),  # fallback 0.1
    (["The founder is j. roe!"], "John Doe", 0.0, True),  # alias, normalised
    (["Irrelevant.", "Second doc names JANE ROE"], "John", 0.0, True),  # concatenated blocks
    (["Irrelevant documents."], "John Doe", 0.0, False),  # gold only in <information>: 0
    (["Founded by Jane Roesch."], "John Doe", 0.0, False),  # word boundary: not contained
    # no answer (step cap: the last search's evaluation is never written), evaluate still pays
    (["Acme was founded by Jane Roe.", "never written"], None, 0.0, True),
    ([], "the jane roe", 1.0, False),  # no search, normalised EM
]


@pytest.mark.parametrize(("evals", "answer", "r_ans", "in_eval"), ROWS)
@pytest.mark.parametrize("r_eval", [0.1, 0.25])
def test_eval_rar_reward(
    evals: list[str], answer: str | None, r_ans: float, in_eval: bool, r_eval: float
) -> None:
    ep = episode(evals, answer)
    expected = r_ans if r_ans > 0 else (r_eval if in_eval else 0.0)
    (total,) = EvalRAR(r_eval=r_eval).reward_funcs()
    assert total([""], [""], episodes=[ep]) == pytest.approx([expected])
    assert answer_reward([""], [""], episodes=[ep]) == [r_ans]
    assert make_evaluate_reward(r_eval)([""], [""], episodes=[ep]) == pytest.approx([r_eval * in_eval])
    # the same from the completion text (injected information included) and the answers column
    assert total([""], [ep.completion_text()], answers=[GOLD]) == pytest.approx([expected])


def test_r_ans_is_the_baselines_exact_match_under_its_own_version() -> None:
    from hoprl.recipes.baselines import exact_match_reward

    # gold "Jane Roe": EM 1; "John Doe": 0; no answer: 0
    eps = [episode([], "Jane Roe"), episode([], "John Doe"), episode(["x"], None)]
    blank = [""] * 3
    assert answer_reward(blank, blank, episodes=eps) == [1.0, 0.0, 0.0]
    assert exact_match_reward(blank, blank, episodes=eps) == [1.0, 0.0, 0.0]
    versions = (answer_reward.__version__, exact_match_reward.__version__)
    assert versions == ("eval_rar_answer@1", "exact_match@1")


def test_paper_default_r_eval_and_top_k() -> None:
    recipe = get_recipe("eval-rar")
    assert recipe.config.r_eval == 0.1 and recipe.top_k == 3
    (total,) = recipe.reward_funcs()
    assert total([""], [""], episodes=[episode(["Jane Roe did it"], "nobody")]) == [0.1]


def test_evaluate_text_ignores_information_and_concatenates() -> None:
    text = "<evaluate>a</evaluate><information><evaluate>x</evaluate></information><evaluate>b</evaluate>"
    assert evaluate_text(text) == "a b"


def test_parse_after_information_turn() -> None:
    action = EvalRAR().parse("<evaluate>doc 1 names Jane Roe</evaluate>\n<answer>Jane Roe</answer>")
    assert (action.kind, action.answer) == ("answer", "Jane Roe")


@pytest.mark.parametrize(
    ("segment", "kind"),
    [
        ("<evaluate>doc 1 names Jane Roe</evaluate>\n<answer>Jane Roe</answer>", "answer"),
        (
            "<evaluate>the birthplace is missing</evaluate>\n<think>t</think><search>Jane Roe</search>",
            "search",
        ),
        ("<think>t</think><answer>Jane Roe</answer>", "format_error"),  # no evaluation
        ("<answer>Jane Roe</answer><evaluate>late</evaluate>", "format_error"),  # after the action
        ("<evaluate></evaluate><answer>Jane Roe</answer>", "format_error"),  # empty
        ("<evaluate>unclosed <answer>Jane Roe</answer>", "format_error"),
    ],
)
def test_algorithm_1_line_17_evaluation_after_information(segment: str, kind: str) -> None:
    assert EvalRAR().parse_after_information(segment).kind == kind


def test_prompt_is_app_a1() -> None:
    """A.1 says what an evaluation holds: the supporting source content, or what is missing."""
    prompt = EvalRAR().messages(Question(id="q", dataset="d", split="dev", question="Who?"))[0]["content"]
    assert "After each search, you must conduct an evaluation" in prompt
    assert "specify what information is missing: entity information, relational information" in prompt
    assert "Provide your evaluation using <evaluate> and </evaluate>." in prompt
