"""The project-wide settings: every ``HOPRL_*`` environment variable, in one class.

Each service has its own settings class for its own prefix (``RETRIEVER_``, ``POLICY_``, ...);
the variables here are the ones several parts share (the API key every service and client
uses, the run registry, the flows' runs folder, the Celery fan-out) or that belong to the
library itself. :func:`get_settings` reads the environment on every call, never at import, so a
variable set after import (a test's ``monkeypatch.setenv``, a CLI flag exported before a flow
starts) is seen by the next read::

    from hoprl.settings import get_settings

    runs = get_settings().runs_dir
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

#: the broker (and result backend) of the fan-out when ``HOPRL_CELERY_BROKER_URL`` is unset
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/1"


class HoprlSettings(BaseSettings):
    """Every ``HOPRL_<FIELD>`` variable; an empty one counts as unset.

    =============================  =============================================================
    ``HOPRL_API_KEY``              the key every service requires (``Authorization: Bearer``)
                                   when set, and every client sends; unset = services are open
    ``HOPRL_DATABASE_URL``         the run registry; unset = ``sqlite:///.hoprl/registry.db``
    ``HOPRL_RUNS_DIR``             the flows' run folders (default ``runs``)
    ``HOPRL_CONFIGS_DIR``          the papers' job configs (``<recipe>.yaml``) the trainer's
                                   ``paper`` preset reads; unset = the source tree's ``configs/``
    ``HOPRL_CACHE``                the library's cache folder (ONNX exports); unset =
                                   ``$XDG_CACHE_HOME/hoprl``, else ``~/.cache/hoprl``
    ``HOPRL_TORCH_THREADS``        torch threads of the process-wide embedder; unset = torch's
    ``HOPRL_BF16``                 force bf16 mixed precision in training on (1) or off (0);
                                   unset = on with CUDA and on CPUs with AMX
    ``HOPRL_ROLLOUT_BF16``         bf16 autocast while the trainer's rollouts decode, on (1) or
                                   off (0); unset = as training with CUDA, off on a CPU
    ``HOPRL_ROLLOUT_PREFILL_BF16`` bf16 autocast while the trainer's rollouts prefill their
                                   prompts, on (1) or off (0); unset = as training
    ``HOPRL_CELERY_BROKER_URL``    the fan-out's Redis (broker and results); unset =
                                   ``redis://127.0.0.1:6379/1``, and a local pipeline runs its
                                   units in process
    ``HOPRL_FANOUT_TIMEOUT``       seconds a fan-out waits for its units (default 3600)
    ``HOPRL_CELERY_EAGER``         1 = run fan-out units in the calling process
    ``HOPRL_POLICY_ADMIN_TOKEN``   the token a pipeline sends to a running policy's admin routes
    ``HOPRL_RETRIEVER_URL``,       running services a pipeline uses; each one unset is started
    ``HOPRL_POLICY_URL``,          as a local process for the run
    ``HOPRL_JUDGE_URL``,
    ``HOPRL_TRAINER_URL``
    =============================  =============================================================

    Unlike the services' settings, an unknown ``HOPRL_*`` variable is not an error: the test
    suite has its own (``HOPRL_TEST_POSTGRES_URL``), and every client reads this class.
    """

    model_config = SettingsConfigDict(env_prefix="HOPRL_", env_ignore_empty=True, extra="ignore", frozen=True)

    api_key: SecretStr | None = Field(None, description="the services' shared API key; unset = open")
    database_url: str | None = Field(None, description="run registry URL; unset = the SQLite default")
    runs_dir: Path = Field(Path("runs"), description="the flows' run folders")
    configs_dir: Path | None = Field(None, description="the papers' job configs; unset = the source's")
    cache: Path | None = Field(None, description="the library's cache folder; unset = the XDG one")
    torch_threads: int | None = Field(None, ge=1, description="threads of the process-wide embedder")
    bf16: bool | None = Field(None, description="bf16 mixed precision in training; unset = detected")
    rollout_bf16: bool | None = Field(
        None, description="bf16 while rollouts decode; unset = as training with CUDA, off on a CPU"
    )
    rollout_prefill_bf16: bool | None = Field(
        None, description="bf16 in rollouts' prefill; unset = as training"
    )
    celery_broker_url: str | None = Field(None, description=f"unset = {DEFAULT_BROKER_URL}, eager locally")
    fanout_timeout: float = Field(3600.0, gt=0, description="seconds a fan-out waits for its units")
    celery_eager: bool = Field(False, description="run fan-out units in the calling process")
    policy_admin_token: SecretStr | None = Field(None, description="a running policy's admin token")
    retriever_url: str | None = Field(None, description="a running retriever; unset = start one")
    policy_url: str | None = Field(None, description="a running policy; unset = start one")
    judge_url: str | None = Field(None, description="a running judge; unset = start one")
    trainer_url: str | None = Field(None, description="a running trainer; unset = start one")

    @property
    def cache_dir(self) -> Path:
        """``HOPRL_CACHE``, else the XDG cache folder's ``hoprl``."""
        if self.cache is not None:
            return self.cache
        return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "hoprl"

    @property
    def broker_url(self) -> str:
        """The fan-out's broker: ``HOPRL_CELERY_BROKER_URL``, else the local Redis's database 1."""
        return self.celery_broker_url or DEFAULT_BROKER_URL


def get_settings() -> HoprlSettings:
    """The ``HOPRL_*`` settings as the environment holds them now (read on every call).

    One object is parsed per distinct set of ``HOPRL_*`` values: pydantic-settings takes
    milliseconds to build one, and every client asks when it is made.
    """
    return _parse(
        tuple(sorted((k.upper(), v) for k, v in os.environ.items() if k.upper().startswith("HOPRL_")))
    )


@functools.lru_cache(maxsize=16)
def _parse(environment: tuple[tuple[str, str], ...]) -> HoprlSettings:
    """``environment`` is the cache key: the ``HOPRL_*`` variables the settings are read from."""
    return HoprlSettings()
