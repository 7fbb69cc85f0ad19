"""``hoprl eval-answers --protocol <recipe> --limit 3`` on a deployed policy answers in the paper's
episode, and its output records the episode that ran.

The policy is a running service (its own HTTP server, as a deployment is) on the ``openai`` engine,
forwarding to a scripted OpenAI-compatible model server (the model is outside what is tested; its
answers do not matter here); the retriever is the real one. Each paper's episode by hand, from its
config and protocol (configs/<recipe>.yaml, hoprl/protocols.py):

- EVO-RAG: T_max = 20 steps (App. A.2) of 256 tokens (Table 10: max response length 256), a budget
  of 20 x (256 + 3 documents x 200 tokens) = 17,120 (``evo_rag.trainer_defaults``: each step's
  tokens and its documents); greedy (no decoding is given);
- R2AG: 6 steps (5 iterations and the stop turn, App. B.2) of 4,096 tokens (App. B.2), a budget of
  2 x 4,096 (the trained 4 steps' 4,096 scaled to 6 steps: ceil(6 / 4) = 2); temperature 0.6
  (App. C.2);
- Eval-RAR: 4 steps of 500 tokens within 4,000 (Search-R1's, as its §5.1 directs); greedy;
- ARENA: one step of 1,024 tokens within 1,024; greedy;
- when-to-search: 5 steps (Table 5) of 4,096 tokens within 16,384 (Table 5); greedy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import app
from hoprl.data.jsonl import load_questions, write_questions
from services.local import LocalServer
from services.policy.app import create_app as create_policy
from services.policy.settings import PolicySettings
from tests import scripted_llm as scripted
from tests.conftest import shared_file

#: each paper's episode, by hand (module docstring): steps, tokens a step, budget, temperature
PAPER_EPISODES = {
    "evo-rag": (20, 256, 17120, 0.0),
    "r2ag": (6, 4096, 8192, 0.6),
    "eval-rar": (4, 500, 4000, 0.0),
    "arena": (1, 1024, 1024, 0.0),
    "when-to-search": (5, 4096, 16384, 0.0),
}


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with LocalServer(scripted.create_app({})) as server:
        yield f"{server.url}/v1"


def deployed(retriever_url: str, model_url: str, **limits: int) -> LocalServer:
    settings = PolicySettings(
        engine="openai", openai_base_url=model_url, model="scripted", retriever_url=retriever_url,
        request_timeout_s=120, **limits,
    )  # fmt: skip
    return LocalServer(create_policy(settings))


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert app(args) == 0
    (report,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    write_questions(folder / "hotpotqa_dev.jsonl", load_questions(shared_file("hotpotqa_dev.jsonl"), limit=3))
    return folder


@pytest.mark.parametrize("recipe", sorted(PAPER_EPISODES))
def test_the_paper_episode_runs_and_is_recorded(
    recipe: str, retriever_url: str, model_url: str, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roomy = {"max_steps": 20, "max_new_tokens_per_step": 4096, "token_budget": 32768}
    with deployed(retriever_url, model_url, **roomy) as policy:
        report = run(
            ["eval-answers", "--protocol", recipe, "--limit", "3", "--data-dir", str(data_dir), "--json",
             "--policy-url", policy.url, "--retriever-url", retriever_url],
            capsys,
        )  # fmt: skip
    steps, tokens, budget, temperature = PAPER_EPISODES[recipe]
    episode = report["episode"]
    assert (episode["max_steps"], episode["max_new_tokens_per_step"], episode["token_budget"]) == (
        steps, tokens, budget,
    )  # fmt: skip
    assert episode["temperature"] == temperature and episode["grammar"] is False
    assert report["limited"] == [] and report["questions"] == 3 and report["errors"] == 0


def test_the_services_limits_lower_the_episode_and_say_so(
    retriever_url: str, model_url: str, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the service's default limits (10 steps by default, 20 at most, 256 tokens a step, 2,048 a
    budget), EVO-RAG still runs its 20 steps greedily, free of the grammar (not the serving shape's
    10 constrained steps), and the output names the budget the service lowered."""
    with deployed(retriever_url, model_url) as policy:
        report = run(
            ["eval-answers", "--protocol", "evo-rag", "--limit", "3", "--data-dir", str(data_dir), "--json",
             "--policy-url", policy.url, "--retriever-url", retriever_url],
            capsys,
        )  # fmt: skip
    episode = report["episode"]
    assert (episode["max_steps"], episode["max_new_tokens_per_step"], episode["grammar"]) == (20, 256, False)
    assert episode["token_budget"] == 2048
    assert report["limited"] == ["token_budget 17120 -> 2048 (POLICY_TOKEN_BUDGET)"]
