"""Fixtures of the flow tests: the services a pipeline talks to, live on 127.0.0.1, and a tiny model.

The retriever is the session's (embedded Qdrant); the judge is the rules judge; the policy's engine
is a scripted OpenAI-compatible model (``tests/scripted_llm.py``) that answers the
synthetic world's first questions from scripts; the trainer is the real service, whose jobs train
a tiny random Llama (2 layers) in worker subprocesses. They run in the test's process over real
HTTP, so flows in other processes (a Prefect worker's flow runs, ``hoprl pipeline``) reach them
through ``HOPRL_*_URL``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from flows.runs import registry
from flows.stack import ServiceUrls
from hoprl.data.synthetic import generate, hops_for
from hoprl.registry.store import Registry
from services.judge.app import create_app as create_judge
from services.judge.settings import JudgeSettings
from services.local import LocalServer
from services.policy.app import create_app as create_policy
from services.policy.settings import PolicySettings
from services.trainer.app import create_app as create_trainer
from services.trainer.settings import TrainerSettings
from tests import scripted_llm as scripted

SCRIPTED = 6  # questions per split the scripted policy knows
ADMIN_TOKEN = "flows-test"  # the policy's checkpoint-switch token (HOPRL_POLICY_ADMIN_TOKEN)


def scripts() -> dict[str, list[str]]:
    """An agent that searches the first hop, then answers: right on even questions, wrong on odd ones."""
    out = {}
    for split in generate(seed=0).values():
        for i, q in enumerate(split[:SCRIPTED]):
            answer = q.answers[0] if q.answers and i % 2 == 0 else "nobody"
            query = hops_for(q)[0].query if hops_for(q) else q.question
            out[q.question] = [
                f"<think>I should look this up.</think>\n<search>{query}</search>",
                f"<reflect>Found it.</reflect>\n<think>Done.</think>\n<answer>{answer}</answer>",
            ]
    return out


@pytest.fixture
def local_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The flows' registry on a fresh SQLite file, with runs under ``tmp_path / "runs"``."""
    monkeypatch.setenv("HOPRL_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("HOPRL_RUNS_DIR", str(tmp_path / "runs"))
    return registry()


@pytest.fixture(scope="session")
def live_services(
    retriever_url: str, tiny_model: str
) -> Callable[[Path], AbstractContextManager[ServiceUrls]]:
    """``with live_services(folder) as urls``: judge, trainer and scripted policy for the block.

    The trainer's registry is ``folder/registry.db``, its jobs go under ``folder/jobs``; it reads
    datasets from ``folder/runs`` (the flows' ``HOPRL_RUNS_DIR``) and models from there and from
    the tiny model's folder.
    """

    @contextmanager
    def start(folder: Path) -> Iterator[ServiceUrls]:
        trainer_settings = TrainerSettings(
            database_url=f"sqlite:///{folder / 'registry.db'}",
            runs_dir=folder / "jobs",
            retriever_url=retriever_url,
            poll_interval_s=0.2,
            torch_threads=1,
            data_roots=[folder / "runs"],
            model_roots=[folder / "runs", Path(tiny_model).parent],
        )
        with (
            LocalServer(scripted.create_app(scripts())) as llm,
            LocalServer(create_judge(JudgeSettings())) as judge,
            LocalServer(create_trainer(trainer_settings)) as trainer,
        ):
            policy_settings = PolicySettings(
                engine="openai",
                openai_base_url=f"{llm.url}/v1",
                model="scripted",
                retriever_url=retriever_url,
                admin_token=ADMIN_TOKEN,
                max_steps=4,
            )
            with LocalServer(create_policy(policy_settings)) as policy:
                yield ServiceUrls(
                    retriever=retriever_url, policy=policy.url, judge=judge.url, trainer=trainer.url
                )

    return start
