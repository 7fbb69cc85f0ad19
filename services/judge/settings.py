"""Judge settings: environment variables with the ``JUDGE_`` prefix."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from hoprl.schemas.judge import MAX_BATCH
from services.judge.prompts import ANSWER_PROMPTS, ANSWERABLE_PROMPTS
from services.settings import ServiceSettings


class JudgeSettings(ServiceSettings):
    """Which backend decides, where the LLM is, how results are cached, and the request limits.

    Every field reads ``JUDGE_<FIELD>``. The rules backend needs nothing else; the openai backend
    needs ``JUDGE_OPENAI_BASE_URL`` and ``JUDGE_MODEL``, e.g. for a Qwen served by vLLM::

        JUDGE_BACKEND=openai JUDGE_OPENAI_BASE_URL=http://127.0.0.1:8000/v1 \\
        JUDGE_MODEL=Qwen/Qwen2.5-7B-Instruct hoprl serve judge
    """

    model_config = SettingsConfigDict(env_prefix="JUDGE_", extra="forbid")

    backend: Literal["rules", "openai"] = Field("rules", description="'rules' (embedded) or 'openai'")
    openai_base_url: str | None = Field(None, description="an OpenAI-compatible API, ending in /v1")
    openai_api_key: SecretStr | None = Field(None, description="unset = the endpoint needs no key")
    model: str | None = Field(None, description="model name the endpoint serves (openai backend)")
    answer_prompt: str = Field(
        "answer_equivalence@1", description=f"prompt for /v1/judge/answer: one of {sorted(ANSWER_PROMPTS)}"
    )
    answerable_prompt: str = Field(
        "answerable@1", description=f"prompt for /v1/judge/answerable: one of {sorted(ANSWERABLE_PROMPTS)}"
    )
    seed: int = Field(0, description="sent with every LLM call (with temperature 0)")
    max_tokens: int = Field(64, ge=1, le=4096, description="LLM reply budget; the verdict is one word")
    timeout_s: float = Field(30.0, gt=0, description="per LLM call")
    retries: int = Field(2, ge=0, le=10, description="extra attempts after a failed LLM call")
    backoff_s: float = Field(0.5, ge=0, description="wait before retry k is backoff_s * 2**k")
    concurrency: int = Field(8, ge=1, le=256, description="LLM calls in flight per batch")

    redis_url: str | None = Field(None, description="e.g. redis://127.0.0.1:6379/0; unset = in-process LRU")
    cache_prefix: str = Field("hoprl:judge:", description="Redis key prefix")
    cache_ttl_s: float = Field(7 * 24 * 3600, gt=0, description="how long a verdict stays cached")
    cache_size: int = Field(100_000, ge=1, description="entries of the in-process LRU cache")

    max_batch: int = Field(
        MAX_BATCH, ge=1, le=MAX_BATCH, description="items per request (at most the schema's ceiling)"
    )

    @model_validator(mode="after")
    def _complete(self) -> JudgeSettings:
        if self.backend == "openai" and not (self.openai_base_url and self.model):
            raise ValueError("JUDGE_BACKEND=openai needs JUDGE_OPENAI_BASE_URL and JUDGE_MODEL")
        if self.answer_prompt not in ANSWER_PROMPTS:
            raise ValueError(f"JUDGE_ANSWER_PROMPT must be one of {sorted(ANSWER_PROMPTS)}")
        if self.answerable_prompt not in ANSWERABLE_PROMPTS:
            raise ValueError(f"JUDGE_ANSWERABLE_PROMPT must be one of {sorted(ANSWERABLE_PROMPTS)}")
        return self
