"""The mixed-precision switch shared by every TRL config and the rollout engine."""

from __future__ import annotations

import pytest
import torch

from hoprl.training.hardware import accelerator_args, bf16_mixed_precision, rollout_bf16


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("on", True), ("0", False), ("false", False)])
def test_the_environment_overrides_the_choice(
    value: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOPRL_BF16", value)
    assert bf16_mixed_precision() is expected
    assert accelerator_args() == {"use_cpu": not torch.cuda.is_available(), "bf16": expected}


def test_the_default_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOPRL_BF16", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert bf16_mixed_precision() is True
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert bf16_mixed_precision() is False


@pytest.mark.parametrize(
    ("training", "rollouts", "expected"),
    [("1", None, True), ("0", None, False), ("1", "0", False), ("0", "1", True)],
)
def test_rollouts_decode_as_training_unless_told_otherwise(
    training: str, rollouts: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOPRL_BF16", training)
    if rollouts is None:
        monkeypatch.delenv("HOPRL_ROLLOUT_BF16", raising=False)
    else:
        monkeypatch.setenv("HOPRL_ROLLOUT_BF16", rollouts)
    assert rollout_bf16() is expected
    assert accelerator_args()["bf16"] is (training == "1")  # training's own precision is untouched
