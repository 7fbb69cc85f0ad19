"""One rank of the two-process rounds test (``test_vllm_rollout.py``), run under ``accelerate launch``.

``ServerModeGeneration`` follows the collective structure of TRL's vLLM *server* mode: every rank's
prompts are gathered, rank 0 "generates" (each completion is its prompt's last ids reversed, then
the end token: deterministic and checkable), the result is broadcast, and each rank takes the slice
at ``process_index * len(prompts)``: exactly the contract that deadlocks or mixes answers up when
ranks call it a different number of times or with different numbers of prompts.

Rank ``r`` runs ``2 * (r + 1)`` concurrent askers of ``r + 2`` turns each, so the ranks' work differs.
Writes ``{"rank", "rounds", "wrong", "answers"}`` to ``OUT.rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object
from transformers import AutoTokenizer

from hoprl.generation.engines import SamplingParams
from hoprl.training.vllm_rollout import VllmRolloutEngine


class ServerModeGeneration:
    def __init__(self, state: PartialState, eos: int) -> None:
        self.state, self.eos = state, eos
        self.temperature, self.top_p, self.max_completion_length = 1.0, 1.0, 8
        self.generation_kwargs: dict[str, Any] = {}

    def generate(self, prompts: list[list[int]], images: Any, num_generations: int) -> tuple[Any, ...]:
        everyone = gather_object(prompts)
        payload = [[[*p[-3:][::-1], self.eos] for p in everyone]] if self.state.is_main_process else [None]
        broadcast_object_list(payload, from_process=0)
        mine = slice(self.state.process_index * len(prompts), (self.state.process_index + 1) * len(prompts))
        completions = payload[0][mine]
        return prompts, completions, [[[-1.0]] * len(c) for c in completions], None


def main(model: str, out: str) -> None:
    state = PartialState(cpu=True)
    rank = state.process_index
    tok = AutoTokenizer.from_pretrained(model)
    engine = VllmRolloutEngine(ServerModeGeneration(state, tok.eos_token_id), tok, window_s=0.01)
    wrong: list[str] = []
    answers = 0

    def asker(i: int) -> None:
        nonlocal answers
        for turn in range(rank + 2):
            prompt = f"rank {rank} asker {i} turn {turn}"
            ids = engine.encode(prompt)
            (gens,) = engine.generate([prompt], SamplingParams(max_tokens=8))
            if gens[0].token_ids != ids[-3:][::-1]:
                wrong.append(prompt)
            answers += 1

    with engine.rounds(), ThreadPoolExecutor(8) as pool:
        list(pool.map(asker, range(2 * (rank + 1))))
    result = {"rank": rank, "rounds": engine.rounds_decoded, "wrong": wrong, "answers": answers}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)
    # Leave together and take the process group down before the interpreter exits: a rank that
    # exits while gloo's threads still run aborts ("terminate called without an active exception").
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
