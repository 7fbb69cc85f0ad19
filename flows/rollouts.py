"""``collect_rollouts`` and ``score_rewards``: episodes of the served policy, and what they scored.

``collect_rollouts`` sends one Celery ``rollout_episode`` unit per (question, sample) through
:func:`flows.fanout.fan_out`; each unit runs the recipe's agent loop against the policy and the
retriever, scores it with the recipe's reward functions and stores it in the registry keyed by
(run, step, question, sample). Units already stored are not sent again, and a unit delivered
twice writes once, so collecting the same step again (a resumed pipeline) adds no duplicates.

``score_rewards`` reads a step's stored episodes back and turns them into the step's metrics:
the mean of every reward signal and of the total (the *return*), exact match of the final
answers, the judge's accuracy (one ``judge_item`` unit per answer), retrieval count and the
share of gold titles the agent retrieved, and the shares of episodes that ended on an answer or
were cut by the token budget, a format error or the step cap (``ended/*``). The pipeline uses the
pair on the dev split between training segments::

    collect_rollouts(run_id, 40, dev_path, collection, "when-to-search", urls.policy, urls.retriever,
                     shape=job_episode_shape(request).greedy())
    score_rewards(run_id, 40, urls.judge, prefix="dev")   # {"dev/return": ..., "dev/em": ...}

:func:`headroom_metrics` reads a step of ``k`` sampled episodes per question instead: pass@1 and
pass@k of the answers, and the share of groups whose rewards have no spread (the before-RL
headroom, :func:`flows.training.headroom`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prefect import flow, get_run_logger, task

from flows.fanout import fan_out, judge_item, rollout_episode
from flows.runs import registry
from hoprl.data.jsonl import load_questions
from hoprl.domain import Episode, EpisodeShape, ended_shares
from hoprl.metrics.answer import exact_match
from hoprl.metrics.sampling import mean_pass_at_k

#: rollouts in flight without a broker: a local policy's POLICY_MAX_BATCH, the episodes it decodes at once
ROLLOUT_THREADS = 16


@task
def send_rollouts(
    run_id: str,
    step: int,
    questions_path: str,
    collection: str,
    recipe: str,
    policy_url: str,
    retriever_url: str,
    limit: int | None,
    samples: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    """One unit per (question, sample) not yet stored at (run, step); returns counts."""
    questions = load_questions(questions_path, limit)
    stored = {(e.question_id, e.sample) for e in registry().episodes(run_id, step)}
    units = [
        rollout_episode.s(
            run_id, step, q.model_dump(), sample, recipe, collection, policy_url, retriever_url, options
        )
        for q in questions
        for sample in range(samples)
        if (q.id, sample) not in stored
    ]
    summaries = fan_out(units, description=f"rollouts {run_id} step {step}", threads=ROLLOUT_THREADS)
    return {"sent": len(units), "written": sum(s["written"] for s in summaries), "skipped": len(stored)}


@flow(name="collect_rollouts")
def collect_rollouts(
    run_id: str,
    step: int,
    questions_path: str,
    collection: str,
    recipe: str,
    policy_url: str,
    retriever_url: str,
    limit: int | None = None,
    samples: int = 1,
    options: dict[str, Any] | None = None,
    shape: EpisodeShape | None = None,
) -> dict[str, Any]:
    """Roll the served policy out on ``questions_path[:limit]``, ``samples`` episodes per question.

    Args:
        shape: the run's episode shape, required: never a default of this flow's own (the dev
            checks pass the trainer's, greedy: :func:`flows.training.dev_check`).
        options: the other :class:`hoprl.agent.runner.RunOptions` fields (``seed``, ``top_p``) plus
            ``model`` (the served model id) and ``recipe_config`` (e.g. the curriculum stage).

    Returns ``{"sent", "written", "skipped"}``: units sent, episodes newly stored, already stored.
    """
    if shape is None:
        raise ValueError("collect_rollouts needs the run's episode shape (hoprl.jobspec.episode_shape)")
    counts = send_rollouts(
        run_id,
        step,
        questions_path,
        collection,
        recipe,
        policy_url,
        retriever_url,
        limit,
        samples,
        {**(options or {}), "shape": EpisodeShape.model_validate(shape).model_dump(mode="json")},
    )
    get_run_logger().info("run %s step %d: %s", run_id, step, counts)
    return counts


def judge_units(run_id: str, step: int, episodes: list[Episode], judge_url: str) -> list[Any]:
    """One ``judge_item`` unit per answered episode of an answerable question."""
    return [
        judge_item.s(
            run_id,
            f"{step}:{e.question_id}:{e.sample}",
            "answer",
            {"question": e.question, "prediction": e.final_answer, "references": e.answers},
            judge_url,
        )
        for e in episodes
        if e.answers and e.final_answer
    ]


def item_key(item_id: str) -> tuple[str, int]:
    """``"<step>:<question id>:<sample>"`` -> (question id, sample); question ids may hold ':'."""
    question_id, sample = item_id.split(":", 1)[1].rsplit(":", 1)
    return question_id, int(sample)


def title_recall(episode: Episode) -> float | None:
    """Share of the gold titles the agent retrieved (None without gold titles)."""
    gold = set(episode.gold_titles)
    return len(gold.intersection(episode.retrieved_titles)) / len(gold) if gold else None


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@task
def episode_metrics(run_id: str, step: int, judge_url: str, prefix: str) -> dict[str, float]:
    """Means over the step's stored episodes: reward signals, return, EM, judge, retrievals, recall."""
    rows = registry().episodes(run_id, step)
    if not rows:
        raise ValueError(f"run {run_id!r} has no episodes at step {step}; collect_rollouts first")
    episodes = [Episode.model_validate(r.trajectory) for r in rows]
    verdicts = {
        item_key(v["item_id"]): v["verdict"]
        for v in fan_out(judge_units(run_id, step, episodes, judge_url), description="judging")
    }
    signals: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for name, value in r.rewards.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                signals[name].append(float(value))
    # An unanswerable question is answered correctly by refusing it.
    judged = [verdicts.get((e.question_id, e.sample), False) if e.answers else e.refused for e in episodes]
    recalls = [r for r in map(title_recall, episodes) if r is not None]
    metrics = {f"reward/{name}": mean(values) for name, values in signals.items()}
    metrics |= {
        "return": mean([r.total_reward for r in rows]),
        "em": mean([exact_match(e.final_answer or "", e.answers) for e in episodes if e.answers]),
        "judge_accuracy": mean([float(j) for j in judged]),
        "retrieval_count": mean([float(e.retrieval_count) for e in episodes]),
        "title_recall": mean(recalls),
        "episodes": float(len(episodes)),
        **ended_shares([e.outcome for e in episodes]),
    }
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


@flow(name="score_rewards")
def score_rewards(run_id: str, step: int, judge_url: str, prefix: str = "rollouts") -> dict[str, float]:
    """Score the stored episodes of (run, step) and log the means as the run's metrics at ``step``.

    The recipe's reward signals were computed when each episode was stored (with their versions
    in the names, e.g. ``when-to-search/answer@1``); this adds the judge's verdicts on the final
    answers and aggregates. Returns the logged metrics, each named ``<prefix>/<metric>``.
    """
    metrics = episode_metrics(run_id, step, judge_url, prefix)
    registry().log_metrics(run_id, step, metrics)
    get_run_logger().info(
        "run %s step %d: return %.3f, EM %.3f, judge %.3f, cut by token budget %.2f / format error %.2f",
        run_id,
        step,
        metrics[f"{prefix}/return"],
        metrics[f"{prefix}/em"],
        metrics[f"{prefix}/judge_accuracy"],
        metrics[f"{prefix}/ended/token_budget"],
        metrics[f"{prefix}/ended/format_error"],
    )
    return metrics


def headroom_metrics(run_id: str, step: int, k: int) -> dict[str, float]:
    """pass@1 and pass@``k`` (EM of the final answer, over the answerable questions), the mean
    total reward, and the share of questions whose samples' rewards have no spread
    (``frac_reward_zero_std``: groups an RL step gets no gradient from), over the stored episodes
    of (run, step), each question's samples a group."""
    groups: dict[str, list[tuple[Episode, float]]] = defaultdict(list)
    for r in registry().episodes(run_id, step):
        groups[r.question_id].append((Episode.model_validate(r.trajectory), r.total_reward))
    if not groups:
        raise ValueError(f"run {run_id!r} has no episodes at step {step}; collect_rollouts first")
    right = [
        [exact_match(e.final_answer or "", e.answers) > 0 for e, _ in group]
        for group in groups.values()
        if group[0][0].answers
    ]
    totals = [[total for _, total in group] for group in groups.values()]
    return {
        "pass@1": mean_pass_at_k(right, 1),
        "pass@k": mean_pass_at_k(right, min([k, *map(len, right)])),
        "k": float(k),
        "questions": float(len(right)),
        "reward": mean([t for group in totals for t in group]),
        "frac_reward_zero_std": mean([float(max(g) == min(g)) for g in totals]),
    }
