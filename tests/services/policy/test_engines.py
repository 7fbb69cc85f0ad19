"""The engines behind one interface: transformers (in process), OpenAI (remote), vLLM (GPU only)."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from hoprl.domain import Question
from hoprl.generation.engines import SamplingParams, find_stop
from hoprl.generation.openai_engine import OpenAIEngine
from hoprl.generation.transformers_engine import TransformersEngine
from hoprl.generation.vllm_engine import VllmEngine

CHAT = [{"role": "user", "content": "Name three colors."}]
GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def engine(model_path: str) -> TransformersEngine:
    return TransformersEngine(model_path)


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        ("a</search> b", ["</search>"], (1, "</search>")),
        ("x.y!", ["!", "."], (1, ".")),
        ("no stop", ["</answer>"], None),
        ("ab", [], None),
    ],
)
def test_find_stop(text: str, stop: list[str], expected: tuple[int, str] | None) -> None:
    assert find_stop(text, stop) == expected


def test_batched_greedy_equals_one_by_one(engine: TransformersEngine) -> None:
    """Left padding keeps each row's greedy output what it is alone."""
    prompts = [CHAT, [{"role": "user", "content": "Where is Paris? Answer briefly."}]]
    alone = [engine.generate([p], GREEDY)[0][0].text for p in prompts]
    together = [g[0].text for g in engine.generate(prompts, GREEDY)]
    assert together == alone


def test_stop_string_cut_and_ids_kept(engine: TransformersEngine) -> None:
    (g,) = engine.generate(
        ["The capital of France is"], SamplingParams(max_tokens=12, temperature=0, stop=(".",))
    )[0]
    assert g.finish_reason == "stop" and g.stop_reason == "." and "." not in g.text
    tok = engine.tokenizer
    assert tok.decode(g.token_ids).startswith(g.text + ".")  # ids run through the stop string


def test_concurrent_callers_share_batches(engine: TransformersEngine) -> None:
    results: list[str] = []

    def call(i: int) -> None:
        prompt = [{"role": "user", "content": f"Count to {i}."}]
        results.append(engine.generate([prompt], GREEDY)[0][0].text)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and all(results)


def test_deadline_bounds_the_work(engine: TransformersEngine) -> None:
    """A passed deadline stops decoding after the token in progress (finish_reason 'length')."""
    params = SamplingParams(max_tokens=200, temperature=0, deadline=time.monotonic() - 1)
    (g,) = engine.generate([CHAT], params)[0]
    assert g.finish_reason == "length" and len(g.token_ids) == 1


def test_prompt_beyond_the_context_is_a_value_error(engine: TransformersEngine) -> None:
    with pytest.raises(ValueError, match="context"):
        engine.generate(["word " * 9000], GREEDY)


def test_openai_engine_forwards_to_a_compatible_server(policy_url: str, engine: TransformersEngine) -> None:
    """The OpenAI engine against our own policy service: same greedy text as the local engine."""
    remote = OpenAIEngine(f"{policy_url}/v1", "unused", None)
    assert remote.model_path == "smollm2-135m-instruct"
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    (got,) = remote.generate([CHAT], params)[0]
    (local,) = engine.generate([CHAT], params)[0]
    assert got.text == local.text and got.finish_reason == local.finish_reason
    assert got.logprobs == pytest.approx(local.logprobs, abs=1e-4)
    (text,) = remote.generate(
        ["The capital of France is"], SamplingParams(max_tokens=8, temperature=0, stop=(".",))
    )[0]
    assert text.stop_reason == "." and text.prompt_tokens > 0
    remote.close()


@pytest.fixture(scope="module")
def vllm_engine(model_path: str) -> Iterator[VllmEngine]:
    """One vLLM engine for this module's two vLLM tests: a start costs ~70 s on two shared cores."""
    engine = VllmEngine(model_path, gpu_memory_utilization=0.3)
    yield engine
    engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is a GPU-only extra (pip install hoprl[gpu])"
)
def test_vllm_engine_matches_the_interface(vllm_engine: VllmEngine, model_path: str) -> None:
    engine = vllm_engine
    (g,) = engine.generate([CHAT], SamplingParams(max_tokens=8, temperature=0, logprobs=True, stop=(".",)))[0]
    assert (
        g.text
        and g.finish_reason in ("stop", "length")
        and g.logprobs
        and len(g.logprobs) == len(g.token_ids)
    )
    outs = engine.generate(["The capital of France is"], SamplingParams(max_tokens=8, n=2, seed=1))
    assert len(outs[0]) == 2
    engine.load(model_path)
    assert engine.model_path == model_path


@pytest.mark.gpu
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is a GPU-only extra (pip install hoprl[gpu])"
)
def test_vllm_engine_decodes_under_a_recipe_grammar(vllm_engine: VllmEngine) -> None:
    """The grammar's Lark text goes to vLLM's structured outputs (guidance backend): the output
    parses to an action, as on the transformers engine."""
    from hoprl.agent.grammar import grammar
    from hoprl.recipes import get_recipe

    recipe, rule = get_recipe("search-r1"), grammar("search-r1", max_tokens=128)
    messages = recipe.messages(Question(id="q", dataset="t", split="dev", question="Who founded Acme?"))
    params = SamplingParams(max_tokens=128, temperature=0, stop=tuple(recipe.stop), grammar=rule.lark)
    (g,) = vllm_engine.generate([messages], params)[0]
    assert recipe.parse(g.text + (g.stop_reason or "")).kind in ("search", "answer"), g.text


def test_transformers_engine_decodes_under_a_recipe_grammar(engine: TransformersEngine) -> None:
    from hoprl.agent.grammar import grammar
    from hoprl.recipes import get_recipe

    recipe, rule = get_recipe("evo-rag"), grammar("evo-rag", max_tokens=128)
    messages = recipe.messages(Question(id="q", dataset="t", split="dev", question="Who founded Acme?"))
    free = SamplingParams(max_tokens=128, temperature=0, stop=tuple(recipe.stop))
    (g,) = engine.generate([messages], replace(free, grammar=rule.lark))[0]
    assert (
        g.text.startswith("<think>") and recipe.parse(g.text + (g.stop_reason or "")).kind != "format_error"
    )
    with pytest.raises(ValueError, match="invalid grammar"):
        engine.generate([messages], replace(free, grammar="start: (("))


def test_autocast_decodes_in_bf16(model_path: str) -> None:
    """``autocast=True`` runs the layers in bf16 while the weights stay float32."""
    import torch

    engine = TransformersEngine(model_path, autocast=True)
    seen: list[torch.dtype] = []
    layer = next(m for m in engine.model.modules() if isinstance(m, torch.nn.Linear))
    hook = layer.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    try:
        (g,) = engine.generate([CHAT], GREEDY)[0]
    finally:
        hook.remove()
    assert g.token_ids and engine.tokenizer.decode(g.token_ids).startswith(g.text)
    assert seen and set(seen) == {torch.bfloat16}
    assert next(engine.model.parameters()).dtype == torch.float32
    engine.close()
