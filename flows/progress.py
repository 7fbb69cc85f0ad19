"""Progress of the pipeline in its log: a line per stage, and a trainer job's step / total, ETA, reward.

``hoprl pipeline`` (``make run``) spends most of its time waiting for trainer jobs (the SFT warm
start, then the RL segments) that run in the trainer service's own worker processes, whose logs
are ``<run>/jobs/<job>/worker.log``. While the flow waits, :func:`watch_job` polls
``GET /v1/jobs/{id}`` and logs a line when the job reaches a new step (at most one every
``every_s`` seconds, and always the last), and :func:`stage` logs each pipeline stage as it starts
and ends. They go through the flow run's logger, so the same lines show in the terminal of
``hoprl pipeline``, in a Prefect worker's output and in the Prefect UI::

    stage warm_start: started
    sft job-3f2a (warm start) [----------] step 0/24 (0%), 0 s in
    sft job-3f2a (warm start) [----------] step 0/24 (0%), 1 min 00 s in
    sft job-3f2a (warm start) [#####-----] step 12/24 (50%), loss 1.234, 3.1 s/step, ETA 37 s
    sft job-3f2a (warm start) [##########] step 24/24 (100%), loss 0.871, succeeded
    stage warm_start: done in 1 min 50 s
    dapo job-9c1e (segment to step 1) [##########] step 1/1 (100%), reward 0.464 ± 0.712, loss 0.003,
        flat groups 0.50, KL to start 0, clipped 0.000, answered 0.88, succeeded

An RL step's line carries the signals that say whether RL is working (:data:`SIGNALS`): the
reward's spread, the share of groups with no reward spread, the KL to the warm start, the share of
clipped importance ratios and the share of episodes that answered.

A job that shows no new step for ``quiet_s`` seconds (loading the model, a slow first rollout)
gets a line anyway, with the time since the wait began, so the terminal is never silent for long.

Log lines rather than a live rich bar: Prefect's console handler writes the flow's other log
lines straight to stderr, which would tear a live bar drawn by the same process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from prefect import get_run_logger

from hoprl.clients.trainer import TERMINAL, TrainerClient
from hoprl.schemas.trainer import Job


def duration(seconds: float) -> str:
    """``37 s``, ``3 min 05 s``, ``1 h 02 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def bar(done: int, total: int, width: int = 10) -> str:
    """``[#####-----]`` for 12 of 24."""
    filled = min(width, round(width * done / total)) if total > 0 else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


#: an RL step's signals in its progress line: (metric, label, format)
SIGNALS = (
    ("frac_reward_zero_std", "flat groups", ".2f"),
    ("warm_start_kl/k3", "KL to start", ".3g"),
    ("clip_ratio/region_mean", "clipped", ".3f"),
    ("ended/answer", "answered", ".2f"),
)


def progress_line(job: Job, label: str, seconds_per_step: float | None, waited_s: float) -> str:
    """One line of a job's progress: step / total, its latest reward and loss, speed and ETA (or
    the time waited, before the speed is known)."""
    percent = round(100 * job.step / job.steps) if job.steps else 100
    head = f"{job.objective} {job.id} ({label}) {bar(job.step, job.steps)}"
    parts = [f"{head} step {job.step}/{job.steps} ({percent}%)"]
    parts += [f"{name} {job.metrics[name]:.3f}" for name in ("reward", "loss") if name in job.metrics]
    if "reward" in job.metrics and "reward_std" in job.metrics:
        parts[1] += f" ± {job.metrics['reward_std']:.3f}"
    parts += [f"{text} {job.metrics[name]:{spec}}" for name, text, spec in SIGNALS if name in job.metrics]
    right = [f"{k[8:]} {v:.2f}" for k, v in sorted(job.metrics.items()) if k.startswith("correct/")]
    parts += [f"right {' / '.join(right)}"] if right else []
    cut = [f"{name[6:]} {job.metrics[name]:.2f}" for name in ("ended/token_budget", "ended/format_error")
           if name in job.metrics]  # fmt: skip
    parts += [f"cut by {' / '.join(cut)}"] if cut else []
    if job.status in TERMINAL:
        parts.append(job.status)
    elif job.step >= job.steps:
        parts.append("saving")
    elif seconds_per_step is not None:
        eta = duration(seconds_per_step * (job.steps - job.step))
        parts.append(f"{seconds_per_step:.1f} s/step, ETA {eta}")
    else:
        parts.append(f"{duration(waited_s)} in")
    return ", ".join(parts)


def watch_job(
    client: TrainerClient,
    job_id: str,
    label: str,
    poll_s: float = 2.0,
    every_s: float = 5.0,
    quiet_s: float = 60.0,
    timeout_s: float = 24 * 3600,
    unreachable_s: float = 300.0,
) -> Job:
    """Wait until trainer job ``job_id`` ends (succeeded, failed or cancelled), logging its progress.

    Args:
        label: what the job is, for the log (``warm start``, ``segment to step 40``).
        every_s: at most one progress line this often (the last step is always logged).
        quiet_s: a line this long after the last one even without a new step.
        unreachable_s: how long the trainer may go without answering (a restart, a machine short of
            memory that answers after the client's timeout) before the wait gives up and raises
            the transport error; each miss is logged as a warning.

    The speed (and so the ETA) is measured from the first step this wait saw completed, so model
    loading and the steps of an earlier attempt (a resumed job) do not count.
    """
    log = get_run_logger()
    began = time.monotonic()
    deadline = began + timeout_s
    first: tuple[float, int] | None = None  # (when, step) of the first step change seen
    seen, logged, logged_at = -1, -1, 0.0
    silent_since: float | None = None  # when the trainer stopped answering, while it does not
    while True:
        try:
            job, now = client.get(job_id), time.monotonic()
        except httpx.TransportError as exc:
            now = time.monotonic()
            silent_since = now if silent_since is None else silent_since
            if now - silent_since > unreachable_s:
                raise
            log.warning("the trainer did not answer (%s); asking again", type(exc).__name__)
            time.sleep(poll_s)
            continue
        silent_since = None
        if seen >= 0 and job.step != seen and first is None:
            first = (now, job.step)
        rate = (now - first[0]) / (job.step - first[1]) if first and job.step > first[1] else None
        new_step = job.step != logged and now - logged_at >= every_s
        if job.status in TERMINAL or new_step or now - logged_at >= quiet_s:
            log.info("%s", progress_line(job, label, rate, now - began))
            logged, logged_at = job.step, now
        if job.status in TERMINAL:
            return job
        if now > deadline:
            raise TimeoutError(f"job {job_id} still {job.status} at step {job.step} after {timeout_s:.0f} s")
        seen = job.step
        time.sleep(poll_s)


def answers_line(label: str, done: int, total: int, em_sum: float, errors: int, elapsed_s: float) -> str:
    """One line of an evaluation's progress: questions answered / total, EM over those so far,
    failed questions (if any), seconds a question and ETA at the pace so far."""
    percent = round(100 * done / total) if total else 100
    parts = [f"{label} {bar(done, total)} {done}/{total} questions ({percent}%)"]
    if done:
        parts.append(f"EM so far {em_sum / done:.3f}")
    if errors:
        parts.append(f"{errors} failed")
    if done >= total:
        parts.append(f"done in {duration(elapsed_s)}")
    elif done:
        pace = elapsed_s / done
        parts.append(f"{pace:.2f} s a question, ETA {duration(pace * (total - done))}")
    return ", ".join(parts)


class AnswerProgress:
    """Progress lines of an evaluation's answers, for ``on_answer`` of
    :func:`hoprl.answer_eval.evaluate_answers`: a line at most every ``every_s`` seconds and
    always at the last answer, through the flow run's logger (the evaluation's rich bar is
    transient and draws nothing outside a terminal, so a flow's log was silent for as long as an
    evaluation ran: 7 to 16 minutes in ``make demo-rl``)."""

    def __init__(self, label: str, total: int, every_s: float = 30.0, log: Any = None,
                 clock: Any = time.monotonic) -> None:  # fmt: skip
        self.label, self.total, self.every_s, self.clock = label, total, every_s, clock
        self.log = log if log is not None else get_run_logger()
        self.began = self.logged_at = clock()
        self.done, self.em_sum, self.errors = 0, 0.0, 0

    def __call__(self, row: dict[str, Any]) -> None:
        self.done += 1
        self.em_sum += float(row.get("em") or 0.0)
        self.errors += row.get("error") is not None
        now = self.clock()
        if self.done >= self.total or now - self.logged_at >= self.every_s:
            line = answers_line(self.label, self.done, self.total, self.em_sum, self.errors, now - self.began)
            self.log.info("%s", line)
            self.logged_at = now


@contextmanager
def stage(name: str, **details: Any) -> Iterator[None]:
    """Log ``stage NAME: started`` and, when the block ends without an error, ``done in ...``."""
    log, start = get_run_logger(), time.monotonic()
    extra = "".join(f", {k} {v}" for k, v in details.items())
    log.info("stage %s: started%s", name, extra)
    yield
    log.info("stage %s: done in %s", name, duration(time.monotonic() - start))
