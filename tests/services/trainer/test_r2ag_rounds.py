"""R2AG's progressive rounds through the job runner: a round expands the forest one level, prunes it
to its gold-hit branches, trains one step, and the forest survives in the checkpoint."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hoprl.agent.trajectory import Episode, RetrievedDoc
from hoprl.data.jsonl import write_questions
from hoprl.data.synthetic import hops_for
from hoprl.recipes import RECIPES
from hoprl.recipes.base import Action
from hoprl.recipes.r2ag import Node, R2ag, RetrievalTree, normalize_title
from hoprl.registry.store import Registry
from hoprl.schemas import Question
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from hoprl.training.callbacks import STATE_FILE
from hoprl.training.r2ag_rounds import group_advantages, level_advantages, tree_from_dict, tree_to_dict
from services.trainer.jobs import run_job, submit
from services.trainer.settings import TrainerSettings

SAMPLES = 4


class TwoBranchR2ag(R2ag):
    """R2AG with expansions a random model makes: a segment ends at the first space; the n-th
    parsed segment (n mod 3) picks two base queries (a gold hop and a distractor), the other gold
    hop and the same distractor, or a stop, whatever the model wrote, so any sampler gives a group
    with two different gold hits and a premature stop. A random model never writes ``<think>``, so
    the double scores each expansion as if its text began with one (the reward would otherwise be
    0 for every sample)."""

    stop = [" "]  # noqa: RUF012
    hits: tuple[str, str] = ("", "")
    miss = ""
    parsed = itertools.count()

    def parse(self, segment: str) -> Action:
        pick = next(self.parsed) % 3
        if pick == 2:
            return Action("stop")
        hit = self.hits[pick]
        return Action("search", queries=[hit, self.miss], query_kinds=["base", "base"])

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
    tree.root.children = [Node("Acme founder", "base", doc, [Node("x", "predicted", None, closed=True)])]
    assert tree_to_dict(tree_from_dict(json.loads(json.dumps(tree_to_dict(tree))))) == tree_to_dict(tree)


def test_round_expands_prunes_and_trains(tiny_model: str, retriever_url: str, collection: str,
                                         synthetic: dict[str, list[Question]], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """One round through the job runner: every sample's pruned tree goes into the checkpoint's
    forest (not only the best one), the distractor branch is pruned, one optimizer step ran."""
    question = next(q for q in synthetic["train"] if len(hops_for(q)) >= 2)
    gold = {normalize_title(t) for t in question.gold_titles}
    monkeypatch.setattr(TwoBranchR2ag, "hits", (hops_for(question)[0].query, hops_for(question)[1].query))
    monkeypatch.setattr(TwoBranchR2ag, "miss", next(p.title for p in question.paragraphs if not p.is_gold))
    monkeypatch.setattr(TwoBranchR2ag, "parsed", itertools.count())
    monkeypatch.setitem(RECIPES, "r2ag", TwoBranchR2ag)
    data = tmp_path / "train.jsonl"
    write_questions(data, [question])
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    settings = TrainerSettings(database_url=url, runs_dir=tmp_path / "runs", retriever_url=retriever_url,
                               torch_threads=1)  # fmt: skip
    hp = Hyperparameters(questions_per_step=1, num_generations=SAMPLES, max_new_tokens_per_step=8,
                         token_budget=64, save_steps=1, eval_questions=1, max_train_questions=1,
                         learning_rate=1e-3)  # fmt: skip
    request = JobRequest(recipe="r2ag", objective="dapo", model=tiny_model, dataset=str(data),
                         collection=collection, steps=1, hyperparameters=hp)  # fmt: skip
    with Registry(settings.database_url) as registry:
        run_id = submit(registry, request).id
        run_job(run_id, settings, registry)

        rows = registry.episodes(run_id, step=1)
        assert len(rows) == SAMPLES  # one open leaf (the root) x the group
        totals = [r.total_reward for r in rows]
        assert max(totals) > min(totals), "the group must have spread to train"
        metrics = registry.latest_metrics(run_id)
        assert metrics["dynamic/dropped"] == 0 and "loss" in metrics and metrics["gold_found"] > 0
        assert [(w.step, w.from_stage, w.to_stage) for w in registry.stage_switches(run_id)] == [
            (1, "round1", "round2")
        ]
        folder = Path(registry.latest_checkpoint(run_id).path)  # type: ignore[union-attr]
        episodes = [Episode.model_validate(r.trajectory) for r in sorted(rows, key=lambda r: r.sample)]
    # Expected from the recorded samples: each search sample keeps its gold-hit branches
    expected = []
    for e in episodes:
        step = e.steps[0]
        kept = tuple(
            q for q, d in zip(step.queries, step.docs, strict=True) if normalize_title(d[0].title) in gold
        )
        if step.action == "search" and kept and kept not in expected:
            expected.append(kept)
    assert len(expected) == 2, "the samples hit both gold documents (parses 0 and 1 of every three)"
    state = json.loads((folder / STATE_FILE).read_text())
    assert state["loop"] == "r2ag-rounds" and state["round"] == 2 and state["question_ids"] == [question.id]
    forest = [tree_from_dict(t) for t in state["forest"]]
    assert [tuple(n.query for n in t.root.children) for t in forest] == expected
    assert metrics["trees"] == len(expected)
    for tree in forest:  # only gold hits survive, and they are what round 2 expands
        assert all(n.doc is not None and normalize_title(n.doc.title) in gold for n in tree.root.children)
        assert tree.frontier() == tree.root.children and tree.question_id == question.id
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"
