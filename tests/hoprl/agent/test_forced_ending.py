"""When a constrained step may only end the episode: the runner's accounting, computed by hand.

The runner (hoprl.agent.runner) grants each call ``min(step_tokens, token_budget - used)`` tokens,
``used`` being the context growth its last call reported, and stops only when nothing is left. An
information block enters ``used`` on the call after it is injected, so the documents a search
brings never shorten the very next call: a step may search when, after its longest search turn,
the next call still holds a closing turn (``grown + longest + closing <= token_budget``).

The hand-computed tests count words (``count`` = words of the chat), so every size is visible; the
last one counts real tokens (SmolLM2's template) and checks real grammars with llguidance.
The grammar sizes are the grammar module's own (tests/hoprl/agent/test_grammar.py pins them):
when-to-search's longest segment is ``max_tokens - 1`` at 96 and 128 tokens and 165 from 256 on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hoprl.agent.grammar import Turn, grammar
from hoprl.data.synthetic import generate, hops_for
from hoprl.domain import Question, RetrievedDoc
from hoprl.generation.chat import Constraint, EngineChat, chat_tokens
from hoprl.generation.engines import Generation
from hoprl.generation.model import resolve_model
from hoprl.recipes import get_recipe

ROOT = Path(__file__).resolve().parents[3]

FIRST = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


def words(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) for m in messages)


def after_search(messages: list[dict[str, str]], search: int, information: int) -> list[dict[str, str]]:
    """The chat after a search turn of ``search`` words and an information block of ``information``."""
    return [
        *messages,
        {"role": "assistant", "content": " ".join(["w"] * search)},
        {"role": "user", "content": " ".join(["d"] * information)},
    ]


def searches(rule: object) -> bool:
    return rule is not None and "<search>" in rule.lark  # type: ignore[attr-defined]


def test_grammar_sizes_the_tests_rely_on() -> None:
    assert grammar("when-to-search", max_tokens=96).longest == 95
    assert grammar("when-to-search", max_tokens=128).longest == 127
    assert grammar("when-to-search", max_tokens=8192).longest == 165


def test_the_issue_shape_searches_at_step_one() -> None:
    """make run's old served shape (128 tokens a step, 512 a episode): step 1 with nothing grown.
    0 + 127 (search turn) + 127 (closing turn) = 254 <= 512: it may search. (The old rule added a
    512-token guess of the documents: 0 + 127 + 512 + 127 = 766 > 512 forced every step to answer.)"""
    chat = EngineChat(engine=None, constraint=Constraint("when-to-search", 4, 128, 512, words))  # type: ignore[arg-type]
    assert searches(chat.rule(FIRST, 128))


def test_the_demo_shape_searches_twice() -> None:
    """The cpu preset's shape (96 tokens a step, 1152 a episode, 4 steps), with the largest
    5-document block measured in the synthetic world (395 tokens) after each search of 95 tokens:

    - step 2: grown = 95 + 395 = 490; 490 + 95 + 95 = 680 <= 1152: a second search is allowed (the
      old rule: 490 + 95 + max(395, 512) + 95 = 1192 > 1152, forced to answer);
    - step 3: grown = 2 * 490 = 980; 980 + 95 + 95 = 1170 > 1152: it must answer. The runner grants
      that step min(96, 1152 - (490 + 95)) = 96 tokens (the second block is not yet counted), so the
      closing turn fits.
    """
    chat = EngineChat(engine=None, constraint=Constraint("when-to-search", 4, 96, 1152, words))  # type: ignore[arg-type]
    assert searches(chat.rule(FIRST, 96))
    chat.calls.append(Generation(text="", finish_reason="stop", token_ids=[0] * 95))
    second = after_search(FIRST, 95, 395)
    assert searches(chat.rule(second, 96))
    chat.calls.append(Generation(text="", finish_reason="stop", token_ids=[0] * 95))
    third = chat.rule(after_search(second, 95, 395), 96)
    assert third is not None and not searches(third) and "<answer>" in third.lark


def test_the_boundary_at_the_demo_shape() -> None:
    """1152 - 95 - 95 = 962: a chat grown by 962 tokens may still search, one grown by 963 may not."""
    rule = Constraint("when-to-search", 4, 96, 1152, words)
    assert searches(rule.grammar(FIRST, step=1, max_tokens=96, grown=962))
    assert not searches(rule.grammar(FIRST, step=1, max_tokens=96, grown=963))
    assert not searches(rule.grammar(FIRST, step=3, max_tokens=96, grown=0))  # the 4th step is the last


def test_the_papers_shape() -> None:
    """when-to-search's Table (max_turns 5, max_action_length 8192, max_response_length 16384,
    max_obs_length 4096): after three searches of 165 tokens, each with a 4096-token observation,
    grown = 3 * (165 + 4096) = 12783 and the runner grants min(8192, 16384 - (12783 - 4096)) = 7697.
    12783 + 165 + 165 = 13113 <= 16384: the 4th step may search (a grant under 8192 is no reason to
    close; the old rule closed on it, and on 12783 + 165 + 4096 + 165 = 17209 > 16384). At 16000
    grown: 16000 + 330 = 16330 <= 16384 still searches; at 16055: 16385 > 16384 it answers."""
    rule = Constraint("when-to-search", 5, 8192, 16384, words)
    assert searches(rule.grammar(FIRST, step=3, max_tokens=7697, grown=12783))
    assert searches(rule.grammar(FIRST, step=3, max_tokens=384, grown=16000))
    assert not searches(rule.grammar(FIRST, step=3, max_tokens=329, grown=16055))
    assert not searches(rule.grammar(FIRST, step=4, max_tokens=8192, grown=0))  # max_turns 5


# -- an in-grammar checkpoint decodes the same constrained and free -----------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The bundled model's tokenizer (the dense copy is converted from its GGUF file once, ~20 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct"))


def expert_chats(question: Question, recipe: Any) -> list[tuple[list[dict[str, str]], str]]:
    """Each step of when-to-search's expert episode: the chat before it and the text it writes.
    After the i-th search the information block holds 5 documents (the recipe's top-k): the hop's
    gold paragraph and the question's other paragraphs, in the recipe's own format."""
    segments, hops = recipe.expert_segments(question), hops_for(question)
    chat, out = recipe.messages(question), []
    for i, text in enumerate(segments):
        out.append((chat, text))
        gold = [p for p in question.paragraphs if p.title == hops[min(i, len(hops) - 1)].title]
        others = [p for p in question.paragraphs if p not in gold]
        docs = [RetrievedDoc(id=p.title, title=p.title, text=p.text, score=1.0) for p in (gold + others)[:5]]
        info = recipe.information([docs])
        chat = [*chat, {"role": "assistant", "content": text}, {"role": "user", "content": info}]
    return out


def admits(matcher_tokenizer: Any, lark: str, ids: list[int]) -> bool:
    """Whether the grammar admits exactly these tokens (every one allowed, and it may end there)."""
    import llguidance

    matcher = llguidance.LLMatcher(matcher_tokenizer, lark, log_level=0)
    return bool(matcher.consume_tokens(ids)) and matcher.is_accepting()


@pytest.mark.parametrize(("step_tokens", "budget"), [(128, 1152), (256, 1400)])
def test_an_in_grammar_checkpoint_decodes_the_same_constrained(
    tokenizer: Any, step_tokens: int, budget: int
) -> None:
    """A checkpoint whose free output is the expert's (the SFT target) and in the recipe's grammar
    (each step admitted by the unforced turn's grammar at its grant) writes, at every step, text the
    grammar the constraint picks admits token by token, so greedy decoding under it chooses the same
    tokens: constrained and free decoding give the same episode. Four steps within make run's 1152
    tokens at 128 a step, and at 256 (the grammar's full caps) within 1400, on the synthetic world's
    two- and three-hop questions that fit 4 steps: a three-hop episode's third search comes at
    ~600-900 grown tokens, where the old 512-token guess (e.g. 700 + 127 + 512 + 127 > 1152) forced
    an answer the checkpoint would not write. (At 96 a step the grammar's own caps, not the forced
    ending, reject most expert steps, e.g. a reflection over 15 tokens: make run serves free.)"""
    import llguidance.hf

    matcher_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
    recipe = get_recipe("when-to-search")
    count = chat_tokens(tokenizer)
    questions = [q for q in generate(seed=0)["test"] if q.answers and len(recipe.expert_segments(q)) <= 4]
    tested = {3: 0, 4: 0}  # in-grammar episodes checked, by steps
    for question in questions[:40]:
        steps = expert_chats(question, recipe)
        used, plan = 0, []  # the runner's accounting: growth at the last call + its completion
        for messages, text in steps:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            grant = min(step_tokens, budget - used)
            assert len(ids) <= grant, (question.question, text)  # the free episode is never cut
            plan.append((messages, ids, grant))
            used = count(messages) - count(steps[0][0]) + len(ids)
        free = [
            grammar("when-to-search", max_tokens=g, turn=Turn(i > 0, False))
            for i, (_, _, g) in enumerate(plan)
        ]
        if not all(admits(matcher_tokenizer, f.lark, ids) for f, (_, ids, _) in zip(free, plan, strict=True)):
            continue  # not an in-grammar checkpoint's episode
        tested[len(steps)] += 1
        chat = EngineChat(engine=None, constraint=Constraint("when-to-search", 4, step_tokens, budget, count))  # type: ignore[arg-type]
        for messages, ids, grant in plan:
            rule = chat.rule(messages, grant)
            assert rule is not None and admits(matcher_tokenizer, rule.lark, ids), (question.question, rule)
            chat.calls.append(Generation(text="", finish_reason="stop", token_ids=ids))
    assert tested[3] >= 3 and tested[4] >= 1, tested  # two- and three-hop episodes among them


def cut_share(tokenizer: Any, questions: list[Question], steps: int, step_tokens: int, budget: int) -> float:
    """The share of the expert's episodes the runner would cut, by its accounting at this shape:
    a step cut at its grant ``min(step_tokens, budget - used)`` (a format error, or the token
    budget when the grant was short), nothing left before a step, or more steps than allowed."""
    recipe, count = get_recipe("when-to-search"), chat_tokens(tokenizer)
    cut = 0
    for question in questions:
        chats = expert_chats(question, recipe)
        used, ended = 0, len(chats) <= steps
        for messages, text in chats[:steps]:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            grant = min(step_tokens, budget - used)
            if grant <= 0 or len(ids) > grant:
                ended = False
                break
            used = count(messages) - count(chats[0][0]) + len(ids)
        cut += not ended
    return cut / len(questions)


def test_the_cpu_preset_holds_the_experts_episodes(tokenizer: Any) -> None:
    """make run's world (two hops): the expert's episodes (what the SFT warm start learns) end with
    their answer at the cpu preset's shape, 4 steps of 96 within 1152, on the first 60 test
    questions with an answer. At the old 64 a step within 512, 7 of the 60 were cut (measured: turns
    of 65-66 tokens, and two-search episodes past the budget; 96 within 512 still cut 5)."""
    from hoprl.jobspec import CPU_PRESET

    questions = [q for q in generate(seed=0, max_hops=2)["test"] if q.answers][:60]
    shape = (CPU_PRESET["max_steps"], CPU_PRESET["max_new_tokens_per_step"], CPU_PRESET["token_budget"])
    assert shape == (4, 96, 1152)
    assert cut_share(tokenizer, questions, *shape) == 0.0
    assert cut_share(tokenizer, questions, 4, 64, 512) > 0.1
    assert cut_share(tokenizer, questions, 4, 96, 512) > 0.0
