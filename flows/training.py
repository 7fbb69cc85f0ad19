"""``warm_start`` and ``train``: trainer jobs in segments, with the curriculum decided between them.

Training is cut into segments of ``steps / segments`` optimizer steps. Each segment is one job of
the trainer service (``POST /v1/jobs``) that starts from the previous segment's checkpoint; the
SFT warm start is segment zero. Between two segments the flow

1. registers the segment's checkpoint on the pipeline run at its global step;
2. copies the job's training signals (:data:`COPIED_METRICS`, :data:`COPIED_PREFIXES`: reward and
   its spread, the reward components, the share of flat groups, the clip fractions, the KL to the
   warm start, entropy, gradient norm, how the episodes ended, searches, answer length, loss) and
   its judge counts (``judge/*``: who decided the reward's verdicts, the fallbacks) into the run's
   metrics as ``train/<name>`` at global steps;
3. checks the policy on dev (after the last RL segment too, unless ``check_last=False``, as the
   pipeline sets it: its final evaluation follows): serves the checkpoint
   (``POST /v1/admin/checkpoint``), rolls out the dev questions greedily in the trainer's episode
   shape (:func:`dev_shape`, :func:`flows.rollouts.collect_rollouts`) and scores them
   (:func:`flows.rollouts.score_rewards`): ``dev/return``, ``dev/em``, ...;
4. feeds the check to the recipe's own curriculum (when-to-search: switch at ``switch_step`` or
   on a plateau of the dev return; EVO-RAG: a plateau of the dev return's EMA), logs
   ``curriculum/stage`` and, when the rule fires, records the switch in the registry
   (``record_stage_switch``) and in the flow's log. The next segment trains in the new stage.

The warm start's job copies its curves as ``sft/<name>`` (:data:`SFT_METRICS`: the loss per SFT
step, ...). Before the first RL segment :func:`headroom` measures what RL can reach from the warm
start: pass@1 and pass@k of ``k`` sampled episodes per dev question (``k`` the group size, at the
training temperature, in the training episode shape), as ``headroom/*`` at step 0.

**Resuming.** Every decision is rebuilt from the registry: a segment whose checkpoint is
registered is not trained again, a check whose ``dev/em`` is logged is not rolled out again, and
the curriculum replays the logged dev returns. A segment killed midway is resumed from its job's
latest checkpoint: the segment's job id is kept in ``<run folder>/jobs/segments.json``.

A stage-2 segment of when-to-search is a job with ``switch_step=0``, whose curriculum starts in
stage 2 (:class:`hoprl.recipes.when_to_search.Curriculum`): its first step trains on stage-2
rewards, so even a one-step segment trains in stage 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.states import State

from flows.progress import watch_job
from flows.rollouts import collect_rollouts, headroom_metrics, score_rewards
from flows.runs import registry, run_dir
from flows.stack import ServiceUrls, admin_token
from hoprl.clients.policy import PolicyClient
from hoprl.clients.trainer import TrainerClient
from hoprl.domain import EpisodeShape
from hoprl.jobspec import job_episode_shape, resolve
from hoprl.recipes import get_recipe
from hoprl.schemas.trainer import JobRequest

#: an RL job's per-step signals copied to the run as ``train/<name>`` (hoprl.training.signals)
COPIED_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "answers_flat", "loss", "kl", "entropy",
                  "grad_norm", "searches", "answer_tokens", "step_time", "rollout_s")  # fmt: skip
#: reward components; how the episodes ended; judge counts; importance-ratio clipping; the KL to the
#: warm start; TRL's completion lengths (and its clipped share, recomputed from the episodes); the
#: groups dynamic sampling refilled or kept flat; where the rollouts' time went (prefill, decoding);
#: the share of right answers per question type
COPIED_PREFIXES = ("rewards/", "ended/", "judge/", "clip_ratio/", "warm_start_kl/", "completions/",
                   "dynamic/", "rollout/", "correct/")  # fmt: skip
#: the warm start's per-step curves, copied as ``sft/<name>``
SFT_METRICS = ("loss", "grad_norm", "mean_token_accuracy", "entropy", "learning_rate")
#: where the headroom's sampled dev episodes are stored: apart from the greedy dev checks (their
#: global steps, 0 included)
HEADROOM_STEP = -1
NEVER_SWITCH = 10**9


def boundaries(steps: int, segments: int) -> list[int]:
    """Global steps at which segments end: ``boundaries(10, 3) == [4, 7, 10]``."""
    segments = max(1, min(segments, steps))
    return [round(steps * (i + 1) / segments) for i in range(segments)]


def stage_name(stage: Any) -> str:
    """The trainer's naming: ``stage1`` for when-to-search's int stages, EVO-RAG's names as they are."""
    return f"stage{stage}" if isinstance(stage, int) else str(stage)


def stage_config(recipe: str, stage: Any) -> dict[str, Any]:
    """Recipe config that makes a trainer job train in ``stage`` (when-to-search only)."""
    if recipe != "when-to-search":
        return {}
    return {"curriculum": "steps", "switch_step": 0 if stage == 2 else NEVER_SWITCH}


def check(curriculum: Any, recipe: str, step: int, dev_return: float) -> str | None:
    """Feed one dev check to the recipe's curriculum; the switch's reason if it switched now."""
    # EVO-RAG's rule reads only the dev return; when-to-search's also the step (its "steps" mode)
    fired = curriculum.update(dev_return) if recipe == "evo-rag" else curriculum.update(step, dev_return)
    if not fired:
        return None
    if getattr(curriculum, "mode", "plateau") == "steps":
        return f"step {step} >= switch_step {curriculum.switch_step}"
    return f"dev return EMA improved < {curriculum.eps} for {curriculum.patience} checks"


class SegmentJobs:
    """The trainer job of each segment, in ``<run folder>/jobs/segments.json`` (resume aid)."""

    def __init__(self, run_id: str) -> None:
        self.path = run_dir(run_id) / "jobs" / "segments.json"

    def get(self, step: int) -> str | None:
        jobs = json.loads(self.path.read_text()) if self.path.is_file() else {}
        return jobs.get(str(step))

    def set(self, step: int, job_id: str) -> None:
        jobs = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({**jobs, str(step): job_id}, indent=1))


class TrainerJobFailed(RuntimeError):
    """A trainer job that ended failed or cancelled.

    The trainer has already relaunched its worker as often as it will (``services/trainer/queue.py``),
    so running the task again would repeat the failure (a worker the OOM killer ends, ended again);
    running the pipeline again with the same run id resumes the job from its latest checkpoint.
    """


def unless_the_job_failed(task: object, task_run: object, state: State) -> bool:
    """Prefect's ``retry_condition_fn``: retry a lost connection or a timeout, not a failed job."""
    return not isinstance(state.data, TrainerJobFailed)


@task(retries=2, retry_delay_seconds=10, retry_condition_fn=unless_the_job_failed)
def run_job(run_id: str, end_step: int, request: dict[str, Any], trainer_url: str) -> dict[str, Any]:
    """Run one trainer job to completion (or resume the segment's earlier job); its final checkpoint.

    An earlier job for this segment that succeeded is reused, one still queued or running is
    waited for, and one that failed or was cancelled is resumed from its latest checkpoint. The
    wait logs the job's progress (:func:`flows.progress.watch_job`). A job that ends failed raises
    :class:`TrainerJobFailed`, which the task does not retry; a lost connection is retried.
    """
    jobs, log = SegmentJobs(run_id), get_run_logger()
    with TrainerClient(trainer_url) as client:
        earlier = jobs.get(end_step)
        job = client.get(earlier) if earlier else None
        if job is None or job.status in ("failed", "cancelled"):
            resume = {"resume_from": job.id} if job is not None and job.checkpoints else {}
            job_id = client.submit({**request, **resume}).id
            jobs.set(end_step, job_id)
            log.info("segment ending at step %d: trainer job %s (%s)", end_step, job_id, request["objective"])
        else:
            job_id = job.id
            log.info("segment ending at step %d: resuming the wait for job %s", end_step, job_id)
        label = "warm start" if request["objective"] == "sft" else f"segment to step {end_step}"
        job = watch_job(client, job_id, label)
    if job.status != "succeeded" or not job.checkpoints:
        raise TrainerJobFailed(f"trainer job {job_id} ended {job.status}: {job.error}; see its worker.log")
    return {"job_id": job_id, "path": job.checkpoints[-1].path, "steps": job.step}


def copy_curves(run_id: str, job_id: str, offset: int, names: tuple[str, ...] = COPIED_METRICS,
                prefixes: tuple[str, ...] = COPIED_PREFIXES, into: str = "train/") -> None:  # fmt: skip
    """The job's per-step metrics ``names`` (and those starting with ``prefixes``) as the run's
    ``<into><name>`` at global steps (the job's step + ``offset``)."""
    reg = registry()
    copied = [n for n in reg.latest_metrics(job_id) if n in names or n.startswith(prefixes)]
    by_step: dict[int, dict[str, float]] = {}
    for name in copied:
        for step, value in reg.metric_series(job_id, name):
            by_step.setdefault(offset + step, {})[f"{into}{name}"] = value
    for step, metrics in by_step.items():
        reg.log_metrics(run_id, step, metrics)


@task(retries=2, retry_delay_seconds=5)
def serve_checkpoint(policy_url: str, path: str) -> str:
    """Make the policy serve checkpoint ``path``; returns the model id it now reports."""
    with PolicyClient(policy_url, admin_token=admin_token(policy_url)) as client:
        client.switch_checkpoint(path)
        return client.model()


def checkpoint_at(run_id: str, step: int) -> Any:
    return next((c for c in registry().checkpoints(run_id) if c.step == step), None)


@flow(name="warm_start")
def warm_start(run_id: str, request: dict[str, Any], urls: ServiceUrls) -> dict[str, Any]:
    """SFT on the recipe's expert trajectories, registered as the run's checkpoint at step 0."""
    done = checkpoint_at(run_id, 0)
    if done is not None:
        get_run_logger().info("warm start already done: %s", done.path)
        return {"checkpoint_id": done.id, "path": done.path, "step": 0}
    job = run_job(run_id, 0, {**request, "objective": "sft"}, urls.trainer)
    copy_curves(run_id, job["job_id"], 0, names=SFT_METRICS, prefixes=(), into="sft/")
    row = registry().add_checkpoint(run_id, 0, job["path"], {"job_id": job["job_id"], "objective": "sft"})
    return {"checkpoint_id": row.id, "path": row.path, "step": 0}


def dev_shape(request: dict[str, Any]) -> EpisodeShape:
    """A dev check's episode shape: the trainer's for ``request`` (the function its rollouts read,
    :func:`hoprl.jobspec.job_episode_shape`), decoded greedily."""
    return job_episode_shape(request).greedy()


def dev_options(request: dict[str, Any], stage: Any, model: str) -> dict[str, Any]:
    """A dev check's model and recipe config, in curriculum ``stage`` (its shape: the trainer's,
    greedy, :func:`dev_check`)."""
    recipe_config = {
        **request["hyperparameters"].get("recipe_config", {}),
        **stage_config(request["recipe"], stage),
    }
    return {"model": model, "recipe_config": recipe_config}


def dev_check(
    run_id: str,
    step: int,
    path: str,
    request: dict[str, Any],
    stage: Any,
    dev: dict[str, Any],
    urls: ServiceUrls,
) -> float:
    """Roll out and score the dev questions with checkpoint ``path``; returns the dev return."""
    logged = dict(registry().metric_series(run_id, "dev/return"))
    if step not in logged:
        model = serve_checkpoint(urls.policy, path)
        collect_rollouts(
            run_id,
            step,
            dev["path"],
            request["collection"],
            request["recipe"],
            urls.policy,
            urls.retriever,
            limit=dev["limit"],
            options=dev_options(request, stage, model),
            shape=dev_shape(request),
        )
        logged[step] = score_rewards(run_id, step, urls.judge, prefix="dev")["dev/return"]
    return logged[step]


@flow(name="headroom")
def headroom(
    run_id: str, request: dict[str, Any], dev: dict[str, Any], urls: ServiceUrls
) -> dict[str, float]:
    """What RL can reach from the run's step-0 checkpoint (the warm start): ``k`` episodes per dev
    question (``k`` = the job's group size), sampled at the training temperature in the training
    episode shape, in the curriculum's first stage; pass@1, pass@k and the share of groups with no
    reward spread (:func:`flows.rollouts.headroom_metrics`), logged as ``headroom/*`` at step 0.

    Args:
        request: the RL segments' shared job request (:func:`train`'s).
        dev: ``{"path": dev JSONL, "limit": questions}``.
    """
    job = JobRequest.model_validate(request)
    k = resolve(job.hyperparameters, job.recipe, job.objective).num_generations
    config = request["hyperparameters"].get("recipe_config", {})
    curriculum = getattr(get_recipe(request["recipe"], **config), "curriculum", None)
    stage = curriculum.stage if curriculum is not None else None
    row = checkpoint_at(run_id, 0)
    if row is None:
        raise ValueError(f"run {run_id!r} has no checkpoint at step 0; run warm_start first")
    model = serve_checkpoint(urls.policy, row.path)
    shape = job_episode_shape(request)  # sampled, as the training rollouts
    options = {**dev_options(request, stage, model), "seed": request.get("seed", 0)}
    collect_rollouts(run_id, HEADROOM_STEP, dev["path"], request["collection"], request["recipe"],
                     urls.policy, urls.retriever, limit=dev["limit"], samples=k, options=options,
                     shape=shape)  # fmt: skip
    measured = headroom_metrics(run_id, HEADROOM_STEP, k)
    metrics = {f"headroom/{name}": value for name, value in measured.items()}
    metrics["headroom/temperature"] = shape.temperature
    registry().log_metrics(run_id, 0, metrics)
    get_run_logger().info(
        "headroom of the warm start on %d dev questions: pass@1 %.3f, pass@%d %.3f, groups without reward "
        "spread %.2f", metrics["headroom/questions"], metrics["headroom/pass@1"], k,
        metrics["headroom/pass@k"], metrics["headroom/frac_reward_zero_std"],
    )  # fmt: skip
    return metrics


def segment_request(request: dict[str, Any], path: str, steps: int, stage: Any) -> dict[str, Any]:
    """The job of one segment: from checkpoint ``path``, ``steps`` steps, in curriculum ``stage``."""
    hp = request["hyperparameters"]
    recipe_config = {**hp.get("recipe_config", {}), **stage_config(request["recipe"], stage)}
    return {
        **request,
        "model": path,
        "steps": steps,
        "hyperparameters": {**hp, "recipe_config": recipe_config},
    }


def advance_curriculum(run_id: str, curriculum: Any, recipe: str, step: int, dev_return: float) -> None:
    """One check of the curriculum: the stage in the metrics, a switch as a registry event and a log line."""
    reg, before = registry(), stage_name(curriculum.stage)
    reason = check(curriculum, recipe, step, dev_return)
    if reason is not None:
        after = stage_name(curriculum.stage)
        reg.record_stage_switch(run_id, step, before, after, reason, "dev_return", dev_return)
        get_run_logger().info("stage switch at step %d: %s -> %s (%s)", step, before, after, reason)
    reg.log_metrics(run_id, step, {"curriculum/stage": 1.0 if curriculum.stage in (1, "discovery") else 2.0})


@flow(name="train")
def train(
    run_id: str, request: dict[str, Any], steps: int, segments: int, dev: dict[str, Any], urls: ServiceUrls,
    check_last: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """RL training in segments, starting from the run's checkpoint at step 0 (the warm start).

    Args:
        request: the trainer job request shared by all segments (recipe, objective, dataset,
            collection, seed, hyperparameters); ``model`` and ``steps`` are set per segment.
        dev: ``{"path": dev JSONL, "limit": questions per check}``.
        check_last: check the last segment's checkpoint on dev too. The pipeline passes False: it
            evaluates that checkpoint on the test set at once, and no curriculum decision is left
            (the check took ~40 s of ``make run``). With ``steps=0`` the warm start is checked
            regardless.

    Returns the final checkpoint: ``{"checkpoint_id", "path", "step"}``.
    """
    reg, recipe = registry(), request["recipe"]
    config = request["hyperparameters"].get("recipe_config", {})
    curriculum = getattr(get_recipe(recipe, **config), "curriculum", None)
    row = checkpoint_at(run_id, 0)
    if row is None:
        raise ValueError(f"run {run_id!r} has no checkpoint at step 0; run warm_start first")
    if curriculum is not None and reg.current_stage(run_id) is None:
        reg.start_stage(run_id, stage_name(curriculum.stage), 0)
    previous = 0
    for end in boundaries(steps, segments):
        stage = curriculum.stage if curriculum is not None else None
        done = checkpoint_at(run_id, end)
        if done is None:
            job = run_job(
                run_id, end, segment_request(request, row.path, end - previous, stage), urls.trainer
            )
            copy_curves(run_id, job["job_id"], previous)
            done = reg.add_checkpoint(
                run_id, end, job["path"], {"job_id": job["job_id"], "stage": stage_name(stage)}
            )
        row, previous = done, end
        if end == steps > 0 and not check_last:  # steps = 0: the warm start is checked, as before
            get_run_logger().info("segment to step %d: %s (the last: no dev check)", end, Path(row.path).name)
            continue
        dev_return = dev_check(run_id, end, row.path, request, stage, dev, urls)
        if curriculum is not None:
            advance_curriculum(run_id, curriculum, recipe, end, dev_return)
        get_run_logger().info("segment to step %d: %s, dev return %.3f", end, Path(row.path).name, dev_return)
    return {"checkpoint_id": row.id, "path": row.path, "step": previous}
