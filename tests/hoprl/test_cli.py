"""The ``hoprl`` command line, run as a user would (a subprocess, real service, real storage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest_paths import shared_file


def hoprl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_help_teaches(tmp_path: Path) -> None:
    out = hoprl("--help", cwd=tmp_path)
    assert out.returncode == 0 and "eval-retrieval" in out.stdout and "hoprl serve retriever" in out.stdout
    assert "Recall@K" in hoprl("eval-retrieval", "--help", cwd=tmp_path).stdout


def test_eval_retrieval_json_on_real_data(tmp_path: Path) -> None:
    data = shared_file("hotpotqa_dev.jsonl")
    args = [
        "eval-retrieval",
        "--data",
        str(data),
        "--limit",
        "15",
        "--k",
        "2",
        "5",
        "--json",
        "--storage",
        str(tmp_path / "qdrant"),
    ]
    out = hoprl(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(report["results"]) == {"dense", "sparse", "hybrid"}
    hybrid = report["results"]["hybrid"]
    assert report["documents"] > 100 and report["index_rate"] > 0
    assert 0.5 < hybrid["recall@5"] <= 1.0 and hybrid["recall@2"] <= hybrid["recall@5"]
    # The second run finds the index already built (same corpus -> same collection) and reuses it.
    again = json.loads(hoprl(*args, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert again["index_rate"] == 0 and again["results"] == report["results"]


def test_bad_data_is_a_clear_error(tmp_path: Path) -> None:
    out = hoprl("eval-retrieval", "--data", "nope.jsonl", cwd=tmp_path)
    assert out.returncode == 2 and "neither a file" in out.stderr
