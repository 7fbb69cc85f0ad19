"""VllmEngine's settings: what reaches vLLM's engine core (the engine itself runs in
tests/services/policy, where the policy serves on it)."""

from __future__ import annotations

from typing import Any

import pytest

from hoprl.generation.vllm_engine import VllmSettings


def settings(monkeypatch: pytest.MonkeyPatch, cores: int, **kw: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """What a CPU engine of ``kw``'s settings gets on a machine of ``cores`` cores."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    return VllmSettings(**kw).resolve("m", on_gpu=False)


def test_two_cores_reserve_none_for_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    env, _ = settings(monkeypatch, 2)
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    env, _ = settings(monkeypatch, 1)
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_larger_machines_keep_vllms_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    env, _ = settings(monkeypatch, 16)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in env


def test_the_setting_and_then_the_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    env, _ = settings(monkeypatch, 2, cpu_reserved_cores=1)
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    env, _ = settings(monkeypatch, 2)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in env  # the environment's 1 stays as it is


def test_scheduler_settings_reach_the_engine_args_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    _, values = settings(monkeypatch, 2)
    assert "max_num_batched_tokens" not in values and "max_model_len" not in values
    _, values = settings(monkeypatch, 2, max_num_batched_tokens=512, max_model_len=4096, max_num_seqs=8)
    assert (values["max_num_batched_tokens"], values["max_model_len"], values["max_num_seqs"]) == (
        512,
        4096,
        8,
    )
    assert values["enforce_eager"] is True  # a CPU: eager unless told otherwise
