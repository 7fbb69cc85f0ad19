"""The services a pipeline talks to: the configured ones, or local processes started for the run.

With ``HOPRL_RETRIEVER_URL``, ``HOPRL_POLICY_URL``, ``HOPRL_JUDGE_URL`` and ``HOPRL_TRAINER_URL``
set (docker compose sets them for the Prefect worker), :func:`services` uses those. Each one that
is unset is started here as a process on a free 127.0.0.1 port, with the same app object
``hoprl serve`` runs; all of them start at once, each is waited for until its ``/readyz`` answers
200, and stopped (by its PID) when the ``with`` block ends::

    with services(run_dir, model=None) as urls:
        RetrieverClient(urls.retriever).collections()

Local processes get the run's settings through their environment: the retriever stores its
embedded Qdrant under the run folder (or uses ``QDRANT_URL`` when set), the policy searches that
retriever, serves on its default engine (vLLM where it is installed, else transformers;
``POLICY_ENGINE`` in the environment chooses another) and accepts checkpoint switches with a
token made for the run, the trainer writes its jobs under the run folder and cancels its running
job when the run stops; every process inherits ``HOPRL_DATABASE_URL`` (PostgreSQL when set,
else the SQLite file), ``QDRANT_URL`` and ``JUDGE_REDIS_URL``. Their logs are
``<run folder>/logs/<service>.log``.

Fan-out units run in this process (Celery eager) unless ``HOPRL_CELERY_BROKER_URL`` is set, in
which case the units go to Redis and ``celery -A flows.fanout worker`` processes run them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from flows import fanout
from hoprl.domain import SHAPE_DEFAULTS, EpisodeShape
from hoprl.ports import free_port
from hoprl.settings import get_settings

log = logging.getLogger(__name__)

# service -> the ASGI app ``hoprl serve`` runs (a running one is named by HOPRL_<SERVICE>_URL)
APPS = {
    "retriever": "services.retriever.app:app",
    "judge": "services.judge.app:app",
    "policy": "services.policy.app:app",
    "trainer": "services.trainer.app:app",
}


def policy_limits(shape: EpisodeShape) -> dict[str, str]:
    """/v1/answer's limits of the policy a local run starts: the run's episode shape
    (:func:`hoprl.jobspec.episode_shape`, the trainer's rollouts and the dev checks read it too),
    served free of the action grammar like the rollouts and dev checks (the shape's ``grammar``
    is off, :func:`hoprl.jobspec.episode_shape` says why). A deployment (HOPRL_POLICY_URL) sets its
    own POLICY_* limits."""
    return {
        "POLICY_MAX_STEPS": str(shape.max_steps),
        "POLICY_DEFAULT_MAX_STEPS": str(shape.max_steps),
        "POLICY_MAX_NEW_TOKENS_PER_STEP": str(shape.max_new_tokens_per_step),
        "POLICY_TOKEN_BUDGET": str(shape.token_budget),
        "POLICY_CONSTRAINED_DECODING": str(shape.grammar).lower(),
        "POLICY_REQUEST_TIMEOUT_S": "600",
    }


#: engine=vllm settings of a local policy (its engine is the settings default: vllm wherever vLLM is
#: installed, else transformers, which ignores these). Eager: torch.compile would add about a minute
#: to the start on a CPU. KV cache: 2 GiB holds 46,592 tokens of the default model in fp32 (45 KiB a
#: token), 16 sequences (POLICY_MAX_BATCH) of ~2.9k, above a cpu-shape episode's prompt with its
#: documents plus its 1152-token budget. Measured 2026-11-27 on two shared cores: the vLLM policy
#: started in 51-81 s, used 1.4% of a core while idle (no load on the trainer beside it) and answered
#: a /v1/answer/batch of 20 episodes in 15 s against the transformers engine's 33-46 s.
LOCAL_VLLM = {"POLICY_EAGER": "true", "POLICY_KV_CACHE_GIB": "2"}
#: how long a stopped service has to shut down before SIGKILL: a ready one shuts down gracefully
#: (the trainer cancels its job); one still starting has nothing to keep, and uvicorn acts on
#: SIGTERM only once the app's start-up is over: a policy loading its engine (25-80 s on a CPU)
#: held a run stopped in its first seconds for the whole 30 s
STOP_GRACE_S, STARTING_GRACE_S = 30.0, 3.0
READY_TIMEOUT_S = 600.0  # the first policy start converts the bundled GGUF model (~20 s), then loads it


@dataclass(frozen=True)
class ServiceUrls:
    """Base URLs of the four services (flow parameters: no secrets in here)."""

    retriever: str
    policy: str
    judge: str
    trainer: str


# policy URL -> the admin token of a policy started here; kept out of flow parameters (Prefect stores those)
_TOKENS: dict[str, str] = {}


def admin_token(policy_url: str) -> str | None:
    """The token for ``POST /v1/admin/checkpoint``: the one made for a local policy, else
    ``$HOPRL_POLICY_ADMIN_TOKEN`` (the policy's ``POLICY_ADMIN_TOKEN``)."""
    token = get_settings().policy_admin_token
    return _TOKENS.get(policy_url) or (token.get_secret_value() if token else None)


def die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the flow's process dies, even by SIGKILL (Linux).

    Otherwise a killed pipeline leaves its services running, and the orphaned retriever keeps the
    run's embedded Qdrant folder locked against the resumed run.
    """
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def wait_ready(name: str, url: str, proc: subprocess.Popen[bytes] | None, logfile: Path | None) -> None:
    """Poll ``url/readyz`` until 200; raise naming the log when the process dies or time runs out."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the {name} service exited with {proc.returncode}; see {logfile}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(
        f"the {name} service at {url} was not ready after {READY_TIMEOUT_S:.0f} s; see {logfile}"
    )


@dataclass
class Spawned:
    """A local service process, started and not yet known to be ready."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    logfile: Path
    ready: bool = False

    def wait_ready(self) -> None:
        wait_ready(self.name, self.url, self.proc, self.logfile)
        self.ready = True


@contextmanager
def spawned(name: str, env: Mapping[str, str], logs: Path) -> Iterator[Spawned]:
    """Start service ``name`` in a child process on a free loopback port, without waiting for it;
    it is stopped when the ``with`` block ends."""
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    logfile = logs / f"{name}.log"
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        APPS[name],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with logfile.open("ab") as out:
        proc = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    url = f"http://127.0.0.1:{port}"
    log.info("started %s (pid %d) at %s, log %s", name, proc.pid, url, logfile)
    service = Spawned(name, url, proc, logfile)
    try:
        yield service
    finally:
        stop(proc, STOP_GRACE_S if service.ready else STARTING_GRACE_S)
        log.info("stopped %s (pid %d)", name, proc.pid)


@contextmanager
def local_process(name: str, env: Mapping[str, str], logs: Path) -> Iterator[str]:
    """Serve service ``name`` in a child process on a free loopback port; yields its URL once ready."""
    with spawned(name, env, logs) as service:
        service.wait_ready()
        yield service.url


def stop(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM (uvicorn shuts down gracefully), then, after ``grace_s``, SIGKILL to the process
    and every process below it (a policy's vLLM engine core is its child)."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        top = psutil.Process(proc.pid)  # not yet reaped: it exists, a zombie at worst
        for p in [top, *top.children(recursive=True)]:
            with suppress(psutil.NoSuchProcess):
                p.kill()
        proc.wait()


def service_env(
    name: str,
    run_dir: Path,
    urls: Mapping[str, str],
    token: str,
    model: str | None,
    shape: EpisodeShape = SHAPE_DEFAULTS["cpu"],
) -> dict[str, str]:
    """The environment of one local service process: where it stores things, whom it calls."""
    if name == "retriever":
        return {"RETRIEVER_STORAGE_PATH": str(run_dir / "qdrant")}
    if name == "policy":
        env = {"POLICY_RETRIEVER_URL": urls["retriever"], "POLICY_ADMIN_TOKEN": token, **LOCAL_VLLM,
               **policy_limits(shape)}  # fmt: skip
        return {**env, "POLICY_MODEL": model} if model else env
    if name == "trainer":
        # the run's own trainer: when the run stops (Ctrl-C, a kill) its job is cancelled, not left
        # training unwatched for the next run's trainer to adopt; --run-id resumes it from its checkpoint
        return {"TRAINER_RETRIEVER_URL": urls["retriever"], "TRAINER_RUNS_DIR": str(run_dir / "jobs"),
                "TRAINER_CANCEL_ON_EXIT": "true"}  # fmt: skip
    return {}


@contextmanager
def services(
    run_dir: Path, model: str | None = None, shape: EpisodeShape = SHAPE_DEFAULTS["cpu"]
) -> Iterator[ServiceUrls]:
    """The configured services, with the missing ones started locally for the ``with`` block.

    Args:
        run_dir: the run's folder (embedded Qdrant storage, trainer jobs, service logs).
        model: the policy's starting model (HF id or folder); None = the bundled default.
        shape: the run's episode shape, a local policy's /v1/answer limits (:func:`policy_limits`).
    """
    config = get_settings()
    fanout.use_eager(config.celery_broker_url is None)
    secret = config.policy_admin_token
    token = secret.get_secret_value() if secret else secrets.token_urlsafe(16)
    running = {"retriever": config.retriever_url, "judge": config.judge_url,
               "policy": config.policy_url, "trainer": config.trainer_url}  # fmt: skip
    urls: dict[str, str] = {}
    with ExitStack() as stack:
        started: list[Spawned] = []
        for name in APPS:  # retriever first: policy and trainer are given its URL
            if url := running[name]:
                urls[name] = url.rstrip("/")
                wait_ready(name, urls[name], None, None)
                continue
            env = service_env(name, run_dir, urls, token, model, shape)
            started.append(stack.enter_context(spawned(name, env, run_dir / "logs")))
            urls[name] = started[-1].url
            if name == "policy":
                _TOKENS[urls[name]] = token
        # all started before any is waited for: they load side by side (the policy's engine takes
        # ~25-50 s on a CPU; started one after another, the others' start-up added ~15 s to it)
        for service in started:
            service.wait_ready()
        yield ServiceUrls(**urls)
