"""POST /v1/jobs over real HTTP: client paths stay inside the configured roots, sizes within the limits.

The queue polls once an hour here, so admitted jobs stay queued and no worker starts: these tests
are about what the API lets in, not about training.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import constants

from hoprl.clients.retriever import RetrieverClient
from hoprl.data.jsonl import DataError, load_questions, write_questions
from hoprl.domain import Question
from hoprl.registry.store import Registry
from services.local import LocalServer
from services.trainer.app import create_app
from services.trainer.settings import TrainerSettings

SECRET = "hunter2-do-not-leak"


@pytest.fixture()
def roots(tmp_path: Path, tiny_model: str, synthetic: dict[str, list[Question]]) -> dict[str, Path]:
    """A data root with a question file, a symlink out of it and a non-question file; a model root."""
    data = tmp_path / "data"
    data.mkdir()
    write_questions(data / "train.jsonl", synthetic["train"])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jsonl").write_text(f"{SECRET}\n")
    (data / "escape.jsonl").symlink_to(outside / "secret.jsonl")
    (data / "secret.jsonl").write_text(f'{{"password": "{SECRET}"}}\n')
    models = tmp_path / "models"
    (models / "empty").mkdir(parents=True)
    (tmp_path / "runs" / "job-old" / "checkpoint-2").mkdir(parents=True)
    return {"data": data, "outside": outside, "models": models, "tiny": Path(tiny_model), "tmp": tmp_path}


def make_settings(roots: dict[str, Path], **limits: Any) -> TrainerSettings:
    tmp = roots["tmp"]
    return TrainerSettings(
        database_url=f"sqlite:///{tmp / 'registry.db'}", runs_dir=tmp / "runs", poll_interval_s=3600,
        data_roots=[roots["data"]], model_roots=[roots["models"], roots["tiny"].parent], **limits,
    )  # fmt: skip


@pytest.fixture()
def trainer(roots: dict[str, Path]) -> Iterator[httpx.Client]:
    with LocalServer(create_app(make_settings(roots))) as server, httpx.Client(base_url=server.url) as http:
        yield http


def post(http: httpx.Client, **fields: Any) -> httpx.Response:
    """A job of the one recipe without a paper config (naive-rag): the sizes it leaves unset are the
    trainer's generic ones, not a paper's (configs/<recipe>.yaml), so the sums below hold."""
    return http.post("/v1/jobs", json={"recipe": "naive-rag", **fields})


def test_datasets_must_resolve_inside_the_data_roots(trainer: httpx.Client, roots: dict[str, Path]) -> None:
    refused = [
        "/etc/shadow",
        "/etc/passwd",
        "/etc/no-such-file.jsonl",  # the same answer whether the file exists or not
        "../../../../../../etc/passwd",
        "paper:evo-rag:/etc",  # a paper's training set from a folder is prepare_data's, not a job's
        str(roots["outside"] / "secret.jsonl"),
        str(roots["data"] / "escape.jsonl"),  # a symlink out of the root
        str(roots["data"] / ".." / "outside" / "secret.jsonl"),
    ]
    for dataset in refused:
        response = post(trainer, dataset=dataset)
        body = response.json()
        assert (response.status_code, body["error"]) == (403, "path_not_allowed"), (dataset, body)
        assert "TRAINER_DATA_ROOTS" in body["message"]
        assert SECRET not in response.text and "root:" not in response.text
    missing = post(trainer, dataset=str(roots["data"] / "none.jsonl"))
    assert (missing.status_code, missing.json()["error"]) == (404, "dataset_not_found")
    unknown = post(trainer, dataset="no-such-benchmark")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_dataset")
    for dataset in ("synthetic:0:2", "hotpotqa", "paper:evo-rag", str(roots["data"] / "train.jsonl")):
        assert post(trainer, dataset=dataset).status_code == 201, dataset


def test_the_admitted_path_is_the_one_stored(trainer: httpx.Client, roots: dict[str, Path]) -> None:
    """A relative path is stored absolute, so the worker opens exactly the file that was checked."""
    relative = Path("..") / roots["data"].relative_to(roots["tmp"].parent) / "train.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(roots["tmp"])
        job = post(trainer, dataset=str(relative)).json()["id"]
    with Registry(f"sqlite:///{roots['tmp'] / 'registry.db'}") as registry:
        run = registry.get_run(job)
        assert run is not None
        assert run.config["request"]["dataset"] == str((roots["data"] / "train.jsonl").resolve())


def hub_cache(root: Path, repo: str) -> Path:
    """A Hugging Face cache holding ``repo``'s config.json, laid out as huggingface_hub writes it."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
    return root


def test_models_and_checkpoints_must_be_hub_ids_jobs_or_folders_inside_the_roots(
    trainer: httpx.Client, roots: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the hub id below is in this (real, on-disk) cache; the machine need not reach the hub
    monkeypatch.setattr(
        constants, "HF_HUB_CACHE", str(hub_cache(roots["tmp"] / "hf", "HuggingFaceTB/SmolLM2-135M-Instruct"))
    )
    cases = [
        ({"model": "/etc"}, 403, "path_not_allowed"),
        ({"model": "gpt2"}, 403, "path_not_allowed"),  # a bare name is a relative folder, not a hub id
        ({"model": "../../../../etc"}, 403, "path_not_allowed"),
        ({"model": str(roots["models"] / "empty")}, 409, "not_a_checkpoint"),
        ({"model": str(roots["models"] / "none")}, 404, "checkpoint_not_found"),
        ({"resume_from": "../../../../etc"}, 403, "path_not_allowed"),
        ({"resume_from": "/etc"}, 403, "path_not_allowed"),
        (
            {"resume_from": str(roots["tmp"] / "runs" / "job-none" / "checkpoint-1")},
            404,
            "checkpoint_not_found",
        ),
    ]
    for fields, status, error in cases:
        response = post(trainer, **fields)
        assert (response.status_code, response.json()["error"]) == (status, error), (fields, response.text)
        if error == "path_not_allowed":
            assert "TRAINER_MODEL_ROOTS" in response.json()["message"]
    admitted = [
        {"model": "HuggingFaceTB/SmolLM2-135M-Instruct"},
        {"model": str(roots["tiny"])},
        {"resume_from": str(roots["tmp"] / "runs" / "job-old" / "checkpoint-2")},
    ]
    for fields in admitted:
        assert post(trainer, **fields).status_code == 201, fields
    job = post(trainer).json()["id"]
    assert post(trainer, model=job).status_code == 201  # a job id: that job's latest checkpoint
    assert post(trainer, resume_from=job).status_code == 201


def test_a_malformed_question_file_error_names_no_content(roots: dict[str, Path]) -> None:
    """Inside the roots, a file that is not the common schema fails without quoting its lines."""
    for name in ("secret.jsonl", "escape.jsonl"):
        with pytest.raises(DataError) as info:
            load_questions(roots["data"] / name)
        assert SECRET not in str(info.value) and "not a question in the common schema" in str(info.value)


LIMITS = {
    "max_steps": 100,
    "max_questions_per_step": 4,
    "max_num_generations": 8,
    "max_new_tokens_per_step": 128,
    "max_token_budget": 1024,
    "max_eval_questions": 32,
    "max_job_tokens": 2_000_000,
}
DYNAMIC = {"questions_per_step": 4, "num_generations": 8, "dynamic_sampling": True, "max_resample": 3}
OVER: list[tuple[dict[str, Any], str, str]] = [
    ({"steps": 1_000_000}, "steps_too_large", "TRAINER_MAX_STEPS"),
    ({"steps": 101}, "steps_too_large", "TRAINER_MAX_STEPS"),
    ({"questions_per_step": 5}, "questions_per_step_too_large", "TRAINER_MAX_QUESTIONS_PER_STEP"),
    ({"num_generations": 9}, "num_generations_too_large", "TRAINER_MAX_NUM_GENERATIONS"),
    (
        {"max_new_tokens_per_step": 129},
        "max_new_tokens_per_step_too_large",
        "TRAINER_MAX_NEW_TOKENS_PER_STEP",
    ),
    ({"token_budget": 1025}, "token_budget_too_large", "TRAINER_MAX_TOKEN_BUDGET"),
    ({"eval_questions": 33}, "eval_questions_too_large", "TRAINER_MAX_EVAL_QUESTIONS"),
    # 100 steps x 4 questions x 8 generations x 1 draw x 1024 tokens = 3,276,800 > 2,000,000
    (
        {"steps": 100, "questions_per_step": 4, "num_generations": 8, "token_budget": 1024},
        "job_too_large",
        "TRAINER_MAX_JOB_TOKENS",
    ),
    # dynamic sampling with 3 redraws: 4 draws per question; 31 x 4 x 8 x 4 x 512 = 2,031,616 > 2,000,000
    ({"steps": 31, **DYNAMIC}, "job_too_large", "TRAINER_MAX_JOB_TOKENS"),
]


def request(fields: dict[str, Any]) -> dict[str, Any]:
    """``steps`` at the top level, every other field a hyperparameter."""
    hp = {k: v for k, v in fields.items() if k != "steps"}
    return {"hyperparameters": hp} | ({"steps": fields["steps"]} if "steps" in fields else {})


def test_sizes_over_their_limit_are_409_naming_the_setting(roots: dict[str, Path]) -> None:
    with (
        LocalServer(create_app(make_settings(roots, **LIMITS))) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        for fields, error, setting in OVER:
            response = post(http, **request(fields))
            body = response.json()
            assert (response.status_code, body["error"]) == (409, error), (fields, body)
            assert setting in body["message"], body
        assert post(http, **request({"steps": 30, **DYNAMIC})).status_code == 201  # 1,966,080 tokens


def test_one_sample_a_question_is_ppo_only(trainer: httpx.Client) -> None:
    """EVO-RAG's PPO rolls out one episode a question (Table 10); a group or a sibling comparison
    needs at least two samples, so GRPO and DPO with one are a 422 naming the field."""
    response = post(trainer, hyperparameters={"num_generations": 1})
    body = response.json()
    assert (response.status_code, body["error"]) == (422, "num_generations_too_small")
    assert "num_generations = 1" in body["message"]
    assert (
        post(trainer, recipe="evo-rag", objective="dpo", hyperparameters={"num_generations": 1}).status_code
        == 422
    )
    assert (
        post(trainer, recipe="evo-rag", objective="ppo", hyperparameters={"num_generations": 1}).status_code
        == 201
    )


def test_the_placebo_and_lora_run_only_in_trls_grpo_family(trainer: httpx.Client) -> None:
    """The placebo permutes rewards and LoRA wraps the policy inside TRL's GRPO family; a loop that
    cannot is a 409 naming it (schema-valid, not servable: the schema cannot relate the fields)."""
    for request, loop in [
        ({"recipe": "evo-rag", "objective": "ppo"}, "objective ppo"),
        ({"recipe": "evo-rag", "objective": "grpo"}, "advantage = siblings"),  # EVO-RAG's default loop
        ({"recipe": "r2ag"}, "r2ag's rounds"),
    ]:
        response = post(trainer, **request, hyperparameters={"placebo": True})
        body = response.json()
        assert (response.status_code, body["error"]) == (409, "placebo_unsupported"), body
        assert loop in body["message"]
    assert post(trainer, hyperparameters={"placebo": True}).status_code == 201
    assert post(trainer, recipe="r2ag", hyperparameters={"placebo": False}).status_code == 201
    response = post(trainer, objective="sft", hyperparameters={"lora_rank": 8})
    assert (response.status_code, response.json()["error"]) == (409, "lora_rank_unsupported")
    assert "objective sft" in response.json()["message"]
    assert post(trainer, hyperparameters={"lora_rank": 8, "placebo": True}).status_code == 201
    # 2 questions x 4 samples (the cpu preset): passes of 2 or 4 divide them, 3 does not
    cpu = {"preset": "cpu"}
    assert post(trainer, hyperparameters={**cpu, "micro_batch": 2}).status_code == 201
    response = post(trainer, hyperparameters={**cpu, "micro_batch": 3})
    assert (response.status_code, response.json()["error"]) == (409, "micro_batch_indivisible")
    assert "the 8 episodes" in response.json()["message"]


def test_default_limits_refuse_a_million_steps(trainer: httpx.Client) -> None:
    response = post(trainer, steps=1_000_000)
    assert response.status_code == 409 and "TRAINER_MAX_STEPS" in response.json()["message"]
    assert post(trainer, steps=10_000).status_code == 201


def test_a_model_that_cannot_be_loaded_is_refused_at_the_door(
    trainer: httpx.Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An unknown hub id was queued and failed ~40 s into the job (trying the hub); it is a 404 now
    when the hub cannot have it (offline, not cached), a 503 while the hub cannot be asked."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    response = post(trainer, model="nobody-at-all/no-such-model")
    assert (response.status_code, response.json()["error"]) == (404, "model_not_found"), response.text
    assert "'nobody-at-all/no-such-model'" in response.json()["message"]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    online = post(trainer, model="nobody-at-all/no-such-model")
    assert online.status_code in (404, 503) and "nobody-at-all/no-such-model" in online.json()["message"]


@pytest.mark.parametrize(
    ("fields", "count"),
    [
        ({"hyperparameters": {"max_train_questions": 1, "questions_per_step": 2}}, 1),
        # train.jsonl holds 8 questions, 2 of them kept back for dev (a quarter): 6 < 7
        ({"dataset": "train.jsonl", "hyperparameters": {"questions_per_step": 7}}, 6),
    ],
)
def test_a_job_that_cannot_fill_one_step_is_a_409(
    trainer: httpx.Client, roots: dict[str, Path], fields: dict[str, Any], count: int
) -> None:
    """It was queued and failed in the worker ("1 training questions cannot fill one step")."""
    if "dataset" in fields:
        fields = fields | {"dataset": str(roots["data"] / fields["dataset"])}
    response = post(trainer, **fields)
    assert (response.status_code, response.json()["error"]) == (409, "job_cannot_run"), response.text
    assert f"the job has {count} training question" in response.json()["message"]
    fits = {**fields, "hyperparameters": {**fields["hyperparameters"], "questions_per_step": count}}
    assert post(trainer, **fits).status_code == 201


def test_the_queue_is_bounded(roots: dict[str, Path]) -> None:
    """TRAINER_MAX_QUEUED_JOBS jobs wait at most; one more is a 429 with Retry-After, and a
    cancelled job makes room again."""
    with (
        LocalServer(create_app(make_settings(roots, max_queued_jobs=2))) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        first, _ = post(http).json()["id"], post(http).json()["id"]
        full = post(http)
        assert (full.status_code, full.json()["error"]) == (429, "queue_full"), full.text
        assert full.headers["retry-after"] == "60" and "TRAINER_MAX_QUEUED_JOBS = 2" in full.json()["message"]
        assert http.post(f"/v1/jobs/{first}/cancel").status_code == 200
        assert post(http).status_code == 201


def test_a_job_leases_its_collection_until_it_ends(
    roots: dict[str, Path], retriever_url: str, collection: str
) -> None:
    """An unknown collection is a 404 at submission (it used to fail in the job: HTTP 404 from the
    retriever); a known one is leased in the retriever while the job is queued, so deleting it is a
    409 naming the job, and cancelling the job releases it."""
    with (
        LocalServer(create_app(make_settings(roots, retriever_url=retriever_url))) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        unknown = post(http, collection="no-such-collection")
        assert (unknown.status_code, unknown.json()["error"]) == (404, "collection_not_found"), unknown.text
        assert "'no-such-collection'" in unknown.json()["message"]
        job = post(http, collection=collection).json()["id"]
        refused = httpx.delete(f"{retriever_url}/v1/collections/{collection}")
        assert (refused.status_code, refused.json()["error"]) == (409, "collection_in_use"), refused.text
        assert job in refused.json()["message"]
        assert http.post(f"/v1/jobs/{job}/cancel").status_code == 200
    with RetrieverClient(retriever_url) as client:
        assert job not in client.info(collection).leases
