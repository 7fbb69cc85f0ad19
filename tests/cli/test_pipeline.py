"""What ``hoprl pipeline`` prints at the end of a run, and the temporary Prefect server a flow command
starts when no Prefect API is set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cli.pipeline import format_summary
from tests.processes import alive, descendants

ROOT = Path(__file__).resolve().parents[2]


def test_the_summary_heads_with_the_em_the_report_scores_then_em_over_all() -> None:
    """A when-to-search run on 20 questions, 7 without an answer: 3 of the 13 answerable ones right
    is EM 3/13 = 0.231 as the report scores it and 3/20 = 0.150 over all."""
    zero = {"em_scored": 0.0, "em": 0.0, "f1": 0.0, "judge_accuracy": 0.0, "retrieval_count": 0.0}
    after = {"em_scored": 3 / 13, "em": 3 / 20, "f1": 0.15, "judge_accuracy": 0.15, "retrieval_count": 2.0}
    text = format_summary({
        "run_id": "r", "recipe": "when-to-search", "collection": "c", "before": zero, "after": after,
        "report": "runs/r/report.md", "plots": [], "checkpoint": "ckpt",
    })  # fmt: skip
    lines = text.splitlines()
    assert lines[2].split() == ["EM", "(as", "the", "report)", "0.000", "0.231", "+0.231"]
    assert lines[3].split() == ["EM", "(all", "questions)", "0.000", "0.150", "+0.150"]
    assert lines[6].split() == ["retrievals", "/", "question", "0.000", "2.000", "+2.000"]


def test_pipeline_passes_the_corpus_to_the_flow() -> None:
    """``hoprl pipeline --corpus C``: the open-domain setting reaches the flow, whose spec keeps it."""
    import argparse
    import inspect

    from cli import pipeline as pipeline_cli
    from flows.pipeline import pipeline
    from flows.spec import RunSpec

    parser = argparse.ArgumentParser()
    pipeline_cli.add_arguments(parser)
    options = pipeline_cli.pipeline_options(parser.parse_args(["--small", "--corpus", "wiki18"]))
    assert options["corpus"] == "wiki18" and "corpus" in inspect.signature(pipeline.fn).parameters
    assert "corpus" not in pipeline_cli.pipeline_options(parser.parse_args(["--small"]))
    assert RunSpec(corpus="wiki18").corpus == "wiki18" and RunSpec().corpus is None


SERVE_ONCE = """
import sys
from cli.pipeline import temporary_server
first, again = temporary_server(180), temporary_server(180)
print(first, again, flush=True)
sys.stdin.read()  # until the test closes stdin
"""


@pytest.mark.parametrize("ending", ["exits", "is-killed"])
def test_the_temporary_prefect_server_is_one_a_process_in_a_session_of_its_own_and_ends_with_it(
    tmp_path: Path, ending: str
) -> None:
    """A command's temporary Prefect server: one however often asked for, answering ``/health``, in a
    session of its own (a terminal's Ctrl-C, sent to the command's process group, does not reach it),
    and gone within 10 s of the command's end, whether it exits or is killed (SIGKILL)."""
    env = {name: value for name, value in os.environ.items() if name != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-c", SERVE_ONCE], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    servers: dict[int, str] = {}
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first, again = proc.stdout.readline().split()
        assert first == again and httpx.get(f"{first}/health", timeout=10).status_code == 200
        servers = {p: cmd for p, cmd in descendants(proc.pid).items() if "prefect.server.api.server" in cmd}
        assert len(servers) == 1, descendants(proc.pid)
        (server,) = servers
        assert os.getsid(server) == server != os.getsid(proc.pid)
        if ending == "exits":
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
        else:
            proc.kill()
            proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(server), f"the server outlived the command that {ending}"
    finally:
        proc.kill()
        for p in servers:
            if alive(p):
                os.kill(p, signal.SIGKILL)
