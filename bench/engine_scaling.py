"""Why more clients buy so little on a CPU: each engine's prefill and decode throughput, alone and batched.

    python bench/engine_scaling.py --data ../shared/data/hotpotqa_dev.jsonl --engines transformers vllm

``bench/policy.py`` found vLLM's /v1/answer throughput at 16 clients only ~1.5x its own one-client
throughput on 2 CPU cores (target 3x). This splits a request into its two phases, on the engine
itself (no HTTP, no agent loop), with the policy's settings (vLLM eager, float32):

- prefill: ``--batch`` prompts of about ``--prompt-tokens`` tokens (a HotpotQA question and its
  context passages, the size of a retrieval-augmented prompt), one new token each: prompt tokens/s
  with the prompts sent one at a time and all at once;
- decode: ``--batch`` short prompts, ``--new-tokens`` greedy tokens each (a counting prompt, so
  every token is used): generated tokens/s one at a time and all at once; with ``--grammar``
  under that recipe's grammar, as /v1/answer decodes.

- whole requests: the prefill prompts, each decoding up to ``--new-tokens`` tokens as the decode
  phase does (under ``--grammar`` where given): requests/s one at a time and all at once, the
  measured counterpart of ``bound``.

Batching pays where a phase is bound by reading the weights (decode: one token a row per pass) and
not where it is bound by arithmetic (prefill: every prompt token is already a row of one matmul).
With the measured rates, a request of P prompt and D generated tokens takes ``P/prefill + D/decode``
alone; the line ``bound`` is the most a batch of ``--batch`` can gain on it (Amdahl's law over the
two phases, the batch's prefill and decode rates).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hoprl.agent.grammar import grammar
from hoprl.data.jsonl import load_questions
from hoprl.generation.engines import SamplingParams
from hoprl.generation.model import resolve_model

COUNTING = "1, 2, 3, 4, 5,"


def long_prompts(path: str, n: int, tokens: int, tokenizer: Any) -> list[str]:
    """``n`` prompts of about ``tokens`` tokens: each question with its passages, cut to size."""
    prompts = []
    for q in load_questions(path)[:n]:
        context = " ".join(f"{p.title}: {p.text}" for p in q.paragraphs)
        ids = tokenizer(f"Question: {q.question}\nPassages: {context}")["input_ids"][:tokens]
        prompts.append(tokenizer.decode(ids))
    return prompts


def rate(engine: Any, prompts: list[str], params: SamplingParams, batched: bool, count: str) -> float:
    """Tokens per second (``count``: "prompt" or "generated") over ``prompts``."""
    start = time.perf_counter()
    gens = [g[0] for g in engine.generate(prompts, params)] if batched else [
        engine.generate([p], params)[0][0] for p in prompts
    ]  # fmt: skip
    elapsed = time.perf_counter() - start
    if count == "requests":
        return len(gens) / elapsed
    total = sum(g.prompt_tokens if count == "prompt" else len(g.token_ids) for g in gens)
    return total / elapsed


def build(kind: str, model: str) -> Any:
    if kind == "vllm":
        from hoprl.generation.vllm_engine import VllmEngine

        return VllmEngine(model, dtype="float32", kv_cache_gib=1, eager=True)
    from hoprl.generation.transformers_engine import TransformersEngine

    return TransformersEngine(model)


def measure(kind: str, model: str, args: argparse.Namespace) -> dict[str, float]:
    from transformers import AutoTokenizer

    engine = build(kind, model)
    try:
        prompts = long_prompts(
            args.data, args.batch, args.prompt_tokens, AutoTokenizer.from_pretrained(model)
        )
        one = SamplingParams(max_tokens=1, temperature=0)
        lark = grammar(args.grammar, max_tokens=args.new_tokens).lark if args.grammar else None
        decode = SamplingParams(max_tokens=args.new_tokens, temperature=0, grammar=lark)
        engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0))  # warm-up
        # distinct counting prompts, so no prefix cache turns a batch into one prompt
        counting = [f"{COUNTING} ({i})" for i in range(args.batch)]
        row = {
            "prefill_1": rate(engine, prompts, one, False, "prompt"),
            "prefill_batch": rate(engine, prompts, one, True, "prompt"),
            "decode_1": rate(engine, counting, decode, False, "generated"),
            "decode_batch": rate(engine, counting, decode, True, "generated"),
            "requests_1": rate(engine, prompts, decode, False, "requests"),
            "requests_batch": rate(engine, prompts, decode, True, "requests"),
        }
    finally:
        engine.close()
    return {**row, "bound": bound(row, args.request_prompt_tokens, args.request_new_tokens)}


def bound(rates: dict[str, float], prompt: int, new: int) -> float:
    """The most a batch gains on requests of ``prompt`` + ``new`` tokens: their time at the one-at-a-
    time rates over their time at the batched rates."""
    alone = prompt / rates["prefill_1"] + new / rates["decode_1"]
    return alone / (prompt / rates["prefill_batch"] + new / rates["decode_batch"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default="../shared/data/hotpotqa_dev.jsonl")
    parser.add_argument(
        "--engines", nargs="+", default=["transformers", "vllm"], choices=["transformers", "vllm"]
    )
    parser.add_argument("--batch", type=int, default=16, help="prompts at once (bench/policy.py's clients)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="tokens of each prefill prompt")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens each decode prompt generates")
    parser.add_argument("--request-prompt-tokens", type=int, default=512, help="P of the bound's request")
    parser.add_argument("--request-new-tokens", type=int, default=32, help="D of the bound's request")
    parser.add_argument("--grammar", default=None, help="decode under this recipe's grammar (naive-rag)")
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--out", default=".hoprl/bench/engine_scaling.json")
    args = parser.parse_args()
    model = resolve_model(args.model, Path(".hoprl/models/smollm2-135m-instruct"))
    results = {kind: measure(kind, model, args) for kind in args.engines}
    b = args.batch
    print(f"| engine | prefill tok/s 1 | x{b} | ratio | decode tok/s 1 | x{b} | ratio | bound x{b} "
          f"| requests/s 1 | x{b} | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, r in results.items():
        print(
            f"| {kind} | {r['prefill_1']:.0f} | {r['prefill_batch']:.0f}"
            f" | {r['prefill_batch'] / r['prefill_1']:.2f}"
            f" | {r['decode_1']:.1f} | {r['decode_batch']:.1f} | {r['decode_batch'] / r['decode_1']:.2f}"
            f" | {r['bound']:.2f} | {r['requests_1']:.3f} | {r['requests_batch']:.3f}"
            f" | {r['requests_batch'] / r['requests_1']:.2f} |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":  # vLLM spawns its engine core: building one needs this guard
    main()
