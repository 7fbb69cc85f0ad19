"""Training benchmarks through the product path: the services a user's run starts, their APIs only.

    # 1. GRPO step wall time with and without multi-turn retrieval, in one run (from an SFT
    #    checkpoint that searches; the untrained model never does)
    python bench/train.py step-time --steps 3 --recipe when-to-search --dataset synthetic:0:2 \
        --model <out>/jobs/<sft job>/checkpoint-24
    # 2. SFT warm start, then GRPO with when-to-search on the synthetic world; dev EM and
    #    retrieval count for SFT-only and for SFT+GRPO at the end of stage 1 and of stage 2
    python bench/train.py when-to-search --dataset synthetic:0:2 --sft-steps 300 --grpo-steps 200 \
        --switch-step 100 --dev 150        (--sft-job JOB|CHECKPOINT reuses a warm start)

The services start as ``hoprl pipeline`` starts them (:func:`flows.stack.services`): a retriever
on embedded storage under ``--out``, the policy, the judge and the trainer, each a process, with a
run registry at ``<out>/registry.db``; a ``HOPRL_<SERVICE>_URL`` in the environment (or
``--retriever-url``) uses a running one instead. Each training phase is a job submitted to the
trainer's ``POST /v1/jobs`` (:class:`hoprl.clients.trainer.TrainerClient`) and waited for; each
evaluated checkpoint is switched in through the policy's ``POST /v1/admin/checkpoint`` and
evaluated through its ``POST /v1/answer/batch`` (:func:`hoprl.answer_eval.evaluate_answers` with
``repeatable=True``: greedy lock-step rounds, so a checkpoint scores the same on every run). The
evaluation therefore runs in the served shape (the policy's POLICY_* limits as the local stack sets
them, the recipe's action grammar), exactly what a user's run reports. Questions are paired for the
bootstrap p-value. Results are printed and written to ``<out>/<command>.json``, with
``<out>/<command>.png`` (the training reward per step beside each model's dev scores;
``python bench/train.py plot --out DIR`` redraws it). Short runs prove the pipeline; the targets
need the long commands above. The machine is usually shared: compare numbers within one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt

from flows.stack import ServiceUrls, admin_token, services
from hoprl.answer_eval import evaluate_answers
from hoprl.clients.policy import PolicyClient
from hoprl.clients.retriever import RetrieverClient
from hoprl.clients.trainer import TrainerClient
from hoprl.data.corpus import pool
from hoprl.data.sources import load
from hoprl.domain import Question
from hoprl.evaluation import corpus_collection, ensure_indexed
from hoprl.metrics.stats import paired_bootstrap
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, Job, JobRequest, LrScheduler

log = logging.getLogger("bench.train")
WAIT_S = 7 * 24 * 3600.0  # a job may train for days


class Campaign:
    """The services of one bench run and what it asks of them."""

    def __init__(self, args: argparse.Namespace, urls: ServiceUrls, registry: Registry) -> None:
        self.args, self.urls, self.registry = args, urls, registry
        self.trainer = TrainerClient(urls.trainer, timeout=60.0)

    def train(self, request: JobRequest) -> Job:
        """Submit ``request`` to the trainer and wait for the job; raises unless it succeeded."""
        job_id = self.trainer.submit(request).id
        log.info("%s job %s: %s, %d steps", request.objective, job_id, request.recipe, request.steps)
        job = self.trainer.wait(job_id, timeout=WAIT_S, poll=2.0)
        if job.status != "succeeded" or not job.checkpoints:
            raise RuntimeError(f"trainer job {job_id} ended {job.status}: {job.error}; see its worker.log")
        log.info(
            "%s job %s: succeeded at step %d, %s",
            request.objective,
            job_id,
            job.step,
            job.checkpoints[-1].path,
        )
        return job

    def collection(self, questions: list[Question], name: str) -> str:
        """The questions' pooled paragraphs in the retriever (indexed once; named by content)."""
        documents = pool(questions)
        collection = corpus_collection(name, documents)
        with RetrieverClient(self.urls.retriever) as client:
            ensure_indexed(client, collection, documents)
        return collection

    def evaluate(self, path: str, recipe: str, questions: list[Question], collection: str) -> dict[str, Any]:
        """Serve checkpoint ``path`` and answer ``questions`` through ``/v1/answer/batch``: the scores
        (:func:`scores`), kept under ``<out>/evals`` so later runs of the same ``--out`` reuse them."""
        key = json.dumps([path, recipe, [q.id for q in questions], self.args.eval_batch]) + " answer/batch"
        cache = self.args.out / "evals" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
        if cache.exists():
            return dict(json.loads(cache.read_text()))
        with PolicyClient(self.urls.policy, admin_token=admin_token(self.urls.policy)) as policy:
            policy.switch_checkpoint(path)
        report = evaluate_answers(self.urls.policy, self.urls.retriever, questions, recipe, collection,
                                  repeatable=True, batch_size=self.args.eval_batch)  # fmt: skip
        result = scores(report["predictions"])
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result))
        return result

    def close(self) -> None:
        self.trainer.close()


def scores(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per question (in order): EM, F1, retrieval count, the answer and the queries
    (:func:`hoprl.answer_eval.evaluate_answers`' rows); with the means EM, F1 (in %) and retrievals.
    A failed request counts 0 and shows as ``errors``."""
    em, f1s, rc = [r["em"] for r in rows], [r["f1"] for r in rows], [float(r["retrievals"]) for r in rows]
    means = {"EM": 100 * sum(em) / len(em), "F1": 100 * sum(f1s) / len(f1s), "retrievals": sum(rc) / len(rc)}
    return {"em": em, "f1": f1s, "rc": rc, "answers": [r["prediction"] or "" for r in rows],
            "queries": [r["queries"] for r in rows], "errors": sum(r["error"] is not None for r in rows),
            **means}  # fmt: skip


def summary(name: str, scores: dict[str, Any]) -> dict[str, Any]:
    return {"model": name, "EM": round(scores["EM"], 1), "F1": round(scores["F1"], 1),
            "retrievals": round(scores["retrievals"], 2)}  # fmt: skip


def step_time(args: argparse.Namespace, run: Campaign) -> dict[str, Any]:
    """GRPO steps: the recipe multi-turn (retrieval between turns) vs the same recipe cut to one
    turn (no injected retrieval), same questions, same sampling. An untrained model never
    searches, so pass a warm-started ``--model`` (e.g. an SFT checkpoint) for a real comparison."""
    out = {}
    for label, turns in (("multi-turn retrieval", args.turns), ("single turn, no retrieval", 1)):
        hp = Hyperparameters(questions_per_step=args.questions, num_generations=args.generations,
                             max_steps=turns, max_new_tokens_per_step=args.tokens, torch_threads=args.threads,
                             token_budget=args.tokens * turns * 4, save_steps=1000)  # fmt: skip
        request = JobRequest(recipe=args.recipe, dataset=args.dataset, model=args.model, steps=args.steps,
                             hyperparameters=hp)  # fmt: skip
        job_id = run.train(request).id
        series = {k: [v for _, v in run.registry.metric_series(job_id, k)]
                  for k in ("step_time", "rollout_s", "retrieval_s", "generation_s")}  # fmt: skip
        out[label] = {k: round(sum(v) / len(v), 3) for k, v in series.items() if v}
        rows = run.registry.episodes(job_id)
        searches = sum(len(s["queries"]) for r in rows for s in r.trajectory["steps"])
        out[label]["searches_per_episode"] = round(searches / max(len(rows), 1), 2)
    return out


def when_to_search(args: argparse.Namespace, run: Campaign) -> dict[str, Any]:
    cfg: dict[str, Any] = {"switch_step": args.switch_step, "expert": args.expert}
    full_dev = load(args.dataset, "dev")
    dev = full_dev[: args.dev]
    collection = run.collection(load(args.dataset, "train") + full_dev, args.dataset.replace(":", "-"))
    common = {"max_steps": args.turns, "max_new_tokens_per_step": args.tokens, "recipe_config": cfg,
              "torch_threads": args.threads}  # fmt: skip
    if args.sft_job:  # a job of this --out's trainer, or a checkpoint folder
        sft_id = args.sft_job
        sft_path = (
            args.sft_job if Path(args.sft_job).is_dir() else run.trainer.get(sft_id).checkpoints[-1].path
        )
    else:
        sft = JobRequest(
            recipe="when-to-search", objective="sft", dataset=args.dataset, collection=collection,
            steps=args.sft_steps, hyperparameters=Hyperparameters(
                questions_per_step=args.sft_questions, save_steps=args.sft_steps, **common),
        )  # fmt: skip
        job = run.train(sft)
        sft_id, sft_path = job.id, job.checkpoints[-1].path

    def score(path: str) -> dict[str, Any]:
        return run.evaluate(path, "when-to-search", dev, collection)

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
                      collection=collection, steps=args.grpo_steps, hyperparameters=hp)  # fmt: skip
    job = run.train(grpo)
    stage1 = next((c.path for c in job.checkpoints if c.step == args.switch_step), None)
    models = (("sft", sft_path), ("grpo_stage1", stage1), ("grpo_stage2", job.checkpoints[-1].path))
    ev = {name: score(p) for name, p in models if p}
    out: dict[str, Any] = {
        "sft_job": sft_id,
        "grpo_job": job.id,
        "table": [summary(k, v) for k, v in ev.items()],
    }
    for k in ("grpo_stage1", "grpo_stage2"):
        if k in ev:
            out[f"p_value EM {k} vs sft"] = paired_bootstrap(ev[k]["em"], ev["sft"]["em"]).p_value
    out["reward_curve"] = run.registry.metric_series(job.id, "reward")
    out["search_curve"] = run.registry.metric_series(job.id, "searches")
    out["switch_step"] = args.switch_step
    return out


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
        if row.get("retrievals"):
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


@contextmanager
def campaign(args: argparse.Namespace) -> Iterator[Campaign]:
    """The stack of a user's run on ``--out`` (its registry at ``<out>/registry.db`` unless
    ``HOPRL_DATABASE_URL`` names one), with ``--retriever-url`` as a running retriever."""
    os.environ.setdefault("HOPRL_DATABASE_URL", f"sqlite:///{args.out.resolve() / 'registry.db'}")
    if args.retriever_url:
        os.environ["HOPRL_RETRIEVER_URL"] = args.retriever_url
    if args.sft_job and Path(args.sft_job).is_dir():  # the trainer loads models from its model roots only
        os.environ["TRAINER_MODEL_ROOTS"] = str(Path(args.sft_job).resolve().parent)
    with (
        services(args.out.resolve(), model=None) as urls,
        Registry(os.environ["HOPRL_DATABASE_URL"], owner="flows") as registry,  # reads only
    ):
        log.info("services: %s (HOPRL_RETRIEVER_URL=%s shares this index)", urls, urls.retriever)
        run = Campaign(args, urls, registry)
        try:
            yield run
        finally:
            run.close()


COMMANDS = {"step-time": step_time, "when-to-search": when_to_search}


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
        help="when-to-search: reuse an SFT job of the --out trainer (its id) or a checkpoint folder",
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
    p.add_argument("--turns", type=int, default=4, help="training: agent turns per episode")
    p.add_argument(
        "--tokens",
        type=int,
        default=64,
        help="training: new tokens per agent step (a reflect + think + "
        "search turn of the when-to-search protocol needs ~60); evaluation uses the policy's limits",
    )
    p.add_argument("--dev", type=int, default=20, help="when-to-search: dev questions")
    p.add_argument(
        "--eval-batch",
        type=int,
        default=20,
        help="questions per /v1/answer/batch request (each must finish within POLICY_REQUEST_TIMEOUT_S)",
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
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not every poll of a job
    if args.command == "plot":
        for name in COMMANDS:
            if (found := args.out / f"{name}.json").exists():
                drawn = plot(json.loads(found.read_text()), found.with_suffix(".png"))
                print(drawn or f"{found}: nothing to plot")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with campaign(args) as run:
        result = COMMANDS[args.command](args, run)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    result["threads"] = args.threads
    (args.out / f"{args.command}.json").write_text(json.dumps(result, indent=1))
    if drawn := plot(result, args.out / f"{args.command}.png"):
        log.info("plot: %s", drawn)
    print(json.dumps({k: v for k, v in result.items() if k != "reward_curve"}, indent=1))


if __name__ == "__main__":
    main()
