"""``make ui``: a local Prefect server with its UI, the deployments and a worker, in one command.

    make ui          # = python -m flows.ui; Ctrl-C stops the worker and the server

1. starts ``prefect server start`` on 127.0.0.1:4200 with its state (a SQLite database) under
   ``.hoprl/prefect`` and analytics off, and waits until ``/api/health`` answers;
2. registers the deployments (``python -m flows.deploy``: work pool ``hoprl``, deployment
   ``pipeline/pipeline``);
3. starts ``prefect worker start --pool hoprl`` in the repository root, which runs what the UI's
   Run button starts (each run starts the services it needs, see :mod:`flows.stack`);

then waits until Ctrl-C (or SIGTERM, or until one of the two dies) and stops both, by process
group. While it runs, ``make run`` in another terminal finds the server (:func:`local_api`) and
its runs show in the UI beside those started there. Logs: ``.hoprl/prefect/server.log`` and
``.hoprl/prefect/worker.log``. Every command is run as ``sys.executable -m ...``, so the
virtual environment need not be on ``PATH``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import httpx

ROOT = Path(__file__).resolve().parents[1]
LOCAL_API_URL = "http://127.0.0.1:4200/api"  # where `make ui` serves and `make run` looks
POOL = "hoprl"
READY_TIMEOUT_S = 180.0


def local_api(url: str = LOCAL_API_URL, timeout: float = 1.0) -> str | None:
    """``url`` if a Prefect server answers ``GET {url}/health`` there, else None."""
    try:
        return url if httpx.get(f"{url}/health", timeout=timeout).status_code == 200 else None
    except httpx.HTTPError:
        return None


def start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m <argv>`` in the repository root, in a process group of its own, output to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *argv],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 20.0) -> None:
    """SIGTERM every process group (the server's own children too) at once, SIGKILL what still runs
    after ``grace_s``: the worker and the server shut down side by side, so Ctrl-C takes at most
    one grace period (one after the other took up to two, over a minute on a loaded machine)."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes], log: Path | None = None, timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Wait until ``url``'s ``/health`` answers; raise, quoting ``log``'s end where there is one,
    when ``proc`` exits first or ``timeout_s`` runs out."""
    deadline = time.monotonic() + timeout_s
    while local_api(url) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            exited = proc.poll() is not None
            why = f"it exited with {proc.returncode}" if exited else f"not within {timeout_s:.0f} s"
            tail = f"; {log}:\n{log.read_text(errors='replace')[-3000:]}" if log else ""
            raise RuntimeError(f"the Prefect server did not come up at {url} ({why}){tail}")
        time.sleep(0.5)


def terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM stops like Ctrl-C: through the finally below


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.ui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=4200)
    parser.add_argument(
        "--home", type=Path, default=ROOT / ".hoprl" / "prefect", help="PREFECT_HOME: the server's state"
    )
    args = parser.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}/api"
    if local_api(url):
        print(f"a Prefect server already answers at {url}; stop it first (or use it as it is)")
        return 1
    home = args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    signal.signal(signal.SIGTERM, terminate)
    # Ctrl-C stops it even when started from a script in the background: a shell's `cmd &` starts
    # it with SIGINT ignored, and Python then installs no KeyboardInterrupt handler (SIGINT did
    # nothing and the test's Ctrl-C waited until it killed flows.ui)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        server_cmd = ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(args.port)]
        procs["server"] = start(server_cmd, home / "server.log", env)
        wait_healthy(url, procs["server"], home / "server.log")
        subprocess.run([sys.executable, "-m", "flows.deploy"], cwd=ROOT, env=env, check=True)
        procs["worker"] = start(["prefect", "worker", "start", "--pool", POOL], home / "worker.log", env)
        print(
            f"Prefect UI: {url.removesuffix('/api')}  (deployment pipeline/pipeline, worker of pool {POOL})\n"
            f"`make run` in another terminal shows there too. Logs: {home}/server.log, {home}/worker.log\n"
            "Ctrl-C stops the worker and the server.",
            flush=True,
        )
        while all(p.poll() is None for p in procs.values()):
            time.sleep(1)
        dead = next(name for name, p in procs.items() if p.poll() is not None)
        print(f"the {dead} exited with {procs[dead].returncode} (see {home}/{dead}.log); stopping")
        return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, subprocess.CalledProcessError) as exc:  # said what failed; no traceback
        print(f"make ui: {exc}", file=sys.stderr)
        return 1
    finally:
        stop(list(procs.values()))


if __name__ == "__main__":
    raise SystemExit(main())
