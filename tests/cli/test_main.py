"""The ``hoprl`` command line (``cli/main.py``), run as a user would: a subprocess, a real service
and real storage; ``hoprl reward`` re-scores stored episodes, its values worked out by hand."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hoprl.domain import Episode, Paragraph, Question, RetrievedDoc, Step
from tests.conftest import shared_file
from tests.episodes import answer, episode, search
from tests.processes import alive, descendants, run_with

GOLD = ["Jane Roe"]
INFO = "<information>\n[1] Acme Records: founded by Jane Roe.\n</information>"


def hoprl(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        input=stdin,
        timeout=600,
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


# --- hoprl reward ---------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def search_then_answer(recipe: str, search: str, answer: str, answer_text: str) -> Episode:
    """One search for the founder of Acme Records (its results: ``INFO``), then ``answer``; ``search``
    and ``answer_text`` are the two steps' texts as ``recipe`` writes them."""
    return Episode(
        recipe=recipe,
        question_id="q1",
        question="Who founded Acme Records?",
        answers=GOLD,
        steps=[
            Step(t=1, action="search", text=search, queries=["Acme founder"], information=INFO),
            Step(t=2, action="answer", answer=answer, text=answer_text),
        ],
        final_answer=answer,
    )


def eval_rar_episode() -> Episode:
    """A wrong final answer after an <evaluate> block that names the gold answer: R = r_eval."""
    search = "<think>t</think><search>Acme founder</search>"
    evaluate = "<evaluate>The founder is Jane Roe.</evaluate><answer>John Doe</answer>"
    return search_then_answer("eval-rar", search, "John Doe", evaluate)


def test_eval_rar_episode_gets_r_eval(tmp_path: Path) -> None:
    path = write(tmp_path, "ep.json", eval_rar_episode().model_dump())
    out = hoprl("reward", "--recipe", "eval-rar", str(path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # EM("John Doe", ["Jane Roe"]) = 0, gold in the evaluate block: R = R_eval = 0.1
    assert report["rewards"] == {"eval_rar@1": 0.1} and report["total"] == pytest.approx(0.1)
    assert [s["action"] for s in report["steps"]] == ["search", "answer"]
    # the recipe override: r_eval 0.25 gives 0.25; a rollout-shaped file works the same
    rollout = {"episode": eval_rar_episode().model_dump(), "trajectory": {"prompt_ids": [], "mask": []}}
    out = hoprl("reward", "--config", '{"r_eval": 0.25}', "-", cwd=tmp_path, stdin=json.dumps(rollout))
    assert out.returncode == 0, out.stderr and json.loads(out.stdout)["total"] == pytest.approx(0.25)


def test_when_to_search_components_and_total(tmp_path: Path) -> None:
    search = "<think>t</think>\n<search>Acme founder</search>"
    answer = "<reflect>It names her.</reflect>\n<think>done</think>\n<answer>Jane Roe</answer>"
    ep = search_then_answer("when-to-search", search, "Jane Roe", answer)
    out = hoprl("reward", str(write(tmp_path, "w.json", ep.model_dump())), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # r_f = 1 (think search reflect think answer), r_s = 0 (one concise query),
    # r_a = 1 (stage 1, correct by EM: no judge bound): r = 2
    assert report["rewards"] == {"wts_format@2": 1.0, "wts_search@2": 0.0, "wts_answer@2": 1.0}
    assert report["total"] == 2.0 and report["recipe"] == "when-to-search"


def test_printed_formula_totals(tmp_path: Path) -> None:
    """``hoprl reward`` prints the totals of the printed equations (R2AG Eq. 5, when-to-search Eq. 8)."""
    # R2AG, gold {A, B}; one expansion, two base branches both finding the new gold A:
    # R_MH^b = 1 + 1 = 2, R_AP^b = (1/2)(1 + 1) = 1, R_f = 0.02: R = 0.2*2 + 0.2*1 + 0.02 = 0.62
    a = RetrievedDoc(id="A", title="A", text="text of A")
    text = "<think>plan</think><base-Q>q A</base-Q><base-Q>q A again</base-Q><end/>"
    step = Step(
        t=1,
        action="search",
        text=text,
        queries=["q A", "q A again"],
        query_kinds=["base", "base"],
        docs=[[a], [a]],
    )
    r2ag = Episode(recipe="r2ag", question_id="q", question="?", gold_titles=["A", "B"], steps=[step])
    out = hoprl("reward", str(write(tmp_path, "r.json", r2ag.model_dump())), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["total"] == pytest.approx(0.62)
    # when-to-search: the same query twice, avg_sim = cos 1 / (N(N-1) = 2) = 0.5, r_s = -0.5;
    # r_f = 1; correct in stage 1 (EM: no judge bound), r_a = 1: r = 1.5
    steps = [
        search(1, "Acme founder", INFO),
        search(2, "Acme founder", INFO, before="<reflect>r</reflect>\n"),
        answer(3, "<reflect>r</reflect>\n<think>done</think>\n<answer>Jane Roe</answer>", "Jane Roe"),
    ]
    wts = episode("when-to-search", steps, "Jane Roe", GOLD, question_id="q1")
    out = hoprl("reward", str(write(tmp_path, "w2.json", wts.model_dump())), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["rewards"]["wts_search@2"] == pytest.approx(-0.5, abs=1e-4)
    assert report["total"] == pytest.approx(1.5, abs=1e-4)


def test_judge_url_counts_who_decided(tmp_path: Path) -> None:
    """``--judge-url``: the reward asks the judge service; one that does not answer is a counted
    fallback (the rules decide), printed under ``judge``."""
    search = "<think>t</think>\n<search>Acme founder</search>"
    answer = "<reflect>It names her.</reflect>\n<think>done</think>\n<answer>Jane Roe</answer>"
    ep = search_then_answer("when-to-search", search, "Jane Roe", answer)
    path = write(tmp_path, "j.json", ep.model_dump())
    out = hoprl("reward", "--judge-url", "http://127.0.0.1:9", str(path), cwd=tmp_path)  # nothing listens
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # the rules judge: "Jane Roe" is the reference, r_a = 1; r_s = 0, r_f = 1: r = 2
    assert report["total"] == 2.0
    assert report["judge"]["judge/calls"] == 1 and report["judge"]["judge/fallbacks"] == 1


def test_evo_rag_prints_each_steps_signals(tmp_path: Path) -> None:
    doc = RetrievedDoc(id="acme", title="Acme Records", text="Acme Records was founded by Jane Roe.")
    ep = Episode(
        recipe="evo-rag",
        question_id="q1",
        question="Who founded Acme Records?",
        answers=GOLD,
        gold_titles=["Acme Records"],
        steps=[
            Step(
                t=1,
                action="search",
                text="<think>t</think><search>Acme founder</search>",
                queries=["Acme founder"],
                docs=[[doc]],
            ),
            Step(t=2, action="answer", answer="Jane Roe", text="<answer>Jane Roe</answer>"),
        ],
        final_answer="Jane Roe",
    )
    out = hoprl("reward", str(write(tmp_path, "e.json", ep.model_dump())), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    steps = json.loads(out.stdout)["steps"]
    # r_step = -1 on every step; the search hit a gold title: r_ret = +1; the exact answer:
    # r_ans = (EM + F1) / 2 = (1 + 1) / 2 = 1
    assert [s["signals"]["r_step"] for s in steps] == [-1.0, -1.0]
    assert steps[0]["signals"]["r_ret"] == 1.0 and steps[1]["signals"]["r_ans"] == 1.0


def test_arena_reads_the_references_from_data(tmp_path: Path) -> None:
    q = Question(
        id="a1", dataset="t", split="dev", question="Who founded Acme Records?", answers=GOLD,
        paragraphs=[Paragraph(title="Beta", text="Beta is a band.", is_gold=False),
                    Paragraph(title="Acme Records", text="Founded by Jane Roe.", is_gold=True)],
    )  # fmt: skip
    text = "<relevance>[2]</relevance><analysis>[2] names the founder.</analysis><answer>Jane Roe</answer>"
    ep = Episode(recipe="arena", question_id="a1", question=q.question, answers=GOLD, final_answer="Jane Roe",
                 steps=[Step(t=1, action="answer", answer="Jane Roe", text=text)])  # fmt: skip
    path = write(tmp_path, "a.json", ep.model_dump())
    missing = hoprl("reward", str(path), cwd=tmp_path)
    assert missing.returncode == 2 and "paragraphs" in missing.stderr and "Traceback" not in missing.stderr
    data = tmp_path / "q.jsonl"
    data.write_text(q.model_dump_json() + "\n")
    out = hoprl("reward", "--data", str(data), str(path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # format 1, accuracy 1 (exact), relevance 1 (cites exactly the gold reference [2]), bonus 10
    assert json.loads(out.stdout)["total"] == pytest.approx(13.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "is not JSON"), ('{"recipe": "x"}', "question_id: Field required")],
)
def test_bad_input_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    out = hoprl("reward", str(path), cwd=tmp_path)
    stderr = " ".join(out.stderr.split())  # the console wraps long lines
    assert out.returncode == 2 and message in stderr and "Traceback" not in stderr


def test_unknown_recipe_lists_the_valid_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "ep.json", eval_rar_episode().model_dump())
    out = hoprl("reward", "--recipe", "nope", str(path), cwd=tmp_path)
    assert out.returncode == 2 and "eval-rar" in out.stderr and "Traceback" not in out.stderr


ROOT = Path(__file__).resolve().parents[2]


def read(*paths: Path) -> str:
    return "".join(p.read_text() for p in paths)


def flow_run_states(db: Path) -> list[str]:
    """The state of every flow run in a Prefect server's SQLite database."""
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT state_type FROM flow_run")]


@pytest.mark.parametrize(
    ("to_group", "signum", "status"),
    [
        (False, signal.SIGTERM, 128 + signal.SIGTERM),  # `kill PID`
        (True, signal.SIGINT, 128 + signal.SIGINT),  # a terminal's Ctrl-C: the whole foreground group
    ],
    ids=["sigterm-to-the-command", "ctrl-c-to-its-group"],
)
def test_a_signal_ends_a_flow_command_and_every_process_it_started(
    tmp_path: Path, to_group: bool, signum: int, status: int
) -> None:
    """``hoprl demo-rl`` on its temporary Prefect server, signalled while its services start: the
    command exits within 25 s, its flow run is recorded as crashed and, 30 s later, no process it
    started is left.

    SIGTERM to the command left Prefect's temporary server running: Prefect re-sent the signal to
    the default handler, which killed the command before atexit stopped the server. And the exit
    took 33 s: a service still starting (the policy loading its engine) acts on SIGTERM only once
    started, and was given 30 s. Ctrl-C reached Prefect's own temporary server too, in the
    command's process group, and the command then slept more than 2.5 minutes, retrying to record
    the run's end on a server that was gone; the run stayed "running".
    """
    runs = tmp_path / "runs"
    env = {**os.environ, "HOPRL_RUNS_DIR": str(runs), "PREFECT_HOME": str(tmp_path / "prefect"),
           "HOPRL_DATABASE_URL": f"sqlite:///{tmp_path / 'registry.db'}"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)  # the command starts its temporary Prefect server
    log = tmp_path / "demo-rl.log"  # a file, not a pipe: a process left running would hold a pipe open
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "demo-rl", "--dataset", "synthetic:0:2", "--steps", "1"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=to_group,
        )  # fmt: skip
    below: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        # the policy's app is made (its log's first line), so uvicorn has its signal handlers, and
        # its engine loads in the app's start-up (POLICY_EAGER: 25-80 s on a CPU)
        while "HOPRL_API_KEY" not in read(*runs.glob("*/logs/policy.log")) and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        assert "HOPRL_API_KEY" in read(*runs.glob("*/logs/policy.log")), log.read_text()[-3000:]
        below = descendants(proc.pid)
        assert any("prefect.server.api.server" in cmd for cmd in below.values()), below
        assert any("services.policy.app" in cmd for cmd in below.values()), below
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        assert proc.wait(timeout=25) == status, log.read_text()[-3000:]
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
        assert flow_run_states(tmp_path / "prefect" / "prefect.db") == ["CRASHED"]
        deadline = time.monotonic() + 30
        while (any(alive(p) for p in below) or run_with(str(runs))) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {p: cmd for p, cmd in below.items() if alive(p)} | run_with(str(runs))
        assert not left, f"left running after the signal: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in [*below, *descendants(proc.pid), *run_with(str(runs))]:
            if alive(p):
                os.kill(p, signal.SIGKILL)
