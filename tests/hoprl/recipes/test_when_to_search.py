"""When-to-search: r = r_a + r_s + r_f, both curriculum stages, b = 0.3, recomputed by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hoprl.data.synthetic import Hop, generate, hops_for
from hoprl.domain import Episode, Question
from hoprl.embedding import get_embedder
from hoprl.judging import Verdict
from hoprl.recipes import get_recipe
from hoprl.recipes.when_to_search import Curriculum, WhenToSearch, is_concise, keyword_query, well_formed
from tests.episodes import answer as answer_step
from tests.episodes import episode as scripted
from tests.episodes import search

GOLD = ["Jane Roe"]
INFO = "<information>\n[1] Acme: founded by Jane Roe.\n</information>"
CONCISE = ["Acme founder", "Jane Roe birthplace", "Acme Records history"]


def episode(queries: list[str], answer: str | None) -> Episode:
    """A well-formed episode: think + search per query, reflect after each information, answer."""
    steps, review = [], ""
    for t, q in enumerate(queries, 1):
        steps.append(search(t, q, INFO, before=review))
        review = "<reflect>The document names the founder.</reflect>\n"
    if answer is not None:
        # the paper's no-search form reflects before answering: <think><reflect><answer>
        closing = "<think>done</think>\n" if queries else "<think>t</think>\n<reflect>I know it.</reflect>\n"
        steps.append(answer_step(len(queries) + 1, f"{review}{closing}<answer>{answer}</answer>"))
    return scripted("when-to-search", steps, answer, GOLD, "Who founded Acme?")


def rewards(recipe: WhenToSearch, ep: Episode) -> list[float | None]:
    return [fn([""], [""], episodes=[ep])[0] for fn in recipe.reward_funcs()]


def cosine_penalty(queries: list[str]) -> float:
    """-avg_sim of Eq. 8: the cosines of the pairs i < j (the embedder's unit vectors, pair by
    pair) summed and divided by N(N-1)."""
    vectors = get_embedder().encode(queries)
    sims = [float(np.dot(vectors[i], vectors[j])) for i, j in itertools.combinations(range(len(queries)), 2)]
    n = len(queries)
    return -sum(sims) / (n * (n - 1))


# (stage, RC, correct, r_a by hand with b = 0.3)
ANSWER_ROWS = [
    (1, 0, True, 1.0),
    (1, 1, True, 1.0),
    (1, 2, True, 1.0),
    (1, 3, True, 1.0),
    (1, 0, False, -1.0),
    (1, 1, False, -0.7),
    (1, 2, False, -0.4),
    (1, 3, False, -0.1),
    (2, 0, True, 1.0),
    (2, 1, True, 0.7),
    (2, 2, True, 0.4),
    (2, 3, True, 0.1),
    (2, 0, False, -1.0),
    (2, 1, False, -1.0),
    (2, 2, False, -1.0),
    (2, 3, False, -1.0),
]


@pytest.mark.parametrize(("stage", "rc", "correct", "r_a"), ANSWER_ROWS)
def test_total_reward_both_stages(stage: int, rc: int, correct: bool, r_a: float) -> None:
    recipe = WhenToSearch()
    recipe.curriculum.stage = stage  # type: ignore[assignment]
    queries = CONCISE[:rc]
    ep = episode(queries, "Jane Roe" if correct else "John Doe")
    r_s = 0.0 if rc <= 1 else cosine_penalty(queries)  # concise single query: 0
    r_f = 1.0
    got = rewards(recipe, ep)
    assert got == pytest.approx([r_f, r_s, r_a], abs=1e-5)
    assert sum(got) == pytest.approx(r_a + r_s + r_f, abs=1e-5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("query", "concise"),
    [
        ("Acme founder", True),
        ("Acme Records founder birth city name", True),  # 6 words
        ("Acme Records founder birth city name country", False),  # 7 words
        ("Who founded Acme?", False),
        ("who founded Acme", False),  # question word first
        ("Acme founder?", False),
        ("", False),
    ],
)
def test_single_query_search_reward(query: str, concise: bool) -> None:
    assert is_concise(query) is concise
    if query:
        assert rewards(WhenToSearch(), episode([query], "Jane Roe"))[1] == (0.0 if concise else -1.0)


def test_repeated_identical_queries_cost_one_half() -> None:
    # Eq. 8: N = 2, one pair with cosine 1: avg_sim = 1 / (2 * 1) = 0.5, r_s = -0.5 (Eq. 9);
    # the "pairs" reading divides by the one pair: -1
    ep = episode(["Acme founder", "Acme founder"], "Jane Roe")
    assert rewards(WhenToSearch(), ep)[1] == pytest.approx(-0.5, abs=1e-4)
    assert rewards(WhenToSearch(avg_sim="pairs"), ep)[1] == pytest.approx(-1.0, abs=1e-4)


@pytest.mark.parametrize(
    ("text", "ok", "lenient"),
    [
        # the paper's two forms: no search (think reflect answer), or searches each reflected on
        ("<think>t</think><reflect>I know it.</reflect><answer>a</answer>", True, True),
        ("<think>t</think><answer>a</answer>", False, True),  # no reflect: the lenient reading only
        ("<think>t</think><reflect>r</reflect><think>t</think><answer>a</answer>", False, False),
        (
            "<think>t</think><search>q</search>" + INFO + "<reflect>r</reflect><think>t</think>"
            "<answer>a</answer>",
            True,
            True,
        ),
        (
            "<think>t</think><search>q</search><reflect>r</reflect><search>q2</search><reflect>r</reflect>"
            "<answer>a</answer>",
            True,
            True,
        ),
        ("<search>q</search><reflect>r</reflect><answer>a</answer>", False, False),  # no think first
        ("<think>t</think><search>q</search><answer>a</answer>", False, False),  # search never reflected on
        ("<think>t</think><search>q</search><reflect>r</reflect>", False, False),  # no answer
        ("<think>t</think><answer>a</answer><think>more</think>", False, False),  # answer not last
        ("<think>t</think><answer>a", False, False),  # unclosed
        ("Well, <think>t</think><answer>a</answer>", False, False),  # text outside the blocks
        ("<think>t <think>u</think></think><answer>a</answer>", False, False),  # nested
    ],
)
def test_format_reward(text: str, ok: bool, lenient: bool) -> None:
    assert well_formed(text) is ok
    assert well_formed(text, "lenient") is lenient
    (format_reward, _, _) = WhenToSearch().reward_funcs()
    assert format_reward([""], [text]) == [1.0 if ok else -1.0]
    (lenient_format, _, _) = WhenToSearch(format_rule="lenient").reward_funcs()
    assert lenient_format([""], [text]) == [1.0 if lenient else -1.0]


def test_from_completion_text_and_answers_column() -> None:
    ep = episode(["Acme founder"], "John Doe")
    got = [fn([""], [ep.completion_text()], answers=[GOLD])[0] for fn in WhenToSearch().reward_funcs()]
    assert got == pytest.approx([1.0, 0.0, -0.7])


def test_config_constants_and_correct_metric() -> None:
    recipe = get_recipe("when-to-search", b=0.5, correct_metric="containment")
    recipe.curriculum.stage = 2
    ep = episode(["Acme founder"], "It was Jane Roe")  # contained, not an exact match
    assert rewards(recipe, ep)[2] == pytest.approx(0.5)
    paper = get_recipe("when-to-search")
    # the paper's defaults: b = 0.3, top-5 documents, at most 5 turns, a judge decides correctness
    assert (paper.config.b, paper.top_k, paper.max_steps) == (0.3, 5, 5)
    assert paper.config.correct_metric == "judge" and paper.config.format_rule == "paper"


class ScriptedJudge:
    """A judge that accepts exactly the predictions it was given (counts its calls)."""

    def __init__(self, accepted: set[str]) -> None:
        self.accepted, self.calls = accepted, 0

    def answer(self, prediction: str, references: list[str], question: str = "") -> Verdict:
        self.calls += 1
        ok = prediction in self.accepted
        return Verdict(verdict=ok, score=float(ok), rationale="scripted", backend="test", version="t@1")

    def answerable(self, question: str, evidence: list[str], references: list[str] | None = None) -> Verdict:
        raise AssertionError("when-to-search never asks about answerability")


def test_correctness_comes_from_the_judge_with_em_as_the_fallback() -> None:
    ep = episode(["Acme founder"], "J. Roe, the singer")  # not an exact match of "Jane Roe"
    judge = ScriptedJudge({"J. Roe, the singer"})
    judged = WhenToSearch(judge=judge)
    assert rewards(judged, ep)[2] == 1.0 and judge.calls == 1  # stage 1, correct by the judge
    assert rewards(WhenToSearch(), ep)[2] == pytest.approx(-0.7)  # no judge bound: EM says wrong
    strict = WhenToSearch(judge=ScriptedJudge(set()))
    exact = episode(["Acme founder"], "Jane Roe")
    assert rewards(strict, exact)[2] == pytest.approx(-0.7)  # the judge, not EM, decides
    assert rewards(WhenToSearch(judge=judge, correct_metric="em"), exact)[2] == 1.0


def test_expert_is_well_formed() -> None:
    q = next(q for q in generate(seed=3, n_entities=80, n_train=12, n_dev=0, n_test=0)["train"] if q.answers)
    assert well_formed(WhenToSearch().expert(q))
    # a question with no hops to search is answered in the paper's no-search form
    direct = Question(id="d", dataset="t", split="train", question="What is 2 + 2?", answers=["4"])
    text = WhenToSearch().expert(direct)
    assert "<search>" not in text and "<reflect>" in text and well_formed(text)


@pytest.mark.parametrize(
    ("question", "query"),
    [
        ("What is the capital of the country that contains Drubul?", "capital country contains Drubul"),
        ("Which river is longer, Drungi River or Drunke River?", "river longer Drungi River Drunke River"),
        ("Which company was founded first, Acme Corp or Beta Ltd?", "founded first Acme Corp Beta Ltd"),
        ("Who directed the film that Jane Roe starred in?", "directed film Jane Roe starred"),
    ],
)
def test_keyword_query_is_concise_and_keeps_the_names(question: str, query: str) -> None:
    assert keyword_query(question) == query
    assert is_concise(query)


def turn(text: str, *titles: str) -> list[dict[str, str]]:
    """An assistant turn and the information that answered it (one short paragraph per title)."""
    docs = "\n".join(f"[{i}] {t}: text." for i, t in enumerate(titles, 1))
    return [
        {"role": "assistant", "content": text},
        {"role": "user", "content": f"<information>\n{docs}\n</information>"},
    ]


def two_hop_question() -> tuple[Question, Hop, Hop, str]:
    """A two-hop question of a small synthetic world, its hops and the expert's answer block."""
    world = generate(seed=3, n_entities=80, n_train=40, n_dev=0, n_test=0, max_hops=2)["train"]
    q = next(q for q in world if q.answers and len(hops_for(q)) == 2)
    first, second = hops_for(q)
    return q, first, second, f"<answer>{q.answers[0]}</answer>"


def test_adaptive_expert_searches_only_for_what_the_results_lack() -> None:
    q, first, second, answer = two_hop_question()
    recipe = WhenToSearch(expert="adaptive")
    assert WhenToSearch().expert_reader(q) is None  # the scripted default
    reader = recipe.expert_reader(q)
    assert reader is not None
    start = recipe.messages(q)
    opening = reader(start)
    keywords = keyword_query(q.question)
    assert opening == f"<think>I should look up {keywords}.</think>\n<search>{keywords}</search>"

    # The keyword search found both gold paragraphs: reflect on both, then answer.
    text = reader(start + turn(opening, first.title, "Other", second.title))
    assert text.startswith(f"<reflect>From {first.title}:") and f"From {second.title}:" in text
    assert text.endswith(answer) and well_formed(opening + text)

    # It found only the first: search the second hop's own query, then answer.
    only_first = start + turn(opening, first.title, "Other")
    text = reader(only_first)
    assert text.endswith(f"<search>{second.query}</search>") and f"From {first.title}:" in text
    final = reader(only_first + turn(text, second.title))
    assert final.startswith(f"<reflect>From {second.title}:") and final.endswith(answer)

    # Nothing found, and a hop's own query fails too: each hop is searched once, then it answers.
    nothing = start + turn(opening, "Other")
    text = reader(nothing)
    assert text.startswith("<reflect>These results do not give what I need.</reflect>")
    assert text.endswith(f"<search>{first.query}</search>")
    nothing += turn(text, "Other")
    text = reader(nothing)
    assert text.endswith(f"<search>{second.query}</search>")
    assert reader(nothing + turn(text, "Other")).endswith(answer)


def test_hops_adaptive_expert_starts_with_the_first_hop_and_stops_when_both_are_found() -> None:
    q, first, second, answer = two_hop_question()
    recipe = WhenToSearch(expert="hops-adaptive")
    reader = recipe.expert_reader(q)
    assert reader is not None
    start = recipe.messages(q)
    opening = reader(start)
    assert opening == WhenToSearch().expert_segments(q)[0]  # the scripted expert's first search
    assert opening.endswith(f"<search>{first.query}</search>")

    # The first hop's query also listed the second hop's paragraph: one search, then the answer.
    text = reader(start + turn(opening, first.title, second.title))
    assert f"From {first.title}:" in text and f"From {second.title}:" in text
    assert "<search>" not in text and text.endswith(answer) and well_formed(opening + text)

    # It did not: search the second hop, as the scripted expert does.
    only_first = start + turn(opening, first.title, "Other")
    text = reader(only_first)
    assert text.endswith(f"<search>{second.query}</search>")
    assert reader(only_first + turn(text, second.title)).endswith(answer)


def test_curriculum_by_step_count() -> None:
    c = Curriculum(mode="steps", switch_step=10)
    assert not c.update(9) and c.stage == 1
    assert c.update(10) and c.stage == 2 and c.switched_at == 10
    assert not c.update(11) and c.stage == 2


def test_curriculum_by_plateau_and_resume() -> None:
    c = Curriculum(mode="plateau", ema_decay=0.5, eps=0.05, patience=2)
    assert not c.update(1, 0.0)  # first check seeds the EMA
    assert not c.update(2, 1.0)  # EMA 0 -> 0.5: improving
    assert c.flat_checks == 0
    assert not c.update(3, 0.5)  # EMA 0.5 -> 0.5: flat (1)
    resumed = Curriculum.from_dict(c.to_dict())  # training stops and resumes here
    assert resumed == c
    assert not resumed.update(4, 0.9)  # EMA 0.5 -> 0.7: improving, flat count resets
    assert resumed.flat_checks == 0
    assert not resumed.update(5, 0.7)  # flat (1)
    assert resumed.update(6, 0.7) and resumed.stage == 2 and resumed.switched_at == 6  # flat (2)
    with pytest.raises(ValueError, match="mean reward"):
        Curriculum(mode="plateau").update(1)


def test_recipe_curriculum_from_config_drives_r_a() -> None:
    recipe = get_recipe("when-to-search", switch_step=2)
    ep = episode(["Acme founder", "Jane Roe birthplace"], "Jane Roe")
    assert rewards(recipe, ep)[2] == 1.0
    recipe.curriculum.update(2)
    assert rewards(recipe, ep)[2] == pytest.approx(0.4)


def test_a_stage_two_job_trains_in_stage_two_from_its_first_step() -> None:
    """A pipeline's stage-2 segment is a job with switch_step=0 (flows.training.stage_config): its
    curriculum starts in stage 2, so the r_a of its very first step is stage 2's (0.4 for the
    two-search episode above, as after the switch in the previous test), even in a one-step segment."""
    from flows.training import stage_config
    from hoprl.training.callbacks import Curricula

    config = stage_config("when-to-search", 2)
    assert config == {"curriculum": "steps", "switch_step": 0}
    recipe = get_recipe("when-to-search", **config)
    assert recipe.curriculum.stage == 2 and recipe.curriculum.switched_at == 0
    assert Curricula(recipe).stage == "stage2"  # what the trainer's job records from step 0
    ep = episode(["Acme founder", "Jane Roe birthplace"], "Jane Roe")
    assert rewards(recipe, ep)[2] == pytest.approx(0.4)
    assert not recipe.curriculum.update(1)  # nothing left to switch
    assert get_recipe("when-to-search", **stage_config("when-to-search", 1)).curriculum.stage == 1


def test_system_prompt_is_app_b4_in_full() -> None:
    """App. B.4's "Instruction for Trained RLM": its six rules, not a paraphrase."""
    prompt = WhenToSearch().config.system_prompt
    assert prompt.startswith("Please answer the given question by following the structured reasoning")
    for line in (
        "1. Always begin with <think>...</think> to provide a brief internal reasoning sketch.",
        "Under no circumstances should you generate a <search> block if your internal knowledge is adequate.",
        "The query should be a brief description with multiple keywords instead of a natural language",
        "5. If the retrieved information is insufficient or contradicts your internal knowledge:",
        "tool usage should be a last resort, not the default.",
    ):
        assert line in prompt
