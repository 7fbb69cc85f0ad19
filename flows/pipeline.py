"""``pipeline``: the whole story of a run, end to end, resumable by run id.

    prepare_data -> build_index -> evaluate (baselines, untrained model) -> warm_start (SFT)
      -> evaluate (the SFT checkpoint) -> headroom (pass@1 / pass@k of the warm start on dev)
      -> train (RL in segments, curriculum between them) -> evaluate (final checkpoint) -> summary

With ``corpus`` (a collection ``hoprl ingest-corpus`` made), build_index is skipped and every job
and evaluation searches the corpus: the open-domain setting.

Every phase runs the run's one episode shape (:func:`run_shape`, stored in its registry config as
``episode``).

Each stage is a Prefect (sub)flow, so the Prefect UI shows the run as this chain, with the report
and the plots as artifacts. The registry run (``runs`` row, id ``run_id``) is created first and
linked to the flow run; every stage that finishes leaves a mark in the registry (see
:mod:`flows.runs`), so ``pipeline(run_id="same-id")`` after a crash skips the finished stages,
resumes training from the latest checkpoint and writes no episode twice.

The services are those named by ``HOPRL_*_URL`` (compose), else local processes started for the
run (:func:`flows.stack.services`). Start it from Python, ``hoprl pipeline``, or a deployment
(``prefect deployment run pipeline/pipeline -p recipe=evo-rag``, see infra/prefect/README.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows import progress
from flows.data import build_index, prepare_data
from flows.evaluate import evaluate, evaluate_protocol
from flows.report import publish_report
from flows.runs import done, link_flow_run, mark, registry, run_dir
from flows.spec import RunSpec
from flows.stack import ServiceUrls, services
from flows.training import headroom, serve_checkpoint, train, warm_start
from hoprl.domain import EpisodeShape
from hoprl.generation.model import resolve_model
from hoprl.jobspec import job_episode_shape, preset_recipe_config
from hoprl.recipes import get_recipe
from hoprl.schemas.trainer import Preset

MODEL_CACHE = Path(
    ".hoprl/models/smollm2-135m-instruct"
)  # the services' default (POLICY_/TRAINER_MODEL_CACHE)


def once(
    run_id: str, stage: str, produce: Callable[[], dict[str, Any]], id_key: str | None = None
) -> dict[str, Any]:
    """``produce()`` unless ``stage`` finished for this run; its result kept in ``<run>/stages/``."""
    path = run_dir(run_id) / "stages" / f"{stage.replace('/', '-')}.json"
    if done(run_id, stage) is not None and path.is_file():
        get_run_logger().info("stage %s: finished earlier, skipped", stage)
        return dict(json.loads(path.read_text()))
    with progress.stage(stage):
        result = produce()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    mark(run_id, stage, float(result[id_key]) if id_key else 1.0)
    return result


def job_hyperparameters(
    recipe: str,
    steps: int,
    hyperparameters: dict[str, Any] | None,
    recipe_config: dict[str, Any] | None,
    preset: str = "paper",
) -> dict[str, Any]:
    """The hyperparameters of every trainer request of a run (:func:`job_request`)."""
    config = {**preset_recipe_config(preset, recipe), **(recipe_config or {})}
    if recipe == "when-to-search":
        config.setdefault("switch_step", max(1, steps // 2))  # stage 2 for the second half
    return {"preset": preset, **(hyperparameters or {}), "recipe_config": config}


def run_shape(recipe: str, objective: str, hp: dict[str, Any]) -> EpisodeShape:
    """The episode shape of a pipeline's run (``hp``: :func:`job_hyperparameters`), stored in its
    registry config as ``episode``: the shape its trainer jobs resolve (:func:`hoprl.jobspec.
    job_episode_shape`, read alike by the rollouts, the dev checks and the local policy's
    /v1/answer) with the recipe's documents per search and stop texts written out. Training samples
    at its temperature; dev checks and evaluations decode it greedily (:meth:`EpisodeShape.greedy`)."""
    request = {"recipe": recipe, "objective": objective, "hyperparameters": hp}
    agent = get_recipe(recipe, **hp["recipe_config"])
    return job_episode_shape(request).model_copy(update={"top_k": agent.top_k, "stop": tuple(agent.stop)})


def job_request(
    recipe: str, objective: str, dataset: str, data: dict[str, Any], collection: str, seed: int,
    hp: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The trainer request every segment shares (``hp``: :func:`job_hyperparameters`). A JSONL dataset
    and a paper's training set (``paper:<recipe>[:<folder>]``) are trained on their prepared train
    split; ``synthetic`` and hub names are loaded by the trainer itself (with the synthetic world's
    expert hops for SFT).

    The preset in ``hp`` goes to the trainer, which resolves the sizes it stands for (``cpu``:
    :data:`hoprl.jobspec.CPU_PRESET`); hyperparameters set there win over it. The recipe config a
    preset scales (EVO-RAG's ``t_max``) is written into the request, so the flow's curriculum and
    dev checks read the config the trainer trains with.
    """
    hp = {"max_train_questions": data["counts"]["train"], **hp}
    prepared = data["source"].endswith(".jsonl") or data["source"].startswith("paper:")
    source = data["paths"]["train"] if prepared else dataset
    return {
        "recipe": recipe,
        "objective": objective,
        "dataset": source,
        "collection": collection,
        "seed": seed,
        "hyperparameters": hp,
    }


def evaluations(
    run_id: str,
    urls: ServiceUrls,
    data: dict[str, Any],
    collection: str,
    recipe: str,
    baselines: tuple[str, ...],
    limit: int | None,
    shape: EpisodeShape,
    recipe_config: dict[str, Any],
    corpus: bool = False,
) -> dict[str, dict[str, Any]]:
    """The untrained policy on the test split: the run's recipe (``baseline``) and each baseline
    recipe, all in the run's episode ``shape`` (the baselines with their own documents a search);
    ``corpus``: ``collection`` is a corpus (the open-domain setting)."""
    out = {}
    for label, name in [("baseline", recipe)] + [(f"baseline/{b}", b) for b in baselines if b != recipe]:

        def run(label: str = label, name: str = name) -> dict[str, Any]:
            return evaluate(
                run_id,
                label,
                data["paths"]["test"],
                collection,
                name,
                urls.policy,
                urls.retriever,
                urls.judge,
                dataset=data["name"],
                limit=limit,
                shape=shape if name == recipe else shape.model_copy(update={"top_k": None, "stop": None}),
                recipe_config=recipe_config if name == recipe else None,
                corpus=corpus,
            )

        out[label] = once(run_id, f"eval/{label}", run, "evaluation_id")
    return out


def evaluate_checkpoint(
    run_id: str,
    label: str,
    checkpoint: dict[str, Any],
    urls: ServiceUrls,
    data: dict[str, Any],
    collection: str,
    recipe: str,
    limit: int | None,
    shape: EpisodeShape,
    recipe_config: dict[str, Any],
    corpus: bool = False,
    concurrency: int = 4,
) -> dict[str, Any]:
    """Serve ``checkpoint`` and evaluate it on the test split as ``label`` (once per run), in ``shape``
    (``corpus``: ``collection`` is a corpus, the open-domain setting; ``concurrency``: requests in
    flight, :func:`flows.evaluate.evaluate`)."""

    def run() -> dict[str, Any]:
        serve_checkpoint(urls.policy, checkpoint["path"])
        return evaluate(
            run_id,
            label,
            data["paths"]["test"],
            collection,
            recipe,
            urls.policy,
            urls.retriever,
            urls.judge,
            dataset=data["name"],
            limit=limit,
            checkpoint_id=checkpoint["checkpoint_id"],
            shape=shape,
            recipe_config=recipe_config,
            corpus=corpus,
            concurrency=concurrency,
        )

    return once(run_id, f"eval/{label}", run, "evaluation_id")


#: the before/after figures of a run's summary: ``em_scored`` is the EM the report heads with (what
#: the recipe can act on: answerable questions for a recipe without a refusal action), ``em`` over all
SUMMARY_METRICS = ("em_scored", "em", "f1", "judge_accuracy", "retrieval_count")


def summary_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """An evaluation's :data:`SUMMARY_METRICS` (a stage stored before ``em_scored`` existed: its EM)."""
    return {k: metrics.get(k, metrics["em"]) if k == "em_scored" else metrics[k] for k in SUMMARY_METRICS}


def summary(
    run_id: str, before: dict[str, Any], after: dict[str, Any], final: dict[str, Any], collection: str
) -> dict[str, Any]:
    folder = run_dir(run_id)
    return {
        "run_id": run_id,
        "recipe": registry().get_run(run_id).recipe,  # type: ignore[union-attr]
        "before": summary_metrics(before["metrics"]),
        "after": summary_metrics(after["metrics"]),
        "report": str(folder / "report.md"),
        "plots": [str(p) for p in sorted(folder.glob("*.png"))],
        "checkpoint": final["path"],
        "collection": collection,
        "prefect_flow_run_id": registry().get_run(run_id).prefect_flow_run_id,  # type: ignore[union-attr]
    }


@flow(name="pipeline")
def pipeline(
    recipe: str = "when-to-search",
    objective: str | None = None,
    model: str | None = None,
    dataset: str = "synthetic",
    steps: int = 200,
    run_id: str | None = None,
    sft_steps: int = 20,
    segments: int = 4,
    eval_limit: int | None = 50,
    dev_limit: int = 16,
    baselines: list[str] | None = None,
    seed: int = 0,
    limit: int | None = None,
    hyperparameters: dict[str, Any] | None = None,
    recipe_config: dict[str, Any] | None = None,
    preset: Preset = "paper",
    protocol: str | None = None,
    data_dir: str = "../shared/data",
    corpus: str | None = None,
) -> dict[str, Any]:
    """Train ``model`` on ``dataset`` with ``recipe`` and report it against the untrained model.

    Args:
        recipe: when-to-search (two stages), evo-rag, r2ag, eval-rar, arena, search-r1, ...
        objective: grpo, dapo, dr_grpo (RL segments; the warm start is always SFT); None = the
            recipe's paper objective (dapo for r2ag and when-to-search, else grpo).
        model: HF id or folder; None = the bundled SmolLM2-135M-Instruct.
        dataset: ``synthetic[:SEED[:MAX_HOPS[:TEST]]]``, a common-schema JSONL path, or a hub name.
        steps: RL optimizer steps in all; ``segments`` jobs of ``steps / segments`` each.
        run_id: the registry run; the same id again resumes it. Default: a new id.
        sft_steps: SFT warm-start steps (0: start RL from ``model``).
        eval_limit / dev_limit: test questions per evaluation / dev questions per curriculum check.
        baselines: recipes evaluated on the untrained model besides ``recipe`` (default naive-rag).
        limit: at most this many questions per split (quick runs; training uses the same cap).
        hyperparameters / recipe_config: trainer hyperparameters and recipe config overrides.
        preset: ``paper`` (the papers' training settings) or ``cpu`` (their sizes scaled down to two
            CPU cores: ``make run``, ``hoprl pipeline --small``); hyperparameters set here win.
        protocol: after the final evaluation, also run this paper's evaluation on the trained policy
            (:func:`flows.evaluate.evaluate_protocol`: its sets found in ``data_dir``, ``eval_limit``
            questions each, its step cap and decoding; the report shows the paper's figures).
        corpus: a corpus collection (``hoprl ingest-corpus``, a Wikipedia dump) that the jobs and
            every evaluation search instead of the dataset's own paragraphs, which are then not
            indexed (the open-domain setting); retrieval metrics find the gold paragraphs in it by
            title and text (:func:`hoprl.evaluation.corpus_gold`).

    Returns the summary: EM / F1 / judge / retrievals before and after, report and plot paths,
    the final checkpoint and the collection it searches.
    """
    spec = RunSpec(
        recipe=recipe, objective=objective, model=model, dataset=dataset, steps=steps, sft_steps=sft_steps,
        segments=segments, eval_limit=eval_limit, dev_limit=dev_limit, baselines=tuple(baselines or ()),
        seed=seed, limit=limit, hyperparameters=hyperparameters or {}, recipe_config=recipe_config or {},
        preset=preset, protocol=protocol, data_dir=data_dir, corpus=corpus,
    )  # fmt: skip
    run_id = run_id or f"{spec.recipe}-{uuid.uuid4().hex[:8]}"
    hp = job_hyperparameters(spec.recipe, spec.steps, spec.hyperparameters, spec.recipe_config, spec.preset)
    shape = run_shape(spec.recipe, spec.trained_objective, hp)
    reg, log = registry(), get_run_logger()
    config = {**spec.model_dump(mode="json"), "episode": shape.model_dump(mode="json")}
    reg.create_run(run_id, spec.recipe, spec.trained_objective, spec.model or "default", config, spec.seed)
    link_flow_run(run_id)
    reg.set_run_status(run_id, "running")
    log.info("run %s (folder %s), episode shape %s", run_id, run_dir(run_id), shape)
    try:
        with services(run_dir(run_id), spec.model, shape) as urls:
            result = stages(run_id, spec, hp, shape.greedy(), urls)
    except BaseException as exc:
        reg.set_run_status(run_id, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    reg.set_run_status(run_id, "succeeded")
    return result


def stages(
    run_id: str, spec: RunSpec, hp: dict[str, Any], greedy: EpisodeShape, urls: ServiceUrls
) -> dict[str, Any]:
    """The pipeline's stages in order (each skipped when the registry says it finished); every
    evaluation answers in the run's episode shape, decoded greedily (``greedy``)."""
    recipe, seed, eval_limit = spec.recipe, spec.seed, spec.eval_limit
    data = once(
        run_id, "prepare_data", lambda: prepare_data(spec.dataset, run_id, seed, spec.limit), "dataset_id"
    )
    if spec.corpus:  # the open-domain setting: the corpus stands in for the dataset's paragraphs
        collection, open_domain = spec.corpus, True
    else:
        index = once(run_id, "build_index", lambda: build_index(run_id, data, urls.retriever), "index_id")
        collection, open_domain = index["collection"], False
    config = hp["recipe_config"]  # the recipe as its jobs train it: evaluations ask the model alike
    evals = evaluations(
        run_id, urls, data, collection, recipe, spec.baselines, eval_limit, greedy, config, open_domain
    )
    request = job_request(recipe, spec.trained_objective, spec.dataset, data, collection, seed, hp)
    if spec.sft_steps > 0:
        with progress.stage("warm_start", steps=spec.sft_steps):
            sft = warm_start(run_id, {**request, "model": spec.model, "steps": spec.sft_steps}, urls)
        # what the RL steps start from
        evaluate_checkpoint(
            run_id, "sft", sft, urls, data, collection, recipe, eval_limit, greedy, config, open_domain
        )
    else:  # RL starts from the model itself, registered as the run's step-0 checkpoint
        registry().add_checkpoint(run_id, 0, resolve_model(spec.model, MODEL_CACHE), {"objective": "base"})
    dev = {"path": data["paths"]["dev"], "limit": spec.dev_limit}
    if spec.steps > 0:  # what RL can reach from the warm start: in the report before its steps
        once(run_id, "headroom", lambda: headroom(run_id, request, dev, urls))
    with progress.stage("train", steps=spec.steps, segments=spec.segments):
        # the last checkpoint is evaluated on test right below: no dev check of it
        final = train(run_id, request, spec.steps, spec.segments, dev, urls, check_last=False)
    after = evaluate_checkpoint(
        run_id, "final", final, urls, data, collection, recipe, eval_limit, greedy, config, open_domain
    )
    if spec.protocol:
        protocol, data_dir = spec.protocol, spec.data_dir
        once(
            run_id,
            "eval/protocol",
            lambda: evaluate_protocol(
                run_id,
                protocol,
                urls.policy,
                urls.retriever,
                urls.judge,
                data_dir,
                limit=eval_limit,
                checkpoint_id=final["checkpoint_id"],
                seed=seed,
                corpus=spec.corpus,
            ),
        )
    mark(run_id, "done")
    publish_report(run_id)  # on this flow run too when every stage was skipped (a resumed run)
    return summary(run_id, evals["baseline"], after, final, collection)
