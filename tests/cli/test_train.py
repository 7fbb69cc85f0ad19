"""``hoprl train --config`` against a live trainer service (real HTTP on 127.0.0.1, a real registry),
and ``hoprl pipeline --config``'s options. The trainer's queue polls hourly, so submitted jobs stay
queued (no worker, no model loaded) and are cancelled at the end."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cli import pipeline as pipeline_cli
from cli.main import app
from cli.train import follow
from hoprl.clients.trainer import TrainerClient
from hoprl.jobspec import CPU_PRESET, load_config
from hoprl.registry.store import Registry
from services.local import LocalServer
from services.trainer.app import create_app
from services.trainer.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "search-r1.yaml"


@pytest.fixture()
def trainer(tmp_path: Path) -> Iterator[tuple[str, TrainerSettings]]:
    settings = TrainerSettings(
        database_url=f"sqlite:///{tmp_path / 'registry.db'}", runs_dir=tmp_path / "runs", poll_interval_s=3600
    )
    with LocalServer(create_app(settings)) as server:
        yield server.url, settings


def train(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = app(["train", "--config", str(CONFIG), *args])
    return code, capsys.readouterr().out


def test_train_small_submits_the_configs_cpu_job(
    trainer: tuple[str, TrainerSettings], capsys: pytest.CaptureFixture[str]
) -> None:
    url, settings = trainer
    code, out = train(capsys, "--small", "--trainer-url", url)
    assert code == 0
    created = json.loads(out)
    assert created["status"] == "queued"
    with TrainerClient(url) as client:
        job = client.get(created["id"])
        assert (job.recipe, job.objective, job.steps) == ("search-r1", "grpo", 4)
        run = Registry(settings.database_url).get_run(job.id)
        assert run is not None
        stored = run.config["hyperparameters"]  # what the trainer resolved and will train with
        assert {k: stored[k] for k in CPU_PRESET} == CPU_PRESET
        assert (stored["generation"], stored["processes"], stored["distributed"]) == ("transformers", 1, None)
        assert (stored["learning_rate"], stored["beta"], stored["recipe_config"]) == (
            1e-6,
            0.001,
            {"top_k": 3},
        )
        assert run.config["request"]["dataset"] == "synthetic" and run.config["request"].get("model") is None

        # explicit options win over the file; a paper-size job is admitted as the file has it
        code, out = train(capsys, "--small", "--trainer-url", url, "--steps", "2",
                          "--hyperparameters", '{"num_generations": 2, "beta": null}')  # fmt: skip
        assert code == 0
        second = Registry(settings.database_url).get_run(json.loads(out)["id"])
        assert second is not None and second.config["request"]["steps"] == 2
        resolved = second.config["hyperparameters"]
        assert (resolved["num_generations"], resolved["beta"]) == (2, 0.001)  # beta: the paper's again
        # the paper-size job asks for vLLM and 8 processes: a machine without CUDA refuses it (422)
        if not torch.cuda.is_available():
            code = app(["train", "--config", str(CONFIG), "--trainer-url", url])
            assert code == 2 and "vllm needs a CUDA GPU" in capsys.readouterr().err
        else:
            code, out = train(capsys, "--trainer-url", url)
            assert code == 0
            paper = Registry(settings.database_url).get_run(json.loads(out)["id"])
            assert paper is not None and paper.config["request"]["model"] == "Qwen/Qwen2.5-3B-Instruct"
            resolved = paper.config["hyperparameters"]
            assert (resolved["generation"], resolved["processes"], resolved["num_generations"]) == (
                "vllm",
                8,
                5,
            )
        for job in client.list():
            assert client.cancel(job.id).status == "cancelled"
        assert follow(client, created["id"]).status == "cancelled"  # what --wait returns at the end


def test_train_reports_a_refused_job_and_a_bad_config(
    trainer: tuple[str, TrainerSettings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = trainer
    code, out = train(capsys, "--small", "--trainer-url", url, "--steps", "1000000")
    assert code == 2 and out == ""  # over TRAINER_MAX_STEPS: the trainer's 422, nothing submitted
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: search-r1\nhyperparameters:\n  lr: 1\n")
    assert app(["train", "--config", str(bad), "--trainer-url", url]) == 2
    with TrainerClient(url) as client:
        assert client.list() == []


def pipeline_options(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    pipeline_cli.add_arguments(parser)
    return pipeline_cli.pipeline_options(parser.parse_args(list(argv)))


def test_pipeline_takes_the_configs_values_and_explicit_options_win() -> None:
    options = pipeline_options("--config", str(ROOT / "configs" / "evo-rag.yaml"), "--small")
    small = load_config(ROOT / "configs" / "evo-rag.yaml", small=True)
    assert (options["recipe"], options["objective"], options["model"], options["steps"]) == (
        "evo-rag", "grpo", None, small.steps
    )  # fmt: skip
    assert options["preset"] == "cpu" and options["dataset"] == "synthetic"
    assert options["recipe_config"] == {"top_k": 3}  # the flow adds the cpu preset's t_max
    hp = options["hyperparameters"]
    assert isinstance(hp, dict) and hp["generation"] == "transformers" and hp["processes"] == 1
    assert "preset" not in hp and "recipe_config" not in hp
    options = pipeline_options("--config", str(CONFIG), "--steps", "7", "--model", "m/x",
                               "--hyperparameters", '{"processes": 2}')  # fmt: skip
    assert (options["steps"], options["model"], options["preset"], options["dataset"]) == (
        7,
        "m/x",
        "paper",
        "hotpotqa",
    )
    assert isinstance(options["hyperparameters"], dict) and options["hyperparameters"]["processes"] == 2
    plain = pipeline_options("--small")  # no config: the command's own defaults, as before
    assert (plain["recipe"], plain["steps"], plain["preset"], plain["dataset"]) == (
        "when-to-search",
        24,
        "cpu",
        "synthetic",
    )
