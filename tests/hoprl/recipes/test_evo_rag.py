"""EVO-RAG: the paper's formulas recomputed by hand on crafted episodes."""

from __future__ import annotations

import json

import pytest
import torch

from hoprl.agent.trajectory import Episode, RetrievedDoc, Step
from hoprl.data.synthetic import generate, hops_for
from hoprl.embedding import get_embedder
from hoprl.judging import RulesJudge
from hoprl.recipes.evo_rag import (
    SIGNALS,
    Curriculum,
    EvoRag,
    EvoRagConfig,
    episode_return,
    episode_step_rewards,
    parse_action,
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


# --- scheduler ------------------------------------------------------------------------------


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


# --- signals --------------------------------------------------------------------------------


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
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "services" / "judge" / "conftest.py"
    spec = importlib.util.spec_from_file_location("judge_fixtures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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


# --- total reward by hand -------------------------------------------------------------------


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


# --- curriculum -----------------------------------------------------------------------------


def test_stage_switches_after_exactly_patience_flat_checks():
    c = Curriculum(alpha=0.5, eps=0.01, patience=3)
    # check 1 seeds the EMA; checks 2, 3, 4 are flat; the third flat one switches
    assert [c.update(1.0) for _ in range(4)] == [False, False, False, True]
    assert c.stage == "refinement" and c.switched_at == 4
    assert c.update(1.0) is False  # switches once


def test_improvement_resets_the_flat_count():
    c = Curriculum(alpha=0.5, eps=0.01, patience=2)
    # EMA: 0 -> 0 (flat) -> 0.5 (gain 0.5, reset) -> 0.25 (flat) -> 0.125 (flat: switch)
    assert [c.update(x) for x in (0.0, 0.0, 1.0, 0.0, 0.0)] == [False, False, False, False, True]
    assert c.ema == pytest.approx(0.125)


def test_rising_returns_never_switch():
    c = Curriculum(alpha=0.3, eps=0.01, patience=2)
    assert not any(c.update(float(i)) for i in range(20))
    assert c.stage == "discovery"


def test_stage_switch_compares_with_the_best_ema_as_the_paper():
    """The paper: switch when the EMA fails to improve on the BEST EMA so far by eps for P checks.

    Defaults alpha = 0.3, eps = 0.01, P = 3; dev returns [1, 0, 1, 1, 1, 1]; EMA seeded by check 1:
      check 1: EMA = 1                                  best 1
      check 2: EMA = 0.3*0 + 0.7*1     = 0.7            0.7 - 1 < eps: flat 1
      check 3: EMA = 0.3*1 + 0.7*0.7   = 0.79           0.79 - 1 < eps: flat 2
      check 4: EMA = 0.3*1 + 0.7*0.79  = 0.853          0.853 - 1 < eps: flat 3 -> switch at check 4
      check 5: EMA = 0.3*1 + 0.7*0.853 = 0.8971
      check 6: EMA = 0.3*1 + 0.7*0.8971 = 0.92797
    Against the PREVIOUS EMA (the option) checks 3-6 gain 0.09, 0.063, 0.0441, 0.03087 >= eps, so
    the count resets at check 3 and never reaches 3: no switch.
    """
    returns = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    c = Curriculum.from_config(EvoRagConfig())
    assert (c.alpha, c.eps, c.patience, c.rule) == (0.3, 0.01, 3, "best")
    switched = []
    emas = []
    for x in returns:
        switched.append(c.update(x))
        emas.append(c.ema)
    assert switched == [False, False, False, True, False, False]
    assert c.switched_at == 4 and c.stage == "refinement"
    assert emas == pytest.approx([1.0, 0.7, 0.79, 0.853, 0.8971, 0.92797])
    assert c.best == pytest.approx(1.0)
    previous = Curriculum.from_config(EvoRagConfig(switch_rule="previous"))
    assert not any(previous.update(x) for x in returns) and previous.stage == "discovery"


def test_a_slow_rise_below_eps_per_check_is_a_plateau():
    """best = max EMA so far: gains smaller than eps each check never reset the count."""
    c = Curriculum(alpha=1.0, eps=0.01, patience=2)  # alpha 1: EMA = the newest return
    assert [c.update(x) for x in (0.5, 0.505, 0.509, 0.6)] == [False, False, True, False]


def test_curriculum_state_round_trips_through_json():
    c = Curriculum.from_config(EvoRagConfig(switch_patience=3))
    for x in (1.0, 1.0, 1.0):
        c.update(x)
    resumed = Curriculum.from_dict(json.loads(json.dumps(c.to_dict())))
    assert resumed == c
    assert resumed.update(1.0) is True and c.update(1.0) is True  # both switch on the same check
    with pytest.raises(ValueError):
        Curriculum.from_dict({**c.to_dict(), "stage": "mystery"})
    with pytest.raises(ValueError, match="finite"):
        c.update(float("nan"))


# --- protocol -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "kind", "payload"),
    [
        ("<think>hop 1</think><search>Acme founder</search>", "search", ["Acme founder"]),
        ("<search>  Acme founder </search>", "search", ["Acme founder"]),
        ("<think>dead end</think><backtrack/>", "backtrack", None),
        ("<think>done</think><answer>Paris</answer>", "answer", "Paris"),
        ("<think>no such fact</think><refuse/>", "refuse", None),
        ("<think>maybe <refuse/> later</think><search>x</search>", "search", ["x"]),  # marker in think
        ("<think>unclosed thought <search>x</search>", "search", ["x"]),
    ],
)
def test_parse_valid(segment, kind, payload):
    action = parse_action(segment)
    assert action.kind == kind
    if kind == "search":
        assert action.queries == payload and action.query_kinds == ["search"]
    if kind == "answer":
        assert action.answer == payload


@pytest.mark.parametrize(
    "segment",
    [
        "<think>hmm</think><search>Acme founder",  # missing closing tag
        "<search>a <search>b</search>",  # nested
        "<answer>a <search>b</search></answer>",  # a tag inside the answer
        "<search>   </search>",  # empty
        "<search>a</search><answer>b</answer>",  # two actions
        "<backtrack/><refuse/>",
        "<think>only thinking</think>",
        "",
        "x" * 10_240,  # 10 KB of garbage
        "<search>" * 2_000,
    ],
)
def test_parse_malformed_is_format_error(segment):
    action = parse_action(segment)
    assert action.kind == "format_error" and action.error


@pytest.fixture(scope="module")
def questions():
    return generate(seed=1, n_entities=80, n_train=20, n_dev=5, n_test=5)["train"]


def replay(recipe: EvoRag, text: str) -> list:
    """Split an expert completion at the stop sequences, as the runner would, and parse."""
    segments, rest = [], text
    while rest.strip():
        cut = min((rest.find(s) + len(s) for s in recipe.stop if s in rest), default=len(rest))
        segments.append(rest[:cut])
        rest = rest[cut:]
    return [recipe.parse(s) for s in segments]


def test_expert_searches_each_hop_then_answers_or_refuses(questions):
    recipe = EvoRag()
    answerable = next(q for q in questions if q.answers)
    actions = replay(recipe, recipe.expert(answerable))
    assert [a.queries[0] for a in actions[:-1]] == [h.query for h in hops_for(answerable)]
    assert actions[-1].kind == "answer" and actions[-1].answer == answerable.answers[0]
    unanswerable = next(q for q in questions if not q.answers)
    assert replay(recipe, recipe.expert(unanswerable))[-1].kind == "refuse"


def test_expert_noise_inserts_a_wrong_search_and_backtrack(questions):
    recipe = EvoRag()
    q = next(q for q in questions if q.answers)
    actions = replay(recipe, recipe.expert(q, noise=1.0, seed=3))
    kinds = [a.kind for a in actions]
    assert kinds == ["search", "backtrack", "search"] * len(hops_for(q)) + ["answer"]
    distractors = {p.title for p in q.paragraphs if not p.is_gold}
    assert actions[0].queries[0] in distractors
    assert recipe.expert(q, noise=0.5, seed=3) == recipe.expert(q, noise=0.5, seed=3)


def test_protocol_surface(questions):
    recipe = EvoRag(t_max=12, top_k=5)
    assert (recipe.name, recipe.top_k, recipe.max_steps) == ("evo-rag", 5, 12)
    system, user = recipe.messages(questions[0])
    assert "<backtrack/>" in system["content"] and "12 steps" in system["content"]
    assert questions[0].question in user["content"]
    info = recipe.information([[doc("Acme Records", "Founded by Jane Roe.")]])
    assert "<information>" in info and "Acme Records" in info and "Jane Roe" in info
    with pytest.raises(ValueError):
        EvoRag(w_rett=(1.0, 1.0, 1.0))  # misspelt constant


def test_only_the_total_is_optimised():
    """The per-signal rewards are for logging: a trainer weights them 0 (TRL would sum them all)."""
    from hoprl.recipes import get_recipe, reward_weights

    for name in ("evo-rag", "r2ag"):
        recipe = get_recipe(name)
        weights = reward_weights(recipe)
        assert len(weights) == len(recipe.reward_funcs())
        assert weights[0] == 1.0 and set(weights[1:]) == {0.0}
    assert reward_weights(get_recipe("arena")) == [1.0] * 4  # format + accuracy + relevance + bonus


# --- episodes of T_max steps in training ------------------------------------------------------


def test_the_trainer_caps_evo_rag_episodes_at_t_max():
    """A job's max_turns follows the recipe's T_max (one source), unless the request sets it."""
    from hoprl.schemas.trainer import Hyperparameters

    assert Hyperparameters().resolved("evo-rag").max_turns == EvoRagConfig().t_max == 20
    assert Hyperparameters(recipe_config={"t_max": 8}).resolved("evo-rag").max_turns == 8
    assert Hyperparameters(max_turns=4).resolved("evo-rag").max_turns == 4  # an explicit request wins
    assert Hyperparameters().resolved("search-r1").max_turns == 4
    # never an error at submission: a budget past the bound is capped; an invalid recipe_config
    # derives nothing (the job reports the recipe's own error when it starts)
    big = Hyperparameters(recipe_config={"t_max": 64}, max_new_tokens_per_step=4096).resolved("evo-rag")
    assert (big.max_turns, big.token_budget) == (64, 32768)
    assert Hyperparameters(recipe_config={"t_max": "many"}).resolved("evo-rag").max_turns == 4


def test_the_default_token_budget_holds_t_max_searches_over_hotpotqa(tokenizer):
    """20 SEARCH steps of 64 generated tokens, each followed by three real HotpotQA paragraphs, fit
    the default budget (counted as the runner counts it: the context's growth, here the token
    trajectory's completion). The old defaults (4 turns, 512 tokens) held less than two steps."""
    import json
    from pathlib import Path

    from hoprl.agent.tokens import to_token_trajectory
    from hoprl.schemas.trainer import Hyperparameters

    data = Path(__file__).resolve().parents[4] / "shared" / "data" / "hotpotqa_dev.jsonl"
    if not data.exists():
        pytest.skip(f"{data} not found (../shared/data sits beside the repository in CI)")
    hp = Hyperparameters().resolved("evo-rag")
    assert hp.token_budget == 20 * (64 + 3 * 200)
    recipe = EvoRag()
    lines = data.read_text().splitlines()[: hp.max_turns]
    thought = tokenizer.decode(tokenizer("<think>" + "I need the next fact. " * 20)["input_ids"][:56])
    steps = []
    for t, line in enumerate(lines, 1):
        paragraphs = json.loads(line)["paragraphs"][:3]
        docs = [
            [RetrievedDoc(id=f"{t}-{i}", title=x["title"], text=x["text"]) for i, x in enumerate(paragraphs)]
        ]
        text = f"{thought}</think><search>hop {t}</search>"
        steps.append(Step(t=t, action="search", text=text, queries=[f"hop {t}"], docs=docs,
                          information=recipe.information(docs)))  # fmt: skip
    episode = ep(*steps)
    episode.prompt = recipe.messages(generate(seed=1)["dev"][0])
    completion = to_token_trajectory(episode, tokenizer).completion_ids
    assert len(completion) <= hp.token_budget, (len(completion), hp.token_budget)
    assert len(completion) > 2 * 512  # the old budget was not even close


@pytest.fixture(scope="module")
def tokenizer():
    from pathlib import Path

    from transformers import AutoTokenizer

    from hoprl.generation.model import resolve_model

    root = Path(__file__).resolve().parents[3]
    return AutoTokenizer.from_pretrained(resolve_model(None, root / ".hoprl/models/smollm2-135m-instruct"))


def test_a_training_episode_runs_to_t_max_and_reaches_the_late_signals(retriever_url):
    """The job's episode options (resolved defaults) through the real runner, a scripted model over
    HTTP and the live retriever: 20 searches, so p(t) reaches 1 and the late, overlapping searches
    (p >= 0.3 from step 7) pay r_act = -1. With the old cap of 4 steps neither could happen."""
    import asyncio
    import importlib.util
    import sys
    from pathlib import Path

    from hoprl.agent.runner import run_episode
    from hoprl.clients.llm import LLMClient
    from hoprl.clients.retriever import AsyncRetrieverClient, RetrieverClient
    from hoprl.schemas import Document
    from hoprl.schemas.trainer import JobRequest
    from services.local import LocalServer
    from services.trainer.jobs import rollout_options
    from services.trainer.settings import TrainerSettings

    path = Path(__file__).resolve().parents[2] / "hoprl" / "agent" / "scripted_llm.py"
    spec = importlib.util.spec_from_file_location("scripted_llm", path)
    assert spec is not None and spec.loader is not None
    scripted = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = scripted
    spec.loader.exec_module(scripted)

    with RetrieverClient(retriever_url) as client:
        client.ingest("evo-rag-tmax", [
            Document(id="acme", title="Acme Records", text="Acme Records was founded by Jane Roe."),
            Document(id="jane", title="Jane Roe", text="Jane Roe was born in Paris."),
        ])  # fmt: skip
    request = JobRequest(recipe="evo-rag", collection="evo-rag-tmax")
    hp = request.hyperparameters.resolved("evo-rag")
    settings = TrainerSettings(retriever_url=retriever_url)
    options = rollout_options(request, hp, "evo-rag-tmax", settings).episode
    assert options["max_steps"] == 20
    queries = ["Acme Records founder", "Jane Roe birthplace"] + ["Acme Records founder"] * 18
    script = [f"<think>t</think><search>{q}</search>" for q in queries] + ["<answer>Paris</answer>"]
    recipe = EvoRag()
    question = generate(seed=1)["dev"][0].model_copy(update={"question": "Where was Acme's founder born?"})
    app = scripted.create_app({question.question: script})

    async def go(llm_url: str):
        llm = LLMClient(llm_url, model="scripted", timeout=30, retries=0)
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await run_episode(recipe, question, llm, retriever, "evo-rag-tmax", **options)
        finally:
            await llm.aclose()
            await retriever.aclose()

    with LocalServer(app) as server:
        episode = asyncio.run(go(server.url + "/v1"))
    assert episode.outcome == "step_cap" and len(episode.steps) == 20
    scored = recipe.score(episode)
    r_act = [s.signals["r_act"] for s in scored.steps]
    assert r_act[:6] == [0.0] * 6 and r_act[6:] == [-1.0] * 14  # p(7) = 6/19 >= 0.3
    w20 = step_weights(20, "discovery", CFG)
    assert w20["r_act"] == 0.8 and w20["r_dup"] == 0.5  # p(20) = 1: Table 2's Mid weights reached
