"""pass@k: how often at least one of k sampled answers to a question is right.

``pass_at_k(n, c, k)`` is the unbiased estimator of Chen et al. (2021, "Evaluating Large Language
Models Trained on Code", Eq. 1) from ``n >= k`` samples of which ``c`` are right:
``1 - C(n - c, k) / C(n, k)``. With ``n == k`` it is 1 when any sample is right; pass@1 is
``c / n``. Averaged over questions, pass@1 is what the policy answers now when sampling and
pass@k what a policy that always picked its best of k samples would: the headroom a group of k
samples gives an RL step to sharpen towards.

>>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 4)
(0.25, 1.0, 0.0)
>>> round(pass_at_k(4, 1, 2), 4)  # 1 - C(3, 2) / C(4, 2) = 1 - 3/6
0.5
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of ``k`` of ``n`` samples (``c`` right) is right."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(groups: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over questions; ``groups`` holds each question's samples (right or not).

    >>> mean_pass_at_k([[True, False], [False, False]], 2)
    0.5
    """
    if not groups:
        return 0.0
    return sum(pass_at_k(len(g), sum(g), k) for g in groups) / len(groups)
