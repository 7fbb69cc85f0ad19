"""RemoteJudge: the ``hoprl.judging.Judge`` protocol over HTTP, used by EVO-RAG's refusal reward."""

from __future__ import annotations

import importlib.resources
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hoprl.clients.judge import JudgeClient, RemoteJudge
from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.judging import RULES_VERSION, Judge, RulesJudge, Verdict
from hoprl.ports import free_port
from hoprl.recipes.evo_rag import score_episode
from hoprl.schemas.judge import JudgeVerdict
from services.judge.prompts import ANSWER_PROMPTS, ANSWERABLE_PROMPTS, load_prompt

from .conftest import ScriptedLLM, judge_service, llm_judge

ROOT = Path(__file__).resolve().parents[3]

QUESTION = "Where was the founder of Acme Records born?"


def refusal_episode(evidence: str, answers: list[str]) -> Episode:
    doc = RetrievedDoc(id="roe", title="Jane Roe", text=evidence)
    steps = [
        Step(t=1, action="search", text="", queries=["Jane Roe"], docs=[[doc]]),
        Step(t=2, action="refuse", text=""),
    ]
    return Episode(
        recipe="evo-rag",
        question_id="q",
        question=QUESTION,
        answers=answers,
        gold_titles=["Jane Roe"],
        steps=steps,
    )


@pytest.mark.parametrize(
    ("evidence", "answers", "r_ref"),
    [
        ("Jane Roe was born in Paris.", ["Paris"], -1.0),  # answerable: refusing is wrong
        ("Jane Roe founded Acme Records.", ["Paris"], 1.0),  # the evidence lacks the answer
        ("Jane Roe was born in Paris.", [], 1.0),  # no answer exists
    ],
)
def test_refusal_reward_through_the_service_matches_rules(
    rules_url: str, evidence: str, answers: list[str], r_ref: float
) -> None:
    remote: Judge = RemoteJudge(rules_url)
    episode = refusal_episode(evidence, answers)
    local = score_episode(episode, RulesJudge(), "refinement")
    served = score_episode(episode, remote, "refinement")
    assert served.steps[1].signals == local.steps[1].signals
    assert served.steps[1].signals["r_ref"] == r_ref
    trail = served.meta["evo_rag"]["refusal"]
    assert trail["backend"] == "rules" and trail["version"] == RULES_VERSION and trail["fallback"] is False


def test_remote_judge_answers_like_rules_judge(rules_url: str) -> None:
    remote, rules = RemoteJudge(rules_url), RulesJudge()
    for prediction, references in [("The Eiffel Tower.", ["Eiffel Tower"]), ("Lyon", ["Paris"])]:
        got = remote.answer(prediction, references, question="Which landmark?")
        assert isinstance(got, JudgeVerdict)
        assert got.model_dump(include=set(rules.answer(prediction, references).model_fields_set)) == (
            rules.answer(prediction, references).model_dump()
        )
    with pytest.raises(ValueError, match="references"):
        remote.answer("x", [])
    remote.close()


def test_an_llm_refusal_check_through_the_service() -> None:
    """With the openai backend the LLM decides answerability, and the trail records its prompt."""
    llm = ScriptedLLM({"Jane Roe founded Acme Records.": "NO"}, default="YES")
    with llm_judge(llm) as url:
        remote = RemoteJudge(url)
        served = score_episode(
            refusal_episode("Jane Roe founded Acme Records.", ["Paris"]), remote, "discovery"
        )
        remote.close()
    assert served.steps[1].signals["r_ref"] == 1.0
    trail = served.meta["evo_rag"]["refusal"]
    assert (trail["backend"], trail["version"], trail["fallback"]) == ("openai", "answerable@1", False)


def test_prompts_ship_as_package_data() -> None:
    """Every prompt loads through importlib.resources, i.e. from wherever the package is installed."""
    folder = importlib.resources.files("services.judge.prompts")
    for version in ANSWER_PROMPTS | ANSWERABLE_PROMPTS:
        assert folder.joinpath(f"{version}.txt").is_file()
        prompt = load_prompt(version)
        assert "{references}" in prompt.template
        assert ("{prediction}" in prompt.template) == (version in ANSWER_PROMPTS)
        # ARENA's prompt (App. C.3, Table 8) and when-to-search's (App. B.4) show the judge the
        # answers only, not the question
        assert ("{question}" in prompt.template) == (version not in ("arena_lj@1", "when_to_search_judge@1"))
    with pytest.raises(ValueError, match="known"):
        load_prompt("answer_equivalence@9")


# -- when the service is gone: the rules decide, and the verdict says so -----------------------


@contextmanager
def judge_process(port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``hoprl serve judge`` in its own process (so a test can kill it), ready on ``port``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUDGE_")}
    cmd = [sys.executable, "-m", "cli.main", "serve", "judge", "--port", str(port), "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not JudgeClient(f"http://127.0.0.1:{port}").ready():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the judge did not get ready within 60 s"
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# (prediction, references): one true, one false, one that only the folded, negation-aware rules get
ANSWERS = [("The Eiffel Tower.", ["Eiffel Tower"]), ("Lyon", ["Paris"]), ("not Paris", ["Paris"])]
# (question, evidence, references)
ANSWERABLE = [
    (QUESTION, ["Jane Roe was born in Paris."], ["Paris"]),
    (QUESTION, ["Jane Roe founded Acme Records."], ["Paris"]),
    (QUESTION, ["The founder of Acme Records was born in Paris."], None),  # the overlap heuristic
]


def test_a_closed_port_falls_back_to_the_rules(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    remote, rules = RemoteJudge(f"http://127.0.0.1:{port}"), RulesJudge()
    with caplog.at_level(logging.WARNING, logger="hoprl.clients.judge"):
        got = [remote.answer(p, r, question="Where?") for p, r in ANSWERS]
        got += [remote.answerable(q, e, r) for q, e, r in ANSWERABLE]
    want = [rules.answer(p, r) for p, r in ANSWERS] + [rules.answerable(q, e, r) for q, e, r in ANSWERABLE]
    for verdict, expected in zip(got, want, strict=True):
        assert isinstance(verdict, JudgeVerdict)
        assert verdict.model_dump(include=set(Verdict.model_fields)) == expected.model_dump()
        assert verdict.fallback is True and verdict.backend == "rules" and not verdict.cached
        assert verdict.fallback_reason is not None
        assert f"127.0.0.1:{port}" in verdict.fallback_reason and "ConnectError" in verdict.fallback_reason
    assert [v.verdict for v in got] == [True, False, False, True, False, True]
    # one warning when the service went away, not one per call
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()
    # what the rules cannot fix still raises: an answer needs a reference
    with pytest.raises(ValueError, match="references"):
        remote.answer("Paris", [])
    remote.close()


def test_a_503_falls_back_and_a_healthy_service_decides() -> None:
    """A judge whose Redis is down answers 503 (cache_unavailable): the rules decide, flagged."""
    with judge_service(redis_url=f"redis://127.0.0.1:{free_port()}/0") as url:
        verdict = RemoteJudge(url).answer("Paris, France", ["Paris"])
    assert isinstance(verdict, JudgeVerdict)
    assert (verdict.verdict, verdict.fallback) == (True, True)
    assert verdict.fallback_reason is not None and "HTTP 503" in verdict.fallback_reason


def test_a_judge_that_dies_mid_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """EVO-RAG's refusal reward scored through a judge process that is killed (SIGKILL) half-way:
    the run goes on, the later verdicts come from the rules with the reason, the rewards are the
    rules' throughout, and once a judge listens again its verdicts are no longer fallbacks."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cases = [
        ("Jane Roe was born in Paris.", ["Paris"], -1.0),
        ("Jane Roe founded Acme Records.", ["Paris"], 1.0),
        ("Jane Roe was born in Bogotá.", ["Bogota"], -1.0),  # answerable once accents are folded
    ] * 2
    remote = RemoteJudge(url)
    scored = []
    with caplog.at_level(logging.INFO, logger="hoprl.clients.judge"):
        with judge_process(port, tmp_path / "judge.log") as proc:
            for i, (evidence, answers, _) in enumerate(cases):
                if i == 3:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                scored.append(score_episode(refusal_episode(evidence, answers), remote, "refinement"))
        trails = [s.meta["evo_rag"]["refusal"] for s in scored]
        assert [t["fallback"] for t in trails] == [False, False, False, True, True, True]
        assert all(t["backend"] == "rules" and t["version"] == RULES_VERSION for t in trails)
        assert all(url in t["fallback_reason"] for t in trails[3:])
        assert [s.steps[1].signals["r_ref"] for s in scored] == [r for _, _, r in cases]
        # the judge comes back (on the same port): verdicts are the service's again
        with judge_process(port, tmp_path / "judge2.log"):
            back = remote.answerable(QUESTION, ["Jane Roe was born in Paris."], ["Paris"])
    assert isinstance(back, JudgeVerdict) and back.verdict and not back.fallback
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "hoprl.clients.judge"]
    assert [level for level, _ in messages] == [logging.WARNING, logging.INFO]
    assert "answers again" in messages[1][1]
    remote.close()


def test_the_fallback_survives_json() -> None:
    """The flag and reason travel with the verdict (a Celery result, an episode's meta)."""
    verdict = RemoteJudge(f"http://127.0.0.1:{free_port()}").answer("Paris", ["Paris"])
    again = JudgeVerdict.model_validate_json(verdict.model_dump_json())
    assert again == verdict and again.fallback and again.fallback_reason
