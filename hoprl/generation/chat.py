"""The episode runner's model on a local engine: LLMClient's ``chat()`` without HTTP.

The episode runner (:mod:`hoprl.agent.runner`) talks to a model through ``chat()``;
:class:`EngineChat` is an adapter with :class:`hoprl.clients.llm.LLMClient`'s signature that calls
an :class:`~hoprl.generation.engines.Engine` in the process. It restores stop text by the client's
rule, so an episode run here equals one run against the policy service over HTTP. The policy
service serves episodes through it; the trainer's rollouts generate through it.

:class:`Constraint` decodes each step under the recipe's action grammar
(:mod:`hoprl.agent.grammar`): serving only, never rollouts (training must see the policy's own
mistakes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Unpack

from anyio import to_thread

from hoprl.agent.grammar import Grammar, Turn, grammar
from hoprl.clients.llm import ChatOptions, chat_options, restore_stop
from hoprl.domain import Completion
from hoprl.generation.engines import Engine, Generation, SamplingParams

Messages = list[dict[str, str]]
_Ask = tuple[Messages, SamplingParams, "asyncio.Future[list[Generation]]"]


def completions(gens: list[Generation], stop: list[str], logprobs: bool) -> list[Completion]:
    """One prompt's generations as LLMClient's completions (stop text restored by its rule)."""
    usage = {"prompt_tokens": gens[0].prompt_tokens, "completion_tokens": sum(len(g.token_ids) for g in gens)}
    out = []
    for g in gens:
        appended = restore_stop(g.text, g.finish_reason, g.stop_reason, stop)
        lps = list(zip(g.tokens, g.logprobs, strict=True)) if logprobs and g.logprobs else None
        out.append(Completion(g.text + (appended or ""), g.finish_reason, appended, lps, usage))
    return out


def sampling_params(
    stop: list[str], max_tokens: int, temperature: float, top_p: float, seed: int | None, n: int,
    logprobs: bool, deadline: float | None = None, grammar: str | None = None,
) -> SamplingParams:  # fmt: skip
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, n=n, stop=tuple(stop),
                          seed=seed, logprobs=logprobs, deadline=deadline, grammar=grammar)  # fmt: skip


@dataclass(frozen=True)
class Constraint:
    """Serve an episode under its recipe's action grammar (:mod:`hoprl.agent.grammar`).

    Args:
        recipe: the recipe's name (its grammar family).
        max_steps: the episode's step cap.
        step_tokens: the runner's full ``max_tokens`` per step (a closing turn is sized for it).
        token_budget: the episode's budget of context growth (the runner's ``token_budget``).
        count: tokens of a chat under the model's template.

    A step may only end the episode (the grammar's *final* turn) when it is the last allowed step,
    or when, after this step, the runner would not give the next one room for a closing turn.
    That is the runner's own accounting (:mod:`hoprl.agent.runner`): before each call it grants
    ``min(step_tokens, token_budget - used)`` tokens, ``used`` being the context growth its *last*
    call reported (prompt growth + completion), and stops the episode only when nothing is left.
    An information block enters ``used`` on the model call after it is injected, so it limits the
    call after that one: when this step is decoded, every block injected so far is already in
    ``grown`` (measured on the chat), and the documents this step's search would bring do not
    shorten the next call. The next call therefore gets at least ``min(step_tokens, token_budget -
    grown - longest(this step))``; this step may search when that holds a closing turn:

        grown + normal.longest + closing.longest <= token_budget

    with ``normal`` this step's grammar at its grant and ``closing`` the final turn's at
    ``step_tokens``. A grant smaller than ``step_tokens`` is no reason to close by itself.

    (no guess of the documents' size: at ``make run``'s shape the old 512-token guess made every
    step final at step 1, so the constrained model never searched).
    """

    recipe: str
    max_steps: int
    step_tokens: int
    token_budget: int
    count: Callable[[Messages], int]

    def grammar(self, messages: Messages, step: int, max_tokens: int, grown: int) -> Grammar | None:
        """The grammar of step ``step`` (0-based) after ``messages``, the chat having ``grown`` tokens
        since its first prompt (information blocks included); None when even the tags do not fit in
        ``max_tokens`` (that step decodes free and the response says so)."""
        after = len(messages) >= 2 and messages[-2]["role"] == "assistant"
        if step + 1 < self.max_steps:
            try:
                normal = grammar(self.recipe, max_tokens=max_tokens, turn=Turn(after, False))
                closing = grammar(self.recipe, max_tokens=self.step_tokens, turn=Turn(True, True))
            except ValueError:  # this step's grant cannot hold a search's tags: it may only close
                pass
            else:
                if grown + normal.longest + closing.longest <= self.token_budget:
                    return normal
        try:
            return grammar(self.recipe, max_tokens=max_tokens, turn=Turn(after, True))
        except ValueError:
            return None


def chat_tokens(tokenizer: Any) -> Callable[[Messages], int]:
    """``count(messages)``: tokens of a chat under ``tokenizer``'s template, as the engine encodes it."""

    def count(messages: Messages) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


class EngineChat:
    """``await EngineChat(engine).chat(messages, stop=[...])``: LLMClient's ``chat`` on the local engine.

    Args:
        deadline: ``time.monotonic()`` after which generation stops (the request's timeout).
        logprobs: always ask the engine for log-probs (rollouts), whatever the runner asks.
        constraint: decode each step under the recipe's grammar (serving only; None = free, as
            rollouts and training always are).

    Every call's generation is kept in ``calls`` (one per runner step, in order) and the name of
    the grammar it was decoded under in ``grammars`` (None: free).
    """

    def __init__(
        self, engine: Engine, deadline: float | None = None, logprobs: bool = False,
        constraint: Constraint | None = None,
    ) -> None:  # fmt: skip
        self.engine, self.deadline, self.logprobs, self.constraint = engine, deadline, logprobs, constraint
        self.calls: list[Generation] = []
        self.grammars: list[str | None] = []
        self.sizes: list[int] = []  # tokens of the chat at each constrained call

    async def chat(self, messages: list[dict[str, str]], **options: Unpack[ChatOptions]) -> list[Completion]:
        o = chat_options(options)
        stop, max_tokens = o["stop"] or [], o["max_tokens"]
        rule = self.rule(messages, max_tokens) if self.constraint else None
        lark = rule.lark if rule else None
        params = sampling_params(stop, max_tokens, o["temperature"], o["top_p"], o["seed"], o["n"],
                                 o["logprobs"] or self.logprobs, self.deadline, lark)  # fmt: skip
        gens = await self.generate(messages, params)
        self.calls.extend(gens)
        self.grammars.extend([rule.name if rule else None] * len(gens))
        return completions(gens, stop, o["logprobs"])

    async def generate(self, messages: Messages, params: SamplingParams) -> list[Generation]:
        (gens,) = await to_thread.run_sync(self.engine.generate, [messages], params)
        return gens

    def rule(self, messages: Messages, max_tokens: int) -> Grammar | None:
        """The constraint's grammar for the next step, from the chat's measured growth so far."""
        assert self.constraint is not None
        self.sizes.append(self.constraint.count(messages))
        return self.constraint.grammar(messages, len(self.calls), max_tokens, self.sizes[-1] - self.sizes[0])
