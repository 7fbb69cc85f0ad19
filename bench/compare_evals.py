"""Compare two evaluations that ``bench/train.py`` cached (``<out>/evals/<key>.json``).

    python bench/compare_evals.py A.json B.json

Prints, as JSON, each side's EM / F1 / retrievals, how many questions differ in EM, in F1 and in
their retrieval count, and the paired bootstrap p-value of EM (10,000 resamples); where both
evaluations kept their answers, also each changed question's answers, EM, retrievals and queries.
Two evaluations of one checkpoint on the same questions should differ in nothing; two
checkpoints, in whatever training changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hoprl.metrics.stats import paired_bootstrap


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Both sides' scores and their per-question differences (the same questions, in order)."""
    if len(a["em"]) != len(b["em"]):
        raise ValueError(f"{len(a['em'])} questions against {len(b['em'])}: not the same evaluation set")
    differ = {k: sum(x != y for x, y in zip(a[k], b[k], strict=True)) for k in ("em", "f1", "rc")}
    return {
        "questions": len(a["em"]),
        "a": {k: round(a[k], 2) for k in ("EM", "F1", "retrievals")},
        "b": {k: round(b[k], 2) for k in ("EM", "F1", "retrievals")},
        "questions differing": {"em": differ["em"], "f1": differ["f1"], "retrievals": differ["rc"]},
        "p_value EM": paired_bootstrap(b["em"], a["em"]).p_value,
        **({"changed": changed(a, b)} if "answers" in a and "answers" in b else {}),
    }


def changed(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The questions whose EM or retrieval count differ, with both answers and queries (older
    cached evaluations kept only the scores)."""
    side = ("answers", "em", "rc", "queries")
    return [
        {"question": i, "a": {k: a[k][i] for k in side}, "b": {k: b[k][i] for k in side}}
        for i in range(len(a["em"]))
        if a["em"][i] != b["em"][i] or a["rc"][i] != b["rc"][i]
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = p.parse_args()
    print(json.dumps(compare(json.loads(args.a.read_text()), json.loads(args.b.read_text())), indent=1))


if __name__ == "__main__":
    main()
