"""bench/compare_evals.py: per-question differences and the paired p-value of two cached evaluations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def scores(em: list[float], rc: list[float]) -> dict[str, object]:
    return {"em": em, "f1": em, "rc": rc, "EM": 100 * sum(em) / len(em), "F1": 100 * sum(em) / len(em),
            "retrievals": sum(rc) / len(rc)}  # fmt: skip


def run(tmp_path: Path, a: dict[str, object], b: dict[str, object]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    command = [sys.executable, str(ROOT / "bench" / "compare_evals.py"), str(tmp_path / "a.json"),
               str(tmp_path / "b.json")]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)


def test_counts_differing_questions_and_pairs_them(tmp_path: Path) -> None:
    a = scores([1, 0, 0, 1] * 25, [2, 2, 1, 2] * 25)
    b = scores([1, 1, 0, 1] * 25, [2, 1, 1, 2] * 25)
    out = json.loads(run(tmp_path, a, b).stdout)
    assert out["questions"] == 100
    assert out["questions differing"] == {"em": 25, "f1": 25, "retrievals": 25}
    assert (out["a"]["EM"], out["b"]["EM"]) == (50.0, 75.0) and out["p_value EM"] < 0.01
    same = json.loads(run(tmp_path, a, a).stdout)
    assert same["questions differing"] == {"em": 0, "f1": 0, "retrievals": 0} and same["p_value EM"] == 1.0


def test_different_question_sets_are_refused(tmp_path: Path) -> None:
    result = run(tmp_path, scores([1, 0], [1, 1]), scores([1], [1]))
    assert result.returncode != 0 and "not the same evaluation set" in result.stderr


def test_help_names_the_input() -> None:
    command = [sys.executable, str(ROOT / "bench" / "compare_evals.py"), "--help"]
    assert "evals/<key>.json" in subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_changed_questions_show_both_answers_where_kept(tmp_path: Path) -> None:
    a = scores([1, 0, 1], [2, 2, 1]) | {"answers": ["Paris", "Lyon", "Nice"], "queries": [["q1", "q2"]] * 3}
    b = scores([1, 1, 1], [2, 2, 2]) | {"answers": ["Paris", "Rome", "Nice"], "queries": [["q1", "q2"]] * 3}
    out = json.loads(run(tmp_path, a, b).stdout)
    assert [(c["question"], c["a"]["answers"], c["b"]["answers"]) for c in out["changed"]] == [
        (1, "Lyon", "Rome"),
        (2, "Nice", "Nice"),
    ]
    assert out["changed"][1]["a"]["rc"] == 1 and out["changed"][1]["b"]["rc"] == 2
    assert "changed" not in json.loads(run(tmp_path, scores([1, 0, 1], [2, 2, 1]), b).stdout)  # older cache
