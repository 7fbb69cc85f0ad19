"""The vLLM engine (GPU): ``vllm.LLM`` in the process, weights reloaded in place on a checkpoint switch."""

from __future__ import annotations

import gc
import threading
from collections.abc import Sequence
from typing import Any

from hoprl.generation.engines import Generation, Prompt, SamplingParams


class VllmEngine:
    """The real vLLM engine (GPU). ``vllm`` is imported here only: the CPU environment lacks it.

    It does not stream (``LLM.generate`` returns whole outputs): a streamed request gets its text
    in one chunk when decoding ends. ``SamplingParams.grammar`` goes to vLLM's structured outputs
    on its ``guidance`` backend: llguidance, the library the transformers engine masks with, so
    the same Lark text (token caps included) constrains both.
    """

    constrains = True

    def __init__(self, path: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85) -> None:
        self.dtype, self.gpu_memory_utilization = dtype, gpu_memory_utilization
        self.lock = threading.Lock()
        self.llm: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.load(path)

    def load(self, path: str) -> None:
        from vllm import LLM

        with self.lock:  # one engine fits in GPU memory: free the old one before building the new
            self.close()
            self.llm = LLM(
                model=path, dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                structured_outputs_config={"backend": "guidance"},
            )  # fmt: skip
            self.tokenizer = self.llm.get_tokenizer()
            self.model_path = path

    def close(self) -> None:
        if self.llm is not None:
            import torch

            self.llm = None
            gc.collect()
            torch.cuda.empty_cache()

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import StructuredOutputsParams

        top = max(params.top_logprobs, 1) if params.logprobs else None
        sampling = VllmSampling(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=top,
            structured_outputs=StructuredOutputsParams(grammar=params.grammar) if params.grammar else None,
        )
        with self.lock:
            outputs = []
            for prompt in prompts:  # one kind per call in practice; order is kept either way
                if isinstance(prompt, str):
                    outputs += self.llm.generate([prompt], sampling, use_tqdm=False)
                else:
                    outputs += self.llm.chat([prompt], sampling, use_tqdm=False)
        return [[self._choice(c, len(o.prompt_token_ids or []), params) for c in o.outputs] for o in outputs]

    def _choice(self, c: Any, prompt_tokens: int, params: SamplingParams) -> Generation:
        eos = self.tokenizer.eos_token_id
        ids = [t for t in c.token_ids if t != eos]
        stop = c.stop_reason if isinstance(c.stop_reason, str) else None
        gen = Generation(c.text, c.finish_reason or "length", stop, ids, prompt_tokens=prompt_tokens)
        gen.tokens = [self.tokenizer.decode([t]) for t in ids]
        if params.logprobs and c.logprobs:
            gen.logprobs = [c.logprobs[i][t].logprob for i, t in enumerate(ids)]
            if params.top_logprobs:
                gen.top_logprobs = [
                    {str(lp.decoded_token): lp.logprob for lp in sorted(d.values(), key=lambda x: x.rank)}
                    for d in c.logprobs[: len(ids)]
                ]
        return gen
