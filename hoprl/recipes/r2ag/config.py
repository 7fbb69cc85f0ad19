"""R2AG's constants and config: the Top-Survivor weights, cut-offs and the readings it offers.

Every default is the paper's (Eq. 5 and Appendix B.2). Where the project once read an ambiguous
line differently, that reading stays available as a named option, documented on its field with
the line it rests on; the default is always the paper as printed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: the per-step signals :func:`~hoprl.recipes.r2ag.reward.score_episode` writes
SIGNALS = ("r_mh", "r_jh", "r_ap", "r_f")
#: recorded with every score; bumped when the reward's definition changes
SCORE_VERSION = "r2ag@3"
#: tree levels of progressive iterative training (the paper's L_MAX)
L_MAX = 5
#: the protocol's tags, and the branch kind each sub-query tag opens
TAGS = ("think", "base-Q", "predicted-Q")
KIND_OF_TAG = {"base-Q": "base", "predicted-Q": "predicted"}


class R2agConfig(BaseModel):
    """Top-Survivor ``R = a R_MH + b R_JH + g R_AP + w R_f`` (Eq. 5) and the forest's limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    a: float = Field(default=0.2, description="alpha: weight of Multi-Hit@Top-1 R_MH")
    b: float = Field(default=0.3, description="beta: weight of Joint-Hit@Top-1 R_JH")
    g: float = Field(default=0.2, description="gamma: weight of the top-t average precision R_AP")
    w: float = Field(default=1.0, ge=0, description="omega: weight of the format reward R_f")
    l: float = Field(default=1.25, description="lambda: R_MH = R_MH^b + l R_MH^p")  # noqa: E741
    t_base: int = Field(default=4, ge=1, description="R_AP^b ranks the first t base branches")
    t_pred: int = Field(default=2, ge=1, description="R_AP^p ranks the first t predicted branches")
    format_bonus: float = Field(default=0.01, ge=0, description="R_f per sub-query segment after a <think>")
    format_cap: float = Field(default=0.02, ge=0, description="w R_f is capped at this (App. B.2)")
    l_max: int = Field(default=L_MAX, ge=1, description="tree levels in progressive training (L_MAX)")
    top_k: int = Field(
        default=1,
        ge=1,
        description="documents each sub-query retrieves: 1 (the Hit@Top-1 constraint of training, "
        "Table 1's rows) or 2 (Table 5's top-k = 2, the QA rows Table 3 reports)",
    )
    top_t: int | None = Field(
        default=None,
        ge=1,
        description="at evaluation, only the first t sub-queries an expansion writes are retrieved "
        "(App. C.2: t = M or M/2, M the dataset's maximum hops; Table A.6); None retrieves them all "
        "(training, where top-t shapes R_AP only)",
    )
    forest_width: int | None = Field(
        default=None,
        ge=1,
        description="at most this many growing trees per question between rounds (most gold first); "
        "None = every sample's pruned tree propagates, as the paper",
    )
    branches: Literal["sum", "distinct"] = Field(
        default="sum",
        description="'sum' (Eq. 5 as printed: R_MH^* sums 1{r_u in g, r_u not in r_prior} over the "
        "x_* branches of a type and R_AP^*'s indicators 1{r_z in g} count every branch, so two branches "
        "that find the same new gold document count twice); 'distinct' counts each document once per "
        "type and step, the project's earlier reading",
    )
    multi_hit: Literal["count", "fraction"] = Field(
        default="count",
        description="'count' (the paper: R_MH^b and R_MH^p are raw counts of newly retrieved gold "
        "documents among that type's top-1 results); 'fraction' divides R_MH by |G|, the project's "
        "earlier reading that kept R_MH in [0, l] per episode",
    )
    ap_relevant: Literal["gold", "new"] = Field(
        default="gold",
        description="'gold' (the paper's indicator 1{r_u in g}); 'new' counts a branch only if its "
        "document is gold not retrieved before this step, the project's earlier reading",
    )
    ap_norm: Literal["gold", "missing"] = Field(
        default="gold",
        description="'gold' (the paper's 1/|g|, g the question's gold set); 'missing' divides by "
        "min(t, gold documents still missing), the project's earlier reading",
    )
    ap_kinds: Literal["sum", "mean"] = Field(
        default="sum",
        description="'sum' (the paper: R_AP = R_AP^b + R_AP^p); 'mean' averages the kinds the "
        "expansion used, the project's earlier reading",
    )

    def weights(self) -> dict[str, float]:
        return {"r_mh": self.a, "r_jh": self.b, "r_ap": self.g, "r_f": self.w}
