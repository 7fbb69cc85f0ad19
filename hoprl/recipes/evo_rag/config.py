"""EVO-RAG's constants and config: Table 2's weights, the stage switch and the episode limits.

Every weight is the paper's; the switch's alpha, eps and patience are the project's (the paper
gives no numbers). :func:`trainer_defaults` derives the trainer's episode limits from the config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Stage = Literal["discovery", "refinement"]
SwitchRule = Literal["best", "previous"]
RefEvidence = Literal["retrieved", "gold_and_retrieved"]
#: the per-step signals :func:`~hoprl.recipes.evo_rag.reward.score_episode` writes
SIGNALS = ("r_ret", "r_dup", "r_bt", "r_ref", "r_step", "r_ans", "r_act")
#: recorded with every score; bumped when the signals' definition changes
SCORE_VERSION = "evo_rag@1"


class EvoRagConfig(BaseModel):
    """EVO-RAG's constants. Weight triples are Table 2's (Start, Mid, End) endpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    t_max: int = Field(default=20, ge=2, le=64, description="episode cap T_max (the trainer's max_steps)")
    top_k: int = Field(default=3, ge=1, description="documents per SEARCH")
    act_p: float = Field(default=0.3, description="r_act applies when p(t) >= act_p")
    w_ret: tuple[float, float, float] = (2.0, 1.0, 0.5)
    w_act: tuple[float, float, float] = (1.5, 0.8, 0.4)
    w_dup: tuple[float, float, float] = (0.1, 0.5, 1.2)
    w_bt: tuple[float, float, float] = (0.3, 0.5, 1.0)
    w_ref: tuple[float, float, float] = (0.5, 0.5, 0.5)
    w_step: tuple[float, float, float] = (0.02, 0.05, 0.10)
    w_ans: tuple[float, float, float] = (0.05, 0.10, 1.00)
    # The stage switch: the paper's rule (best EMA so far); alpha, eps and P are not given as
    # numbers in the paper, so these three values are ours.
    ema_alpha: float = Field(default=0.3, gt=0.0, le=1.0, description="EMA weight of the newest dev return")
    switch_eps: float = Field(default=0.01, description="an EMA gain below this is a flat check")
    switch_patience: int = Field(default=3, ge=1, description="flat checks in a row before switching")
    switch_rule: SwitchRule = Field(
        default="best",
        description="best: a check is flat when the EMA is not eps above the best EMA so far (the paper); "
        "previous: not eps above the previous check's EMA (an option)",
    )
    ref_evidence: RefEvidence = Field(
        default="retrieved",
        description="what r_ref's judge reads: the retrieved documents (the paper), or the gold "
        "paragraphs plus the retrieved ones (an option)",
    )

    def endpoints(self, signal: str) -> tuple[float, float, float]:
        """(Start, Mid, End) weights of ``r_xxx``."""
        triple: tuple[float, float, float] = getattr(self, "w_" + signal.removeprefix("r_"))
        return triple


#: Context tokens allowed per retrieved document, as
#: :func:`~hoprl.recipes.evo_rag.protocol.render_information` writes it (SmolLM2's tokenizer):
#: the median three-document block measured 440 tokens on HotpotQA (p90 689), 267 on 2Wiki and
#: 382 on MuSiQue (100 dev questions each), the synthetic world's 174; 20 searches over the first
#: 20 HotpotQA dev questions' paragraphs came to 11,434 context tokens.
INFO_TOKENS_PER_DOC = 200


def trainer_defaults(recipe_config: dict[str, Any], max_new_tokens_per_step: int = 64) -> dict[str, Any]:
    """The trainer's episode limits for this recipe, derived from its config (one source of truth).

    ``max_steps = t_max`` (the paper's T_max = 20 by default), and a ``token_budget`` (context
    growth per episode) that lets all ``t_max`` steps be searches: per step, the generated tokens
    plus ``top_k`` documents of :data:`INFO_TOKENS_PER_DOC`. With the defaults:
    20 * (64 + 3 * 200) = 13280 tokens.

    >>> trainer_defaults({"t_max": 5, "top_k": 2}, max_new_tokens_per_step=32)
    {'max_steps': 5, 'token_budget': 2160}
    """
    cfg = EvoRagConfig(**recipe_config)
    per_step = max_new_tokens_per_step + cfg.top_k * INFO_TOKENS_PER_DOC
    return {"max_steps": cfg.t_max, "token_budget": cfg.t_max * per_step}
