"""The papers' LLM judges: a job's reward calls the judge service with its ``openai`` backend, and
every verdict the rules gave instead is counted and flagged.

The LLM is the project's own policy service (an OpenAI-compatible server on the bundled
SmolLM2-135M) behind a real judge service; nothing is scripted. What the tiny model replies is
not fixed, so the checks compare the reward with the verdict the judge service gives for the
same item (its cache returns the very verdict the reward saw), by the paper's Eq. 10.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hoprl.clients.judge import JudgeClient
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.jsonl import write_questions
from hoprl.domain import Episode, Question, Step
from hoprl.generation.model import resolve_model
from hoprl.judging import JudgeLedger, judge_flag
from hoprl.recipes import get_recipe
from hoprl.recipes.scoring import score_episodes
from hoprl.registry.store import Registry
from hoprl.schemas.judge import AnswerItem
from hoprl.schemas.trainer import Hyperparameters, JobRequest, JudgeSpec
from services.judge.app import create_app as create_judge
from services.judge.settings import JudgeSettings
from services.local import LocalServer
from services.policy.app import create_app as create_policy
from services.trainer.jobs import bind_judge, run_job, submit
from services.trainer.routes import job_view
from services.trainer.settings import TrainerSettings
from tests.episodes import answer as answer_step
from tests.episodes import episode, search
from tests.services.policy.conftest import COLLECTION, CORPUS, small_settings

ROOT = Path(__file__).resolve().parents[3]
SERVED = "smollm2-135m-instruct"
QUESTION = "Who founded Acme Records?"
INFO = "<information>\n[1] Acme Records: founded in 1961 by Jane Roe.\n</information>"


@pytest.fixture(scope="module")
def llm_judge_url(retriever_url: str) -> Iterator[str]:
    """A judge service, ``openai`` backend, asking the policy service's OpenAI-compatible API."""
    with RetrieverClient(retriever_url) as client:
        client.ingest(COLLECTION, CORPUS)
    model = resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")
    with LocalServer(create_policy(small_settings(retriever_url, model))) as policy:
        settings = JudgeSettings(
            backend="openai",
            openai_base_url=f"{policy.url}/v1",
            model=SERVED,
            max_tokens=4,
            timeout_s=120.0,
            backoff_s=0.01,
        )
        with LocalServer(create_judge(settings)) as judge:
            yield judge.url


def wts_episode(answer: str) -> Episode:
    """One search, reflected on, then ``answer``: RC = 1, well formed (r_f = 1)."""
    text = f"<reflect>It names her.</reflect>\n<think>done</think>\n<answer>{answer}</answer>"
    return episode("when-to-search", [search(1, "Acme founder", INFO), answer_step(2, text, answer)], answer,
                   ["Jane Roe"], QUESTION)  # fmt: skip


def test_when_to_search_reward_reads_the_llm_judge(llm_judge_url: str) -> None:
    recipe = get_recipe("when-to-search")
    request = JobRequest(recipe="when-to-search", judge=JudgeSpec(model=SERVED, url=llm_judge_url))
    ledger = bind_judge(recipe, request, TrainerSettings())
    assert isinstance(ledger, JudgeLedger) and recipe.judge is ledger
    answers = ["Jane Roe", "Her name was Jane Roe", "John Doe"]
    per, totals = score_episodes(recipe, [wts_episode(a) for a in answers])
    items = [AnswerItem(question=QUESTION, prediction=a, references=["Jane Roe"]) for a in answers]
    with JudgeClient(llm_judge_url) as client:
        verdicts = client.answer(items)
    assert all(v.cached for v in verdicts)  # the very verdicts the reward got
    for verdict, rewards, total in zip(verdicts, per, totals, strict=True):
        # Eq. 10, stage 1, RC = 1: r_a = 1 if correct else -1 + 0.3 * 1 = -0.7; r_s = 0 (one
        # concise query), r_f = 1 (Eq. 6); r = r_a + r_s + r_f (Eq. 12)
        r_a = 1.0 if verdict.verdict else -0.7
        assert rewards["wts_answer@2"] == pytest.approx(r_a)
        assert total == pytest.approx(r_a + 0.0 + 1.0, abs=1e-4)
    llm = sum(v.backend == "openai" and not v.fallback for v in verdicts)
    metrics = ledger.metrics()
    assert metrics == {
        "judge/llm_expected": 1.0,
        "judge/service_bound": 1.0,
        "judge/calls": 3.0,
        "judge/llm_calls": float(llm),
        "judge/fallbacks": float(3 - llm),
    }
    assert (judge_flag(metrics) is None) == (llm == 3)


def test_no_judge_service_is_a_counted_fallback(tmp_path: Path) -> None:
    recipe = get_recipe("when-to-search")
    request = JobRequest(recipe="when-to-search", judge=JudgeSpec(model="Qwen/Qwen3-235B-A22B-Instruct-2507"))
    ledger = bind_judge(recipe, request, TrainerSettings())
    assert ledger is not None
    _, (total,) = score_episodes(recipe, [wts_episode("Jane Roe")])
    # the rules judge decides "Jane Roe" = "Jane Roe": r_a = 1, r_s = 0, r_f = 1: r = 2
    assert total == pytest.approx(2.0)
    metrics = ledger.metrics()
    assert (metrics["judge/calls"], metrics["judge/fallbacks"], metrics["judge/service_bound"]) == (1, 1, 0)
    flag = judge_flag(metrics)
    assert flag is not None and "no judge service was bound" in flag
    # the job record: the metrics as the worker logs them, the flag in GET /v1/jobs/{id}
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}") as registry:
        run = registry.create_run(
            "job-1",
            recipe="when-to-search",
            objective="dapo",
            model="m",
            config={"request": {"steps": 1}},
            seed=0,
        )
        registry.log_metrics("job-1", 1, metrics)
        assert job_view(run, registry).judge_flag == flag


def test_an_unreachable_service_falls_back_to_the_rules() -> None:
    recipe = get_recipe("evo-rag")
    request = JobRequest(recipe="evo-rag", judge=JudgeSpec(url="http://127.0.0.1:9"))  # nothing listens
    ledger = bind_judge(recipe, request, TrainerSettings())
    assert ledger is not None and recipe.judge is ledger
    refusal = Episode(
        recipe="evo-rag",
        question_id="q",
        question=QUESTION,
        answers=["Jane Roe"],
        gold_titles=["Acme Records"],
        steps=[Step(t=1, action="refuse", text="<refuse/>")],
    )
    _, (total,) = score_episodes(recipe, [refusal])
    # t = 1 (p = 0, Discovery Start weights): REFUSE with no evidence: the rules find it
    # unanswerable, r_ref = +1 (w 0.5); r_step = -1 (w 0.02). R = 0.5 - 0.02 = 0.48
    assert total == pytest.approx(0.48)
    metrics = ledger.metrics()
    assert (metrics["judge/calls"], metrics["judge/fallbacks"], metrics["judge/service_bound"]) == (1, 1, 1)
    assert judge_flag(metrics) == (
        "the paper judges with an LLM, but 1 of 1 verdicts came from the rules judge (fallback)"
    )


def test_recipes_without_a_judge_or_a_paper_judge_are_left_alone() -> None:
    arena = get_recipe("arena")  # ARENA's judge is its LJ metric, not its reward
    assert bind_judge(arena, JobRequest(recipe="arena", judge=JudgeSpec()), TrainerSettings()) is None
    wts = get_recipe("when-to-search")
    assert bind_judge(wts, JobRequest(recipe="when-to-search"), TrainerSettings()) is None
    assert wts.judge is None  # exact match decides, as before


def test_a_job_records_who_judged_its_reward(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]], tmp_path: Path
) -> None:
    """A when-to-search job whose request names the paper's LLM judge but runs without a judge
    service: one GRPO step, every r_a verdict from the rules, counted in the job's metrics and
    flagged in ``GET /v1/jobs/{id}``."""
    data = tmp_path / "train.jsonl"
    write_questions(data, synthetic["train"][:1])
    settings = TrainerSettings(
        database_url=f"sqlite:///{tmp_path / 'registry.db'}",
        runs_dir=tmp_path / "runs",
        retriever_url=retriever_url,
        torch_threads=1,
    )
    hp = Hyperparameters(
        questions_per_step=1,
        num_generations=2,
        max_new_tokens_per_step=8,
        token_budget=64,
        max_steps=2,
        save_steps=1,
        eval_questions=1,
        max_train_questions=1,
    )
    request = JobRequest(
        recipe="when-to-search",
        objective="grpo",
        model=tiny_model,
        dataset=str(data),
        collection=collection,
        steps=1,
        hyperparameters=hp,
        judge=JudgeSpec(model="Qwen/Qwen3-235B-A22B-Instruct-2507"),
    )
    with Registry(settings.database_url) as registry:
        run_id = submit(registry, request).id
        run_job(run_id, settings, registry)
        metrics = registry.latest_metrics(run_id)
        view = job_view(registry.get_run(run_id), registry)  # type: ignore[arg-type]
    # one question x 2 samples: r_a asks the judge at least once per completion (TRL may score more
    # generations per step), and the rules answer every time
    calls = metrics["judge/calls"]
    assert calls >= 2 and metrics["judge/fallbacks"] == calls and metrics["judge/llm_calls"] == 0
    assert (metrics["judge/llm_expected"], metrics["judge/service_bound"]) == (1, 0)
    assert view.judge_flag is not None and "no judge service was bound" in view.judge_flag
