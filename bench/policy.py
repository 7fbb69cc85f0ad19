"""Policy benchmark: engine tokens/s (batched vs unbatched) and /v1/answer latency and throughput.

    python bench/policy.py --data ../shared/data/hotpotqa_dev.jsonl      (make bench)
    python bench/policy.py --quick                                        (a smoke run, ~5 min)

Measures, on the default model (SmolLM2-135M-Instruct, transformers engine, one torch thread):
- tokens/s of greedy decoding, 8 prompts one at a time vs the same 8 in one batch;
- ``POST /v1/answer`` (naive-rag under its answer grammar, the HotpotQA dev corpus indexed through
  a local retriever): requests/s with one client and with ``--clients`` concurrent clients (the
  engine batches their generations continuously), measured back to back ``--repeats`` times, their
  ratio (median of the per-repeat ratios), latency p50 / p99 for both, the errors (non-200s), and
  the medians of the service's own timings of each answer (retrieval, generation, the rest);
- time to first token (TTFT) of streamed chat completions through the official ``openai`` client
  (greedy, ``--tokens`` new tokens, the question as the user turn): median for one client, median
  and p99 with ``--clients`` concurrent streams, and the median time to the last chunk
  (``--ttft-only`` measures this alone, without the corpus).
- with ``--engines transformers vllm``, each engine in turn behind the same policy service and
  settings (vLLM: eager mode, a 1 GiB KV cache), the /v1/answer and streaming figures above for
  each, the peak resident memory of the policy (this process and its children, the vLLM engine
  core among them, sampled every 0.2 s while the engine serves) and the vLLM/transformers ratios.
- with ``--layouts threads processes``, each engine also with the retriever and the policy in their
  own processes (``uvicorn``, as ``make run`` serves them) and only the clients in this one: the
  default ``threads`` layout runs both services in this process beside the clients, on one GIL.
  What a layout changes in the 16-client scaling is the cost of sharing that process.
The question sample is fixed (every k-th question of the file). The retriever's storage is kept in
``.hoprl/bench/qdrant`` so the corpus is indexed once. Timings on shared machines are noisy: run
it on an idle machine and compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import psutil
import torch

from flows.stack import APPS, local_process
from hoprl.answer_eval import prepare_collection
from hoprl.clients.http import api_key, client_options
from hoprl.data.jsonl import load_questions
from hoprl.domain import Question
from hoprl.generation.engines import SamplingParams
from hoprl.generation.model import resolve_model
from hoprl.generation.transformers_engine import TransformersEngine
from services.local import LocalServer
from services.policy.app import create_app as create_policy
from services.policy.settings import PolicySettings
from services.retriever.app import create_app as create_retriever
from services.retriever.settings import RetrieverSettings


def fixed_sample(questions: list[Question], n: int) -> list[Question]:
    step = max(1, len(questions) // n)
    return questions[::step][:n]


def engine_tokens_per_s(model: str, questions: list[Question], max_tokens: int) -> dict[str, float]:
    engine = TransformersEngine(model, threads=1)
    prompts = [[{"role": "user", "content": q.question}] for q in questions[:8]]
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    start = time.perf_counter()
    single = sum(len(engine.generate([p], params)[0][0].token_ids) for p in prompts)
    single_s = time.perf_counter() - start
    start = time.perf_counter()
    batched = sum(len(g[0].token_ids) for g in engine.generate(prompts, params))
    batched_s = time.perf_counter() - start
    engine.close()
    return {
        "unbatched_tokens_per_s": single / single_s,
        "batched8_tokens_per_s": batched / batched_s,
        "speedup": (batched / batched_s) / (single / single_s),
    }


PHASES = ("retrieval_s", "generation_s", "total_s")  # the service's own timings of each answer


async def answer_load(
    url: str, questions: list[Question], concurrency: int, phases: dict[str, list[float]] | None = None
) -> tuple[list[float], float, int]:
    """Latencies of the answered /v1/answer requests, the wall time and the number of errors
    (any other status), ``concurrency`` clients at once; each answer's ``timings`` go to ``phases``."""
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    errors = 0
    phases = {} if phases is None else phases
    async with httpx.AsyncClient(base_url=url, **client_options(600, {})) as http:  # sends $HOPRL_API_KEY

        async def one(q: Question) -> None:
            nonlocal errors
            async with semaphore:
                start = time.perf_counter()
                response = await http.post("/v1/answer", json={"question": q.question})
                if response.status_code != 200:
                    errors += 1
                    return
                latencies.append(time.perf_counter() - start)
                timings = response.json()["timings"]
                for phase in PHASES:
                    phases.setdefault(phase, []).append(timings[phase])

        start = time.perf_counter()
        await asyncio.gather(*(one(q) for q in questions))
    return latencies, time.perf_counter() - start, errors


def answer_bench(args: argparse.Namespace, policy_url: str, questions: list[Question]) -> dict[str, object]:
    """/v1/answer at one client, then ``args.clients`` at once, ``args.repeats`` times in turn.

    Each repeat measures both throughputs back to back, so their ratio compares two runs under the
    same machine load; the figures are medians over the repeats. Every request of the whole bench
    asks another question, so the engine's prefix cache holds no earlier prompt (only the system
    prompt they all share): what the concurrent run gains is batching.
    """
    size = args.single + args.concurrent_requests
    runs = []
    phases_1: dict[str, list[float]] = {}
    phases_n: dict[str, list[float]] = {}
    asyncio.run(answer_load(policy_url, questions[-1:], 1))  # warm-up
    for r in range(args.repeats):
        single = questions[r * size : r * size + args.single]
        many = questions[r * size + args.single : (r + 1) * size]
        one = asyncio.run(answer_load(policy_url, single, 1, phases_1))
        concurrent = asyncio.run(answer_load(policy_url, many, args.clients, phases_n))
        runs.append((one, concurrent))
    per_s_1 = [args.single / wall for (_, wall, _), _ in runs]
    per_s_n = [args.concurrent_requests / wall for _, (_, wall, _) in runs]
    lat_1 = [t for (lat, _, _), _ in runs for t in lat]
    lat_n = [t for _, (lat, _, _) in runs for t in lat]
    n = args.clients
    ratios = [b / a for a, b in zip(per_s_1, per_s_n, strict=True)]
    return (
        {
            "answer_repeats": args.repeats,
            "answer_requests_per_s_1_client": float(np.median(per_s_1)),
            f"answer_requests_per_s_{n}_clients": float(np.median(per_s_n)),
            f"answer_speedup_{n}_clients": float(np.median(ratios)),
            f"answer_speedup_{n}_clients_each_repeat": [round(r, 3) for r in ratios],
            "answer_p50_s": float(np.percentile(lat_1, 50)) if lat_1 else None,
            "answer_p99_s": float(np.percentile(lat_1, 99)) if lat_1 else None,
            f"answer_p50_s_{n}_clients": float(np.percentile(lat_n, 50)) if lat_n else None,
            f"answer_p99_s_{n}_clients": float(np.percentile(lat_n, 99)) if lat_n else None,
            "answer_errors": sum(one[2] + concurrent[2] for one, concurrent in runs),
        }
        | phase_medians(phases_1, "")
        | phase_medians(phases_n, f"_{n}_clients")
    )


def phase_medians(phases: dict[str, list[float]], suffix: str) -> dict[str, float]:
    """Median seconds of each phase the service timed (``answer_retrieval_p50_s...``), and of the
    rest of its handler (``answer_service_other_p50_s``: total minus retrieval and generation)."""
    out = {f"answer_{k.removesuffix('_s')}_p50_s{suffix}": float(np.median(v)) for k, v in phases.items()}
    if phases:
        rest = np.subtract(phases["total_s"], np.add(phases["retrieval_s"], phases["generation_s"]))
        out[f"answer_service_other_p50_s{suffix}"] = float(np.median(rest))
    return out


LOGS = Path(".hoprl/bench/logs")  # the service processes' logs (--layouts processes)


def policy_values(args: argparse.Namespace, model: str, engine: str, **values: object) -> dict[str, object]:
    """The policy as benchmarked: the same limits on either engine (vLLM eager, a 1 GiB KV cache)."""
    extra: dict[str, object] = {"kv_cache_gib": 1, "eager": True} if engine == "vllm" else {}
    return {"model": model, "engine": engine, "max_new_tokens_per_step": args.tokens,
            "request_timeout_s": 600, **extra, **values}  # fmt: skip


def policy_settings(args: argparse.Namespace, model: str, engine: str, **values: object) -> PolicySettings:
    return PolicySettings.model_validate(policy_values(args, model, engine, **values))


def policy_env(values: dict[str, object]) -> dict[str, str]:
    """The same settings as the environment of a policy process (``POLICY_*``)."""
    return {f"POLICY_{key.upper()}": str(value) for key, value in values.items()}


def in_process() -> list[Any]:
    """This process and all its children (vLLM's engine core and workers)."""
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def policy_processes() -> list[Any]:
    """The policy's own process (``--layouts processes``) and all its children."""
    tree = []
    for child in psutil.Process().children():
        with suppress(psutil.Error):
            if APPS["policy"] in child.cmdline():
                tree += [child, *child.children(recursive=True)]
    return tree


@contextmanager
def peak_rss(processes: Callable[[], list[Any]] = in_process) -> Iterator[dict[str, float]]:
    """``{"peak_rss_gib": ...}`` once the block ends: the most resident memory the ``processes``
    held together, sampled every 0.2 s."""
    out, done = {"peak_rss_gib": 0.0}, threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            total = 0
            for p in processes():
                with suppress(psutil.Error):
                    total += p.memory_info().rss
            out["peak_rss_gib"] = max(out["peak_rss_gib"], total / 2**30)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        done.set()
        thread.join()


@contextmanager
def retriever_at(layout: str, storage: Path) -> Iterator[str]:
    """A retriever on ``storage``, in this process or in its own; yields its URL."""
    if layout == "processes":
        with local_process("retriever", {"RETRIEVER_STORAGE_PATH": str(storage)}, LOGS) as url:
            yield url
    else:
        with LocalServer(create_retriever(RetrieverSettings(storage_path=storage))) as server:
            yield server.url


@contextmanager
def policy_at(layout: str, values: dict[str, object]) -> Iterator[str]:
    """A policy with ``values`` as its settings, in this process or in its own; yields its URL."""
    if layout == "processes":
        with local_process("policy", policy_env(values), LOGS) as url:
            yield url
    else:
        with LocalServer(create_policy(PolicySettings.model_validate(values)), startup_timeout=900) as server:
            yield server.url


def engine_bench(
    args: argparse.Namespace,
    model: str,
    engine: str,
    retriever_url: str,
    collection: str,
    questions: list[Question],
    layout: str = "threads",
) -> dict[str, object]:
    """One engine behind the policy: /v1/answer (1 and ``--clients``), streaming TTFT, peak RSS."""
    values = policy_values(args, model, engine, retriever_url=retriever_url,
                           default_collection=collection, default_recipe="naive-rag")  # fmt: skip
    with peak_rss(policy_processes if layout == "processes" else in_process) as rss:
        start = time.perf_counter()
        with policy_at(layout, values) as policy_url:
            result: dict[str, object] = {"start_s": time.perf_counter() - start}
            result |= answer_bench(args, policy_url, questions)
            result |= ttft_on(args, policy_url, questions)
    return result | rss


async def stream_timings(
    url: str, questions: list[Question], tokens: int, clients: int
) -> tuple[list[float], list[float]]:
    """Seconds to the first text chunk and to the end of each streamed chat completion, at the client."""
    key = api_key() or "unused"
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    semaphore = asyncio.Semaphore(clients)
    first: list[float] = []
    total: list[float] = []

    async def one(q: Question) -> None:
        async with semaphore:
            start, seen = time.perf_counter(), None
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": q.question}], max_tokens=tokens,
                temperature=0, stream=True,
            )  # fmt: skip
            async for chunk in stream:
                if seen is None and chunk.choices and chunk.choices[0].delta.content:
                    seen = time.perf_counter() - start
            end = time.perf_counter() - start
            first.append(end if seen is None else seen)
            total.append(end)

    await asyncio.gather(*(one(q) for q in questions))
    await client.close()
    return first, total


def ttft_on(args: argparse.Namespace, url: str, questions: list[Question]) -> dict[str, float]:
    """TTFT of streamed chat completions: one client, then ``args.clients`` at once."""
    asyncio.run(stream_timings(url, questions[:1], args.tokens, 1))  # warm-up
    first, total = asyncio.run(stream_timings(url, questions[: args.single], args.tokens, 1))
    many = (questions * 4)[: args.concurrent_requests]
    first_many, _ = asyncio.run(stream_timings(url, many, args.tokens, args.clients))
    return {
        "stream_ttft_p50_s": float(np.percentile(first, 50)),
        "stream_total_p50_s": float(np.percentile(total, 50)),
        f"stream_ttft_p50_s_{args.clients}_clients": float(np.percentile(first_many, 50)),
        f"stream_ttft_p99_s_{args.clients}_clients": float(np.percentile(first_many, 99)),
    }


def ttft_bench(args: argparse.Namespace, model: str, questions: list[Question]) -> dict[str, float]:
    """TTFT of streamed chat completions on the first of ``--engines``, without the corpus."""
    with LocalServer(create_policy(policy_settings(args, model, args.engines[0])), startup_timeout=900) as p:
        return ttft_on(args, p.url, questions)


def table(result: dict[str, dict[str, object]], clients: int) -> str:
    """The engines side by side as a Markdown table (with the vLLM/transformers ratio)."""
    rows = [("start (s)", "start_s"), ("/v1/answer req/s, 1 client", "answer_requests_per_s_1_client"),
            (f"/v1/answer req/s, {clients} clients", f"answer_requests_per_s_{clients}_clients"),
            (f"{clients} clients / 1 client", f"answer_speedup_{clients}_clients"),
            ("p50 / p99 latency (s), 1 client", ("answer_p50_s", "answer_p99_s")),
            (f"p50 / p99 latency (s), {clients} clients",
             (f"answer_p50_s_{clients}_clients", f"answer_p99_s_{clients}_clients")),
            ("in the service: retrieval / generation p50 (s), 1 client",
             ("answer_retrieval_p50_s", "answer_generation_p50_s")),
            (f"in the service: retrieval / generation p50 (s), {clients} clients",
             (f"answer_retrieval_p50_s_{clients}_clients", f"answer_generation_p50_s_{clients}_clients")),
            ("errors (non-200)", "answer_errors"), ("streamed TTFT p50 (s), 1 client", "stream_ttft_p50_s"),
            (f"streamed TTFT p50 / p99 (s), {clients} clients",
             (f"stream_ttft_p50_s_{clients}_clients", f"stream_ttft_p99_s_{clients}_clients")),
            ("peak RSS of the policy (GiB)", "peak_rss_gib")]  # fmt: skip
    engines = list(result)
    head = "| | " + " | ".join(engines) + (f" | {engines[1]} / {engines[0]} |" if len(engines) == 2 else " |")
    lines = [head, "|---" * (len(engines) + 1 + (len(engines) == 2)) + "|"]
    for label, key in rows:
        keys = key if isinstance(key, tuple) else (key,)
        cells = [" / ".join(_fmt(result[e].get(k)) for k in keys) for e in engines]
        if len(engines) == 2:
            a, b = (result[e].get(keys[0]) for e in engines)
            ok = isinstance(a, int | float) and isinstance(b, int | float) and a
            cells.append(f"{b / a:.2f}" if ok else "")  # type: ignore[operator]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default="../shared/data/hotpotqa_dev.jsonl")
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens per generation")
    parser.add_argument("--single", type=int, default=30, help="requests for the one-client latency")
    parser.add_argument("--concurrent-requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="1-client / concurrent /v1/answer pairs")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--ttft-only", action="store_true", help="only the streaming time to first token")
    parser.add_argument("--engines", nargs="+", default=["transformers"], choices=["transformers", "vllm"],
                        help="the engines benchmarked in turn, in one run")  # fmt: skip
    parser.add_argument("--layouts", nargs="+", default=["threads"], choices=["threads", "processes"],
                        help="the services in this process (threads) or each in its own")  # fmt: skip
    args = parser.parse_args()
    # vLLM logs to stdout by default, which would break the JSON this prints there
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if args.quick:
        # 32 tokens: room for naive-rag's answer grammar, so /v1/answer runs as served by default
        args.tokens, args.single, args.concurrent_requests = 32, 8, 16
    torch.set_num_threads(1)
    model = resolve_model(None, Path(".hoprl/models/smollm2-135m-instruct"))
    needed = (args.single + args.concurrent_requests) * args.repeats + 1
    questions = fixed_sample(load_questions(args.data), max(needed, 16))
    result: dict[str, object] = {"model": model, "tokens": args.tokens, "cpus": os.cpu_count()}
    result["load_average_before"] = os.getloadavg()
    if args.ttft_only:
        result |= ttft_bench(args, model, questions)
    else:
        result |= engine_tokens_per_s(model, questions, args.tokens)
        engines: dict[str, dict[str, object]] = {}
        for layout in args.layouts:  # one retriever at a time: the embedded Qdrant folder is locked
            with retriever_at(layout, Path(".hoprl/bench/qdrant")) as retriever_url:
                start = time.perf_counter()
                collection = prepare_collection(
                    retriever_url, load_questions(args.data), name="bench-hotpotqa"
                )
                result.setdefault("index_s", time.perf_counter() - start)
                for e in args.engines:
                    name = e if layout == "threads" else f"{e}, processes"
                    engines[name] = engine_bench(args, model, e, retriever_url, collection, questions, layout)
        result["engines"] = engines
        result["table"] = table(engines, args.clients)
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if "table" in result:
        print(result["table"])


if __name__ == "__main__":
    main()
