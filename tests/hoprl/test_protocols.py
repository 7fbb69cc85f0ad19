"""The evaluation protocols and headline rows (hoprl/protocols.py) against the papers' text.

Every expected value below was read from the paper's text (``docs/papers.md``) at the place the
comment names, not from the module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hoprl.answer_eval import AnswerSettings
from hoprl.data.hub import HUB, bamboogle
from hoprl.domain import EpisodeShape
from hoprl.protocols import (
    HEADLINES,
    METRIC_KEYS,
    PROTOCOLS,
    EvalSet,
    get_protocol,
    headlines,
    local_file,
    sample,
    served_backbone,
)
from hoprl.recipes import RECIPES
from tests.conftest import shared_file

DATA = shared_file("hotpotqa_dev.jsonl").parent


def sets(recipe: str) -> dict[str, tuple[str, int | None, bool]]:
    return {s.dataset: (s.split, s.questions, s.sampled) for s in PROTOCOLS[recipe].sets}


def test_evo_rag() -> None:
    p = PROTOCOLS["evo-rag"]
    assert p.max_steps == 20  # App. A.2: "an episode cap T_max = 20 steps"
    # App. A.1: HotpotQA (7,404 dev), 2WikiMultiHopQA (12,575), MuSiQue (2,417), Bamboogle (125); official dev
    assert sets("evo-rag") == {
        "hotpotqa": ("dev", 7404, False), "2wiki": ("dev", 12575, False),
        "musique": ("dev", 2417, False), "bamboogle": ("test", 125, False),
    }  # fmt: skip
    assert {"em", "f1", "steps"} <= set(p.metrics)  # App. A.7: EM and F1, Avg. Steps
    assert (p.temperature, p.top_p) == (0.0, 1.0) and "not given" in p.decoding_source
    assert p.seeds == 3  # App. A.6: the mean over 3 random seeds


def test_r2ag() -> None:
    p = PROTOCOLS["r2ag"]
    assert (p.temperature, p.top_p, p.max_tokens) == (0.6, 0.9, 4096)  # App. C.2 "Other Evaluation Settings"
    # App. C.2: 1,000 instances sampled at random from the dev sets of NQ, HotpotQA, 2Wiki, MuSiQue
    for dataset in ("nq", "hotpotqa", "2wiki", "musique"):
        assert sets("r2ag")[dataset] == ("dev", 1000, True)
    assert sets("r2ag")["longbench-v2"] == ("test", 503, False)  # App. C.2: all 503 test instances
    assert p.max_steps == 5 + 1  # §3.2: L_MAX-I = 5 iterations; the last turn emits the stop
    assert set(p.metrics) == {"recall", "full_recall", "k", "map", "em", "f1"}  # §3.1
    assert p.generator == "naive-rag"  # §3.2: the same Qwen3-8B generator for naive RAG and R2AG
    # Table 5 / Table 3: the QA rows are top-k = 2 per sub-query. App. C.2: t = M/2, M the set's most
    # hops: HotpotQA's bridge and comparison questions 2 -> 1; 2Wiki and MuSiQue 4 -> 2; NQ 1 hop -> 1
    assert p.config_for("2wiki") == {"top_k": 2, "top_t": 2}
    assert p.config_for("musique") == {"top_k": 2, "top_t": 2}
    assert p.config_for("hotpotqa") == {"top_k": 2, "top_t": 1}
    assert p.config_for("nq") == {"top_k": 2, "top_t": 1}
    assert p.config_for("multihoprag") == {"top_k": 2}


def test_eval_rar() -> None:
    p = PROTOCOLS["eval-rar"]
    # App. A.4 Table 4: test splits of NQ 3,610, TriviaQA 11,313, PopQA 14,267, Bamboogle 125; dev splits
    # of HotpotQA 7,405, 2Wiki 12,576, Musique 2,417
    assert {d: n for d, (_, n, _) in sets("eval-rar").items()} == {
        "nq": 3610, "triviaqa": 11313, "popqa": 14267, "bamboogle": 125,
        "hotpotqa": 7405, "2wiki": 12576, "musique": 2417}  # fmt: skip
    assert p.metrics[0] == "em" and "top-3" in p.top_k  # §5.1
    assert p.max_steps is None and "not given" in p.steps_source  # Algorithm 1's N has no value


def test_arena() -> None:
    p = PROTOCOLS["arena"]
    # §4.1 Table 2 and App. B: 500 development examples sampled from each of three datasets
    assert sets("arena") == {d: ("dev", 500, True) for d in ("hotpotqa", "2wiki", "musique")}
    assert set(p.metrics) == {"em", "f1", "judge"} and "GPT-4o" in (p.judge or "")  # §4.2, App. C.3
    assert p.max_steps == 1 and AnswerSettings.of(p).references  # §4.4: answers over the given paragraphs


def test_when_to_search() -> None:
    p = PROTOCOLS["when-to-search"]
    assert len(p.sets) == 7 and p.max_steps == 5  # §4.1 seven benchmarks; Table 5 max_turns 5
    assert set(p.metrics) == {"f1", "judge", "retrieval_count"}  # §4.1: F1, LLM as a Judge, RC
    assert "Qwen3-235B-A22B" in (p.judge or "") and "top-k 5" in p.top_k  # App. B.2; §4.2


@pytest.mark.parametrize(
    ("recipe", "model", "dataset", "metric", "value", "source"),
    [
        ("evo-rag", "Qwen/Qwen2.5-7B-Instruct", "hotpotqa", "em", 57.6, "Table 3"),  # §4.3: 57.6/71.5
        ("evo-rag", "meta-llama/Llama-3.1-8B-Instruct", "bamboogle", "f1", 58.6, "Table 3"),
        ("evo-rag", "meta-llama/Llama-3.1-8B-Instruct", "hotpotqa", "steps", 10.2, "Table 7 (GRPO)"),
        ("r2ag", "Qwen/Qwen3-8B", "musique", "full_recall", 51.3, "Table 1 (R2AG-0.56B@8B@top-1)"),
        ("r2ag", "Qwen/Qwen3-8B", "2wiki", "em", 92.5, "Table 3 (R2AG-Qwen3-8B)"),
        ("eval-rar", "Qwen/Qwen2.5-3B", "bamboogle", "em", 0.368, "Table 1"),
        ("arena", "Qwen/Qwen2.5-7B-Instruct", "hotpotqa", "judge", 0.812, "Table 3"),
        ("when-to-search", "Qwen/Qwen2.5-7B-Instruct", "musique", "retrieval_count", 1.65, "Table 3"),
    ],
)
def test_headline_cells(
    recipe: str, model: str, dataset: str, metric: str, value: float, source: str
) -> None:
    (row,) = [h for h in headlines(recipe, dataset) if h.model == model and h.metric == metric]
    assert row.value == value and row.source == source


def test_headlines_fit_their_protocols() -> None:
    for h in HEADLINES:
        assert h.dataset in {s.dataset for s in PROTOCOLS[h.recipe].sets}, h
        assert h.metric in METRIC_KEYS and h.scale in (1.0, 100.0), h
    assert set(PROTOCOLS) <= set(RECIPES) and all(p.recipe == name for name, p in PROTOCOLS.items())
    # the papers that print percentages: EVO-RAG's and R2AG's tables; the others print fractions
    assert {h.recipe for h in HEADLINES if h.scale == 100} == {"evo-rag", "r2ag"}
    with pytest.raises(KeyError, match="valid: arena, eval-rar, evo-rag"):
        get_protocol("search-r1")


def test_local_files_and_samples() -> None:
    evo = PROTOCOLS["evo-rag"]
    found = {s.dataset: local_file(s, DATA) for s in evo.sets}
    assert found["bamboogle"] is None and found["hotpotqa"] == DATA / "hotpotqa_dev.jsonl"
    assert found["2wiki"] == DATA / "2wiki_dev.jsonl" and found["musique"] == DATA / "musique_dev.jsonl"
    pool = list(range(528))  # hotpotqa_dev.jsonl holds 528 questions (its README)
    arena = EvalSet("hotpotqa", "dev", 500, True, "§4.1")
    drawn = sample(pool, arena, seed=0)
    assert len(set(drawn)) == 500 and drawn == sample(pool, arena, seed=0) != sample(pool, arena, seed=1)
    r2ag = EvalSet("hotpotqa", "dev", 1000, True, "App. C.2")
    assert sample(pool, r2ag) == pool  # fewer questions than the paper's 1,000: all of them
    assert sample(pool, evo.sets[0]) == pool  # EVO-RAG: the whole split, in order


def test_served_backbone() -> None:
    assert served_backbone("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B-Instruct")
    assert served_backbone("qwen2.5-7b-instruct-grpo-step40", "Qwen2.5-7B-Instruct")
    assert not served_backbone("smollm2-135m-instruct", "Qwen2.5-7B-Instruct")
    assert not served_backbone("Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct")
    # the hub owner of the paper's model is not part of a served checkpoint's folder name
    assert served_backbone("qwen2.5-7b-instruct-grpo-step40", "Qwen/Qwen2.5-7B-Instruct")
    assert served_backbone("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")
    assert not served_backbone("Qwen/Qwen3-4B", "Qwen/Qwen3-8B")
    # Eval-RAR's Table 1 has a base and an instruct row: each is compared only with its own model
    assert served_backbone("qwen2.5-3b-grpo-step40", "Qwen/Qwen2.5-3B")
    assert not served_backbone("Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-3B")
    assert served_backbone("Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-3B-Instruct")


def test_judge_prompts_are_the_papers() -> None:
    # ARENA App. C.3 Table 8; Learning When to Search App. B.4 ("Instruction for Judge LLM")
    assert PROTOCOLS["arena"].judge_prompt == "arena_lj@1"
    assert PROTOCOLS["when-to-search"].judge_prompt == "when_to_search_judge@1"
    assert all(p.judge_prompt is None for p in PROTOCOLS.values() if "judge" not in p.metrics)


def test_protocol_settings_reach_the_request() -> None:
    r2ag = AnswerSettings.of(PROTOCOLS["r2ag"], seed=3, dataset="musique")
    fields = r2ag.fields(shared_question())
    # the paper's whole episode (App. B.2: 6 turns, 4,096 tokens; App. C.2: 0.6 / 0.9), not the service's
    assert fields.pop("shape") == EpisodeShape(
        max_steps=6, max_new_tokens_per_step=4096, token_budget=8192, temperature=0.6
    )
    assert fields == {"top_p": 0.9, "seed": 3, "recipe_config": {"top_k": 2, "top_t": 2}}
    assert not r2ag.greedy and AnswerSettings.of(PROTOCOLS["evo-rag"]).greedy
    arena = AnswerSettings.of(PROTOCOLS["arena"]).fields(shared_question())
    assert arena["shape"].max_steps == 1 and len(arena["paragraphs"]) == 10  # HotpotQA: 10 paragraphs each
    assert all(set(p) == {"title", "text"} for p in arena["paragraphs"])  # the gold flags stay here


def shared_question():  # type: ignore[no-untyped-def]
    from hoprl.data.jsonl import load_questions

    return load_questions(DATA / "hotpotqa_dev.jsonl", limit=1)[0]


def test_bamboogle_ids_are_stable_across_processes() -> None:
    """Bamboogle rows carry no id: the loader derives one from the question, the same in every
    process (Python's str hash is salted per process), so predictions can be paired across runs."""
    row = {"Question": "Who was president of the U.S. when superconductivity was discovered?",
           "Answer": "William Howard Taft"}  # fmt: skip
    code = f"from hoprl.data.hub import bamboogle; print(bamboogle({row!r}, 'test').id)"
    ids = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert len(ids) == 1 and ids == {bamboogle(row, "test").id}
    assert HUB["bamboogle"].splits["test"] == "test"  # Bamboogle's 125 questions are its test split


def test_where_each_paper_retrieves_from(tmp_path: Path) -> None:
    seven = {"nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"}
    # Eval-RAR §5.1: every set from the December 2018 dump, as Search-R1; when-to-search §4.2: every
    # set from Wikipedia through FlashRAG; R2AG App. C.2: NQ only, the others their own collections
    assert {s.dataset for s in PROTOCOLS["eval-rar"].sets if s.open_domain} == seven
    assert {s.dataset for s in PROTOCOLS["when-to-search"].sets if s.open_domain} == seven
    r2ag = PROTOCOLS["r2ag"]
    assert [s.dataset for s in r2ag.sets if s.open_domain] == ["nq"]
    nq, hotpotqa = (next(s for s in r2ag.sets if s.dataset == d) for d in ("nq", "hotpotqa"))
    assert r2ag.setting(nq).startswith("open-domain: the 2021 Wikipedia dump of Izacard et al.")
    assert r2ag.setting(hotpotqa) == "the questions' own paragraphs"
    assert "December 2018" in (PROTOCOLS["eval-rar"].corpus or "")
    for recipe in ("evo-rag", "arena"):  # the questions' own paragraphs (ARENA §4.1: given paragraphs)
        assert PROTOCOLS[recipe].corpus is None and not any(s.open_domain for s in PROTOCOLS[recipe].sets)
    # an open-domain set's file is found where a user puts it
    (tmp_path / "nq_test.jsonl").write_text("")
    assert local_file(PROTOCOLS["eval-rar"].sets[0], tmp_path) == tmp_path / "nq_test.jsonl"
