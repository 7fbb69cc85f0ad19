"""Training benchmarks for the trainer's targets (CPU by default; long versions are for an idle box).

    # 1. GRPO step wall time with and without multi-turn retrieval, in one run (from an SFT
    #    checkpoint that searches; the untrained model never does)
    python bench/train.py step-time --steps 3 --recipe when-to-search --dataset synthetic:0:2 \
        --model runs/<run>/jobs/<sft job>/checkpoint-24
    # 2. SFT warm start, then GRPO with when-to-search on the synthetic world; dev EM and
    #    retrieval count for SFT-only and for SFT+GRPO at the end of stage 1 and of stage 2
    python bench/train.py when-to-search --dataset synthetic:0:2 --sft-steps 300 --grpo-steps 200 \
        --switch-step 100 --dev 150        (--sft-job JOB|CHECKPOINT reuses a warm start)
    # 3. SFT warm start, then GRPO with arena on real data; EM/F1 on a fixed hotpotqa_dev sample
    python bench/train.py arena --train ../shared/data/hotpotqa_train.jsonl \
        --dev ../shared/data/hotpotqa_dev.jsonl --sft-steps 300 --grpo-steps 100 --dev-n 150

Each training phase is a real trainer job (:func:`services.trainer.jobs.submit` +
:func:`~services.trainer.jobs.run_job`, the code a worker runs) recorded in a registry under
``--out`` (default ``.hoprl/bench/train``), with a retriever started in-process on embedded
storage. Evaluation rolls out greedily (temperature 0) with the policy service's transformers
engine, one sample per question, and pairs questions for the bootstrap p-value. Results are
printed and written to ``<out>/<command>.json``, with ``<out>/<command>.png`` (the training reward
per step beside each model's dev scores; ``python bench/train.py plot --out DIR`` redraws it).
Short runs prove the pipeline; the targets need the long commands above. The machine is usually
shared: compare numbers within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import matplotlib
import torch

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt

from hoprl.agent.trajectory import Episode
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.data.jsonl import write_questions
from hoprl.data.sources import load
from hoprl.generation.lockstep import lockstep_episodes
from hoprl.generation.transformers_engine import TransformersEngine
from hoprl.metrics.answer import exact_match, f1
from hoprl.metrics.retrieval import full_recall_at_k
from hoprl.metrics.stats import paired_bootstrap
from hoprl.recipes import get_recipe
from hoprl.registry.store import Registry
from hoprl.schemas import Question
from hoprl.schemas.trainer import Hyperparameters, JobRequest, LrScheduler
from hoprl.training.hardware import bf16_mixed_precision
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.settings import RetrieverSettings
from services.trainer.jobs import checkpoint_of, ensure_collection, run_job, submit
from services.trainer.settings import TrainerSettings

log = logging.getLogger("bench.train")


def train(registry: Registry, settings: TrainerSettings, request: JobRequest) -> tuple[str, str]:
    """Run one job to the end in this process; returns (run id, final checkpoint folder)."""
    run_id = submit(registry, request).id
    registry.set_run_status(run_id, "running")
    run_job(run_id, settings, registry)
    registry.set_run_status(run_id, "succeeded")
    latest = registry.latest_checkpoint(run_id)
    assert latest is not None
    return run_id, latest.path


def evaluate(path: str, recipe_name: str, questions: list[Question], retriever_url: str, collection: str,
             recipe_config: dict[str, Any], max_turns: int, tokens: int) -> dict[str, Any]:  # fmt: skip
    """Greedy episodes of checkpoint ``path``, scored by :func:`episode_scores`. Decoding
    autocasts to bf16 where training does (:func:`bf16_mixed_precision`) and runs in lock-step
    rounds (:func:`lockstep_episodes`), so a checkpoint scores the same in every process."""
    engine = TransformersEngine(path, threads=1, autocast=bf16_mixed_precision())
    recipe = get_recipe(recipe_name, **recipe_config)

    async def run() -> list[Any]:
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await lockstep_episodes(recipe, questions, engine, retriever, collection,
                                           max_steps=max_turns, max_new_tokens_per_step=tokens,
                                           token_budget=4 * tokens * max_turns, temperature=0.0)  # fmt: skip
        finally:
            await retriever.aclose()

    episodes = asyncio.run(run())
    engine.close()
    return episode_scores(episodes)


def episode_scores(episodes: list[Episode]) -> dict[str, Any]:
    """Per question (in order): EM, F1, retrieval count, the answer, the queries, and whether the
    first search's results already listed every gold paragraph (``gold_first``: when one search
    was enough); with the means EM, F1 and retrievals."""
    em = [exact_match(e.final_answer or "", e.answers) if e.answers else float(e.refused) for e in episodes]
    f1s = [f1(e.final_answer or "", e.answers) if e.answers else float(e.refused) for e in episodes]
    rc = [float(e.retrieval_count) for e in episodes]
    first = [next((s for s in e.steps if s.docs), None) for e in episodes]
    listed = [[d.title for docs in s.docs for d in docs] if s else [] for s in first]
    gold_first = [
        full_recall_at_k(t, set(e.gold_titles), len(t)) for e, t in zip(episodes, listed, strict=True)
    ]
    means = {"EM": 100 * sum(em) / len(em), "F1": 100 * sum(f1s) / len(f1s), "retrievals": sum(rc) / len(rc)}
    return {"em": em, "f1": f1s, "rc": rc, "answers": [e.final_answer or "" for e in episodes],
            "queries": [e.queries for e in episodes], "gold_first": gold_first, **means}  # fmt: skip


def evaluate_once(out: Path, path: str, recipe: str, questions: list[Question], *rest: Any) -> dict[str, Any]:
    """:func:`evaluate` (``rest``: its arguments after ``questions``), kept under ``<out>/evals`` so
    that later campaigns of the same ``--out`` reuse a checkpoint's scores on the same questions
    and settings. Lock-step decoding makes them exactly repeatable; scores cached before it (the
    engine batched episodes as they arrived, and padding flipped near-ties: the same SFT checkpoint
    scored 24 and 23 EM on 100 questions in two processes) have other keys and are not reused."""
    key = json.dumps([path, recipe, [q.id for q in questions], *rest[2:]])  # not the URL or collection
    key += " lockstep"
    if bf16_mixed_precision():  # (so fp32 scores cached by earlier versions keep their keys)
        key += " bf16"
    cache = out / "evals" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    if cache.exists():
        return dict(json.loads(cache.read_text()))
    scores = evaluate(path, recipe, questions, *rest)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(scores))
    return scores


def summary(name: str, scores: dict[str, Any]) -> dict[str, Any]:
    return {"model": name, "EM": round(scores["EM"], 1), "F1": round(scores["F1"], 1),
            "retrievals": round(scores["retrievals"], 2)}  # fmt: skip


def step_time(args: argparse.Namespace, registry: Registry, settings: TrainerSettings) -> dict[str, Any]:
    """GRPO steps: the recipe multi-turn (retrieval between turns) vs the same recipe cut to one
    turn (no injected retrieval), same questions, same sampling. An untrained model never
    searches, so pass a warm-started ``--model`` (e.g. an SFT checkpoint) for a real comparison."""
    out = {}
    for label, turns in (("multi-turn retrieval", args.turns), ("single turn, no retrieval", 1)):
        hp = Hyperparameters(questions_per_step=args.questions, num_generations=args.generations,
                             max_turns=turns, max_new_tokens_per_step=args.tokens,
                             token_budget=args.tokens * turns * 4, save_steps=1000)  # fmt: skip
        request = JobRequest(recipe=args.recipe, dataset=args.dataset, model=args.model, steps=args.steps,
                             hyperparameters=hp)  # fmt: skip
        run_id, _ = train(registry, settings, request)
        series = {k: [v for _, v in registry.metric_series(run_id, k)]
                  for k in ("step_time", "rollout_s", "retrieval_s", "generation_s")}  # fmt: skip
        out[label] = {k: round(sum(v) / len(v), 3) for k, v in series.items() if v}
        rows = registry.episodes(run_id)
        searches = sum(len(s["queries"]) for r in rows for s in r.trajectory["steps"])
        out[label]["searches_per_episode"] = round(searches / max(len(rows), 1), 2)
    return out


def when_to_search(args: argparse.Namespace, registry: Registry, settings: TrainerSettings) -> dict[str, Any]:
    cfg: dict[str, Any] = {"switch_step": args.switch_step, "expert": args.expert}
    common = {"max_turns": args.turns, "max_new_tokens_per_step": args.tokens, "recipe_config": cfg}
    sft = JobRequest(
        recipe="when-to-search",
        objective="sft",
        dataset=args.dataset,
        steps=args.sft_steps,
        hyperparameters=Hyperparameters(
            questions_per_step=args.sft_questions, save_steps=args.sft_steps, **common
        ),
    )
    if args.sft_job:  # reuse an SFT job of this registry (--out)
        sft_id, sft_path = args.sft_job, checkpoint_of(registry, args.sft_job)
    else:
        sft_id, sft_path = train(registry, settings, sft)
    full_dev = load(args.dataset, "dev")
    dev = full_dev[: args.dev]
    collection = ensure_collection(sft, load(args.dataset, "train") + full_dev, settings)
    url = settings.retriever_url

    def score(path: str) -> dict[str, Any]:
        rest = (url, collection, cfg, args.turns, args.tokens)
        return evaluate_once(args.out, path, "when-to-search", dev, *rest)

    if args.grpo_steps == 0:  # the warm start alone
        return {"sft_job": sft_id, "table": [summary("sft", score(sft_path))]}
    hp = Hyperparameters(
        questions_per_step=args.questions,
        num_generations=args.generations,
        save_steps=args.switch_step,
        token_budget=args.tokens * args.turns * 4,
        learning_rate=args.lr,
        lr_scheduler=args.lr_scheduler,
        beta=args.beta,
        temperature=args.temperature,
        scale_rewards=args.scale_rewards,
        dynamic_sampling=args.dynamic_sampling or None,
        **common,
    )
    grpo = JobRequest(recipe="when-to-search", objective=args.objective, model=sft_id, dataset=args.dataset,
                      steps=args.grpo_steps, hyperparameters=hp)  # fmt: skip
    grpo_id, _ = train(registry, settings, grpo)
    stage1 = next((c.path for c in registry.checkpoints(grpo_id) if c.step == args.switch_step), None)
    final = registry.latest_checkpoint(grpo_id).path  # type: ignore[union-attr]
    models = (("sft", sft_path), ("grpo_stage1", stage1), ("grpo_stage2", final))
    ev = {name: score(p) for name, p in models if p}
    out: dict[str, Any] = {"table": [summary(k, v) for k, v in ev.items()]}
    for k in ("grpo_stage1", "grpo_stage2"):
        if k in ev:
            out[f"p_value EM {k} vs sft"] = paired_bootstrap(ev[k]["em"], ev["sft"]["em"]).p_value
    out["reward_curve"] = registry.metric_series(grpo_id, "reward")
    out["search_curve"] = registry.metric_series(grpo_id, "searches")
    out["switch_step"] = args.switch_step
    return out


def fewer_paragraphs(question: Question, n: int) -> Question:
    """``question`` with its gold paragraphs and its first distractors, ``n`` in all, in their
    original order: a shorter ARENA prompt (10 HotpotQA paragraphs are ~1,500 tokens, ~100 s per
    2-episode SFT step on one CPU thread)."""
    golds = sum(p.is_gold for p in question.paragraphs)
    budget = max(n - golds, 0)
    kept = []
    for p in question.paragraphs:
        if p.is_gold or budget > 0:
            kept.append(p)
            budget -= not p.is_gold
    return question.model_copy(update={"paragraphs": kept})


def arena_file(path: str, n: int | None, out: Path) -> str:
    """``path`` itself, or a copy under ``out`` with ``n`` paragraphs per question."""
    if not n:
        return path
    target = out / f"{Path(path).stem}-{n}p.jsonl"
    write_questions(target, [fewer_paragraphs(q, n) for q in load(path)])
    return str(target)


def arena(args: argparse.Namespace, registry: Registry, settings: TrainerSettings) -> dict[str, Any]:
    common = {"max_turns": 1, "max_new_tokens_per_step": args.tokens, "token_budget": args.tokens}
    args.train = arena_file(args.train, args.paragraphs, args.out)
    args.dev_file = arena_file(args.dev_file, args.paragraphs, args.out)
    sft = JobRequest(
        recipe="arena",
        objective="sft",
        dataset=args.train,
        steps=args.sft_steps,
        hyperparameters=Hyperparameters(
            questions_per_step=args.sft_questions, save_steps=args.sft_steps, **common
        ),
    )
    sft_id, sft_path = train(registry, settings, sft)
    hp = Hyperparameters(questions_per_step=args.questions, save_steps=args.grpo_steps,
                         num_generations=args.generations, **common)  # fmt: skip
    grpo = JobRequest(recipe="arena", objective="grpo", model=sft_id, dataset=args.train,
                      steps=args.grpo_steps, hyperparameters=hp)  # fmt: skip
    grpo_id, grpo_path = train(registry, settings, grpo)
    pool = load(args.dev_file)
    dev = pool[:: max(1, len(pool) // args.dev_n)][: args.dev_n]  # a fixed, evenly spaced sample
    untrained = settings.default_model or str(settings.model_cache)
    ev = {name: evaluate(p, "arena", dev, settings.retriever_url, "unused", {}, 1, args.tokens)
          for name, p in (("untrained", untrained), ("sft", sft_path), ("sft+grpo", grpo_path))}  # fmt: skip
    return {"table": [summary(k, v) for k, v in ev.items()],
            "p_value F1 sft+grpo vs sft": paired_bootstrap(ev["sft+grpo"]["f1"], ev["sft"]["f1"]).p_value,
            "reward_curve": registry.metric_series(grpo_id, "reward")}  # fmt: skip


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """``result``'s training reward per GRPO step (the stage switch dashed, if any; with the searches
    per training episode where recorded) beside each evaluated model's dev EM and F1, with its
    retrievals per question; None without a curve."""
    curve, table = result.get("reward_curve"), result.get("table")
    if not curve or not table:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(*zip(*curve, strict=True), marker=".", color="tab:blue", linewidth=1)
    if result.get("switch_step"):
        left.axvline(
            result["switch_step"], color="tab:red", linestyle="--", linewidth=1, label="stage switch"
        )
        left.legend(fontsize=8)
    left.set(xlabel="GRPO step", ylabel="training reward (mean of the batch)")
    if result.get("search_curve"):  # sampled searches per episode (when-to-search's stage 2 lowers it)
        searches = left.twinx()
        searches.plot(*zip(*result["search_curve"], strict=True), marker=".", color="tab:green", linewidth=1)
        searches.set_ylabel("searches per training episode", color="tab:green")
        searches.set_ylim(bottom=0)
    names = [row["model"] for row in table]
    x = range(len(names))
    right.bar([i - 0.2 for i in x], [row["EM"] for row in table], width=0.4, label="EM")
    right.bar([i + 0.2 for i in x], [row["F1"] for row in table], width=0.4, label="F1")
    for i, row in enumerate(table):
        if row.get("retrievals"):  # (ARENA answers from given paragraphs: none)
            right.annotate(f"{row['retrievals']:.2f} retr.", (i, max(row["EM"], row["F1"])), ha="center",
                           xytext=(0, 3), textcoords="offset points", fontsize=8)  # fmt: skip
    right.set_xticks(list(x), names)
    right.set(ylabel="dev score")
    right.legend(fontsize=8)
    fig.suptitle(path.stem)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@contextlib.contextmanager
def retriever_url(args: argparse.Namespace) -> Iterator[str]:
    """``--retriever-url`` as given, else a retriever started in-process on ``<out>/qdrant`` (its
    URL is logged, so another process can evaluate against the same index)."""
    if args.retriever_url:
        yield args.retriever_url
        return
    with LocalServer(create_app(RetrieverSettings(storage_path=args.out / "qdrant"))) as server:
        log.info("retriever: %s (pass it as --retriever-url to share this index)", server.url)
        yield server.url


COMMANDS = {"step-time": step_time, "when-to-search": when_to_search, "arena": arena}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "command", choices=sorted([*COMMANDS, "plot"]), help="plot: redraw <out>/*.png from *.json"
    )
    p.add_argument("--out", type=Path, default=Path(".hoprl/bench/train"))
    p.add_argument("--steps", type=int, default=3, help="step-time: GRPO steps per variant")
    p.add_argument("--model", default=None, help="step-time: model or checkpoint folder")
    p.add_argument("--recipe", default="search-r1", help="step-time: the recipe")
    p.add_argument("--dataset", default="synthetic", help="step-time, when-to-search: the dataset spec")
    p.add_argument("--objective", default="dapo", help="when-to-search: the RL objective")
    p.add_argument("--lr", type=float, default=None, help="RL learning rate (unset: the trainer default)")
    p.add_argument(
        "--lr-scheduler",
        default=Hyperparameters.model_fields["lr_scheduler"].default,
        choices=get_args(LrScheduler),
        help="when-to-search: the RL learning-rate schedule (linear: decay to 0 over the steps)",
    )
    p.add_argument(
        "--beta", type=float, default=None, help="when-to-search: KL coefficient (unset: the recipe's, 0)"
    )
    p.add_argument("--sft-questions", type=int, default=4, help="SFT episodes per step")
    p.add_argument(
        "--sft-job",
        default=None,
        help="when-to-search: reuse an SFT job of the --out registry (its id) or a checkpoint folder",
    )
    p.add_argument(
        "--expert",
        default="hops",
        choices=["hops", "adaptive", "hops-adaptive"],
        help=(
            "when-to-search: the SFT expert (adaptive: keywords first, then only missing hops; "
            "hops-adaptive: the first hop's query first, then only missing hops)"
        ),
    )
    p.add_argument("--sft-steps", type=int, default=20)
    p.add_argument("--grpo-steps", type=int, default=4)
    p.add_argument("--switch-step", type=int, default=2, help="when-to-search: stage 1 -> 2 at this step")
    p.add_argument("--questions", type=int, default=2, help="questions per GRPO step")
    p.add_argument("--generations", type=int, default=4, help="samples per question")
    p.add_argument("--temperature", type=float, default=1.0, help="GRPO sampling temperature")
    p.add_argument(
        "--scale-rewards",
        default=None,
        choices=["group", "batch", "none"],
        help="advantage std scaling (default: none for dr_grpo, else group)",
    )
    p.add_argument(
        "--dynamic-sampling", action="store_true", help="refill groups whose rewards have zero spread (DAPO)"
    )
    p.add_argument("--turns", type=int, default=4)
    p.add_argument(
        "--tokens",
        type=int,
        default=64,
        help="new tokens per agent step (a reflect + think + "
        "search turn of the when-to-search protocol needs ~60)",
    )
    p.add_argument("--dev", type=int, default=20, help="when-to-search: dev questions")
    p.add_argument("--dev-n", type=int, default=20, help="arena: dev questions (a fixed sample)")
    p.add_argument("--train", default="../shared/data/hotpotqa_train.jsonl")
    p.add_argument("--dev-file", default="../shared/data/hotpotqa_dev.jsonl", help="arena: dev questions")
    p.add_argument(
        "--paragraphs",
        type=int,
        default=None,
        help="arena: keep the gold and the first distractors, this many paragraphs per question",
    )
    p.add_argument(
        "--retriever-url",
        default=None,
        help="a running retriever (e.g. another campaign's, from its log) instead of one on <out>/qdrant: "
        "evaluations in two processes then search one index",
    )
    p.add_argument("--threads", type=int, default=2, help="training threads (1: two share 2 cores)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.command == "plot":
        for name in COMMANDS:
            if (found := args.out / f"{name}.json").exists():
                drawn = plot(json.loads(found.read_text()), found.with_suffix(".png"))
                print(drawn or f"{found}: nothing to plot")
        return
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (
        retriever_url(args) as url,
        Registry(f"sqlite:///{args.out / 'registry.db'}", owner="trainer") as reg,
    ):
        settings = TrainerSettings(runs_dir=args.out / "runs", retriever_url=url, torch_threads=args.threads)
        result = COMMANDS[args.command](args, reg, settings)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    result["threads"] = torch.get_num_threads()
    (args.out / f"{args.command}.json").write_text(json.dumps(result, indent=1))
    if drawn := plot(result, args.out / f"{args.command}.png"):
        log.info("plot: %s", drawn)
    print(json.dumps({k: v for k, v in result.items() if k != "reward_curve"}, indent=1))


if __name__ == "__main__":
    main()
