"""Action grammars: each recipe's protocol as a Lark grammar, for constrained decoding at serving time.

An untrained or small policy often writes text its recipe cannot parse (the 135M default model
answered none of 200 dev questions with ``search-r1``: a format error at step 1 every time). When
serving, the policy service hands the grammar of the next *segment* (one turn, up to and including
the stop string that ends it) to the engine, which masks every token that would leave the grammar
(llguidance on CPU, vLLM's structured outputs on GPU; both read the same Lark text). Training never
uses them: rollouts must show the policy's own mistakes to the reward.

Each grammar is written from its recipe's protocol in ``hoprl/recipes`` (tags, stop strings, the
rules of ``parse``), so every string it admits parses to an action that is not a format error:

==============  ================================================================================
recipe          one segment
==============  ================================================================================
naive-rag       ``<answer>a</answer>``, or the plain one-paragraph answer its parser also takes
                (forcing the tag made the untrained model copy the prompt's example answer)
search-r1       ``<think>t</think>`` then ``<search>q</search>`` or ``<answer>a</answer>``
eval-rar        after an information turn ``<evaluate>e</evaluate>`` first, then as search-r1
when-to-search  the paper's two forms: first turn think, then search, or reflect and answer;
                after an information turn ``<reflect>r</reflect>``, an optional think, then
                search or answer
evo-rag         ``<think>t</think>`` then one of search, ``<backtrack/>``, answer, ``<refuse/>``
r2ag            ``<think>t</think>``, then one to four ``<base-Q>`` / ``<predicted-Q>`` sub-queries
                or the stop ``<base-Q>stop retrieval</base-Q>`` (either optionally followed by
                ``<predicted-Q>none</predicted-Q>``), then ``<end/>``; no stop at the first
                expansion (nothing is retrieved yet)
arena           ``<relevance>[1,5]</relevance><analysis>x</analysis><answer>a</answer>``
==============  ================================================================================

``final=True`` (the episode's last allowed step) keeps only the endings (answer, refuse, stop), so
a served episode ends with an answer instead of running out of steps.

Every free-text block is non-empty, holds no ``<`` (so no tag can open inside it) and has a token
cap (:data:`CAPS`). Tags themselves cost at most one token per byte, so :func:`grammar` knows the
longest segment its grammar admits and shrinks the caps alike until it fits ``max_tokens`` (an
answer or query keeps :data:`ANSWER_FLOOR` tokens at the thoughts' expense where it can): a
constrained segment is never cut at the token limit (which the runner would count as a format error).

    >>> g = grammar("search-r1", max_tokens=256)
    >>> g.name, g.longest <= 256
    ('search-r1@1', True)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from hoprl.domain import unknown

#: Token caps of the free-text blocks (a serving limit: long thoughts cost latency, not accuracy).
CAPS = {"think": 48, "review": 40, "analysis": 96, "query": 24, "answer": 24, "plain": 64}
#: the thought blocks, and the tokens an answer or query keeps before they do when a segment must
#: fit fewer tokens (most HotpotQA answers take 1-5 tokens)
THOUGHTS = frozenset({"think", "review", "analysis"})
ANSWER_FLOOR = 8

# Lexemes: TEXT may span lines, LINE may not; both hold a non-space character and no "<".
LEXEMES = {
    "TEXT": r"/[^<]*[^<\s][^<]*/",
    "LINE": r"/[^<\n]*[^<\s][^<\n]*/",
    # R2AG: a sub-query that is no stop signal (parse reads those two words as stop / no query).
    "SUBQUERY": r"/[^<\n]*[^<\s][^<\n]*/ & ~/(?i)\s*(stop retrieval|none)\W*\s*/",
    # naive-rag's plain answer: a paragraph (its stop "\n\n" ends it), no tag in it
    "PLAIN": r"/[^<\s][^<]*/",
    "REFS": r"/\[[1-9][0-9]?(,[ ]?[1-9][0-9]?){0,9}\]/",
}

# -- a tiny grammar algebra: Lark text plus the longest segment in tokens ---------------------------
# Written here because the token bound is ours to compute: llguidance compiles the Lark text, but
# no library tells how many tokens the longest string of a grammar takes.


@dataclass(frozen=True)
class Lit:
    """A literal string (a tag): at most one token per UTF-8 byte."""

    text: str


@dataclass(frozen=True)
class Gen:
    """Free text: ``lexeme`` under the token cap of ``cap`` (a key of :data:`CAPS`)."""

    cap: str
    lexeme: str


@dataclass(frozen=True)
class Seq:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Rep:
    part: Node
    low: int
    high: int


Node = Lit | Gen | Seq | Alt | Rep


def seq(*parts: Node | str) -> Seq:
    return Seq(tuple(Lit(p) if isinstance(p, str) else p for p in parts))


def alt(*parts: Node | str) -> Alt:
    return Alt(tuple(Lit(p) if isinstance(p, str) else p for p in parts))


def opt(part: Node | str) -> Rep:
    return Rep(Lit(part) if isinstance(part, str) else part, 0, 1)


def block(tag: str, cap: str, lexeme: str = "TEXT") -> Seq:
    """``<tag>free text</tag>``."""
    return seq(f"<{tag}>", Gen(cap, lexeme), f"</{tag}>")


NL = opt("\n")


def _lark(node: Node) -> str:
    """The node as a Lark expression (a Gen is a reference to its capped rule)."""
    if isinstance(node, Lit):
        return json.dumps(node.text)
    if isinstance(node, Gen):
        return f"{node.cap}_{node.lexeme.lower()}"
    if isinstance(node, Seq):
        return " ".join(_lark(p) for p in node.parts)
    if isinstance(node, Alt):
        return "(" + " | ".join(_lark(p) for p in node.parts) + ")"
    return f"({_lark(node.part)}){{{node.low},{node.high}}}"


def _longest(node: Node, caps: dict[str, int]) -> int:
    """Tokens of the longest string the node admits under ``caps``."""
    if isinstance(node, Lit):
        return len(node.text.encode())
    if isinstance(node, Gen):
        return caps[node.cap]
    if isinstance(node, Seq):
        return sum(_longest(p, caps) for p in node.parts)
    if isinstance(node, Alt):
        return max(_longest(p, caps) for p in node.parts)
    return node.high * _longest(node.part, caps)


def _gens(node: Node) -> set[Gen]:
    if isinstance(node, Gen):
        return {node}
    if isinstance(node, Seq | Alt):
        return set().union(*(_gens(p) for p in node.parts))
    if isinstance(node, Rep):
        return _gens(node.part)
    return set()


# -- the recipes' segments --------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """Where the segment sits: right after an injected information turn, and/or the last step."""

    after_information: bool = False
    final: bool = False


THINK = block("think", "think")
SEARCH = block("search", "query", "LINE")
ANSWER = block("answer", "answer", "LINE")


def _naive_rag(turn: Turn) -> Node:
    return alt(ANSWER, Gen("plain", "PLAIN"))


def _search_r1(turn: Turn) -> Node:
    return seq(THINK, NL, ANSWER if turn.final else alt(SEARCH, ANSWER))


def _eval_rar(turn: Turn) -> Node:
    body = _search_r1(turn)
    return seq(block("evaluate", "review"), NL, body) if turn.after_information else body


def _when_to_search(turn: Turn) -> Node:
    reflect = block("reflect", "review")
    answer = seq(reflect, NL, ANSWER)  # think, reflect, answer: the paper's no-search form
    if turn.after_information:
        action = ANSWER if turn.final else alt(SEARCH, ANSWER)
        return seq(reflect, NL, opt(seq(THINK, NL)), action)
    return seq(THINK, NL, answer if turn.final else alt(SEARCH, answer))


def _evo_rag(turn: Turn) -> Node:
    endings = (ANSWER, "<refuse/>")
    return seq(THINK, NL, alt(*endings) if turn.final else alt(SEARCH, "<backtrack/>", *endings))


def _r2ag(turn: Turn) -> Node:
    sub = alt(block("base-Q", "query", "SUBQUERY"), block("predicted-Q", "query", "SUBQUERY"))
    no_prediction = seq(NL, "<predicted-Q>none</predicted-Q>")  # the paper's "nothing to predict"
    subs = seq(sub, Rep(seq(NL, sub), 0, 3), opt(no_prediction))
    stop = seq("<base-Q>stop retrieval</base-Q>", opt(no_prediction))
    # The first expansion has found nothing yet, so it cannot stop; the last one must.
    action = stop if turn.final else subs if not turn.after_information else alt(subs, stop)
    return seq(THINK, NL, action, NL, "<end/>")


def _arena(turn: Turn) -> Node:
    refs = seq("<relevance>", Gen("answer", "REFS"), "</relevance>")
    return seq(refs, NL, block("analysis", "analysis"), NL, ANSWER)


@dataclass(frozen=True)
class ActionGrammar:
    """One recipe's grammar family: ``build(turn)`` is the segment; ``version`` changes with it."""

    version: int
    build: Callable[[Turn], Node]


GRAMMARS: dict[str, ActionGrammar] = {
    "naive-rag": ActionGrammar(2, _naive_rag),
    "search-r1": ActionGrammar(1, _search_r1),
    "eval-rar": ActionGrammar(1, _eval_rar),
    "when-to-search": ActionGrammar(1, _when_to_search),
    "evo-rag": ActionGrammar(1, _evo_rag),
    "r2ag": ActionGrammar(1, _r2ag),
    "arena": ActionGrammar(1, _arena),
}


@dataclass(frozen=True)
class Grammar:
    """A segment grammar: ``lark`` for the engine, ``name`` (``recipe@version``) for the record."""

    name: str
    lark: str
    longest: int


def _shrink(node: Node, caps: dict[str, int], keys: list[str], max_tokens: int) -> bool:
    """Scale the caps of ``keys`` (down to 1 token each) until ``node`` fits ``max_tokens``; the
    other caps stay. Returns whether it fits."""
    if _longest(node, caps) <= max_tokens:
        return True
    if not keys:
        return False
    floor = {**caps, **dict.fromkeys(keys, 1)}
    if _longest(node, floor) > max_tokens:
        return False
    fixed, full = _longest(node, {**caps, **dict.fromkeys(keys, 0)}), _longest(node, caps)
    scale = (max_tokens - fixed) / (full - fixed)  # every path's text in ``keys`` shrinks alike
    caps.update({k: max(1, int(caps[k] * scale)) for k in keys})
    while _longest(node, caps) > max_tokens:  # the floor of 1 token can overshoot: trim the largest
        top = max(keys, key=lambda k: caps[k])
        caps[top] -= 1
    return True


def grammar(recipe: str, *, max_tokens: int = 256, turn: Turn = Turn()) -> Grammar:
    """The Lark grammar of ``recipe``'s next segment, whose longest string fits ``max_tokens``.

    Raises ``KeyError`` (listing the recipes) for an unknown name and ``ValueError`` when even the
    tags alone exceed ``max_tokens``.
    """
    if recipe not in GRAMMARS:
        raise unknown("grammar", recipe, GRAMMARS)
    family = GRAMMARS[recipe]
    node = family.build(turn)
    used = {g.cap for g in _gens(node)}
    if _longest(node, dict.fromkeys(used, 1)) > max_tokens:
        raise ValueError(f"max_tokens={max_tokens} is too small for the {recipe} grammar (its tags "
                         f"alone take up to {_longest(node, dict.fromkeys(used, 0))} tokens)")  # fmt: skip
    caps = {k: CAPS[k] for k in used}
    _shrink(node, caps, sorted(used), max_tokens)  # all blocks alike; fits: the 1-token floor does
    # An answer or query cut below ANSWER_FLOOR tokens takes room from the thoughts instead (at 64
    # tokens when-to-search's blocks all fell to 1 token and make run's answers read "Dilem").
    short = {k: min(CAPS[k], ANSWER_FLOOR) for k in used - THOUGHTS}
    if any(caps[k] < v for k, v in short.items()):
        kept = {**{k: CAPS[k] for k in used}, **short}
        if _shrink(node, kept, sorted(used & THOUGHTS), max_tokens):
            caps = kept
    rules = [f"start: {_lark(node)}"]
    for gen in sorted(_gens(node), key=lambda g: (g.cap, g.lexeme)):
        rules.append(f"{gen.cap}_{gen.lexeme.lower()}[max_tokens={caps[gen.cap]}]: {gen.lexeme}")
    rules += [
        f"{name}: {regex}" for name, regex in LEXEMES.items() if any(g.lexeme == name for g in _gens(node))
    ]
    return Grammar(f"{recipe}@{family.version}", "\n".join(rules) + "\n", _longest(node, caps))
