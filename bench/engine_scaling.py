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

Every pass sends its prompts with a tag of its own at the front (:func:`fresh`): vLLM's prefix
cache would otherwise serve a prompt's second pass from the first and count cache hits as prefill.
``--max-num-batched-tokens 512 2048 8192`` measures vLLM once per value of that scheduler setting
(the tokens one engine step takes: prompt chunks and decode rows together), ``--reserved-cores 1 0``
once per count of cores vLLM keeps for its scheduler process (by default one: on 2 cores the model
runs on the other alone).

Batching pays where a phase is bound by reading the weights (decode: one token a row per pass) and
not where it is bound by arithmetic (prefill: every prompt token is already a row of one matmul).
With the measured rates, a request of P prompt and D generated tokens takes ``P/prefill + D/decode``
alone; ``bound``, at the P and D the timed requests had, is the most a batch of ``--batch`` can
gain on it (Amdahl's law over the two phases, the batch's prefill and decode rates).
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


def fresh(prompts: list[str], tag: str) -> list[str]:
    """``prompts``, each opened by a tag of its own: vLLM caches prompt prefixes, so a prompt sent a
    second time (the batched pass after the one-at-a-time pass) would skip most of its prefill and
    the batched rate would count cache hits as prefill."""
    return [f"[{tag}{i}] {p}" for i, p in enumerate(prompts)]


def timed(engine: Any, prompts: list[str], params: SamplingParams, batched: bool) -> tuple[list[Any], float]:
    """The generations of ``prompts`` (all at once or one at a time) and the seconds they took."""
    start = time.perf_counter()
    gens = [g[0] for g in engine.generate(prompts, params)] if batched else [
        engine.generate([p], params)[0][0] for p in prompts
    ]  # fmt: skip
    return gens, time.perf_counter() - start


def rate(engine: Any, prompts: list[str], params: SamplingParams, batched: bool, count: str) -> float:
    """Tokens per second (``count``: "prompt" or "generated") over ``prompts``."""
    gens, elapsed = timed(engine, prompts, params, batched)
    total = sum(g.prompt_tokens if count == "prompt" else len(g.token_ids) for g in gens)
    return total / elapsed


def requests(engine: Any, prompts: list[str], params: SamplingParams, batched: bool) -> dict[str, float]:
    """Whole requests: requests/s, and the mean prompt and generated tokens of one."""
    gens, elapsed = timed(engine, prompts, params, batched)
    return {
        "rate": len(gens) / elapsed,
        "prompt": sum(g.prompt_tokens for g in gens) / len(gens),
        "new": sum(len(g.token_ids) for g in gens) / len(gens),
    }


def build(kind: str, model: str, vllm_settings: dict[str, int | None] | None = None) -> Any:
    if kind == "vllm":
        from hoprl.generation.vllm_engine import VllmEngine

        return VllmEngine(model, dtype="float32", kv_cache_gib=1, eager=True, **(vllm_settings or {}))
    from hoprl.generation.transformers_engine import TransformersEngine

    return TransformersEngine(model)


def measure(
    kind: str, model: str, args: argparse.Namespace, vllm_settings: dict[str, int | None] | None = None
) -> dict[str, float]:
    from transformers import AutoTokenizer

    engine = build(kind, model, vllm_settings)
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
        alone = requests(engine, fresh(prompts, "r1-"), decode, False)
        together = requests(engine, fresh(prompts, "rb-"), decode, True)
        row = {
            "prefill_1": rate(engine, fresh(prompts, "p1-"), one, False, "prompt"),
            "prefill_batch": rate(engine, fresh(prompts, "pb-"), one, True, "prompt"),
            "decode_1": rate(engine, counting, decode, False, "generated"),
            "decode_batch": rate(engine, counting, decode, True, "generated"),
            "requests_1": alone["rate"],
            "requests_batch": together["rate"],
            "request_prompt_tokens": alone["prompt"],
            "request_new_tokens": alone["new"],
        }
    finally:
        engine.close()
    # the bound for the requests just timed: their own mean prompt and generated tokens
    return {**row, "bound": bound(row, row["request_prompt_tokens"], row["request_new_tokens"])}


def bound(rates: dict[str, float], prompt: int, new: int) -> float:
    """The most a batch gains on requests of ``prompt`` + ``new`` tokens: their time at the one-at-a-
    time rates over their time at the batched rates."""
    alone = prompt / rates["prefill_1"] + new / rates["decode_1"]
    return alone / (prompt / rates["prefill_batch"] + new / rates["decode_batch"])


def vllm_grid(args: argparse.Namespace) -> list[tuple[int | None, int | None]]:
    """Every pair of the vLLM settings asked for: (max_num_batched_tokens, reserved cores)."""
    return [(t, r) for t in args.max_num_batched_tokens for r in args.reserved_cores]


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
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        nargs="+",
        default=[None],
        help="vLLM: one row per value of the tokens one engine step schedules (default: vLLM's own)",
    )
    parser.add_argument(
        "--reserved-cores",
        type=int,
        nargs="+",
        default=[None],
        help="vLLM on a CPU: one row per count of cores kept off the model threads for the scheduler "
        "(VLLM_CPU_NUM_OF_RESERVED_CPU; default: vLLM's own, 1)",
    )
    parser.add_argument("--grammar", default=None, help="decode under this recipe's grammar (naive-rag)")
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--out", default=".hoprl/bench/engine_scaling.json")
    args = parser.parse_args()
    model = resolve_model(args.model, Path(".hoprl/models/smollm2-135m-instruct"))
    results = {}
    for kind in args.engines:
        for tokens, reserved in vllm_grid(args) if kind == "vllm" else [(None, None)]:
            label = " ".join(
                [kind]
                + ([f"max_num_batched_tokens={tokens}"] if tokens is not None else [])
                + ([f"reserved cores={reserved}"] if reserved is not None else [])
            )
            settings = {"max_num_batched_tokens": tokens, "cpu_reserved_cores": reserved}
            results[label] = measure(kind, model, args, settings)
    b = args.batch
    print(f"| engine | prefill tok/s 1 | x{b} | ratio | decode tok/s 1 | x{b} | ratio | request P + D "
          f"| bound x{b} | requests/s 1 | x{b} | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, r in results.items():
        print(
            f"| {kind} | {r['prefill_1']:.0f} | {r['prefill_batch']:.0f}"
            f" | {r['prefill_batch'] / r['prefill_1']:.2f}"
            f" | {r['decode_1']:.1f} | {r['decode_batch']:.1f} | {r['decode_batch'] / r['decode_1']:.2f}"
            f" | {r['request_prompt_tokens']:.0f} + {r['request_new_tokens']:.1f}"
            f" | {r['bound']:.2f} | {r['requests_1']:.3f} | {r['requests_batch']:.3f}"
            f" | {r['requests_batch'] / r['requests_1']:.2f} |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":  # vLLM spawns its engine core: building one needs this guard
    main()
