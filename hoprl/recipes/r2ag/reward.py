"""R2AG's Top-Survivor reward (the paper's Eq. 5 and Appendix B.2), one expansion per step.

``R = a R_MH + b R_JH + g R_AP + w R_f``, with the paper's defaults a=0.2, b=0.3, g=0.2, w=1.

Each sub-query of an expansion is a *branch*; the retriever returns its top-1 document. Branches
are of two types, base (``<base-Q>``) and predicted (``<predicted-Q>``), each ranked in emission
order. Per step:

R_MH  Multi-Hit@Top-1: ``R_MH^b + l R_MH^p`` with ``R_MH^* = sum_{u=1}^{x_*} 1{r_u in g, r_u not
      in r_prior}`` (Eq. 5): a count over that type's branches of top-1 results that are gold and
      were not retrieved in earlier steps (for a tree expansion: not already in the tree). Two
      branches of one type that find the same new gold document count twice, as the sum prints it;
      one found by a base and a predicted branch of the same step counts in both terms.
      ``branches="distinct"`` counts each document once per type (the earlier reading).
R_JH  Joint-Hit@Top-1: 1 on the stop step when every gold document has been retrieved.
R_AP  ``R_AP^b + R_AP^p``, each ``(1/|g|) sum_{u<=t} P@u 1{r_u in g}`` over that type's first t
      branches (t = 4 base, 2 predicted; App. B.2), ``g`` the question's gold set and
      ``P@u = (1/u) sum_{z<=u} 1{r_z in g}``. Every branch whose top-1 document is gold is
      relevant, repeats included (Eq. 5 as printed), so R_AP^* can exceed 1: four base branches
      re-finding A with |g| = 2 score (1/2)(1+1+1+1) = 2. ``branches="distinct"`` makes a
      document repeated lower in the same ranking not relevant again (the earlier reading).
R_f   format: ``format_bonus`` (0.01) per ``<base-Q>`` / ``<predicted-Q>`` segment that comes after
      a closed ``<think>``; ``<think>`` itself earns nothing, and ``w R_f`` over the episode is
      capped at ``format_cap`` (0.02) (App. B.2).

The **total** reward is 0 if any step lacks a closed ``<think>`` or if the policy stops before
every gold document is found (App. B.2: "the total reward is set to zero"): every signal of
every step is then 0, and ``meta["r2ag"]`` keeps the reason and the sums before zeroing.

Worked example (gold {A, B}; one expansion ``<think>``, base->A, base->X, predicted->B):
R_MH = 1 + 1.25*1, R_AP = (1/2)(P@1*1 + P@2*0) + (1/2)(P@1*1) = 0.5 + 0.5,
R_f = 3 segments * 0.01 capped at 0.02; R = 0.2*2.25 + 0.2*1.0 + 0.02 = 0.67.
Two base branches both finding the new gold A (gold {A, B}): R_MH = 2, R_AP = (1/2)(1 + 1) = 1,
R = 0.2*2 + 0.2*1 + 0.02 = 0.62 (``branches="distinct"``: 0.2*1 + 0.2*0.5 + 0.02 = 0.32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hoprl.domain import Episode, Step
from hoprl.recipes.base import RewardFunc, versioned
from hoprl.recipes.parsing import parse_tags
from hoprl.recipes.r2ag.config import KIND_OF_TAG, SCORE_VERSION, SIGNALS, TAGS, R2agConfig
from hoprl.recipes.rewards import (
    episode_reward,
    normalize_title,
    sequence_reward,
    signal_total,
    step_rewards,
)

KINDS = ("base", "predicted")


def average_precision(relevant: Sequence[bool], denominator: int) -> float:
    """``(1/denominator) sum_u P@u rel_u`` over a ranking cut at its cut-off already; 0 if no denominator.

    >>> average_precision([True, False, True], 2)  # (1/1 + 2/3) / 2
    0.8333333333333333
    """
    if denominator <= 0:
        return 0.0
    hits, total = 0, 0.0
    for rank, rel in enumerate(relevant, 1):
        if rel:
            hits += 1
            total += hits / rank
    return total / denominator


def branches(step: Step, kind: str, gold: set[str]) -> list[str | None]:
    """The step's branches of ``kind`` in emission order: the normalised gold title of each top-1
    document, or None where it is not gold. A query recorded without an R2AG kind counts as base."""
    kinds = step.query_kinds or ["base"] * len(step.queries)
    out: list[str | None] = []
    for k, ranked in zip(kinds, step.docs, strict=False):
        if (k == "predicted") != (kind == "predicted"):
            continue
        title = normalize_title(ranked[0].title) if ranked else ""
        out.append(title if title in gold else None)
    return out


def type_ap(
    hits: Sequence[str | None], cutoff: int, gold: set[str], found: set[str], cfg: R2agConfig
) -> float:
    """R_AP^b or R_AP^p of one step: the ranking ``hits`` cut at ``cutoff`` (see the module doc)."""
    seen: set[str] = set()
    relevant = []
    for title in hits[:cutoff]:
        repeat = cfg.branches == "distinct" and title in seen
        rel = title is not None and not repeat and (cfg.ap_relevant == "gold" or title not in found)
        relevant.append(rel)
        if title is not None:
            seen.add(title)
    denominator = len(gold) if cfg.ap_norm == "gold" else min(cutoff, len(gold - found))
    return average_precision(relevant, denominator)


def multi_hit(hits: Sequence[str | None], found: set[str], cfg: R2agConfig) -> float:
    """R_MH^b or R_MH^p of one step: branches whose top-1 document is gold and not in ``found``
    (Eq. 5's sum over the type's branches); ``branches="distinct"`` counts each document once."""
    new = [h for h in hits if h is not None and h not in found]
    return float(len(set(new)) if cfg.branches == "distinct" else len(new))


def format_segments(text: str) -> tuple[int, bool]:
    """(sub-query segments after the first closed, non-empty ``<think>``; whether there is one)."""
    parsed = parse_tags(text, TAGS)
    think = next((b for b in parsed.blocks if b.tag == "think" and b.closed and b.content), None)
    if think is None:
        return 0, False
    after = [
        b for b in parsed.blocks if b.tag in KIND_OF_TAG and b.closed and b.content and b.start >= think.end
    ]
    return len(after), True


def score_episode(episode: Episode, config: R2agConfig | None = None) -> Episode:
    """A copy of ``episode`` with ``r_mh``, ``r_jh``, ``r_ap`` and ``r_f`` on every step (pure).

    ``episode.meta["found_titles"]`` names gold documents retrieved before the episode (a tree
    expansion passes the titles its tree already holds), so "newly retrieved" means new to them.
    """
    cfg = config or R2agConfig()
    scored = episode.model_copy(deep=True)
    gold = {normalize_title(t) for t in scored.gold_titles}
    found = {normalize_title(t) for t in scored.meta.get("found_titles", [])} & gold
    format_left = cfg.format_cap / cfg.w if cfg.w > 0 else float("inf")
    think_missing = premature_stop = False
    parts: list[dict[str, float]] = []
    for step in scored.steps:
        signals = dict.fromkeys(SIGNALS, 0.0)
        part = {"mh_base": 0.0, "mh_pred": 0.0, "ap_base": 0.0, "ap_pred": 0.0}
        segments, has_think = format_segments(step.text)
        think_missing |= not has_think
        if step.action == "search":
            hits = {kind: branches(step, kind, gold) for kind in KINDS}
            part["mh_base"], part["mh_pred"] = (multi_hit(hits[k], found, cfg) for k in KINDS)
            part["ap_base"] = type_ap(hits["base"], cfg.t_base, gold, found, cfg)
            part["ap_pred"] = type_ap(hits["predicted"], cfg.t_pred, gold, found, cfg)
            mh = part["mh_base"] + cfg.l * part["mh_pred"]
            signals["r_mh"] = mh / len(gold) if cfg.multi_hit == "fraction" and gold else mh
            used = [k for k in KINDS if hits[k]]
            ap = part["ap_base"] + part["ap_pred"]
            signals["r_ap"] = ap / len(used) if cfg.ap_kinds == "mean" and used else ap
            found |= {h for k in KINDS for h in hits[k] if h}
        elif step.action == "stop":
            signals["r_jh"] = 1.0 if found >= gold else 0.0
            premature_stop |= not found >= gold
        if step.action in ("search", "stop"):
            signals["r_f"] = min(cfg.format_bonus * segments, format_left)
            format_left -= signals["r_f"]
        step.signals = signals
        parts.append(part)
    zeroed = "missing <think>" if think_missing else "stop before all gold found" if premature_stop else None
    before = {name: sum(s.signals[name] for s in scored.steps) for name in SIGNALS}
    if zeroed:
        for step in scored.steps:
            step.signals = dict.fromkeys(SIGNALS, 0.0)
    scored.meta["r2ag"] = {
        "version": SCORE_VERSION,
        "config": cfg.model_dump(mode="json"),
        "found": sorted(found),
        "zeroed": zeroed,
        "before_zeroing": before,
        "steps": parts,
    }
    return scored


def episode_return(episode: Episode, config: R2agConfig | None = None) -> float:
    """Top-Survivor reward ``R`` of a scored episode."""
    weights = (config or R2agConfig()).weights()
    return sequence_reward(episode, lambda t: weights)


def episode_step_rewards(episode: Episode, config: R2agConfig | None = None) -> list[float]:
    """Per-step ``R_t`` of a scored episode (they sum to ``R``)."""
    weights = (config or R2agConfig()).weights()
    return step_rewards(episode, lambda t: weights)


def make_reward_funcs(config: R2agConfig) -> list[RewardFunc]:
    """The Top-Survivor total first, then one logging reward per signal.

    Unscored episodes (or ones scored by another version or config) are scored in place on first
    use (scoring is deterministic and cheap).
    """

    def scored(ep: Episode) -> Episode:
        meta = ep.meta.get("r2ag", {})
        if meta.get("version") != SCORE_VERSION or meta.get("config") != config.model_dump(mode="json"):
            done = score_episode(ep, config)
            ep.steps, ep.meta = done.steps, done.meta
        return ep

    total = versioned("r2ag_total@3")(episode_reward(lambda ep: episode_return(scored(ep), config)))
    return [total, *(_signal_reward(name, scored) for name in SIGNALS)]


def _signal_reward(name: str, scored: Callable[[Episode], Episode]) -> RewardFunc:
    return versioned(f"r2ag_{name}@3")(episode_reward(lambda ep: signal_total(scored(ep), name)))
