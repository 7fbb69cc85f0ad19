"""R2AG's progressive rounds through the job runner: a round expands the forest one level, prunes it
to its gold-hit branches, trains one step, and the forest survives in the checkpoint."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from hoprl.data.jsonl import write_questions
from hoprl.data.synthetic import hops_for
from hoprl.domain import Action, Episode, Question, RetrievedDoc, Step
from hoprl.recipes import RECIPES
from hoprl.recipes.r2ag import Node, R2ag, RetrievalTree, episode_return, normalize_title
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from hoprl.training.callbacks import STATE_FILE
from hoprl.training.r2ag_rounds import (
    cap_reward,
    group_advantages,
    level_advantages,
    tree_from_dict,
    tree_to_dict,
)
from services.trainer.jobs import run_job, submit
from services.trainer.settings import TrainerSettings

SAMPLES = 3


class TwoBranchR2ag(R2ag):
    """R2AG with expansions a random model makes: a segment ends at the first space; the n-th
    parsed segment (n mod 3) picks two base queries (the two questions' first gold hops: one hits
    gold for either tree), a premature stop, or the distractor alone, whatever the model wrote.
    Of any 6 consecutive parses a tree's 3 hold a pick 0 unless the other tree's hold it twice, so
    at least one group of a batch of two trees has spread. A random model never writes ``<think>``, so
    the double scores each expansion as if its text began with one (the reward would otherwise be
    0 for every sample)."""

    stop = [" "]  # noqa: RUF012
    hits: tuple[str, str] = ("", "")
    miss = ""
    parsed = itertools.count()

    def parse(self, segment: str) -> Action:
        pick = next(self.parsed) % 3
        if pick == 1:
            return Action("stop")
        if pick == 2:
            return Action("search", queries=[self.miss], query_kinds=["base"])
        return Action("search", queries=list(self.hits), query_kinds=["base", "base"])

    def score(self, episode: Episode) -> Episode:
        thought = episode.model_copy(deep=True)
        for step in thought.steps:
            step.text = "<think>sampled</think>" + step.text
        scored = super().score(thought)
        out = episode.model_copy(deep=True)
        for step, done in zip(out.steps, scored.steps, strict=True):
            step.signals = done.signals
        out.meta = scored.meta
        return out


def test_group_advantages_drop_flat_groups() -> None:
    assert group_advantages([0.5, 0.5, 0.5]) is None
    adv = group_advantages([1.0, 0.0])
    assert adv is not None and adv[0] > 0 > adv[1] and sum(adv) == pytest.approx(0.0)
    assert adv[0] == pytest.approx(0.5 / (0.5**0.5 + 1e-4))  # centred, divided by the sample std
    assert group_advantages([1.0, 0.0, 0.5], scale=False) == [0.5, -0.5, 0.0]  # Dr. GRPO: centred only


def test_level_advantages_scale_by_group_batch_or_nothing() -> None:
    groups = [[1.0, 0.0], [2.0, 2.0], [3.0, 0.0]]
    assert level_advantages(groups, "none") == [[0.5, -0.5], None, [1.5, -1.5]]
    by_group = level_advantages(groups, "group")
    assert by_group[0] == pytest.approx(by_group[2], rel=1e-3)  # each group scaled to the same spread
    std = statistics.stdev([r for g in groups for r in g])
    assert level_advantages(groups, "batch")[2] == pytest.approx([1.5 / (std + 1e-4), -1.5 / (std + 1e-4)])


def test_tree_round_trip() -> None:
    doc = RetrievedDoc(id="d1", title="Acme", text="Acme was founded by Jane Roe.", score=1.0)
    tree = RetrievalTree("Who founded Acme?", ["Acme"], Node("Who founded Acme?", "question"))
    tree.root.children = [Node("Acme founder", "base", doc, [Node("x", "predicted", None)])]
    assert tree_to_dict(tree_from_dict(json.loads(json.dumps(tree_to_dict(tree))))) == tree_to_dict(tree)


def run_rounds(tiny_model: str, retriever_url: str, collection: str, questions: list[Question],
               tmp_path: Path, **hp: Any) -> tuple[list[Any], dict[str, float], Path, list[Any]]:  # fmt: skip
    """One step of the R2AG job on ``questions``: (episode rows, metrics, checkpoint, stage switches)."""
    data = tmp_path / "train.jsonl"
    write_questions(data, questions)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    settings = TrainerSettings(database_url=url, runs_dir=tmp_path / "runs", retriever_url=retriever_url,
                               torch_threads=1)  # fmt: skip
    values = {"max_new_tokens_per_step": 8, **hp}
    hyper = Hyperparameters(questions_per_step=2, num_generations=SAMPLES, save_steps=1, eval_questions=1,
                            learning_rate=1e-3, **values)  # fmt: skip
    request = JobRequest(recipe="r2ag", objective="dapo", model=tiny_model, dataset=str(data),
                         collection=collection, steps=1, hyperparameters=hyper)  # fmt: skip
    with Registry(settings.database_url) as registry:
        run_id = submit(registry, request).id
        run_job(run_id, settings, registry)
        rows = registry.episodes(run_id, step=1)
        metrics = registry.latest_metrics(run_id)
        folder = Path(registry.latest_checkpoint(run_id).path)  # type: ignore[union-attr]
        switches = [(w.step, w.from_stage, w.to_stage) for w in registry.stage_switches(run_id)]
    return rows, metrics, folder, switches


def two_questions(synthetic: dict[str, list[Question]], monkeypatch: pytest.MonkeyPatch) -> list[Question]:
    questions = [q for q in synthetic["train"] if len(hops_for(q)) >= 2][:2]
    monkeypatch.setattr(
        TwoBranchR2ag, "hits", (hops_for(questions[0])[0].query, hops_for(questions[1])[0].query)
    )
    monkeypatch.setattr(
        TwoBranchR2ag, "miss", next(p.title for p in questions[0].paragraphs if not p.is_gold)
    )
    monkeypatch.setattr(TwoBranchR2ag, "parsed", itertools.count())
    monkeypatch.setitem(RECIPES, "r2ag", TwoBranchR2ag)
    return questions


def test_algorithm_1_a_batch_of_trees_groups_of_g_and_early_stops_kept(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """R2AG Algorithm 1 through the job runner, one step = one prompt batch of B = 2 trees
    (RR-Forest^0: both questions' roots) x G = 3 responses each. Every response's pruned tree
    joins RR-Forest^1 (a set), the early stops' root-only trees included; level 0 is then done,
    so the next step expands RR-Forest^1 (stage round1 -> round2); one optimizer step ran."""
    questions = two_questions(synthetic, monkeypatch)
    rows, metrics, folder, switches = run_rounds(tiny_model, retriever_url, collection, questions, tmp_path)
    assert len(rows) == 2 * SAMPLES  # the batch's 2 trees x the group size
    assert metrics["trees_in_batch"] == 2 and metrics["groups"] == 2 and metrics["dynamic/dropped"] <= 1
    assert "loss" in metrics and metrics["truncated"] == 0 and switches == [(1, "round1", "round2")]
    # RR-Forest^1 expected from the recorded responses: each keeps its gold-hit queries
    gold = {q.id: {normalize_title(t) for t in q.gold_titles} for q in questions}
    expected = set()
    for row in rows:
        step = Episode.model_validate(row.trajectory).steps[0]
        pairs = zip(step.queries, step.docs, strict=True) if step.action == "search" else []
        hits = [q for q, d in pairs if normalize_title(d[0].title) in gold[row.question_id]]
        expected.add((row.question_id, tuple(hits)))
    assert any(hits == () for _, hits in expected), "an early stop (or a miss) keeps its root-only tree"
    assert any(hits for _, hits in expected), "some response hit gold"
    state = json.loads((folder / STATE_FILE).read_text())
    assert state["loop"] == "r2ag-rounds" and (state["level"], state["cursor"]) == (1, 0)
    forest = [tree_from_dict(t) for t in state["forest"]]
    assert {(t.question_id, tuple(n.query for n, _ in t.nodes())) for t in forest} == expected
    assert len(forest) == len(expected) and state["next_forest"] == []
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"


class NeverStops(TwoBranchR2ag):
    stop = ["<never-stops>"]  # noqa: RUF012


def test_a_response_cut_at_the_output_cap_earns_0(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """App. B.2: responses longer than the cap (the paper: 4,096 tokens; here 4) are truncated and
    earn 0, so every group is flat and dropped: no update. The cap is the response's own, not the
    episode's token budget."""
    questions = two_questions(synthetic, monkeypatch)
    monkeypatch.setitem(RECIPES, "r2ag", NeverStops)
    rows, metrics, _, _ = run_rounds(tiny_model, retriever_url, collection, questions, tmp_path,
                                     max_new_tokens_per_step=4, token_budget=16)  # fmt: skip
    assert len(rows) == 2 * SAMPLES and metrics["truncated"] == 2 * SAMPLES
    assert all(r.total_reward == 0.0 for r in rows)
    assert all(Episode.model_validate(r.trajectory).meta["r2ag"]["zeroed"] == "truncated" for r in rows)
    assert metrics["dynamic/dropped"] == 2 and "loss" not in metrics


def test_cap_reward_zeroes_a_truncated_response_by_hand() -> None:
    """A response that would score R_f = 0.02 (two sub-query segments after <think>) but was cut at
    the cap earns 0; the same response not cut keeps its 0.02 (0.01 per segment, App. B.2)."""
    text = "<think>x</think><base-Q>a</base-Q><predicted-Q>b</predicted-Q>"
    docs = [[RetrievedDoc(id=t, title=t, text=t)] for t in ("X", "Y")]  # no gold: R_MH = R_AP = 0
    step = Step(
        t=1, action="search", text=text, queries=["a", "b"], query_kinds=["base", "predicted"], docs=docs
    )
    episode = Episode(recipe="r2ag", question_id="q", question="?", gold_titles=["A"], steps=[step],
                      meta={"finish_reasons": ["length"]})  # fmt: skip
    recipe = R2ag()
    kept = recipe.score(episode.model_copy(update={"meta": {"finish_reasons": ["stop"]}}, deep=True))
    assert episode_return(cap_reward(kept), recipe.config) == pytest.approx(0.02)
    assert episode_return(cap_reward(recipe.score(episode)), recipe.config) == 0.0
