"""EVO-RAG's rewards: the paper's formulas recomputed by hand on crafted episodes."""

from __future__ import annotations

import pytest
import torch

from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.embedding import get_embedder
from hoprl.judging import RulesJudge
from hoprl.recipes.evo_rag import (
    SIGNALS,
    EvoRag,
    EvoRagConfig,
    episode_return,
    episode_step_rewards,
    progress,
    score_episode,
    step_weights,
)

torch.set_num_threads(1)

CFG = EvoRagConfig()
JUDGE = RulesJudge()
GOLD = ["Acme Records", "Jane Roe"]


def doc(title: str, text: str = "filler text") -> RetrievedDoc:
    return RetrievedDoc(id=title, title=title, text=text)


def search(t: int, query: str, *titles: str, text: str = "filler text") -> Step:
    return Step(t=t, action="search", text="", queries=[query], docs=[[doc(x, text) for x in titles]])


def ep(*steps: Step, answers: list[str] | None = None) -> Episode:
    return Episode(
        recipe="evo-rag",
        question_id="q",
        question="Where was the founder of Acme Records born?",
        answers=["Paris"] if answers is None else answers,
        gold_titles=GOLD,
        steps=list(steps),
    )


def cos(a: str, b: str) -> float:
    return float(get_embedder().similarity([a], [b])[0, 0])


# p(7) = 6/19, so w(7) = 13/19 * early + 6/19 * late
@pytest.mark.parametrize(
    ("stage", "t", "signal", "expected"),
    [
        ("discovery", 1, "r_ret", 2.0),
        ("discovery", 20, "r_ret", 1.0),
        ("discovery", 7, "r_ret", (13 * 2.0 + 6 * 1.0) / 19),
        ("refinement", 1, "r_ret", 1.0),
        ("refinement", 20, "r_ret", 0.5),
        ("refinement", 7, "r_ret", (13 * 1.0 + 6 * 0.5) / 19),
        ("discovery", 1, "r_act", 1.5),
        ("refinement", 20, "r_act", 0.4),
        ("discovery", 7, "r_dup", (13 * 0.1 + 6 * 0.5) / 19),
        ("refinement", 20, "r_dup", 1.2),
        ("discovery", 20, "r_bt", 0.5),
        ("refinement", 7, "r_bt", (13 * 0.5 + 6 * 1.0) / 19),
        ("discovery", 1, "r_ref", 0.5),
        ("refinement", 20, "r_ref", 0.5),
        ("refinement", 7, "r_step", (13 * 0.05 + 6 * 0.10) / 19),
        ("discovery", 1, "r_step", 0.02),
        ("discovery", 20, "r_ans", 0.10),
        ("refinement", 20, "r_ans", 1.00),
        ("refinement", 1, "r_ans", 0.10),
    ],
)
def test_weights_follow_table_2(stage, t, signal, expected):
    assert step_weights(t, stage, CFG)[signal] == pytest.approx(expected)


def test_progress_endpoints_and_bounds():
    assert progress(1, 20) == 0.0
    assert progress(20, 20) == 1.0
    assert progress(7, 20) == pytest.approx(6 / 19)
    for bad in (0, 21):
        with pytest.raises(ValueError, match=r"outside 1\.\.T_max"):
            progress(bad, 20)


def test_weights_are_config_not_constants():
    cfg = EvoRagConfig(w_ret=(4.0, 3.0, 2.0), t_max=3)
    assert step_weights(2, "discovery", cfg)["r_ret"] == pytest.approx(3.5)  # p = 1/2


def test_signals_on_each_action():
    episode = ep(
        search(1, "founder of Acme Records", "acme records"),  # title match ignores case
        search(2, "birthplace of Jane Roe", "Some Distractor"),
        Step(t=3, action="backtrack", text=""),
        Step(t=4, action="answer", text="", answer="Paris, France"),
    )
    s = [step.signals for step in score_episode(episode, JUDGE, "discovery").steps]
    assert all(set(x) == set(SIGNALS) for x in s)
    assert [x["r_ret"] for x in s] == [1.0, -1.0, 0.0, 0.0]
    assert [x["r_bt"] for x in s] == [0.0, 0.0, -1.0, 0.0]
    assert [x["r_step"] for x in s] == [-1.0] * 4
    assert s[0]["r_dup"] == 0.0  # the first query has nothing to overlap
    assert s[1]["r_dup"] == pytest.approx(-cos("birthplace of Jane Roe", "founder of Acme Records"), abs=1e-5)
    # "Paris, France" vs "Paris": EM 0, F1 = 2 * (1/2 * 1) / (1/2 + 1) = 2/3
    assert s[3]["r_ans"] == pytest.approx((0.0 + 2 / 3) / 2)
    assert [x["r_ans"] for x in s[:3]] == [0.0, 0.0, 0.0]


def test_r_dup_takes_the_max_over_all_earlier_queries():
    q1, q2, q3 = "Acme Records founder", "weather in Oslo", "who founded Acme Records"
    s = score_episode(ep(search(1, q1), search(2, q2), search(3, q3)), JUDGE, "discovery").steps
    assert s[2].signals["r_dup"] == pytest.approx(-max(cos(q3, q1), cos(q3, q2)), abs=1e-5)


@pytest.mark.parametrize(
    ("t_repeat", "expected"),
    [(6, 0.0), (7, -1.0)],  # p(6) = 5/19 = 0.263 < 0.3 <= p(7) = 6/19 = 0.316
)
def test_r_act_only_late(t_repeat, expected):
    filler = [Step(t=t, action="backtrack", text="") for t in range(2, t_repeat)]
    episode = ep(search(1, "Acme Records founder"), *filler, search(t_repeat, "Acme Records founder"))
    last = score_episode(episode, JUDGE, "discovery").steps[-1].signals
    assert last["r_dup"] == pytest.approx(-1.0, abs=1e-5)
    assert last["r_act"] == expected


def test_r_act_needs_overlap():
    late_first = ep(*[Step(t=t, action="backtrack", text="") for t in range(1, 10)], search(10, "Acme"))
    assert score_episode(late_first, JUDGE, "discovery").steps[-1].signals["r_act"] == 0.0


@pytest.mark.parametrize(
    ("answers", "evidence", "expected"),
    [
        (["Paris"], "Jane Roe was born in Paris.", -1.0),  # answerable from evidence: wrong refusal
        (["Paris"], "Jane Roe founded Acme Records.", 1.0),  # evidence lacks the answer
        ([], "Jane Roe was born in Paris.", 1.0),  # unanswerable question
    ],
)
def test_r_ref_uses_the_judge_on_evidence_so_far(answers, evidence, expected):
    episode = ep(
        search(1, "Jane Roe", "Jane Roe", text=evidence), Step(t=2, action="refuse", text=""), answers=answers
    )
    scored = score_episode(episode, JUDGE, "refinement")
    assert scored.steps[1].signals["r_ref"] == expected
    assert scored.meta["evo_rag"]["refusal"]["backend"] == "rules"


@pytest.mark.parametrize(
    ("ref_evidence", "answers", "expected"),
    [
        ("retrieved", ["Paris"], 1.0),  # the paper: nothing retrieved answers it, so refusing pays
        ("retrieved", [], 1.0),
        ("gold_and_retrieved", ["Paris"], -1.0),  # the option: the gold paragraph answers it
        ("gold_and_retrieved", [], 1.0),
    ],
)
def test_refusing_before_any_search_is_judged_on_the_retrieved_evidence(ref_evidence, answers, expected):
    """r_ref's judge reads what the agent retrieved, never the gold paragraphs (unless asked to)."""
    episode = ep(Step(t=1, action="refuse", text=""), answers=answers)
    episode.meta["gold_evidence"] = ["Jane Roe was born in Paris."]
    cfg = EvoRagConfig(ref_evidence=ref_evidence)
    assert score_episode(episode, JUDGE, "discovery", cfg).steps[0].signals["r_ref"] == expected


def test_r_ref_reads_every_retrieved_document_as_the_policy_saw_it():
    """A distractor that happens to hold the answer makes the evidence sufficient; so does a title
    (the policy reads "Doc i (Title: ...) text"); gold paragraphs that were not retrieved do not."""
    refuse = Step(t=3, action="refuse", text="")
    distractor = search(2, "Roe", "Distractor", text="born in Paris")
    by_text = ep(search(1, "Acme", "Acme Records"), distractor, refuse)
    by_title = ep(search(1, "Acme", "Paris"), Step(t=2, action="refuse", text=""))
    missed = ep(search(1, "Acme", "Acme Records"), Step(t=2, action="refuse", text=""))
    missed.meta["gold_evidence"] = ["Jane Roe was born in Paris."]
    episodes = (by_text, by_title, missed)
    r_ref = [score_episode(e, JUDGE, "discovery").steps[-1].signals["r_ref"] for e in episodes]
    assert r_ref == [-1.0, -1.0, 1.0]


def load_judge_fixtures():
    """tests/services/judge/conftest.py (its scripted LLM endpoint and judge services), by path."""
    from tests.conftest import load_script

    return load_script("tests/services/judge/conftest.py", "judge_fixtures")


@pytest.mark.parametrize(("ref_evidence", "expected"), [("retrieved", 1.0), ("gold_and_retrieved", -1.0)])
def test_r_ref_with_the_llm_judge_sends_the_retrieved_passages(ref_evidence, expected):
    """With the judge service's LLM backend (answerable@1 prompt), the passages in the prompt are
    the retrieved documents; the (scripted, outside-the-machine) LLM says YES only when the
    birthplace passage is among them, which only the gold option puts there."""
    from hoprl.clients.judge import RemoteJudge

    fixtures = load_judge_fixtures()
    llm = fixtures.ScriptedLLM({"born in Paris": "YES"}, default="NO")
    episode = ep(search(1, "Jane Roe", "Jane Roe", text="Jane Roe founded Acme Records."),
                 Step(t=2, action="refuse", text=""))  # fmt: skip
    episode.meta["gold_evidence"] = ["Jane Roe was born in Paris."]
    with fixtures.llm_judge(llm) as url:
        judge = RemoteJudge(url)
        scored = score_episode(episode, judge, "discovery", EvoRagConfig(ref_evidence=ref_evidence))
        judge.close()
    assert scored.steps[1].signals["r_ref"] == expected
    trail = scored.meta["evo_rag"]["refusal"]
    assert (trail["backend"], trail["version"], trail["fallback"]) == ("openai", "answerable@1", False)
    prompt = " ".join(m["content"] for m in llm.requests[0]["messages"] if m["role"] == "user")
    assert "(Title: Jane Roe) Jane Roe founded Acme Records." in prompt
    assert ("born in Paris" in prompt) == (ref_evidence == "gold_and_retrieved")


def test_score_episode_is_pure():
    episode = ep(search(1, "Acme", "Acme Records"))
    score_episode(episode, JUDGE, "discovery")
    assert episode.steps[0].signals == {} and "evo_rag" not in episode.meta


def four_step_episode() -> Episode:
    return ep(
        search(1, "founder of Acme Records", "Acme Records"),
        search(2, "Acme Records founder name", "Distractor"),
        Step(t=3, action="backtrack", text=""),
        Step(t=4, action="answer", text="", answer="Paris"),
    )


def test_total_reward_of_a_four_step_episode_by_hand():
    c = cos("Acme Records founder name", "founder of Acme Records")
    # Discovery: w(t) = (1 - p) Start + p Mid, p = (t - 1) / 19
    r1 = 2.0 * 1 + 0.02 * -1  # p = 0: r_ret = +1, r_step = -1
    r2 = (  # p = 1/19: r_ret = -1, r_dup = -c, r_step = -1, r_act = 0 (p < 0.3)
        (18 * 2.0 + 1 * 1.0) / 19 * -1 + (18 * 0.1 + 1 * 0.5) / 19 * -c + (18 * 0.02 + 1 * 0.05) / 19 * -1
    )
    r3 = (17 * 0.3 + 2 * 0.5) / 19 * -1 + (17 * 0.02 + 2 * 0.05) / 19 * -1  # p = 2/19: r_bt, r_step
    r4 = (16 * 0.05 + 3 * 0.10) / 19 * 1.0 + (16 * 0.02 + 3 * 0.05) / 19 * -1  # p = 3/19: r_ans = 1
    scored = score_episode(four_step_episode(), JUDGE, "discovery")
    assert episode_step_rewards(scored) == pytest.approx([r1, r2, r3, r4], abs=1e-6)
    assert episode_return(scored) == pytest.approx(r1 + r2 + r3 + r4, abs=1e-6)

    # Refinement: w(t) = (1 - p) Mid + p End
    r1 = 1.0 * 1 + 0.05 * -1
    r4 = (16 * 0.10 + 3 * 1.00) / 19 * 1.0 + (16 * 0.05 + 3 * 0.10) / 19 * -1
    refined = episode_step_rewards(score_episode(four_step_episode(), JUDGE, "refinement"))
    assert refined[0] == pytest.approx(r1) and refined[3] == pytest.approx(r4)


def test_reward_funcs_score_in_place_and_agree():
    recipe = EvoRag()
    funcs = recipe.reward_funcs()
    versions = [getattr(f, "__version__", None) for f in funcs]
    assert versions == ["evo_rag_total@1"] + [f"evo_rag_{s}@1" for s in SIGNALS]
    episodes = [four_step_episode(), ep(search(1, "Acme", "Nothing"), Step(t=2, action="refuse", text=""))]
    totals = funcs[0](["p", "p"], ["c", "c"], episodes=episodes)
    assert "evo_rag" in episodes[0].meta  # scored in place, under the curriculum's stage
    assert totals == [pytest.approx(episode_return(e)) for e in episodes]
    by_name = {f.__name__: f(["p", "p"], ["c", "c"], episodes=episodes) for f in funcs[1:]}
    assert by_name["evo_rag_r_step"] == [-4.0, -2.0]
    assert by_name["evo_rag_r_ret"] == [0.0, -1.0]
    assert by_name["evo_rag_r_ref"] == [0.0, 1.0]


def test_unscored_episode_is_an_error_for_the_module_functions():
    with pytest.raises(KeyError, match="score_episode"):
        episode_return(four_step_episode())
