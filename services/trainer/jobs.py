"""Run one job from its registry record: data, index, model, trainer, resume, status.

``run_job(run_id)`` is what ``python -m services.trainer.worker RUN_ID`` executes. Everything it
needs is in the run's ``config`` (the :class:`~hoprl.schemas.trainer.JobRequest` as sent,
plus the resolved hyperparameters), so a job re-queued after a service restart, or killed and
started again, runs the same way:

1. load the dataset (``train`` split, and ``dev`` for curriculum checks);
2. make sure the retriever holds its paragraphs (one collection per corpus, reused) unless the
   recipe needs no retrieval (``arena`` reads the question's own paragraphs);
3. load the model: the request's ``model`` (HF id, folder, or a job id = that job's latest
   checkpoint), else the default model;
4. pick the checkpoint to resume: this run's latest *complete* checkpoint if any (a killed job),
   else ``resume_from`` (a job id's latest checkpoint, or a folder); restore the curriculum
   state from its ``hoprl_state.json``;
5. train with the objective's trainer and save the final checkpoint: ``grpo`` / ``dapo`` /
   ``dr_grpo`` through TRL (for ``r2ag``: the progressive rounds of
   :mod:`hoprl.training.r2ag_rounds`), ``sft`` through TRL, ``ppo`` / ``dpo`` through
   :mod:`hoprl.training.offpolicy` (fresh rollouts, or another run's stored episodes with
   ``episodes_from``). EVO-RAG's refusal check and when-to-search's correctness use the judge
   service of the request's ``judge.url`` or ``TRAINER_JUDGE_URL`` (:func:`bind_judge`), else the
   rules judge; the job's ``judge/*`` metrics count the verdicts and the fallbacks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.clients.judge import RemoteJudge
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import pool
from hoprl.data.sources import load
from hoprl.domain import Question
from hoprl.evaluation import corpus_collection, ensure_indexed
from hoprl.generation.model import resolve_model
from hoprl.jobspec import episode_shape, resolve
from hoprl.judging import JudgeLedger, RulesJudge
from hoprl.recipes import get_recipe, reward_weights
from hoprl.registry.models import RunRow
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from hoprl.training import distributed
from hoprl.training.callbacks import STATE_FILE, Curricula, RunCallback, latest_complete_checkpoint
from hoprl.training.rollout import RolloutOptions
from services.trainer.settings import TrainerSettings

log = logging.getLogger("hoprl.trainer")

#: recipes whose episodes never call the retriever
NO_RETRIEVAL = {"arena"}


def submit(registry: Registry, request: JobRequest) -> RunRow:
    """Queue ``request`` as a new run: the request and its resolved hyperparameters are the config."""
    hp = resolve(request.hyperparameters, request.recipe, request.objective)
    config = {"request": request.model_dump(mode="json"), "hyperparameters": hp.model_dump(mode="json")}
    return registry.create_run(f"job-{uuid.uuid4().hex[:12]}", recipe=request.recipe,
                               objective=request.objective, model=request.model or "default",
                               config=config, seed=request.seed, kind="job")  # fmt: skip


def load_splits(request: JobRequest, hp: Hyperparameters) -> tuple[list[Question], list[Question]]:
    """Train and dev questions; a single JSONL file serves as both (dev = its last questions, at most
    ``eval_questions`` and a quarter of the file)."""
    if Path(request.dataset).exists():
        questions = load(request.dataset)
        cut = len(questions) - min(hp.eval_questions, len(questions) // 4)
        train, dev = questions[:cut], questions[cut:]
    else:
        train, dev = load(request.dataset, "train", seed=request.seed), load(request.dataset, "dev")
    if hp.max_train_questions is not None:
        train = train[: hp.max_train_questions]
    if len(train) < hp.questions_per_step:
        raise ValueError(
            f"{len(train)} training questions cannot fill one step of questions_per_step="
            f"{hp.questions_per_step}; use a larger dataset or fewer questions per step"
        )
    return train, dev[: hp.eval_questions]


def ensure_collection(request: JobRequest, questions: list[Question], settings: TrainerSettings) -> str:
    """The collection the job's episodes search: the request's ``collection`` as named (a corpus
    such as a Wikipedia dump: the open-domain setting; the rewards match gold paragraphs by title,
    which a corpus passage keeps), else the questions' pooled paragraphs, indexed on first use.
    Questions without paragraphs (NQ, TriviaQA, PopQA) and no collection: a ValueError naming the fix.
    """
    if request.collection:
        return request.collection
    if request.recipe in NO_RETRIEVAL:
        return "unused"
    documents = pool(questions)
    if not documents:
        raise ValueError(
            f"the questions of {request.dataset!r} carry no paragraphs to retrieve from (an open-domain "
            "dataset): ingest a corpus (hoprl ingest-corpus) and name it as the job's collection"
        )
    name = corpus_collection(Path(request.dataset).stem.replace(":", "-"), documents)
    with RetrieverClient(settings.retriever_url) as client:
        ensure_indexed(client, name, documents)
    return name


def checkpoint_of(registry: Registry, ref: str) -> str:
    """A job id's latest checkpoint folder, or ``ref`` itself when it is a folder."""
    if Path(ref).is_dir():
        return ref
    run = registry.get_run(ref)
    if run is None:
        raise ValueError(f"{ref!r} is neither a checkpoint folder nor a job id")
    latest = registry.latest_checkpoint(ref)
    if latest is None:
        raise ValueError(f"job {ref!r} has no checkpoint yet")
    return latest.path


def model_path(request: JobRequest, registry: Registry, settings: TrainerSettings) -> str:
    name = request.model or settings.default_model
    if name and registry.get_run(name) is not None:
        return checkpoint_of(registry, name)
    return resolve_model(name, settings.model_cache)


def run_job(run_id: str, settings: TrainerSettings, registry: Registry) -> None:
    """Train run ``run_id`` to its last step; raises on failure (the worker records it)."""
    run = registry.get_run(run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r} in the registry")
    request = JobRequest.model_validate(run.config["request"])
    hp = Hyperparameters.model_validate(run.config["hyperparameters"])
    if hp.generation == "vllm" and hp.vllm_server_url is None and settings.vllm_server_url:
        hp = hp.model_copy(update={"vllm_server_url": settings.vllm_server_url})  # the deployment's server
    if settings.torch_threads or hp.torch_threads:
        torch.set_num_threads(hp.torch_threads or settings.torch_threads)
    output_dir = settings.runs_dir / run_id
    resume = latest_complete_checkpoint(output_dir)
    if resume is None and request.resume_from:
        resume = Path(checkpoint_of(registry, request.resume_from))
    train, dev = load_splits(request, hp)
    collection = ensure_collection(request, train + dev, settings)
    path = model_path(request, registry, settings)
    log.info("run %s: %s/%s on %s (%d train, %d dev), model %s, resume %s, hyperparameters %s",
             run_id, request.recipe, request.objective, request.dataset, len(train), len(dev), path,
             resume, hp.model_dump())  # fmt: skip
    recipe = get_recipe(request.recipe, **hp.recipe_config)
    ledger = bind_judge(recipe, request, settings)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    trainer = build_trainer(request, hp, recipe, model, tokenizer, train, dev, collection, settings,
                            registry, run_id, str(output_dir))  # fmt: skip
    if resume is not None and (resume / STATE_FILE).is_file():
        trainer_curricula(trainer).restore(json.loads((resume / STATE_FILE).read_text())["curriculum"])
    if resume is not None and getattr(trainer, "preference", None) is not None:
        trainer.preference.restore(resume)
    if ledger is not None and distributed.is_main():
        registry.log_metrics(run_id, 0, ledger.metrics())
    try:
        # TRL's flow saves every save_steps and at the last step, so a finished job ends on a checkpoint.
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    finally:
        if ledger is not None and distributed.is_main():
            registry.log_metrics(run_id, max(int(trainer.state.global_step), 1), ledger.metrics())
    if distributed.world_size() > 1:
        check_ranks_agree(trainer, registry, run_id, output_dir)


def bind_judge(recipe: Any, request: JobRequest, settings: TrainerSettings) -> JudgeLedger | None:
    """Give a recipe whose reward calls a judge (EVO-RAG's refusals, when-to-search's r_a) the
    judge service of ``request.judge.url`` or ``TRAINER_JUDGE_URL``, counted by a :class:`JudgeLedger`.

    Without a service the rules judge decides: when the request's ``judge`` says the paper uses an
    LLM, every such verdict is a fallback in the job's ``judge/*`` metrics and a warning is logged.
    A recipe without a judge, or a request with no ``judge`` and no service, is left as it is
    (``None``).
    """
    if not hasattr(recipe, "judge"):
        return None
    spec = request.judge
    url = (spec.url if spec else None) or settings.judge_url
    if spec is None and url is None:
        return None
    expected = spec.backend if spec else "rules"
    if url is None:
        log.warning("the %s paper judges with an LLM (%s) but no judge service is bound "
                    "(judge.url or TRAINER_JUDGE_URL): the rules judge decides, counted as fallbacks",
                    request.recipe, spec.model if spec else "?")  # fmt: skip
    ledger = JudgeLedger(RemoteJudge(url) if url else RulesJudge(), expected=expected, bound=url is not None)
    recipe.judge = ledger
    return ledger


def check_ranks_agree(trainer: Any, registry: Registry, run_id: str, output_dir: Path) -> None:
    """Several processes: every rank must end with the same weights (DDP keeps them equal). Rank 0
    writes ``ranks.json`` (each rank's digest) and the metric ``ranks/identical_weights``; ranks
    that drifted fail the job."""
    digests = distributed.rank_digests(trainer.accelerator.unwrap_model(trainer.model))
    same = len(set(digests)) == 1
    if distributed.is_main():
        (output_dir / "ranks.json").write_text(json.dumps({"digests": digests, "identical": same}, indent=1))
        registry.log_metrics(run_id, trainer.state.global_step, {"ranks/identical_weights": float(same)})
    if not same:
        raise RuntimeError(f"the {len(digests)} ranks ended with different weights: {digests}")


def trainer_curricula(trainer: Any) -> Curricula:
    if hasattr(trainer, "curricula"):  # the project's own loops (offpolicy, r2ag_rounds)
        curricula: Curricula = trainer.curricula
        return curricula
    callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, RunCallback))
    return callback.curricula


def build_trainer(request: JobRequest, hp: Hyperparameters, recipe: Any, model: Any, tokenizer: Any,
                  train: list[Question], dev: list[Question], collection: str, settings: TrainerSettings,
                  registry: Registry, run_id: str, output_dir: str) -> Any:  # fmt: skip
    """The objective's trainer with the run's callback attached."""
    if request.objective == "sft":
        from hoprl.training.sft import build_sft, expert_episodes, sft_config, sft_dataset

        episodes = asyncio.run(expert_episodes(recipe, train, settings.retriever_url, collection,
                                               noise=hp.expert_noise, seed=request.seed))  # fmt: skip
        data = sft_dataset(episodes, tokenizer, max_length=model.config.max_position_embeddings)
        callback = RunCallback(registry, run_id, Curricula(recipe))
        config = sft_config(hp, request.steps, output_dir, request.seed)
        return build_sft(model, tokenizer, data, config, callbacks=[callback])
    opts = rollout_options(request, hp, collection, settings)
    if request.objective in ("ppo", "dpo") or hp.advantage == "siblings":  # siblings: EVO-RAG's GRPO
        from hoprl.training.offpolicy import OffPolicyTrainer

        return OffPolicyTrainer(request.objective, request, hp, recipe, model, tokenizer, train, dev, opts,
                                registry, run_id, output_dir)  # fmt: skip
    if request.recipe == "r2ag":
        from hoprl.training.r2ag_rounds import R2agRounds

        return R2agRounds(request, hp, recipe, model, tokenizer, train, opts, registry, run_id, output_dir)
    from hoprl.training.grpo import build_grpo, grpo_config
    from hoprl.training.lora import lora_config
    from hoprl.training.preference_learning import PreferenceCallback, preference_learner
    from hoprl.training.rollout import AgentRollout

    preference = preference_learner(hp, recipe, request.seed)  # EVO-RAG's Algorithm 1 reward model

    def sink(step: int, episodes: Any, per: list[dict[str, float]], totals: list[float]) -> None:
        rewards = [{**p, "total": t} for p, t in zip(per, totals, strict=True)]
        registry.write_episodes(run_id, step, episodes, rewards)
        if preference is not None:
            registry.log_metrics(run_id, step, preference.step(episodes))

    rollout = AgentRollout(recipe, train, opts, sink=sink)
    # EVO-RAG's dev check: rank 0 rolls out the dev split, every rank gets its value (distributed.py)
    curricula = Curricula(recipe, dev_return=lambda: distributed.on_main(lambda: rollout.evaluate(dev)))
    args = grpo_config(hp, request.objective, request.steps, output_dir, request.seed, reward_weights(recipe))
    # the preference model saves into a checkpoint before RunCallback marks it complete
    callbacks: list[Any] = [PreferenceCallback(preference)] if preference is not None else []
    callbacks.append(RunCallback(registry, run_id, curricula, rollout))
    trainer = build_grpo(model, tokenizer, rollout, train, args, hp.kl_estimator or "k3", callbacks,
                         advantage=hp.advantage or "sequence", placebo=hp.placebo,
                         warm_start_kl=hp.warm_start_kl or 0, peft_config=lora_config(hp))  # fmt: skip
    trainer.preference = preference
    return trainer


def rollout_options(request: JobRequest, hp: Hyperparameters, collection: str,
                    settings: TrainerSettings) -> RolloutOptions:  # fmt: skip
    """How every RL objective rolls out: one definition, so GRPO, PPO and DPO episodes match."""
    return RolloutOptions(
        collection=collection, retriever_url=settings.retriever_url, num_generations=hp.num_generations,
        shape=episode_shape(hp),
        dynamic_sampling=bool(hp.dynamic_sampling),
        dynamic_sampling_signal=hp.dynamic_sampling_signal or "answers",
        max_resample=hp.max_resample, flat_groups=hp.flat_groups or "drop", seed=request.seed,
    )  # fmt: skip
