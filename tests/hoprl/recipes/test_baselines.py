from __future__ import annotations

from typing import Any

import pytest

from hoprl.data.synthetic import Hop, SyntheticQuestion, generate, hops_for
from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.recipes import RECIPES, get_recipe
from hoprl.recipes.baselines import NaiveRAG, SearchR1, exact_match_reward, format_docs, hop_fact

TAG_RECIPES = ["search-r1", "eval-rar", "when-to-search"]


@pytest.fixture(scope="module")
def questions() -> list[SyntheticQuestion]:
    return [q for q in generate(seed=3, n_entities=80, n_train=12, n_dev=0, n_test=0)["train"] if q.answers]


def test_registry_names_and_unknown_name() -> None:
    assert set(RECIPES) >= {"naive-rag", "search-r1", "eval-rar", "arena", "when-to-search"}
    for name in ["naive-rag", "search-r1", "eval-rar", "arena", "when-to-search"]:
        assert get_recipe(name).name == name
    with pytest.raises(KeyError, match=r"valid: .*eval-rar.*search-r1"):
        get_recipe("search-r2")


def test_config_overrides_and_rejects_unknown_keys() -> None:
    assert get_recipe("search-r1", top_k=5).top_k == 5
    assert get_recipe("search-r1").top_k == 3
    with pytest.raises(ValueError, match="topk"):
        get_recipe("search-r1", topk=5)


@pytest.mark.parametrize(
    ("segment", "kind", "queries", "answer"),
    [
        ("<think>need founder</think>\n<search>Acme founder</search>", "search", ["Acme founder"], None),
        # cut at the stop sequence and not restored: the end of text closes the block
        ("<think>need founder</think>\n<search>Acme founder", "search", ["Acme founder"], None),
        ("<think>known</think><answer> Jane Roe </answer>", "answer", [], "Jane Roe"),
        ("<think>unclosed reasoning <answer>Jane Roe</answer>", "answer", [], "Jane Roe"),
        ("<think>only thinking</think>", "format_error", [], None),
        ("<search></search>", "format_error", [], None),
        ("<answer>a <answer>b</answer></answer>", "format_error", [], None),
        ("x" * 20_000, "format_error", [], None),
    ],
)
def test_search_r1_parse(segment: str, kind: str, queries: list[str], answer: str | None) -> None:
    action = SearchR1().parse(segment)
    assert (action.kind, action.queries, action.answer) == (kind, queries, answer)
    assert (action.error is not None) == (kind == "format_error")


def test_naive_rag_parse_and_messages_with_documents() -> None:
    recipe = NaiveRAG()
    assert recipe.retrieve_first
    assert recipe.parse("<answer>1912</answer>").answer == "1912"
    # The plain baseline takes untagged text as the answer, up to the first blank line.
    assert recipe.parse("The answer is 1912.\n\nMore text.").answer == "The answer is 1912."
    assert recipe.parse("  \n").kind == "format_error"
    assert recipe.accept_truncated and "\n\n" in recipe.stop
    q = SyntheticQuestion(id="q", dataset="d", split="dev", question="When?", answers=["1912"])
    docs = [
        [RetrievedDoc(id="a", title="Acme", text="Founded 1912."), RetrievedDoc(id="b", title="B", text="x")]
    ]
    user = recipe.messages(q, docs=docs)[1]["content"]
    assert "[1] Acme: Founded 1912.\n[2] B: x" in user and user.endswith("Question: When?")
    assert "Documents" not in recipe.messages(q)[1]["content"]


def test_format_docs_numbers_and_deduplicates_across_queries() -> None:
    a, b = RetrievedDoc(id="a", title="A", text="ta"), RetrievedDoc(id="b", title="B", text="tb")
    assert format_docs([[a, b], [b, a]]) == "[1] A: ta\n[2] B: tb"
    assert SearchR1().information([[a]]) == "<information>\n[1] A: ta\n</information>"


def _episode(answer: str | None, answers: list[str]) -> Episode:
    return Episode(recipe="search-r1", question_id="q", question="q", answers=answers, final_answer=answer)


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("Jane Roe", ["Jane Roe"], 1.0),
        ("the jane roe.", ["Jane Roe"], 1.0),  # normalised: case, article, punctuation
        ("1918300", ["1,918,300", "1918300"], 1.0),  # alias
        ("Jane", ["Jane Roe"], 0.0),
        (None, ["Jane Roe"], 0.0),  # no answer (step cap)
        ("unknown", [], 0.0),  # unanswerable question: nothing matches
    ],
)
def test_exact_match_reward(prediction: str | None, answers: list[str], expected: float) -> None:
    by_episode = exact_match_reward([""], [""], episodes=[_episode(prediction, answers)])
    text = f"<think>t</think><answer>{prediction}</answer>" if prediction is not None else "<think>t</think>"
    by_text = exact_match_reward([""], [text], answers=[answers])
    assert by_episode == by_text == [expected]


def test_exact_match_reward_needs_gold() -> None:
    with pytest.raises(ValueError, match="answers"):
        exact_match_reward([""], ["<answer>x</answer>"])


@pytest.mark.parametrize("name", TAG_RECIPES)
@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_expert_segments_replay_the_gold_path(name: str, noise: float, questions: list[Any]) -> None:
    recipe = get_recipe(name)
    for q in questions:
        segments = recipe.expert_segments(q, noise=noise, seed=1)
        assert recipe.expert(q, noise=noise, seed=1) == "".join(segments)
        actions = [recipe.parse(s) for s in segments]
        for s in segments:
            assert any(s.endswith(stop) for stop in recipe.stop)
        assert [a.kind for a in actions] == ["search"] * (len(segments) - 1) + ["answer"]
        assert actions[-1].answer == q.answers[0]
        queries = [a.queries[0] for a in actions[:-1]]
        gold = [h.query for h in hops_for(q)]
        if noise == 0.0:
            assert queries == gold
        else:  # a wrong first query and one redundant search
            assert len(queries) == len(gold) + 2
            assert queries[0] == (gold[-1] if len(gold) > 1 else q.question)
            assert len(set(queries[1:])) < len(queries[1:])


def test_naive_rag_expert_is_one_answer(questions: list[Any]) -> None:
    q = questions[0]
    assert NaiveRAG().expert_segments(q) == [f"<answer>{q.answers[0]}</answer>"]


def test_expert_steps_make_a_valid_episode(questions: list[Any]) -> None:
    q = questions[0]
    segments = SearchR1().expert_segments(q)
    steps = [Step(t=i + 1, action="search", text=s) for i, s in enumerate(segments)]
    ep = Episode(
        recipe="search-r1",
        question_id=q.id,
        question=q.question,
        answers=q.answers,
        steps=steps,
        final_answer=SearchR1().parse(segments[-1]).answer,
    )
    assert exact_match_reward([""], [""], episodes=[ep]) == [1.0]


def test_hop_fact_tells_a_dead_end_from_a_real_data_lead() -> None:
    assert hop_fact(None) == "These results do not give what I need."  # a wrong search
    withheld = Hop(title="Ann", relation="born_in", query="Ann born", answer=None)
    assert hop_fact(withheld) == "These results do not give what I need."  # synthetic, unanswerable
    lead = Hop(title="Dear Brother", relation="", query="Dear Brother", answer=None)
    assert hop_fact(lead) == "Dear Brother is relevant to the question."  # real data, bridge hop
    last = Hop(title="Hank Williams Jr.", relation="", query="Hank Williams Jr.", answer="Hank Jr.")
    assert hop_fact(last) == "From Hank Williams Jr.: the fact I need is Hank Jr."
    born = Hop(title="Ann", relation="born_in", query="Ann born", answer="Paris")
    assert hop_fact(born) == "From Ann: the born in is Paris."
